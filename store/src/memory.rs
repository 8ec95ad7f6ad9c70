//! Large buffers that are filled once, front to back, and buffers used again.

use crate::error::Result;
use bytes::Bytes;
use std::sync::Mutex;

/// An empty buffer of `len` bytes' capacity whose memory the kernel may back with huge pages:
/// a fresh 16 MiB buffer filled 4 KiB page by page takes 4,096 page faults, with 2 MiB pages 8
/// (a pack writer or a stream reader filling one after another spent much of its time in them).
pub(crate) fn fresh_buffer(len: usize) -> Vec<u8> {
    let v: Vec<u8> = Vec::with_capacity(len);
    let start = (v.as_ptr() as usize).next_multiple_of(4096);
    let end = (v.as_ptr() as usize + len) & !4095;
    if end > start {
        // SAFETY: advice on memory this Vec owns and nothing has touched yet; failing (no
        // transparent huge pages) changes nothing.
        unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE) };
    }
    v
}

/// Buffers given back for reuse: every page of a fresh buffer faults in and is zeroed by the
/// kernel on its first write, which cost encrypted pushes on a two-core machine a sixth of
/// their time (a fresh 48 MiB buffer for each sealed pack); a kept buffer's pages are mapped.
pub(crate) struct Kept {
    buffers: Mutex<Vec<Vec<u8>>>,
    /// Most bytes kept (past it, a given-back buffer is freed).
    limit: usize,
}

/// Buffers smaller than this are neither kept nor taken from the kept ones (small objects —
/// tags, leases, manifests of small images — are cheap to allocate, and would each pin a
/// large kept buffer).
const KEPT_FROM: usize = 1 << 20;

/// The process's kept buffers: at most 512 MiB.
pub(crate) static KEPT: Kept = Kept::new(512 << 20);

impl Kept {
    /// No buffers kept yet, keeping at most `limit` bytes.
    pub(crate) const fn new(limit: usize) -> Kept {
        Kept { buffers: Mutex::new(Vec::new()), limit }
    }

    /// An empty buffer of at least `len` bytes' capacity: the smallest kept one that fits,
    /// else a [`fresh_buffer`] (a plain allocation below [`KEPT_FROM`]).
    pub(crate) fn buffer(&self, len: usize) -> Vec<u8> {
        let mut b = self.filled(0, len);
        b.clear();
        b
    }

    /// A buffer of `len` bytes with at least `capacity` bytes' capacity, holding whatever it
    /// held before (zeros where nothing was written): for a caller that overwrites it, a kept
    /// buffer is not zeroed again.
    pub(crate) fn filled(&self, len: usize, capacity: usize) -> Vec<u8> {
        let capacity = capacity.max(len);
        if capacity < KEPT_FROM {
            return vec![0u8; len];
        }
        // Sizes rounded up to 2 MiB (a huge page), so that a kept buffer serves the many
        // requests of about one size (16 MiB reads and a few blocks) rather than one exactly.
        let capacity = capacity.next_multiple_of(2 << 20);
        let mut kept = self.buffers.lock().expect("kept buffers lock");
        let best = kept.iter().enumerate().filter(|(_, b)| b.capacity() >= capacity).min_by_key(|(_, b)| b.capacity());
        let Some(i) = best.map(|(i, _)| i) else {
            drop(kept);
            if len == 0 {
                return fresh_buffer(capacity);
            }
            // Zeroed by the allocator (fresh pages are zero already), not by a second pass.
            let mut b = vec![0u8; capacity];
            b.truncate(len);
            return b;
        };
        let mut b = kept.swap_remove(i);
        b.resize(len, 0);
        b
    }

    /// `len` bytes that `read` writes into a buffer (whole: it starts with whatever the
    /// buffer held), shared as [`Kept::shared`] shares them.
    pub(crate) fn read(&'static self, len: usize, read: impl FnOnce(&mut [u8]) -> Result<()>) -> Result<Bytes> {
        let mut buf = self.filled(len, len);
        read(&mut buf)?;
        Ok(self.shared(buf))
    }

    /// `buf`'s bytes, shared; `buf` is kept for [`Kept::buffer`] when the last of them is
    /// dropped (while the kept buffers hold less than the limit).
    pub(crate) fn shared(&'static self, buf: Vec<u8>) -> Bytes {
        if buf.capacity() < KEPT_FROM {
            return Bytes::from(buf);
        }
        Bytes::from_owner(GivenBack { buf, to: self })
    }

    fn give_back(&self, buf: Vec<u8>) {
        let mut kept = self.buffers.lock().expect("kept buffers lock");
        if kept.iter().map(Vec::capacity).sum::<usize>() + buf.capacity() <= self.limit {
            kept.push(buf);
        }
    }
}

/// A buffer that goes back to its [`Kept`] when dropped.
struct GivenBack {
    buf: Vec<u8>,
    to: &'static Kept,
}

impl AsRef<[u8]> for GivenBack {
    fn as_ref(&self) -> &[u8] {
        &self.buf
    }
}

impl Drop for GivenBack {
    fn drop(&mut self) {
        self.to.give_back(std::mem::take(&mut self.buf));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_given_back_buffer_is_used_again_and_holds_only_what_is_written() {
        static KEPT: Kept = Kept::new(8 << 20);
        let mut b = KEPT.buffer(3 << 20);
        b.extend_from_slice(&[7u8; 3 << 20]);
        let at = b.as_ptr();
        let bytes = KEPT.shared(b);
        let slice = bytes.slice(5..10);
        drop(bytes);
        assert_eq!(&slice[..], &[7u8; 5], "a slice keeps the buffer alive");
        drop(slice);
        let again = KEPT.buffer(2 << 20);
        assert!(again.is_empty(), "a reused buffer starts empty");
        assert_eq!(again.as_ptr(), at, "the given-back buffer was reused");
        let other = KEPT.buffer(1 << 20);
        assert_ne!(other.as_ptr(), at, "a buffer in use is not handed out twice");
        drop(other);
        drop(KEPT.shared(again));
        let big = KEPT.buffer(6 << 20);
        assert_ne!(big.as_ptr(), at, "too small a kept buffer is not handed out");
        drop(KEPT.shared(big));
        assert_eq!(KEPT.buffers.lock().unwrap().len(), 1, "past the limit, a buffer is freed");
        let small = KEPT.buffer(4096);
        assert!(small.capacity() < 1 << 20, "a small buffer is not a kept one");
        drop(KEPT.shared(small));
        assert_eq!(KEPT.buffers.lock().unwrap().len(), 1, "and is not kept");
        let mut some = KEPT.buffer(1 << 20);
        some.extend_from_slice(&[9u8; 1 << 20]);
        drop(KEPT.shared(some));
        let filled = KEPT.filled(2 << 20, 0);
        assert_eq!(filled.as_ptr(), at);
        assert!(filled[..1 << 20].iter().all(|&b| b == 9), "a filled buffer holds what was written in it");
        assert!(filled[1 << 20..].iter().all(|&b| b == 0), "and zeros past it");
    }
}
