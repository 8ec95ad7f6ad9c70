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

/// Both ends of the FIFO at `path`, opened without waiting for another process: the reading
/// end (blocking reads) and a writing end for the caller to hold. Another process may open the
/// FIFO for writing at any time; the reader sees the end of the stream only once that process
/// has closed it and the held writing end is dropped, so the reader never waits on an open
/// and never ends early, whether the other process opens the FIFO or not.
pub fn open_held(path: &Path) -> std::io::Result<(std::fs::File, std::fs::File)> {
    use std::os::unix::fs::OpenOptionsExt;
    use std::os::unix::io::AsRawFd;
    // Non-blocking, so it does not wait for a writer; a reader being there, the writing end
    // opens at once too.
    let reader = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(path)?;
    let held = std::fs::OpenOptions::new().write(true).open(path)?;
    // SAFETY: fcntl on a descriptor this function owns.
    let flags = unsafe { libc::fcntl(reader.as_raw_fd(), libc::F_GETFL) };
    if flags < 0 || unsafe { libc::fcntl(reader.as_raw_fd(), libc::F_SETFL, flags & !libc::O_NONBLOCK) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok((reader, held))
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

    #[test]
    fn a_held_fifo_ends_once_the_writer_and_the_holder_are_gone() {
        use std::io::{Read, Write};
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("pipe");
        super::make(&p).unwrap();
        let (mut reader, held) = super::open_held(&p).unwrap();
        let writer = std::thread::spawn({
            let p = p.clone();
            move || std::fs::OpenOptions::new().write(true).open(&p).unwrap().write_all(b"archive").unwrap()
        });
        writer.join().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let reading = std::thread::spawn(move || {
            let mut got = Vec::new();
            reader.read_to_end(&mut got).unwrap();
            tx.send(got).unwrap();
        });
        // The writer is gone, but the held end keeps the stream open.
        assert!(rx.recv_timeout(std::time::Duration::from_millis(200)).is_err(), "ended while held");
        drop(held);
        assert_eq!(rx.recv_timeout(std::time::Duration::from_secs(10)).unwrap(), b"archive");
        reading.join().unwrap();
    }

    #[test]
    fn a_held_fifo_no_one_writes_to_is_empty() {
        use std::io::Read;
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("pipe");
        super::make(&p).unwrap();
        let (mut reader, held) = super::open_held(&p).unwrap();
        drop(held);
        let mut got = Vec::new();
        reader.read_to_end(&mut got).unwrap();
        assert!(got.is_empty());
    }
}
