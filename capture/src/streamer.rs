//! CRIU's image streamer protocol, served by gstore, so that `criu dump --stream` sends a
//! process image straight into a streamed push (../shared/reference/criu-lazy-and-stream.md
//! §3; CRIU's `criu/img-streamer.c`).
//!
//! CRIU connects once to `<image dir>/streamer-capture.sock`. For each image file it sends the
//! file's name — a native-endian u32 length, then the protobuf `img_streamer_request_entry {
//! required string filename = 1; }` — and then one byte carrying, as SCM_RIGHTS, the read end
//! of a pipe it writes the file into and closes. CRIU writes several files at once (a
//! process's pagemap and its pages), so every pipe is read on its own thread.
//!
//! The image is complete when CRIU runs its post-dump action script, before it kills the
//! process or lets it run on: the [`Gate`]. The script writes `dumped` into one FIFO and waits
//! for a word from another; anything but `stored` (or gstore gone) fails the script, and CRIU
//! then resumes the process instead of killing it.

use crate::error::{CaptureError, Result};
use gstore_lazy::socket::{bind_in, recv_exact};
use gstore_store::commands::push::stream::StreamSink;
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};

/// The socket CRIU's dump connects to, in the image directory.
pub(crate) const SOCKET_NAME: &str = "streamer-capture.sock";
/// Longest file name accepted from CRIU.
const MAX_NAME: usize = 4096;
/// The pipe size asked for (the kernel default is 64 KiB): fewer, larger reads.
const PIPE_SIZE: libc::c_int = 1 << 20;

/// The post-dump action script and its two FIFOs, in the image directory.
pub(crate) struct Gate {
    /// The script CRIU runs (`--action-script`).
    pub(crate) script: PathBuf,
    /// The script writes `dumped` here; gstore writes `exited` when CRIU has returned. Opened
    /// read-write, so opening never blocks and the last writer closing gives no end of file.
    told: File,
    /// gstore's answer to the script, `stored` or `failed`.
    answer: File,
}

/// What ended the receiving.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ended {
    /// CRIU ran its post-dump script: every image file is complete, and CRIU waits for
    /// [`Gate::answer`].
    Dumped,
    /// CRIU returned before its post-dump script ran (it failed).
    Exited,
}

impl Gate {
    /// Makes the script and FIFOs in `dir`.
    pub(crate) fn create(dir: &Path) -> Result<Gate> {
        let told = fifo(&dir.join("gate-told"))?;
        let answer = fifo(&dir.join("gate-answer"))?;
        let script = dir.join("post-dump.sh");
        let quote = |p: &Path| format!("'{}'", p.display().to_string().replace('\'', r"'\''"));
        // Both FIFOs are opened read-write, which never blocks; the answer is awaited a second
        // at a time while gstore lives, so a gstore that died never leaves CRIU (and the
        // frozen process) waiting: the script fails and CRIU resumes the process.
        let text = format!(
            "#!/bin/sh\n# gstore: the image is complete; wait until it is stored before CRIU goes on.\n\
             [ \"$CRTOOLS_SCRIPT_ACTION\" = post-dump ] || exit 0\n\
             exec 3<>{told} 4<>{answer}\necho dumped >&3\nanswer=\n\
             while [ -z \"$answer\" ] && kill -0 {pid} 2>/dev/null; do\n\
             \x20 answer=$(timeout 1 head -n 1 <&4)\ndone\n[ \"$answer\" = stored ]\n",
            told = quote(&dir.join("gate-told")),
            answer = quote(&dir.join("gate-answer")),
            pid = std::process::id(),
        );
        let staging = |source| CaptureError::Staging { path: script.clone(), source };
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o700)
            .open(&script)
            .and_then(|mut f| f.write_all(text.as_bytes()))
            .map_err(staging)?;
        Ok(Gate { script, told, answer })
    }

    /// Answers the script: the image is stored (CRIU goes on) or not (CRIU resumes the process).
    pub(crate) fn answer(&self, stored: bool) {
        // A script that is gone (CRIU failed) reads nothing: nothing to do.
        let _ = (&self.answer).write_all(if stored { b"stored\n" } else { b"failed\n" });
    }

    /// Says CRIU has returned, for a receiver still waiting.
    pub(crate) fn tell_exited(&self) {
        let _ = (&self.told).write_all(b"exited\n");
    }

    /// What the FIFO says: [`Ended::Dumped`] or [`Ended::Exited`].
    fn read_told(&self) -> Result<Ended> {
        let mut buf = [0u8; 64];
        let n = (&self.told).read(&mut buf).map_err(|e| os("reading the post-dump gate", e))?;
        Ok(if buf[..n].starts_with(b"dumped") { Ended::Dumped } else { Ended::Exited })
    }
}

/// Makes a FIFO at `path` and opens it read-write.
fn fifo(path: &Path) -> Result<File> {
    gstore_gpu_dump::fifo::make(path).map_err(|source| CaptureError::Staging { path: path.to_path_buf(), source })?;
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .map_err(|source| CaptureError::Staging { path: path.to_path_buf(), source })
}

/// Listens for CRIU in `dir`.
pub(crate) fn listen(dir: &Path) -> Result<UnixListener> {
    Ok(bind_in(dir, SOCKET_NAME)?.0)
}

/// Serves CRIU's connection on `listener`, reading every image file into `sink`, until CRIU
/// runs the post-dump script or returns. Every file's reader has finished when this returns;
/// the first reader error is returned (a push that stopped, a pipe that failed).
pub(crate) fn receive(listener: &UnixListener, gate: &Gate, sink: &StreamSink) -> Result<Ended> {
    let mut conn: Option<UnixStream> = None;
    let mut closed = false;
    std::thread::scope(|readers| {
        let mut spawned = Vec::new();
        let ended = loop {
            let sock = match &conn {
                Some(c) => c.as_raw_fd(),
                None => listener.as_raw_fd(),
            };
            let mut fds = [
                libc::pollfd { fd: if closed { -1 } else { sock }, events: libc::POLLIN, revents: 0 },
                libc::pollfd { fd: gate.told.as_raw_fd(), events: libc::POLLIN, revents: 0 },
            ];
            // SAFETY: two valid pollfd entries.
            if unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) } < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                break Err(os("waiting for CRIU", e));
            }
            // Requests first: CRIU sent every one before it ran the script.
            if fds[0].revents != 0 {
                match &conn {
                    None => match listener.accept() {
                        Ok((c, _)) => conn = Some(c),
                        Err(e) => break Err(os("accepting CRIU's connection", e)),
                    },
                    Some(c) => match next_file(c) {
                        Ok(Some((name, pipe))) => {
                            let file = match sink.file(&name, 0o600) {
                                Ok(f) => f,
                                Err(e) => break Err(e.into()),
                            };
                            spawned.push(readers.spawn(move || -> Result<u64> {
                                let mut file = file;
                                Ok(file.read_from(&mut File::from(pipe))?)
                            }));
                        }
                        Ok(None) => closed = true,
                        Err(e) => break Err(e),
                    },
                }
                continue;
            }
            match gate.read_told() {
                Ok(ended) => break Ok(ended),
                Err(e) => break Err(e),
            }
        };
        // On an error here, CRIU's pipes close as it fails, and the readers end.
        drop(conn);
        let mut first = ended;
        for r in spawned {
            let r = r.join().expect("an image file reader does not panic");
            if let (Ok(_), Err(e)) = (&first, r) {
                first = Err(e);
            }
        }
        first
    })
}

/// Reads CRIU's next file request and the pipe that comes with it; `None` once CRIU has closed
/// the connection.
fn next_file(conn: &UnixStream) -> Result<Option<(String, std::os::fd::OwnedFd)>> {
    let mut len = [0u8; 4];
    let mut peek = [0u8; 1];
    // SAFETY: a one-byte buffer of ours.
    let n = unsafe { libc::recv(conn.as_raw_fd(), peek.as_mut_ptr().cast(), 1, libc::MSG_PEEK) };
    if n == 0 {
        return Ok(None);
    }
    recv_exact(conn, &mut len)?;
    let len = u32::from_ne_bytes(len) as usize;
    if len > MAX_NAME + 8 {
        return Err(protocol(format!("a file request of {len} bytes")));
    }
    let mut msg = vec![0u8; len];
    recv_exact(conn, &mut msg)?;
    let name = request_filename(&msg)?;
    let mut fds = recv_exact(conn, &mut [0u8; 1])?.fds;
    if fds.len() != 1 {
        return Err(protocol(format!("{name} came with {} descriptors, expected one pipe", fds.len())));
    }
    let pipe = fds.remove(0);
    // SAFETY: fcntl on a descriptor we own; failing leaves the default size.
    unsafe { libc::fcntl(pipe.as_raw_fd(), libc::F_SETPIPE_SZ, PIPE_SIZE) };
    Ok(Some((name, pipe)))
}

/// The filename (field 1, a length-delimited string) of an `img_streamer_request_entry`.
fn request_filename(msg: &[u8]) -> Result<String> {
    let bad = || protocol(format!("a file request that is not a filename: {msg:02x?}"));
    let (&tag, rest) = msg.split_first().ok_or_else(bad)?;
    if tag != 0x0a {
        return Err(bad());
    }
    let (mut len, mut shift, mut at) = (0usize, 0, 0);
    loop {
        let &b = rest.get(at).ok_or_else(bad)?;
        len |= ((b & 0x7f) as usize) << shift;
        at += 1;
        if b & 0x80 == 0 {
            break;
        }
        shift += 7;
        if shift > 28 {
            return Err(bad());
        }
    }
    let name = rest.get(at..at + len).filter(|_| at + len == rest.len()).ok_or_else(bad)?;
    String::from_utf8(name.to_vec()).map_err(|_| bad())
}

fn protocol(detail: String) -> CaptureError {
    CaptureError::Lazy(gstore_lazy::LazyError::Protocol(format!("CRIU image streamer: {detail}")))
}

fn os(what: &str, e: std::io::Error) -> CaptureError {
    CaptureError::Lazy(gstore_lazy::LazyError::os(what.to_string(), e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use gstore_store::format::meta::{ImageMeta, Kind};
    use gstore_store::progress::Silent;
    use gstore_store::{commands::push, commands::push::stream, IndexedStore, Store, StoreLocation, TagRef};
    use std::os::fd::{FromRawFd, OwnedFd};

    /// What CRIU sends for one file: the request, then one byte carrying `fd`. Fails once the
    /// receiver has hung up.
    fn send_request(conn: &UnixStream, request: &[u8], fd: &OwnedFd) -> std::io::Result<()> {
        (&*conn).write_all(&(request.len() as u32).to_ne_bytes())?;
        (&*conn).write_all(request)?;
        gstore_lazy::socket::send_with_fd(conn.as_raw_fd(), &[0], Some(fd.as_raw_fd()))
    }

    fn pipe() -> (File, File) {
        let mut fds = [0; 2];
        // SAFETY: a two-element array for pipe(2).
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        // SAFETY: both descriptors are new and ours.
        unsafe { (File::from_raw_fd(fds[0]), File::from_raw_fd(fds[1])) }
    }

    /// A new local store in `dir`.
    fn new_store(dir: &Path) -> IndexedStore {
        let loc = StoreLocation::Local(dir.join("store"));
        Store::init(&loc, &gstore_store::StoreConfig::default()).unwrap();
        Store::open_indexed(&loc, &|_| {}).unwrap()
    }

    fn request(name: &str) -> Vec<u8> {
        let mut r = vec![0x0a, name.len() as u8];
        r.extend(name.as_bytes());
        r
    }

    /// Plays CRIU's part: sends `files` (the pipes written side by side, as CRIU writes a
    /// pagemap and its pages), then runs the post-dump script's part and returns its answer.
    fn play_criu(dir: &Path, files: &[(&[u8], Vec<u8>)]) -> String {
        let conn = UnixStream::connect(dir.join(SOCKET_NAME)).unwrap();
        std::thread::scope(|s| {
            for (req, data) in files {
                let (r, mut w) = pipe();
                send_request(&conn, req, &OwnedFd::from(r)).unwrap();
                s.spawn(move || {
                    // A reader that stopped (a refused request) breaks the pipe: fine here.
                    let _ = w.write_all(data);
                });
            }
        });
        std::fs::write(dir.join("gate-told"), b"dumped\n").unwrap();
        // One line, as the script's `read` takes it (gstore holds the FIFO open: no end of file).
        let mut answer = String::new();
        let fifo = File::open(dir.join("gate-answer")).unwrap();
        std::io::BufRead::read_line(&mut std::io::BufReader::new(fifo), &mut answer).unwrap();
        drop(conn);
        answer
    }

    #[test]
    fn files_sent_the_way_criu_sends_them_become_the_image() {
        let dir = tempfile::tempdir().unwrap();
        let store = new_store(dir.path());
        let images = dir.path().join("images");
        std::fs::create_dir(&images).unwrap();
        let pages: Vec<u8> = (0..20u32 << 20).map(|i| (i.wrapping_mul(2_654_435_761) >> 17) as u8).collect();
        let files = [(&request("pagemap-7.img")[..], b"map".to_vec()), (&request("pages-1.img")[..], pages.clone())];
        let gate = Gate::create(&images).unwrap();
        let listener = listen(&images).unwrap();
        let (sink, source) = stream::channel(&store, 8 << 20);
        let tag = TagRef::parse("p:1").unwrap();
        let (answer, pushed) = std::thread::scope(|s| {
            let pushing = s.spawn(|| push::push_stream(&store, source, &tag, &Silent));
            let criu = s.spawn(|| play_criu(&images, &files));
            assert_eq!(receive(&listener, &gate, &sink).unwrap(), Ended::Dumped);
            let meta = ImageMeta::of_kind(Kind::CpuProcess);
            sink.finish(meta).unwrap();
            let pushed = pushing.join().unwrap().unwrap();
            gate.answer(true);
            (criu.join().unwrap(), pushed)
        });
        assert_eq!(answer.trim(), "stored");
        let m = store.get_manifest(&pushed.manifest).unwrap();
        let got: Vec<(String, u64)> = m.entries.iter().map(|e| (e.path.clone(), e.size)).collect();
        assert_eq!(got, [("pagemap-7.img".to_string(), 3), ("pages-1.img".to_string(), pages.len() as u64)]);
        let out = dir.path().join("out");
        let id = pushed.manifest;
        gstore_restore::restore_to_dir(&store, &id, &m, &out, gstore_restore::Budget::of(256 << 20), &Silent).unwrap();
        assert!(std::fs::read(out.join("pages-1.img")).unwrap() == pages, "the pages come back exact");
    }

    #[test]
    fn a_request_that_is_not_a_filename_or_comes_twice_stops_the_receiving() {
        for requests in [vec![b"\x12\x01a".to_vec()], vec![request("a.img"), request("a.img")]] {
            let dir = tempfile::tempdir().unwrap();
            let store = new_store(dir.path());
            let gate = Gate::create(dir.path()).unwrap();
            let listener = listen(dir.path()).unwrap();
            let (sink, _source) = stream::channel(&store, 8 << 20);
            let files: Vec<(&[u8], Vec<u8>)> = requests.iter().map(|r| (&r[..], vec![1u8; 1000])).collect();
            let e = std::thread::scope(|s| {
                s.spawn(|| {
                    let conn = UnixStream::connect(dir.path().join(SOCKET_NAME)).unwrap();
                    for (req, data) in &files {
                        let (r, mut w) = pipe();
                        // As CRIU does, stop at the first request the receiver hung up on.
                        if send_request(&conn, req, &OwnedFd::from(r)).is_err() {
                            break;
                        }
                        let _ = w.write_all(data);
                    }
                    // CRIU fails once its connection is dropped; then it returns.
                    let mut rest = Vec::new();
                    let _ = (&conn).read_to_end(&mut rest);
                    gate.tell_exited();
                });
                receive(&listener, &gate, &sink).unwrap_err()
            });
            let e = e.to_string();
            assert!(e.contains("not a filename") || e.contains("arrived twice"), "{e}");
        }
    }

    #[test]
    fn filenames_are_read_from_requests_and_anything_else_is_refused() {
        assert_eq!(request_filename(b"\x0a\x0bpages-1.img").unwrap(), "pages-1.img");
        let long = "p".repeat(200);
        let mut msg = vec![0x0a, 0xc8, 0x01];
        msg.extend(long.as_bytes());
        assert_eq!(request_filename(&msg).unwrap(), long);
        for bad in [&b""[..], b"\x12\x01a", b"\x0a\x05abc", b"\x0a\x01ab", b"\x0a\x80"] {
            assert!(request_filename(bad).is_err(), "{bad:?}");
        }
    }
}
