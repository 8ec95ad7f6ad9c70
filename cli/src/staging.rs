//! Where process images are staged between CRIU and the store: `--staging DIR`, else a new
//! directory under `$TMPDIR`, else under `/var/tmp`.
//!
//! Disk-backed page cache rather than tmpfs: on the lent H100 machine `criu dump` of a 4 GiB
//! GPU process took 2.25-2.75 s into an ext4 directory and 3.16-3.23 s into /dev/shm, with
//! restores alike (docs/BENCHMARKS.md).

use anyhow::{Context, Result};
use std::path::{Path, PathBuf};

/// A new, not yet existing image directory inside a fresh staging directory.
pub fn new_dir(purpose: &str) -> Result<PathBuf> {
    let parent = std::env::var_os("TMPDIR")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/tmp"));
    let nanos =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(0);
    let dir = parent.join(format!("gstore-{purpose}-{}-{nanos}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating staging directory {}", dir.display()))?;
    Ok(dir.join("image"))
}

/// Removes a staging directory made by [`new_dir`] (the image's parent).
pub fn remove(image_dir: &Path) {
    if let Some(parent) = image_dir.parent() {
        let _ = std::fs::remove_dir_all(parent);
    }
}
