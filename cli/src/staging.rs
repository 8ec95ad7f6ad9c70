//! Where process images are staged between CRIU and the store: tmpfs (`/dev/shm`) when it
//! has room, so a dump or restore never waits on a disk, else the system temp directory.

use anyhow::{Context, Result};
use std::path::{Path, PathBuf};

const TMPFS: &str = "/dev/shm";
/// Room left free on the tmpfs beyond the image itself.
const MARGIN: u64 = 512 << 20;

/// Bytes available to unprivileged writers on the filesystem holding `dir`.
fn available(dir: &Path) -> Option<u64> {
    let c = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()).ok()?;
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    (unsafe { libc::statvfs(c.as_ptr(), &mut s) } == 0).then(|| s.f_bavail as u64 * s.f_frsize as u64)
}

/// A new, not yet existing directory path for an image of about `bytes`.
pub fn new_dir(purpose: &str, bytes: u64) -> Result<PathBuf> {
    let tmpfs = Path::new(TMPFS);
    let parent = match available(tmpfs) {
        Some(free) if free >= bytes + bytes / 10 + MARGIN => tmpfs.to_path_buf(),
        _ => std::env::temp_dir(),
    };
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(0);
    let dir = parent.join(format!("gstore-{purpose}-{}-{nanos}", std::process::id()));
    std::fs::create_dir(&dir).with_context(|| format!("creating staging directory {}", dir.display()))?;
    Ok(dir.join("image"))
}

/// Removes a staging directory made by [`new_dir`] (the image's parent).
pub fn remove(image_dir: &Path) {
    if let Some(parent) = image_dir.parent() {
        let _ = std::fs::remove_dir_all(parent);
    }
}

/// Rough size of the image a checkpoint of `pid` will write: its resident memory plus the GPU
/// memory it holds (from nvidia-smi, when there is one).
pub fn process_image_estimate(pid: u32) -> u64 {
    let rss_kib: u64 = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("VmRSS:")).and_then(|l| l.split_whitespace().nth(1)?.parse().ok()))
        .unwrap_or(0);
    let gpu_mib: u64 = std::process::Command::new("nvidia-smi")
        .args(["--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"])
        .output()
        .ok()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .filter_map(|l| l.split_once(','))
                .filter(|(p, _)| p.trim() == pid.to_string())
                .filter_map(|(_, m)| m.trim().parse::<u64>().ok())
                .sum()
        })
        .unwrap_or(0);
    rss_kib * 1024 + gpu_mib * (1 << 20)
}
