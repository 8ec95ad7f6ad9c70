//! Which memory of an image is lazy and where its bytes are: read from the image's own
//! `pstree.img`, `mm-<pid>.img` and `pagemap-<pid>.img`.
//!
//! A page map lists runs of pages in address order. The bytes of every run flagged
//! `PE_PRESENT` lie back to back in `pages-<pages_id>.img`, in run order. Runs flagged
//! `PE_LAZY` as well are left to the daemon (CRIU skips them); the other present runs are read
//! by CRIU itself ("eager"). Lazy runs are split at memory-area edges, because one
//! `UFFDIO_COPY` cannot cross two areas.

use crate::error::{LazyError, Result};
use gstore_gpu_dump::images::{self, Vma, PAGE_SIZE, PE_LAZY, PE_PARENT, PE_PRESENT};
use std::ops::Range;
use std::path::Path;

/// A lazy run: `len` bytes at `vaddr`, whose bytes are at `file_off` of the pages file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Run {
    /// First address (page-aligned).
    pub vaddr: u64,
    /// Offset in the pages file.
    pub file_off: u64,
    /// Length in bytes (whole pages).
    pub len: u64,
    /// Size of the memory area the run lies in (orders the fill: large areas first).
    pub area_len: u64,
}

/// One process of the image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Process {
    /// Its pid (the same after restore).
    pub pid: u32,
    /// Its pages file, `pages-N.img`.
    pub pages_file: String,
    /// Lazy runs, by address.
    pub lazy: Vec<Run>,
    /// Byte ranges of the pages file CRIU reads itself.
    pub eager: Vec<Range<u64>>,
    /// Bytes the pages file must hold at least.
    pub pages_len: u64,
}

impl Process {
    /// Lazy bytes in all.
    pub fn lazy_bytes(&self) -> u64 {
        self.lazy.iter().map(|r| r.len).sum()
    }

    /// The lazy run holding `vaddr`, if any.
    pub fn run_at(&self, vaddr: u64) -> Option<&Run> {
        let i = self.lazy.partition_point(|r| r.vaddr + r.len <= vaddr);
        self.lazy.get(i).filter(|r| r.vaddr <= vaddr)
    }
}

/// Every process of an image and its memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    /// Processes in `pstree.img` order. A process without a page map (a zombie) is absent.
    pub processes: Vec<Process>,
    /// Number of records in `pstree.img`: the tasks CRIU will announce.
    pub tasks: usize,
}

impl Layout {
    /// Reads the layout from the image files in `dir`.
    pub fn read(dir: &Path) -> Result<Layout> {
        let tree = images::parse_pstree(&read(dir, "pstree.img")?).map_err(|d| bad("pstree.img", d))?;
        let mut processes = Vec::new();
        for p in &tree {
            let pagemap_name = format!("pagemap-{}.img", p.pid);
            if !dir.join(&pagemap_name).exists() {
                continue;
            }
            let mm_name = format!("mm-{}.img", p.pid);
            let vmas = images::parse_mm(&read(dir, &mm_name)?).map_err(|d| bad(&mm_name, d))?;
            let pagemap = images::parse_pagemap(&read(dir, &pagemap_name)?).map_err(|d| bad(&pagemap_name, d))?;
            processes.push(process(p.pid, &vmas, &pagemap).map_err(|d| bad(&pagemap_name, d))?);
        }
        Ok(Layout { processes, tasks: tree.len() })
    }

    /// The process with pid `pid`.
    pub fn process(&self, pid: u32) -> Option<&Process> {
        self.processes.iter().find(|p| p.pid == pid)
    }

    /// Lazy bytes of all processes.
    pub fn lazy_bytes(&self) -> u64 {
        self.processes.iter().map(Process::lazy_bytes).sum()
    }
}

/// The runs of one process.
fn process(pid: u32, vmas: &[Vma], pagemap: &images::Pagemap) -> std::result::Result<Process, String> {
    let mut out = Process {
        pid,
        pages_file: format!("pages-{}.img", pagemap.pages_id),
        lazy: Vec::new(),
        eager: Vec::new(),
        pages_len: 0,
    };
    let mut file_off = 0u64;
    for e in &pagemap.entries {
        let len = e.nr_pages * PAGE_SIZE;
        if e.flags & PE_PARENT != 0 {
            return Err(format!(
                "pages at {:#x} are in a parent image (an incremental dump); gstore stores whole images only",
                e.vaddr
            ));
        }
        if e.flags & PE_PRESENT == 0 {
            if e.flags & PE_LAZY != 0 {
                return Err(format!(
                    "pages at {:#x} were never written (a `criu dump --lazy-pages` image); dump without it",
                    e.vaddr
                ));
            }
            continue;
        }
        if e.flags & PE_LAZY == 0 {
            match out.eager.last_mut() {
                Some(r) if r.end == file_off => r.end += len,
                _ => out.eager.push(file_off..file_off + len),
            }
        } else {
            split_at_areas(e.vaddr, file_off, len, vmas, &mut out.lazy)?;
        }
        file_off += len;
    }
    out.pages_len = file_off;
    Ok(out)
}

/// Adds the run `[vaddr, vaddr + len)` to `runs`, cut where memory areas end.
fn split_at_areas(
    vaddr: u64,
    file_off: u64,
    len: u64,
    vmas: &[Vma],
    runs: &mut Vec<Run>,
) -> std::result::Result<(), String> {
    let (mut at, end) = (vaddr, vaddr + len);
    while at < end {
        let i = vmas.partition_point(|v| v.end <= at);
        let v =
            vmas.get(i).filter(|v| v.start <= at).ok_or_else(|| format!("lazy page {at:#x} lies in no memory area"))?;
        let piece = v.end.min(end) - at;
        runs.push(Run { vaddr: at, file_off: file_off + (at - vaddr), len: piece, area_len: v.end - v.start });
        at += piece;
    }
    Ok(())
}

fn read(dir: &Path, name: &str) -> Result<Vec<u8>> {
    std::fs::read(dir.join(name)).map_err(|e| LazyError::os(format!("reading {}", dir.join(name).display()), e))
}

fn bad(file: &str, detail: String) -> LazyError {
    LazyError::Image { file: file.to_string(), detail }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gstore_gpu_dump::images::{Pagemap, PagemapEntry};

    const P: u64 = PAGE_SIZE;

    #[test]
    fn runs_follow_present_entries_and_split_at_areas() {
        let vmas = [
            Vma { start: 0x10 * P, end: 0x20 * P, flags: 0x22 },
            Vma { start: 0x20 * P, end: 0x30 * P, flags: 0x22 },
            Vma { start: 0x40 * P, end: 0x41 * P, flags: 0x02 },
        ];
        let entries = vec![
            PagemapEntry { vaddr: 0x10 * P, nr_pages: 2, flags: PE_LAZY | PE_PRESENT },
            PagemapEntry { vaddr: 0x12 * P, nr_pages: 1, flags: PE_PRESENT },
            PagemapEntry { vaddr: 0x14 * P, nr_pages: 4, flags: PE_LAZY },
            PagemapEntry { vaddr: 0x1e * P, nr_pages: 4, flags: PE_LAZY | PE_PRESENT },
            PagemapEntry { vaddr: 0x40 * P, nr_pages: 1, flags: PE_PRESENT },
        ];
        let mut pm = Pagemap { pages_id: 7, entries };
        let err = process(9, &vmas, &pm).unwrap_err();
        assert!(err.contains("--lazy-pages"), "{err}");
        pm.entries.remove(2);
        let p = process(9, &vmas, &pm).expect("layout");
        assert_eq!(p.pages_file, "pages-7.img");
        assert_eq!(p.eager, vec![2 * P..3 * P, 7 * P..8 * P]);
        assert_eq!(
            p.lazy,
            vec![
                Run { vaddr: 0x10 * P, file_off: 0, len: 2 * P, area_len: 0x10 * P },
                Run { vaddr: 0x1e * P, file_off: 3 * P, len: 2 * P, area_len: 0x10 * P },
                Run { vaddr: 0x20 * P, file_off: 5 * P, len: 2 * P, area_len: 0x10 * P },
            ]
        );
        assert_eq!(p.pages_len, 8 * P);
        assert_eq!(p.lazy_bytes(), 6 * P);
        assert_eq!(p.run_at(0x21 * P + 5).map(|r| r.file_off), Some(5 * P));
        assert_eq!(p.run_at(0x12 * P), None);
        pm.entries.push(PagemapEntry { vaddr: 0x50 * P, nr_pages: 1, flags: PE_LAZY | PE_PRESENT });
        assert!(process(9, &vmas, &pm).unwrap_err().contains("no memory area"));
        pm.entries.pop();
        pm.entries[0].flags = PE_PARENT;
        assert!(process(9, &vmas, &pm).unwrap_err().contains("incremental"));
    }
}
