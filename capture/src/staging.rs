//! Where process images are staged between CRIU and the store: a new directory under
//! `$TMPDIR`, else under `/var/tmp`, unless the caller names one.
//!
//! A staging directory made here holds a lock file (`.lock`, locked with `flock` for as long
//! as the gstore that made it runs): a gstore killed mid-restore cannot remove its directory,
//! so every new one first removes the directories beside it whose lock nobody holds. A lock is
//! created locked (under another name, then renamed), so no directory is ever seen unlocked
//! while its maker lives; directories without a lock (older gstore versions) are left alone.
//!
//! Disk-backed page cache rather than tmpfs: on the lent H100 machine `criu dump` of a 4 GiB
//! GPU process took 2.25-2.75 s into an ext4 directory and 3.16-3.23 s into /dev/shm, with
//! restores alike (docs/BENCHMARKS.md).

use crate::error::{CaptureError, Result};
use std::fs::File;
use std::path::{Path, PathBuf};

/// An image directory: one made here (removed with its parent when done) or the caller's.
pub(crate) struct Staged {
    pub(crate) dir: PathBuf,
    /// The staging directory's lock, held while it is in use, when made here.
    lock: Option<File>,
}

impl Staged {
    /// The caller's directory `at`, or a new one for `purpose`.
    pub(crate) fn new(at: Option<PathBuf>, purpose: &str) -> Result<Staged> {
        match at {
            Some(dir) => Ok(Staged { dir, lock: None }),
            None => {
                let (dir, lock) = new_dir(&staging_root(), purpose)?;
                Ok(Staged { dir, lock: Some(lock) })
            }
        }
    }

    /// Removes the directory if it was made here.
    pub(crate) fn remove_if_made(&self) {
        if self.lock.is_some() {
            if let Some(parent) = self.dir.parent() {
                let _ = std::fs::remove_dir_all(parent);
            }
        }
    }

    /// Moves file `name` of the image directory out of a staging directory made here (which is
    /// about to be removed), beside it in the staging root, and returns where it went.
    pub(crate) fn keep(&self, name: &str) -> Option<PathBuf> {
        self.lock.as_ref()?;
        let staging = self.dir.parent()?;
        let kept = staging.with_file_name(format!("{}-{name}", staging.file_name()?.to_string_lossy()));
        std::fs::rename(self.dir.join(name), &kept).ok()?;
        Some(kept)
    }

    /// Removes the image: the whole staging directory if made here, else the caller's
    /// directory's content.
    pub(crate) fn remove(&self) {
        if self.lock.is_some() {
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

/// Where staging directories go: `$TMPDIR`, else `/var/tmp`.
fn staging_root() -> PathBuf {
    std::env::var_os("TMPDIR").filter(|v| !v.is_empty()).map(PathBuf::from).unwrap_or_else(|| PathBuf::from("/var/tmp"))
}

/// The lock file in a staging directory.
const LOCK: &str = ".lock";

/// A new, not yet existing image directory inside a fresh staging directory in `root`, and
/// the staging directory's lock, held. Abandoned staging directories in `root` go first.
fn new_dir(root: &Path, purpose: &str) -> Result<(PathBuf, File)> {
    remove_abandoned(root);
    let nanos =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(0);
    let dir = root.join(format!("gstore-{purpose}-{}-{nanos}", std::process::id()));
    let failed = |source| CaptureError::Staging { path: dir.clone(), source };
    std::fs::create_dir_all(&dir).map_err(failed)?;
    let unnamed = dir.join(".lock.new");
    let lock = File::create(&unnamed).map_err(failed)?;
    lock.lock().map_err(failed)?;
    std::fs::rename(&unnamed, dir.join(LOCK)).map_err(failed)?;
    Ok((dir.join("image"), lock))
}

/// Removes the staging directories in `root` whose lock nobody holds: their gstore ended
/// without removing them (killed). Best effort: what cannot be read or removed stays.
fn remove_abandoned(root: &Path) {
    let Ok(entries) = std::fs::read_dir(root) else { return };
    for e in entries.flatten() {
        let name = e.file_name();
        let ours =
            name.to_str().is_some_and(|n| n.starts_with("gstore-checkpoint-") || n.starts_with("gstore-restore-"));
        if !ours || !e.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        let Ok(lock) = File::open(e.path().join(LOCK)) else { continue };
        if lock.try_lock().is_ok() {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A staging directory as a gstore leaves it, its lock held (returned) while `lock` says its
    /// maker still runs.
    fn leftover(root: &Path, name: &str, lock: bool) -> Option<File> {
        let dir = root.join(name);
        std::fs::create_dir_all(dir.join("image")).unwrap();
        std::fs::write(dir.join("image/pages-1.img"), b"pages").unwrap();
        let file = File::create(dir.join(LOCK)).unwrap();
        lock.then(|| {
            file.lock().unwrap();
            file
        })
    }

    #[test]
    fn a_new_staging_directory_removes_only_those_whose_maker_is_gone() {
        let root = tempfile::tempdir().unwrap();
        let root = root.path();
        leftover(root, "gstore-restore-1-1", false);
        leftover(root, "gstore-checkpoint-2-2", false);
        let _live = leftover(root, "gstore-restore-3-3", true);
        // Older gstore versions made no lock; other programs' directories are not ours.
        std::fs::create_dir_all(root.join("gstore-restore-4-4/image")).unwrap();
        leftover(root, "other-5", false);
        let (image, _lock) = new_dir(root, "restore").unwrap();
        let mut left: Vec<String> =
            std::fs::read_dir(root).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        left.sort();
        let made = image.parent().unwrap().file_name().unwrap().to_str().unwrap().to_string();
        let mut expected = vec!["gstore-restore-3-3".to_string(), "gstore-restore-4-4".into(), "other-5".into(), made];
        expected.sort();
        assert_eq!(left, expected);
        // The new one is locked while in use: another gstore leaves it alone.
        remove_abandoned(root);
        assert!(image.parent().unwrap().join(LOCK).exists());
    }
}
