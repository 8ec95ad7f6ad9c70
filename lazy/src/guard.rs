//! The guard: a small process forked before CRIU restores anything, knowing the pids the image
//! will come back with (where they are this machine's: not for a container, whose tasks it
//! learns as they announce themselves), and holding a copy of CRIU's connection once the
//! daemon accepts it (userfaultfds sent on it and not yet received stay open in its queue) and
//! of every restored task's userfaultfd once the daemon receives it. While any copy of a userfaultfd
//! is open, a missing page makes the touching thread wait instead of reading zeros. If the
//! daemon dies before it says the memory is complete (its end of the control socket closes) —
//! even before it has received the userfaultfds, when CRIU may already release the tasks — the
//! guard kills every restored process it knows and exits, so that none ever runs on missing
//! memory; the records still queued on CRIU's connection name the rest (each carries its
//! sender's pid, see [`crate::socket`]). A pid is killed only if its process started no earlier than the guard (one that
//! held the pid before the restore began is not the restored one).
//!
//! The guard leaves the terminal's session and ignores SIGINT, SIGTERM, SIGHUP and SIGQUIT, so
//! that a Ctrl-C of `gstore restore` reaches the daemon only. After the fork it makes nothing
//! but async-signal-safe system calls, with buffers allocated before the fork.

use crate::error::{LazyError, Result};
use crate::socket::{receive, sender_of};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};

/// The most processes one guard tracks.
const MAX_PIDS: usize = 4096;
/// Control messages: a tag byte and a native pid.
const TAG_PID: u8 = b'P';
const TAG_HOLD: u8 = b'H';
const TAG_CONN: u8 = b'C';
const TAG_GROUP: u8 = b'G';
const TAG_RELEASE: u8 = b'R';
const TAG_KILL: u8 = b'K';

/// The daemon's handle on its guard.
pub struct Guard {
    pid: libc::pid_t,
    ctl: OwnedFd,
    /// Told to release or kill (and reaped).
    finished: AtomicBool,
}

impl Guard {
    /// Forks the guard. It will kill `pids` (and those added later) if the daemon dies.
    pub fn start(pids: &[i32]) -> Result<Guard> {
        if pids.len() > MAX_PIDS {
            return Err(LazyError::Unsupported(format!(
                "{} processes is more than the {MAX_PIDS} a restore guard tracks",
                pids.len()
            )));
        }
        let mut pair = [0 as RawFd; 2];
        // SAFETY: socketpair writes two descriptors into `pair`.
        if unsafe { libc::socketpair(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0, pair.as_mut_ptr()) }
            != 0
        {
            return Err(LazyError::os("creating the guard's socket", io::Error::last_os_error()));
        }
        // SAFETY: both descriptors were just created and are owned here.
        let (ours, theirs) = unsafe { (OwnedFd::from_raw_fd(pair[0]), OwnedFd::from_raw_fd(pair[1])) };
        let mut known = [0 as libc::pid_t; MAX_PIDS];
        known[..pids.len()].copy_from_slice(pids);
        // SAFETY: the child runs only `guard_main`, which makes async-signal-safe calls.
        match unsafe { libc::fork() } {
            -1 => Err(LazyError::os("forking the restore guard", io::Error::last_os_error())),
            0 => guard_main(theirs.as_raw_fd(), known, pids.len()),
            pid => Ok(Guard { pid, ctl: ours, finished: AtomicBool::new(false) }),
        }
    }

    /// Tells the guard about a process forked during the fill, with its userfaultfd.
    pub fn add(&self, pid: i32, uffd: Option<RawFd>) -> Result<()> {
        send(&self.ctl, TAG_PID, pid, uffd).map_err(|e| LazyError::os("telling the restore guard a new pid", e))
    }

    /// Gives the guard a copy of descriptor `fd` to keep open until it exits: a process's
    /// userfaultfd before its pid is known.
    pub fn hold(&self, fd: RawFd) -> Result<()> {
        send(&self.ctl, TAG_HOLD, 0, Some(fd)).map_err(|e| LazyError::os("handing the restore guard a descriptor", e))
    }

    /// Gives the guard a copy of CRIU's connection (passing credentials): the userfaultfds sent
    /// on it but not yet received stay open in its queue while the guard holds it, and if the
    /// guard must kill, the senders of the records still queued are killed too.
    pub fn hold_connection(&self, conn: RawFd) -> Result<()> {
        send(&self.ctl, TAG_CONN, 0, Some(conn))
            .map_err(|e| LazyError::os("handing the restore guard CRIU's connection", e))
    }

    /// Names the process group of the runtime restoring the tasks (runc and its CRIU): killed
    /// after the tasks when the guard must kill, since a CRIU whose tasks die before it has
    /// finished waits for ever, and so does the runtime waiting for it.
    pub fn add_runtime_group(&self, pgid: i32) -> Result<()> {
        send(&self.ctl, TAG_GROUP, pgid, None)
            .map_err(|e| LazyError::os("telling the restore guard the runtime's process group", e))
    }

    /// The memory is complete (or CRIU failed, and removed what it restored): the guard exits,
    /// closing its copies of the userfaultfds. The first of `release` and `kill` counts.
    pub fn release(&self) {
        self.finish(TAG_RELEASE);
    }

    /// The fill failed: the guard kills every process it knows, then exits.
    pub fn kill(&self) {
        self.finish(TAG_KILL);
    }

    fn finish(&self, tag: u8) {
        if self.finished.swap(true, Ordering::AcqRel) {
            return;
        }
        let _ = send(&self.ctl, tag, 0, None);
        let mut status = 0;
        // SAFETY: reaping our own child.
        unsafe { libc::waitpid(self.pid, &mut status, 0) };
    }
}

/// Sends one control message, with `fd` as SCM_RIGHTS if given.
fn send(ctl: &OwnedFd, tag: u8, pid: i32, fd: Option<RawFd>) -> io::Result<()> {
    let mut payload = [0u8; 5];
    payload[0] = tag;
    payload[1..].copy_from_slice(&pid.to_ne_bytes());
    crate::socket::send_with_fd(ctl.as_raw_fd(), &payload, fd)
}

/// The guard process. Never returns.
fn guard_main(ctl: RawFd, mut pids: [libc::pid_t; MAX_PIDS], mut n: usize) -> ! {
    // SAFETY (whole function): async-signal-safe system calls only, on memory allocated before
    // the fork.
    unsafe {
        libc::setsid();
        for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT, libc::SIGPIPE] {
            libc::signal(sig, libc::SIG_IGN);
        }
        // Close everything but the control socket (descriptors come later, through it).
        if ctl > 3 {
            libc::syscall(libc::SYS_close_range, 3u32, (ctl - 1) as u32, 0u32);
        }
        libc::syscall(libc::SYS_close_range, (ctl + 1) as u32, u32::MAX, 0u32);
        let since = start_time(0);
        let mut conn: RawFd = -1;
        let mut group: libc::pid_t = 0;
        loop {
            let (mut payload, mut cmsg) = ([0u8; 5], [0u64; 4]);
            let (r, msg) = receive(ctl, &mut payload, &mut cmsg, 0);
            if r < 0 && *libc::__errno_location() == libc::EINTR {
                continue;
            }
            match (r, payload[0]) {
                (5, TAG_PID) => {
                    // The received descriptor (if any) simply stays open.
                    if n < MAX_PIDS {
                        pids[n] = i32::from_ne_bytes([payload[1], payload[2], payload[3], payload[4]]);
                        n += 1;
                    }
                }
                // The received descriptor stays open.
                (5, TAG_HOLD) => {}
                (5, TAG_CONN) => conn = received_fd(&msg).unwrap_or(conn),
                (5, TAG_GROUP) => group = i32::from_ne_bytes([payload[1], payload[2], payload[3], payload[4]]),
                (5, TAG_RELEASE) => libc::_exit(0),
                _ => {
                    // Told to, or the daemon is gone: nobody may run on missing memory.
                    if conn >= 0 {
                        n = drain_senders(conn, &mut pids, n);
                    }
                    for &pid in &pids[..n] {
                        // Without /proc to tell, every known pid is killed.
                        let restored = match since {
                            Some(since) => start_time(pid).is_some_and(|t| t >= since),
                            None => true,
                        };
                        if pid > 0 && restored {
                            libc::kill(pid, libc::SIGKILL);
                        }
                    }
                    // Then the runtime (runc and its CRIU), which would wait for ever.
                    if group > 1 {
                        libc::kill(-group, libc::SIGKILL);
                    }
                    libc::_exit(0);
                }
            }
        }
    }
}

/// The descriptor a control message brought (SCM_RIGHTS). Async-signal-safe.
///
/// # Safety
/// `msg` is a message `recvmsg` just filled.
unsafe fn received_fd(msg: &libc::msghdr) -> Option<RawFd> {
    let c = libc::CMSG_FIRSTHDR(msg);
    (!c.is_null() && (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS)
        .then(|| libc::CMSG_DATA(c).cast::<i32>().read_unaligned())
}

/// Reads what is still queued on CRIU's connection `conn` without waiting and adds the pid of
/// every sender to `pids[..n]`; the new count. Descriptors that come along stay open until the
/// guard exits. Async-signal-safe: stack buffers and plain system calls only.
fn drain_senders(conn: RawFd, pids: &mut [libc::pid_t; MAX_PIDS], mut n: usize) -> usize {
    // SAFETY: plain system calls on stack buffers of the stated sizes.
    unsafe {
        loop {
            let (mut payload, mut cmsg) = ([0u8; 64], [0u64; 16]);
            let (r, msg) = receive(conn, &mut payload, &mut cmsg, libc::MSG_DONTWAIT);
            if r <= 0 {
                return n;
            }
            if let Some(pid) = sender_of(&msg).filter(|_| n < MAX_PIDS) {
                pids[n] = pid;
                n += 1;
            }
        }
    }
}

/// When process `pid` (0: this one) started, in clock ticks since boot (field 22 of
/// `/proc/PID/stat`); `None` when that cannot be read (no such process). Async-signal-safe:
/// stack buffers and plain system calls only.
fn start_time(pid: libc::pid_t) -> Option<u64> {
    // "/proc/" then "self" or the pid's digits, then "/stat"; the zeros after end the string.
    let mut path = [0u8; 32];
    path[..6].copy_from_slice(b"/proc/");
    let mut len = 6;
    if pid > 0 {
        let digits = (pid as u32).checked_ilog10().unwrap_or(0) as usize + 1;
        let mut v = pid as u32;
        for at in (len..len + digits).rev() {
            path[at] = b'0' + (v % 10) as u8;
            v /= 10;
        }
        len += digits;
    } else {
        path[len..len + 4].copy_from_slice(b"self");
        len += 4;
    }
    path[len..len + 5].copy_from_slice(b"/stat");
    let mut stat = [0u8; 1024];
    // SAFETY: `path` is NUL-terminated (zeroed beyond `len + 5`); `stat` is a live buffer.
    let n = unsafe {
        let fd = libc::open(path.as_ptr().cast(), libc::O_RDONLY | libc::O_CLOEXEC);
        if fd < 0 {
            return None;
        }
        let n = libc::read(fd, stat.as_mut_ptr().cast(), stat.len());
        libc::close(fd);
        n
    };
    let stat = stat.get(..usize::try_from(n).ok()?)?;
    // The command name (field 2) may hold spaces and parentheses: fields 3 on follow the last ')'.
    let after = &stat[stat.iter().rposition(|&b| b == b')')? + 1..];
    let field = after.split(|&b| b == b' ').filter(|f| !f.is_empty()).nth(22 - 3)?;
    field.iter().try_fold(0u64, |v, &b| b.is_ascii_digit().then(|| v * 10 + u64::from(b - b'0')))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether the read end `fd` of a pipe sees its write end closed within `ms`.
    fn hung_up(fd: RawFd, ms: i32) -> bool {
        let mut p = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
        // SAFETY: one pollfd over a live descriptor.
        let n = unsafe { libc::poll(&mut p, 1, ms) };
        n == 1 && p.revents & libc::POLLHUP != 0
    }

    #[test]
    fn a_held_connection_keeps_the_descriptors_queued_in_it_open_until_the_guard_exits() {
        let (daemon, criu) = std::os::unix::net::UnixStream::pair().unwrap();
        let guard = Guard::start(&[]).unwrap();
        guard.hold(daemon.as_raw_fd()).unwrap();
        // A pipe's write end stands for a userfaultfd CRIU sent and the daemon never received.
        let mut ends = [0 as RawFd; 2];
        // SAFETY: pipe2 writes two descriptors into `ends`.
        assert_eq!(unsafe { libc::pipe2(ends.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
        // SAFETY: both were just created and are owned here.
        let (read, write) = unsafe { (OwnedFd::from_raw_fd(ends[0]), OwnedFd::from_raw_fd(ends[1])) };
        crate::socket::send_with_fd(criu.as_raw_fd(), b"uffd", Some(write.as_raw_fd())).unwrap();
        drop(write);
        // The daemon dies without receiving it: the guard's copy of the connection keeps it.
        drop(daemon);
        drop(criu);
        assert!(!hung_up(read.as_raw_fd(), 200), "the queued descriptor closed with the daemon's end");
        guard.release();
        assert!(hung_up(read.as_raw_fd(), 5000), "the queued descriptor outlived the guard");
    }

    #[test]
    fn a_guard_told_to_kill_kills_the_senders_of_records_still_queued_on_the_connection() {
        let (daemon, criu) = std::os::unix::net::UnixStream::pair().unwrap();
        let on: libc::c_int = 1;
        // SAFETY: setsockopt reads one int from a live local.
        let r = unsafe {
            libc::setsockopt(
                daemon.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_PASSCRED,
                (&on as *const libc::c_int).cast(),
                4,
            )
        };
        assert_eq!(r, 0);
        let guard = Guard::start(&[]).unwrap();
        guard.hold_connection(daemon.as_raw_fd()).unwrap();
        // A task (a child forked after the guard) sends its record, then waits.
        // SAFETY: the child makes async-signal-safe calls only.
        let task = match unsafe { libc::fork() } {
            0 => unsafe {
                let pid = 7i32.to_ne_bytes();
                libc::send(criu.as_raw_fd(), pid.as_ptr().cast(), 4, 0);
                loop {
                    libc::pause();
                }
            },
            pid => pid,
        };
        std::thread::sleep(std::time::Duration::from_millis(200));
        guard.kill();
        let mut status = 0;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        // SAFETY: reaping our own child.
        while unsafe { libc::waitpid(task, &mut status, libc::WNOHANG) } == 0 {
            if std::time::Instant::now() > deadline {
                // SAFETY: ending our own child.
                unsafe { libc::kill(task, libc::SIGKILL) };
                panic!("the guard left the sender of a queued record running");
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert!(libc::WIFSIGNALED(status) && libc::WTERMSIG(status) == libc::SIGKILL, "status {status:#x}");
    }

    #[test]
    fn start_times_come_from_proc_and_a_later_process_started_no_earlier() {
        let me = start_time(0).expect("this process's start time");
        assert_eq!(start_time(std::process::id() as libc::pid_t), Some(me));
        let mut child = std::process::Command::new("sleep").arg("5").spawn().unwrap();
        let theirs = start_time(child.id() as libc::pid_t).expect("the child's start time");
        assert!(theirs >= me, "a child started at {theirs}, before its parent at {me}");
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(start_time(child.id() as libc::pid_t), None, "a reaped process has none");
        assert!(start_time(1).is_some_and(|t| t <= me), "init started first");
    }
}
