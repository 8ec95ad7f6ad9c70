//! What a lazy restore writes to disk before CRIU starts: every image file except the pages
//! files in full (they are small), and each `pages-N.img` as a sparse file of its full size
//! holding only the pages CRIU restores itself. CRIU never reads the lazy byte ranges.

use crate::error::{LazyError, Result};
use crate::fetch::FileChunks;
use crate::layout::Layout;
use gstore_store::dedup::similar::{is_page_image, is_page_image_path};
use gstore_store::format::manifest::Manifest;
use gstore_store::progress::Progress;
use gstore_store::{IndexedStore, ObjectId};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;

/// Bytes of eager pages fetched at a time.
const EAGER_READ: u64 = 4 << 20;

/// An image made ready for a lazy restore.
pub struct Prepared {
    /// Which memory is lazy.
    pub layout: Layout,
    /// The located chunks of each process's pages file (in `layout.processes` order).
    pub chunks: Vec<FileChunks>,
    /// Bytes written to disk.
    pub written_bytes: u64,
}

/// Writes image `id` (manifest `m`) out to the new directory `dir` for a lazy restore.
pub fn prepare(
    store: &IndexedStore,
    id: &ObjectId,
    m: &Manifest,
    dir: &Path,
    budget: gstore_restore::Budget,
    progress: &dyn Progress,
) -> Result<Prepared> {
    // Pages files sit at the top of a CRIU image: a path with a directory part is not one.
    let small = m.subset(|e| !is_page_image(&e.path));
    let mut chunks = Vec::new();
    let report = gstore_restore::restore_to_dir(store, id, &small, dir, budget, progress)?;
    let mut written = report.logical_bytes;
    let layout = Layout::read(dir)?;
    let (mut decoder, mut scratch) = (store.decoder(), Vec::new());
    let mut buf = vec![0u8; FileChunks::buffer_len(EAGER_READ, store.config().chunk_max) + 4096];
    let align = buf.as_ptr().align_offset(4096);
    for p in &layout.processes {
        let file = FileChunks::locate(store, m, &p.pages_file)?;
        if file.size < p.pages_len {
            return Err(LazyError::Image {
                file: p.pages_file.clone(),
                detail: format!("holds {} bytes, its page map needs {}", file.size, p.pages_len),
            });
        }
        let path = dir.join(&p.pages_file);
        if !path.exists() {
            let mode = m.entries.iter().find(|e| e.path == p.pages_file).map_or(0o600, |e| e.mode & 0o777);
            let f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(mode)
                .custom_flags(libc::O_NOFOLLOW)
                .open(&path)
                .map_err(|e| LazyError::os(format!("creating {}", path.display()), e))?;
            f.set_len(file.size).map_err(|e| LazyError::os(format!("sizing {}", path.display()), e))?;
            for range in &p.eager {
                let mut at = range.start;
                while at < range.end {
                    let end = range.end.min(at + EAGER_READ);
                    let off = file.read_into(store, at..end, &mut buf[align..], &mut scratch, &mut decoder)?;
                    let bytes = &buf[align + off..align + off + (end - at) as usize];
                    f.write_all_at(bytes, at).map_err(|e| LazyError::os(format!("writing {}", path.display()), e))?;
                    written += end - at;
                    at = end;
                }
            }
        }
        chunks.push(file);
    }
    Ok(Prepared { layout, chunks, written_bytes: written })
}

/// Locates the chunks of every pages file of image `id`, at any depth (a runc image keeps them
/// under `checkpoint/`), with [`FileChunks::locate`], which records where they are for the
/// restores of the image on this machine: a checkpoint does so once its image is stored, so
/// that even the first lazy restore reads the locations instead of looking each chunk up while
/// the restore waits. The record names the chunk list, not the path. A cache: a failure here
/// fails nothing, and the restore looks the chunks up itself.
pub fn locate_ahead(store: &IndexedStore, id: &ObjectId) {
    let Ok(m) = store.get_manifest(id) else { return };
    for e in m.entries.iter().filter(|e| is_page_image_path(&e.path)) {
        if FileChunks::locate(store, &m, &e.path).is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_files_are_told_apart() {
        assert!(is_page_image("pages-1.img") && is_page_image("pages-12.img"));
        assert!(!is_page_image("pagemap-1.img") && !is_page_image("pages-.img") && !is_page_image("pages-1.img.x"));
        assert!(!is_page_image("dir/pages-1.img"));
    }
}
