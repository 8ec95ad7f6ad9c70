//! CRIU's side of the lazy-pages protocol: `criu restore --lazy-pages` connects once to
//! `<work dir>/lazy-pages.socket`, sends one record per process of the image (a native `int`
//! pid, then a one-byte message carrying the task's userfaultfd as SCM_RIGHTS; a zombie sends
//! its pid negated and no descriptor) and, once every task is restored, the u32 `RSTF`.
//!
//! Each task sends its own record, so the socket listens with `SO_PASSCRED`: the kernel
//! attaches the sender's credentials to every message, its pid as this process sees it. In a
//! container that is the task's host pid, where the record carries its pid inside the
//! container's pid namespace (the image's pid).

use crate::error::{LazyError, Result};
use crate::uffd::Uffd;
use std::io::{self, Read};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// The socket's name in CRIU's work directory.
pub const SOCKET_NAME: &str = "lazy-pages.socket";
/// What CRIU sends once every task is restored: "RSTF".
pub const RESTORE_FINISHED: u32 = 0x5253_5446;

/// A restored task as CRIU announced it.
#[derive(Debug)]
pub struct Announced {
    /// Its pid in the image (in a container: inside the container's pid namespace).
    pub pid: i32,
    /// Its pid as this process sees it (the sender's credentials).
    pub host_pid: i32,
    /// Its userfaultfd (`None` for a zombie).
    pub uffd: Option<Uffd>,
}

/// The listening socket, bound before `criu restore` starts.
pub struct LazySocket {
    listener: UnixListener,
    path: PathBuf,
}

impl LazySocket {
    /// Binds `dir/lazy-pages.socket` (through `/proc/self/fd` when the path is too long for a
    /// socket address).
    pub fn bind(dir: &Path) -> Result<LazySocket> {
        let (listener, path) = bind_in(dir, SOCKET_NAME)?;
        pass_credentials(listener.as_raw_fd())?;
        listener.set_nonblocking(true).map_err(|e| LazyError::os("making the lazy-pages socket non-blocking", e))?;
        Ok(LazySocket { listener, path })
    }

    /// Waits for CRIU's connection; gives up with [`LazyError::Aborted`] once `abort` is set.
    pub fn accept(&self, abort: &AtomicBool) -> Result<UnixStream> {
        loop {
            match self.listener.accept() {
                Ok((conn, _)) => {
                    conn.set_nonblocking(false).map_err(|e| LazyError::os("setting up the CRIU connection", e))?;
                    pass_credentials(conn.as_raw_fd())?;
                    return Ok(conn);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if abort.load(Ordering::Acquire) {
                        return Err(LazyError::Aborted);
                    }
                    std::thread::sleep(Duration::from_millis(2));
                }
                Err(e) => return Err(LazyError::os("accepting CRIU's connection", e)),
            }
        }
    }
}

impl Drop for LazySocket {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Listens on a Unix socket `name` in `dir` (replacing a stale one), through `/proc/self/fd`
/// when the path is too long for a socket address. Returns the listener and the path.
pub fn bind_in(dir: &Path, name: &str) -> Result<(UnixListener, PathBuf)> {
    let path = dir.join(name);
    let _ = std::fs::remove_file(&path);
    let bound = if path.as_os_str().len() < 100 {
        UnixListener::bind(&path)
    } else {
        let d = std::fs::File::open(dir).map_err(|e| LazyError::os(format!("opening {}", dir.display()), e))?;
        UnixListener::bind(format!("/proc/self/fd/{}/{name}", d.as_raw_fd()))
    };
    let listener = bound.map_err(|e| LazyError::os(format!("listening on {}", path.display()), e))?;
    Ok((listener, path))
}

/// Receives the `tasks` records CRIU sends, in any order. `sender` learns each task's pid as
/// this process sees it between the record's pid and its userfaultfd: a daemon that dies in
/// between leaves the userfaultfd queued on the connection (the guard holds it), so the task
/// waits instead of reading zeros, and the guard already knows whom to kill.
pub fn receive_tasks(
    conn: &UnixStream,
    tasks: usize,
    sender: &mut dyn FnMut(i32) -> Result<()>,
) -> Result<Vec<Announced>> {
    let mut out = Vec::with_capacity(tasks);
    for _ in 0..tasks {
        let mut pid = [0u8; 4];
        let got = recv_exact(conn, &mut pid)?;
        let pid = i32::from_ne_bytes(pid);
        let host_pid = got.sender.ok_or_else(|| {
            LazyError::Protocol(format!("the record of pid {pid} came without its sender's credentials"))
        })?;
        if pid <= 0 {
            out.push(Announced { pid: -pid, host_pid, uffd: None });
            continue;
        }
        sender(host_pid)?;
        let mut fds = if got.fds.is_empty() { recv_exact(conn, &mut [0u8; 1])?.fds } else { got.fds };
        if fds.len() != 1 {
            return Err(LazyError::Protocol(format!("pid {pid} came with {} descriptors, expected one", fds.len())));
        }
        out.push(Announced { pid, host_pid, uffd: Some(Uffd::new(fds.remove(0))) });
    }
    Ok(out)
}

/// Asks the kernel to attach the sender's credentials to every message `sock` receives (a
/// listener's connections inherit it).
fn pass_credentials(sock: RawFd) -> Result<()> {
    let on: libc::c_int = 1;
    // SAFETY: setsockopt reads one int from a live local.
    let r = unsafe {
        libc::setsockopt(
            sock,
            libc::SOL_SOCKET,
            libc::SO_PASSCRED,
            (&on as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r != 0 {
        return Err(LazyError::os("asking for CRIU's credentials (SO_PASSCRED)", io::Error::last_os_error()));
    }
    Ok(())
}

/// Waits for the end-of-restore word. `false` if CRIU closed the connection first (it failed).
pub fn wait_restore_finished(mut conn: &UnixStream) -> Result<bool> {
    let mut word = [0u8; 4];
    match conn.read_exact(&mut word) {
        Ok(()) if u32::from_ne_bytes(word) == RESTORE_FINISHED => Ok(true),
        Ok(()) => Err(LazyError::Protocol(format!("expected RSTF, got {:#x}", u32::from_ne_bytes(word)))),
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Ok(false),
        Err(e) => Err(LazyError::os("reading from CRIU", e)),
    }
}

/// Sends `payload` on socket `sock` in one message, with `fd` as SCM_RIGHTS if given (as CRIU
/// sends a descriptor: with the message's bytes).
pub fn send_with_fd(sock: RawFd, payload: &[u8], fd: Option<RawFd>) -> io::Result<()> {
    let mut iov = libc::iovec { iov_base: payload.as_ptr().cast_mut().cast(), iov_len: payload.len() };
    let mut cmsg = [0u64; 4];
    // SAFETY: msghdr points at live local buffers (sendmsg only reads the payload); the control
    // message is laid out with the CMSG macros inside `cmsg`, large enough for one descriptor.
    unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        if let Some(fd) = fd {
            msg.msg_control = cmsg.as_mut_ptr().cast();
            msg.msg_controllen = libc::CMSG_SPACE(4) as usize;
            let c = libc::CMSG_FIRSTHDR(&msg);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(4) as usize;
            libc::CMSG_DATA(c).cast::<i32>().write_unaligned(fd);
        }
        if libc::sendmsg(sock, &msg, libc::MSG_NOSIGNAL) < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// What [`recv_exact`] received besides the bytes.
pub struct Received {
    /// Descriptors that came along (SCM_RIGHTS).
    pub fds: Vec<OwnedFd>,
    /// The sending process's pid, where the socket passes credentials (SCM_CREDENTIALS).
    pub sender: Option<i32>,
}

/// Fills `buf` from `conn`, collecting any descriptors that come along (SCM_RIGHTS) and the
/// sender's pid. A connection closed before `buf` is full is a [`LazyError::Protocol`] error.
pub fn recv_exact(conn: &UnixStream, buf: &mut [u8]) -> Result<Received> {
    let mut got_msg = Received { fds: Vec::new(), sender: None };
    let mut got = 0;
    while got < buf.len() {
        let mut cmsg = [0u64; 12];
        // SAFETY: one recvmsg into live local buffers.
        let (n, msg) = unsafe { receive(conn.as_raw_fd(), &mut buf[got..], &mut cmsg, libc::MSG_CMSG_CLOEXEC) };
        if n < 0 {
            let err = io::Error::last_os_error();
            if err.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(LazyError::os("receiving from CRIU", err));
        }
        if n == 0 {
            return Err(LazyError::Protocol(format!("CRIU closed the connection after {got} of {} bytes", buf.len())));
        }
        got += n as usize;
        // SAFETY: walking the control messages the kernel wrote into `cmsg`.
        unsafe {
            let mut c = libc::CMSG_FIRSTHDR(&msg);
            while !c.is_null() {
                if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                    let data = libc::CMSG_DATA(c).cast::<i32>();
                    let count = ((*c).cmsg_len as usize - libc::CMSG_LEN(0) as usize) / 4;
                    for i in 0..count {
                        got_msg.fds.push(OwnedFd::from_raw_fd(data.add(i).read_unaligned()));
                    }
                }
                c = libc::CMSG_NXTHDR(&msg, c);
            }
            if got_msg.sender.is_none() {
                got_msg.sender = sender_of(&msg);
            }
        }
    }
    Ok(got_msg)
}

/// One `recvmsg` of `fd` into `payload`, control messages into `control`: its result, and the
/// header, whose control fields describe what arrived (its data pointers are cleared).
/// Async-signal-safe (the restore guard uses it after its fork).
///
/// # Safety
/// A plain system call on the buffers given.
pub(crate) unsafe fn receive(
    fd: RawFd,
    payload: &mut [u8],
    control: &mut [u64],
    flags: libc::c_int,
) -> (isize, libc::msghdr) {
    let mut iov = libc::iovec { iov_base: payload.as_mut_ptr().cast(), iov_len: payload.len() };
    let mut msg: libc::msghdr = std::mem::zeroed();
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(control);
    let r = libc::recvmsg(fd, &mut msg, flags);
    msg.msg_iov = std::ptr::null_mut();
    msg.msg_iovlen = 0;
    (r, msg)
}

/// The sender's pid a message [`receive`] just got carries (SCM_CREDENTIALS, on a socket that
/// passes credentials). Async-signal-safe.
///
/// # Safety
/// `msg` is a header [`receive`] returned, its control buffer still alive.
pub(crate) unsafe fn sender_of(msg: &libc::msghdr) -> Option<i32> {
    let mut c = libc::CMSG_FIRSTHDR(msg);
    while !c.is_null() {
        if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_CREDENTIALS {
            return Some(libc::CMSG_DATA(c).cast::<libc::ucred>().read_unaligned().pid);
        }
        c = libc::CMSG_NXTHDR(msg, c);
    }
    None
}
