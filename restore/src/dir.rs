//! The directory sink: restores an image's entries under a destination directory.
//!
//! Everything is written into a hidden staging directory beside the destination
//! (`.NAME.gstore-partial`), which is renamed into place only once every chunk has been
//! fetched, verified and written, so a destination that exists is complete. Files are created
//! at their final size (zero chunks stay sparse holes) and filled with positional writes.
//! A restore that fails on damage or a full disk removes the staging directory; one that is
//! interrupted (killed, or the backend unreachable) leaves it, and running the same restore
//! again resumes: chunks whose bytes are already in place (checked by hash) are not fetched.

use crate::engine::{self, Piece, Sink};
use crate::plan::{self, PlannedChunk};
use gstore_store::manifest::{EntryKind, Manifest};
use gstore_store::progress::Progress;
use gstore_store::{ObjectId, Result, Store, StoreError};
use serde::Serialize;
use std::fs::{self, File, OpenOptions};
use std::os::unix::fs::{FileExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Marker file inside a staging directory naming the manifest being restored.
const MARKER: &str = ".gstore-restore";

/// What a directory restore did.
#[derive(Debug, Clone, Serialize)]
pub struct RestoreReport {
    /// The destination.
    pub destination: String,
    /// Entries restored.
    pub entries: usize,
    /// Plain bytes of the image.
    pub logical_bytes: u64,
    /// Bytes read from packs.
    pub fetched_bytes: u64,
    /// Range reads issued.
    pub reads: usize,
    /// Chunks found already in place in an interrupted restore's staging directory.
    pub resumed_chunks: usize,
    /// Wall-clock seconds.
    pub seconds: f64,
}

/// Writes pieces into the files of one image.
struct DirSink {
    root: PathBuf,
    files: Vec<Option<File>>,
    m: Manifest,
}

impl Sink for DirSink {
    fn write_batch(&self, pieces: &[Piece<'_>]) -> Result<()> {
        for p in pieces {
            let f = self.files[p.entry].as_ref().expect("chunk targets are files");
            f.write_all_at(p.data, p.offset)
                .map_err(|e| StoreError::io("writing", self.root.join(&self.m.entries[p.entry].path), e))?;
        }
        Ok(())
    }
}

impl DirSink {
    /// Creates (or, when resuming, reopens) every entry under `root`.
    fn open(root: &Path, m: &Manifest, resume: bool) -> Result<DirSink> {
        let mut files = Vec::with_capacity(m.entries.len());
        for e in &m.entries {
            let path = root.join(&e.path);
            files.push(match e.kind {
                EntryKind::Dir => {
                    fs::create_dir_all(&path).map_err(|err| StoreError::io("creating", &path, err))?;
                    None
                }
                EntryKind::File => {
                    if let Some(parent) = path.parent() {
                        fs::create_dir_all(parent).map_err(|err| StoreError::io("creating", parent, err))?;
                    }
                    let mut o = OpenOptions::new();
                    o.read(true).write(true);
                    if resume {
                        o.create(true);
                    } else {
                        o.create_new(true);
                    }
                    let f = o.open(&path).map_err(|err| StoreError::io("creating", &path, err))?;
                    f.set_len(e.size).map_err(|err| StoreError::io("sizing", &path, err))?;
                    Some(f)
                }
                EntryKind::Symlink => None,
            });
        }
        Ok(DirSink { root: root.to_path_buf(), files, m: m.clone() })
    }

    /// True when every target of `c` already holds its bytes.
    fn has(&self, c: &PlannedChunk) -> bool {
        let mut buf = vec![0u8; c.loc.plain_len as usize];
        c.targets.iter().all(|&(entry, off)| {
            let f = self.files[entry].as_ref().expect("chunk targets are files");
            f.read_exact_at(&mut buf, off).is_ok() && ObjectId::of(&buf) == c.id
        })
    }

    /// Symlinks last, so no file is ever written through one; modes last, so read-only
    /// files and directories could still be filled.
    fn finish(self) -> Result<()> {
        let DirSink { root, files, m } = self;
        drop(files);
        for e in m.entries.iter().filter(|e| e.kind == EntryKind::Symlink) {
            let path = root.join(&e.path);
            if fs::symlink_metadata(&path).is_ok() {
                fs::remove_file(&path).map_err(|err| StoreError::io("replacing", &path, err))?;
            }
            std::os::unix::fs::symlink(e.target.as_deref().unwrap_or_default(), &path)
                .map_err(|err| StoreError::io("creating symlink", &path, err))?;
        }
        for e in m.entries.iter().rev().filter(|e| e.kind != EntryKind::Symlink) {
            let path = root.join(&e.path);
            fs::set_permissions(&path, fs::Permissions::from_mode(e.mode))
                .map_err(|err| StoreError::io("setting mode of", &path, err))?;
        }
        Ok(())
    }
}

/// Restores image `id` (manifest `m`) into `dest`, which must not exist or be an empty
/// directory, holding at most about `memory_budget` bytes in flight.
pub fn restore_to_dir(
    store: &Store,
    id: &ObjectId,
    m: &Manifest,
    dest: &Path,
    memory_budget: u64,
    progress: &dyn Progress,
) -> Result<RestoreReport> {
    let started = std::time::Instant::now();
    check_destination(dest)?;
    let mut plan = plan::plan(store, m, engine::max_read_for(memory_budget))?;
    let staging = staging_path(dest)?;
    let resume = match fs::read_to_string(staging.join(MARKER)) {
        Ok(marker) if marker.trim() == id.to_hex() => true,
        _ => {
            if staging.exists() {
                fs::remove_dir_all(&staging)
                    .map_err(|e| StoreError::io("removing stale staging directory", &staging, e))?;
            }
            fs::create_dir(&staging).map_err(|e| StoreError::io("creating", &staging, e))?;
            fs::write(staging.join(MARKER), id.to_hex())
                .map_err(|e| StoreError::io("writing", staging.join(MARKER), e))?;
            false
        }
    };
    let result = (|| {
        let sink = DirSink::open(&staging, m, resume)?;
        let before = plan.chunk_count();
        if resume {
            plan.retain_missing(|c| sink.has(c));
        }
        engine::run(store, &plan, &sink, progress)?;
        sink.finish()?;
        fs::remove_file(staging.join(MARKER)).map_err(|e| StoreError::io("removing", staging.join(MARKER), e))?;
        publish(&staging, dest)?;
        Ok(before - plan.chunk_count())
    })();
    let resumed_chunks = match result {
        Ok(n) => n,
        Err(e) if keep_for_resume(&e) => {
            return Err(StoreError::Invalid(format!(
                "{e} (the partial restore is kept in {}: run the same restore again to resume)",
                staging.display()
            )))
        }
        Err(e) => {
            let _ = fs::remove_dir_all(&staging);
            return Err(e);
        }
    };
    Ok(RestoreReport {
        destination: dest.display().to_string(),
        entries: m.entries.len(),
        logical_bytes: m.logical_size(),
        fetched_bytes: plan.fetch_bytes(),
        reads: plan.reads.len(),
        resumed_chunks,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// Damage will not heal and a full disk needs the space back: only other failures (the
/// backend unreachable, an interrupted transfer) keep the partial restore for a retry.
fn keep_for_resume(e: &StoreError) -> bool {
    match e {
        StoreError::Backend { .. } => true,
        StoreError::Io { source, .. } => source.raw_os_error() != Some(ENOSPC),
        _ => false,
    }
}

/// "No space left on device" (Linux).
const ENOSPC: i32 = 28;

fn check_destination(dest: &Path) -> Result<()> {
    match fs::symlink_metadata(dest) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(StoreError::io("checking destination", dest, e)),
        Ok(md) if !md.is_dir() => {
            Err(StoreError::Invalid(format!("destination {} exists and is not a directory", dest.display())))
        }
        Ok(_) => {
            let mut rd = fs::read_dir(dest).map_err(|e| StoreError::io("reading destination", dest, e))?;
            if rd.next().is_some() {
                Err(StoreError::Invalid(format!(
                    "destination {} is not empty; restore into a new or empty directory",
                    dest.display()
                )))
            } else {
                Ok(())
            }
        }
    }
}

fn staging_path(dest: &Path) -> Result<PathBuf> {
    let name = dest
        .file_name()
        .ok_or_else(|| StoreError::Invalid(format!("destination {} has no final component", dest.display())))?;
    let parent = match dest.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    fs::create_dir_all(&parent).map_err(|e| StoreError::io("creating", &parent, e))?;
    Ok(parent.join(format!(".{}.gstore-partial", name.to_string_lossy())))
}

fn publish(staging: &Path, dest: &Path) -> Result<()> {
    if dest.exists() {
        fs::remove_dir(dest).map_err(|e| StoreError::io("replacing empty destination", dest, e))?;
    }
    fs::rename(staging, dest).map_err(|e| StoreError::io("moving restored image into place at", dest, e))
}
