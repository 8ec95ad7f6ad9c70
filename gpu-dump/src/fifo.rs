//! Named pipes (FIFOs) through which images stream between processes: CRIU's image streamer,
//! a container runtime's checkpoint export.

use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// Makes a FIFO at `path`, readable and writable by this user only.
pub fn make(path: &Path) -> std::io::Result<()> {
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidInput, "a path with a NUL byte"))?;
    // SAFETY: a valid NUL-terminated path.
    if unsafe { libc::mkfifo(c.as_ptr(), 0o600) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::FileTypeExt;

    #[test]
    fn a_fifo_is_made_once() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("pipe");
        super::make(&p).unwrap();
        assert!(std::fs::metadata(&p).unwrap().file_type().is_fifo());
        assert_eq!(super::make(&p).unwrap_err().kind(), std::io::ErrorKind::AlreadyExists);
    }
}
