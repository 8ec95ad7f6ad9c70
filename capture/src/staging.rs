//! Where process images are staged between CRIU and the store: a new directory under
//! `$TMPDIR`, else under `/var/tmp`, unless the caller names one.
//!
//! Disk-backed page cache rather than tmpfs: on the lent H100 machine `criu dump` of a 4 GiB
//! GPU process took 2.25-2.75 s into an ext4 directory and 3.16-3.23 s into /dev/shm, with
//! restores alike (docs/BENCHMARKS.md).

use crate::error::{CaptureError, Result};
use std::path::{Path, PathBuf};

/// An image directory: one made here (removed with its parent when done) or the caller's.
pub(crate) struct Staged {
    pub(crate) dir: PathBuf,
    made: bool,
}

impl Staged {
    /// The caller's directory `at`, or a new one for `purpose`.
    pub(crate) fn new(at: Option<PathBuf>, purpose: &str) -> Result<Staged> {
        match at {
            Some(dir) => Ok(Staged { dir, made: false }),
            None => Ok(Staged { dir: new_dir(purpose)?, made: true }),
        }
    }

    /// Removes the directory if it was made here.
    pub(crate) fn remove_if_made(&self) {
        if self.made {
            if let Some(parent) = self.dir.parent() {
                let _ = std::fs::remove_dir_all(parent);
            }
        }
    }

    /// Removes the image: the whole staging directory if made here, else the caller's
    /// directory's content.
    pub(crate) fn remove(&self) {
        if self.made {
            self.remove_if_made();
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    /// The image directory.
    pub(crate) fn path(&self) -> &Path {
        &self.dir
    }
}

/// A new, not yet existing image directory inside a fresh staging directory.
fn new_dir(purpose: &str) -> Result<PathBuf> {
    let parent = std::env::var_os("TMPDIR")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/tmp"));
    let nanos =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(0);
    let dir = parent.join(format!("gstore-{purpose}-{}-{nanos}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|source| CaptureError::Staging { path: dir.clone(), source })?;
    Ok(dir.join("image"))
}
