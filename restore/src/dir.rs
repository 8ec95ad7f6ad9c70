//! The directory sink: restores an image's entries under a destination directory.
//!
//! Everything is written into a hidden staging directory beside the destination, which is
//! renamed into place only once every chunk has been fetched, verified and written; a failed
//! restore removes it, so a destination that exists is always complete.

use crate::plan::{self, Plan};
use gstore_store::codec;
use gstore_store::manifest::{EntryKind, Manifest};
use gstore_store::progress::Progress;
use gstore_store::{Result, Store, StoreError};
use rayon::prelude::*;
use serde::Serialize;
use std::fs::{self, File, OpenOptions};
use std::os::unix::fs::{FileExt, PermissionsExt};
use std::path::{Path, PathBuf};

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
    /// Wall-clock seconds.
    pub seconds: f64,
}

/// Restores `m` into `dest`, which must not exist or be an empty directory.
pub fn restore_to_dir(store: &Store, m: &Manifest, dest: &Path, progress: &dyn Progress) -> Result<RestoreReport> {
    let started = std::time::Instant::now();
    check_destination(dest)?;
    let plan = plan::plan(store, m)?;
    let staging = staging_path(dest)?;
    if staging.exists() {
        fs::remove_dir_all(&staging).map_err(|e| StoreError::io("removing stale staging directory", &staging, e))?;
    }
    let result = fill(store, m, &plan, &staging, progress).and_then(|()| publish(&staging, dest));
    if result.is_err() {
        let _ = fs::remove_dir_all(&staging);
    }
    result?;
    Ok(RestoreReport {
        destination: dest.display().to_string(),
        entries: m.entries.len(),
        logical_bytes: m.logical_size(),
        fetched_bytes: plan.fetch_bytes,
        reads: plan.reads.len(),
        seconds: started.elapsed().as_secs_f64(),
    })
}

fn check_destination(dest: &Path) -> Result<()> {
    match fs::symlink_metadata(dest) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(StoreError::io("checking destination", dest, e)),
        Ok(md) if !md.is_dir() => Err(StoreError::Invalid(format!("destination {} exists and is not a directory", dest.display()))),
        Ok(_) => {
            let mut rd = fs::read_dir(dest).map_err(|e| StoreError::io("reading destination", dest, e))?;
            if rd.next().is_some() {
                Err(StoreError::Invalid(format!("destination {} is not empty; restore into a new or empty directory", dest.display())))
            } else {
                Ok(())
            }
        }
    }
}

fn staging_path(dest: &Path) -> Result<PathBuf> {
    let name = dest.file_name().ok_or_else(|| StoreError::Invalid(format!("destination {} has no final component", dest.display())))?;
    let parent = match dest.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    fs::create_dir_all(&parent).map_err(|e| StoreError::io("creating", &parent, e))?;
    Ok(parent.join(format!(".{}.gstore-partial", name.to_string_lossy())))
}

fn fill(store: &Store, m: &Manifest, plan: &Plan, staging: &Path, progress: &dyn Progress) -> Result<()> {
    fs::create_dir(staging).map_err(|e| StoreError::io("creating", staging, e))?;
    let mut files: Vec<Option<File>> = Vec::with_capacity(m.entries.len());
    for e in &m.entries {
        let path = staging.join(&e.path);
        files.push(match e.kind {
            EntryKind::Dir => {
                fs::create_dir_all(&path).map_err(|err| StoreError::io("creating", &path, err))?;
                None
            }
            EntryKind::File => {
                if let Some(parent) = path.parent() {
                    fs::create_dir_all(parent).map_err(|err| StoreError::io("creating", parent, err))?;
                }
                let f = OpenOptions::new().write(true).create_new(true).open(&path).map_err(|err| StoreError::io("creating", &path, err))?;
                // Preallocates the length; never-written ranges (zero chunks) stay holes.
                f.set_len(e.size).map_err(|err| StoreError::io("sizing", &path, err))?;
                Some(f)
            }
            EntryKind::Symlink => None,
        });
    }
    progress.start("restoring", plan.write_bytes);
    let written = plan.reads.par_iter().try_for_each_init(codec::Decoder::new, |decoder, read| {
        let data = store.read_pack_range(&read.pack, read.start..read.end)?;
        for c in &read.chunks {
            let at = (c.loc.offset - read.start) as usize;
            let stored = &data[at..at + c.loc.stored_len as usize];
            let plain = decoder.decode(c.loc.codec, stored, c.loc.plain_len as usize, &c.id).map_err(|e| in_pack(e, &read.pack))?;
            for &(entry, off) in &c.targets {
                let f = files[entry].as_ref().expect("chunk targets are files");
                f.write_all_at(plain, off).map_err(|e| StoreError::io("writing", staging.join(&m.entries[entry].path), e))?;
                progress.advance(plain.len() as u64);
            }
        }
        Ok::<(), StoreError>(())
    });
    progress.finish();
    written?;
    drop(files);
    // Symlinks last, so no file is ever written through one; modes last, so read-only
    // files and directories could still be filled.
    for e in m.entries.iter().filter(|e| e.kind == EntryKind::Symlink) {
        let path = staging.join(&e.path);
        std::os::unix::fs::symlink(e.target.as_deref().unwrap_or_default(), &path).map_err(|err| StoreError::io("creating symlink", &path, err))?;
    }
    for e in m.entries.iter().rev().filter(|e| e.kind != EntryKind::Symlink) {
        let path = staging.join(&e.path);
        fs::set_permissions(&path, fs::Permissions::from_mode(e.mode)).map_err(|err| StoreError::io("setting mode of", &path, err))?;
    }
    Ok(())
}

/// Adds the pack to a chunk error so the user learns which object is damaged.
fn in_pack(e: StoreError, pack: &gstore_store::ObjectId) -> StoreError {
    match e {
        StoreError::Corrupt { what, key, detail } => StoreError::Corrupt { what, key, detail: format!("{detail} (in pack {})", pack.to_hex()) },
        other => other,
    }
}

fn publish(staging: &Path, dest: &Path) -> Result<()> {
    if dest.exists() {
        fs::remove_dir(dest).map_err(|e| StoreError::io("replacing empty destination", dest, e))?;
    }
    fs::rename(staging, dest).map_err(|e| StoreError::io("moving restored image into place at", dest, e))
}
