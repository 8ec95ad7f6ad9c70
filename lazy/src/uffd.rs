//! The userfaultfd calls the daemon makes on a restored task's descriptor: copy pages in,
//! map zero pages, wake, unregister, and read events (faults, fork, mremap, madvise, munmap).
//! The layouts are the kernel's (`include/uapi/linux/userfaultfd.h`).

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

const UFFDIO_COPY: libc::c_ulong = 0xC028_AA03;
const UFFDIO_ZEROPAGE: libc::c_ulong = 0xC020_AA04;
const UFFDIO_WAKE: libc::c_ulong = 0x8010_AA02;
const UFFDIO_UNREGISTER: libc::c_ulong = 0x8010_AA01;

const EVENT_PAGEFAULT: u8 = 0x12;
const EVENT_FORK: u8 = 0x13;
const EVENT_REMAP: u8 = 0x14;
const EVENT_REMOVE: u8 = 0x15;
const EVENT_UNMAP: u8 = 0x16;

#[repr(C)]
struct Range {
    start: u64,
    len: u64,
}

#[repr(C)]
struct Copy {
    dst: u64,
    src: u64,
    len: u64,
    mode: u64,
    copy: i64,
}

#[repr(C)]
struct ZeroPage {
    range: Range,
    mode: u64,
    zeropage: i64,
}

/// One message read from a userfaultfd.
#[derive(Debug)]
pub enum Event {
    /// A thread touched the missing page at `addr`.
    PageFault {
        /// The faulting address.
        addr: u64,
    },
    /// The task forked; the child's memory reports to `uffd`.
    Fork {
        /// The child's userfaultfd.
        uffd: Uffd,
    },
    /// `mremap` moved `[from, from + len)` to `to`.
    Remap {
        /// Old start.
        from: u64,
        /// New start.
        to: u64,
        /// Length moved.
        len: u64,
    },
    /// `madvise(MADV_DONTNEED/REMOVE)` dropped `[start, end)`: it now reads as zeros.
    Remove {
        /// Start.
        start: u64,
        /// End.
        end: u64,
    },
    /// `munmap` removed `[start, end)`.
    Unmap {
        /// Start.
        start: u64,
        /// End.
        end: u64,
    },
}

/// How a copy went.
#[derive(Debug)]
pub enum Copied {
    /// All bytes were copied.
    Done,
    /// The page at `done` bytes in already exists (copied before, or written by the task):
    /// the bytes before it were copied.
    Exists(u64),
    /// Events are pending (fork, mremap, ...): the bytes before `done` were copied; read the
    /// events, then retry.
    Again(u64),
    /// The range is no longer registered (unmapped or moved): `done` bytes were copied.
    NoRange(u64),
    /// The task has exited.
    Gone,
}

/// How a fill ioctl (COPY or ZEROPAGE) went, from its return value and its count of bytes
/// done (or negative errno).
fn outcome(r: libc::c_int, done: i64) -> io::Result<Copied> {
    if r == 0 {
        return Ok(Copied::Done);
    }
    let err = io::Error::last_os_error();
    let done = done.max(0) as u64;
    match err.raw_os_error() {
        Some(libc::EEXIST) => Ok(Copied::Exists(done)),
        Some(libc::EAGAIN) => Ok(Copied::Again(done)),
        Some(libc::ENOENT) => Ok(Copied::NoRange(done)),
        Some(libc::ESRCH) => Ok(Copied::Gone),
        _ => Err(err),
    }
}

/// A task's userfaultfd.
#[derive(Debug)]
pub struct Uffd(OwnedFd);

impl Uffd {
    /// Takes ownership of a received descriptor.
    pub fn new(fd: OwnedFd) -> Uffd {
        Uffd(fd)
    }

    /// The raw descriptor (for poll and for the guard).
    pub fn raw(&self) -> RawFd {
        self.0.as_raw_fd()
    }

    /// Copies `len` bytes from `src` (page-aligned, resident) to `dst` in the task, waking
    /// threads that wait on the range.
    pub fn copy(&self, dst: u64, src: *const u8, len: u64) -> io::Result<Copied> {
        let mut arg = Copy { dst, src: src as u64, len, mode: 0, copy: 0 };
        // SAFETY: UFFDIO_COPY reads `len` bytes at `src`, which the caller keeps valid.
        let r = unsafe { libc::ioctl(self.raw(), UFFDIO_COPY, &mut arg) };
        outcome(r, arg.copy)
    }

    /// Maps zero pages over `[start, start + len)` where pages are missing, waking waiters.
    pub fn zero(&self, start: u64, len: u64) -> io::Result<Copied> {
        let mut arg = ZeroPage { range: Range { start, len }, mode: 0, zeropage: 0 };
        // SAFETY: plain ioctl on an owned descriptor with a correctly laid out argument.
        let r = unsafe { libc::ioctl(self.raw(), UFFDIO_ZEROPAGE, &mut arg) };
        outcome(r, arg.zeropage)
    }

    /// Wakes threads waiting on `[start, start + len)` (they fault again if it is still missing).
    pub fn wake(&self, start: u64, len: u64) {
        let mut arg = Range { start, len };
        // SAFETY: as above; a failure only means nobody waited.
        unsafe { libc::ioctl(self.raw(), UFFDIO_WAKE, &mut arg) };
    }

    /// Unregisters `[start, end)`: missing pages there are then the kernel's to fill (zeros).
    pub fn unregister(&self, start: u64, end: u64) {
        let mut arg = Range { start, len: end - start };
        // SAFETY: as above; a range that is already gone is no error worth reporting.
        unsafe { libc::ioctl(self.raw(), UFFDIO_UNREGISTER, &mut arg) };
    }

    /// Reads every pending event without blocking and appends it to `out`.
    pub fn read_events(&self, out: &mut Vec<Event>) -> io::Result<()> {
        let mut buf = [0u8; 32 * 64];
        loop {
            // SAFETY: reading into a local buffer of the stated size.
            let n = unsafe { libc::read(self.raw(), buf.as_mut_ptr().cast(), buf.len()) };
            if n < 0 {
                let err = io::Error::last_os_error();
                return match err.raw_os_error() {
                    Some(libc::EAGAIN) => Ok(()),
                    Some(libc::EINTR) => continue,
                    _ => Err(err),
                };
            }
            if n == 0 {
                return Ok(());
            }
            for msg in buf[..n as usize].chunks_exact(32) {
                let u64_at = |at: usize| u64::from_ne_bytes(msg[at..at + 8].try_into().expect("8 bytes"));
                out.push(match msg[0] {
                    EVENT_PAGEFAULT => Event::PageFault { addr: u64_at(16) },
                    EVENT_FORK => {
                        let fd = u32::from_ne_bytes(msg[8..12].try_into().expect("4 bytes")) as RawFd;
                        // SAFETY: the kernel installed this descriptor for us with the event.
                        Event::Fork { uffd: Uffd(unsafe { OwnedFd::from_raw_fd(fd) }) }
                    }
                    EVENT_REMAP => Event::Remap { from: u64_at(8), to: u64_at(16), len: u64_at(24) },
                    EVENT_REMOVE => Event::Remove { start: u64_at(8), end: u64_at(16) },
                    EVENT_UNMAP => Event::Unmap { start: u64_at(8), end: u64_at(16) },
                    other => {
                        return Err(io::Error::new(io::ErrorKind::InvalidData, format!("unknown event {other:#x}")))
                    }
                });
            }
        }
    }
}

const UFFDIO_API: libc::c_ulong = 0xC018_AA3F;
/// The events CRIU asks for, which a lazy restore needs: fork, remap, remove, unmap.
const NEEDED_FEATURES: u64 = (1 << 1) | (1 << 2) | (1 << 3) | (1 << 6);

#[repr(C)]
struct Api {
    api: u64,
    features: u64,
    ioctls: u64,
}

/// Checks that this kernel lets this process create userfaultfds with the events a lazy
/// restore needs; the error says why not.
pub fn check_support() -> std::result::Result<(), String> {
    // SAFETY: userfaultfd(2) returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_userfaultfd, libc::O_CLOEXEC | libc::O_NONBLOCK) };
    if fd < 0 {
        return Err(format!("userfaultfd is not available: {}", io::Error::last_os_error()));
    }
    // SAFETY: the descriptor was just created and is owned here.
    let fd = unsafe { OwnedFd::from_raw_fd(fd as RawFd) };
    let mut api = Api { api: 0xAA, features: 0, ioctls: 0 };
    // SAFETY: UFFDIO_API with a correctly laid out argument.
    if unsafe { libc::ioctl(fd.as_raw_fd(), UFFDIO_API, &mut api) } != 0 {
        return Err(format!("userfaultfd API handshake failed: {}", io::Error::last_os_error()));
    }
    if api.features & NEEDED_FEATURES != NEEDED_FEATURES {
        return Err(format!(
            "this kernel's userfaultfd lacks fork/remap/remove/unmap events (features {:#x})",
            api.features
        ));
    }
    Ok(())
}
