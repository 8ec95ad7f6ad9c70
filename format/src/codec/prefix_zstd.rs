//! zstd frames compressed against a prefix (zstd's `refPrefix`: the decoder is given the
//! same bytes) by one context kept between frames.
//!
//! A fresh context per frame allocates its workspace and clears its tables every time
//! (`ZSTD_resetCCtx_internal`); a context used again only moves its window past what the
//! tables hold. `zstd_safe::CCtx` ties a prefix's borrow to the context's whole life, so a
//! kept context could not take a prefix that lives for one frame: this wrapper borrows the
//! prefix for the one call that uses it and lets go of it before returning.

use std::ptr::NonNull;
use zstd::zstd_safe::zstd_sys;

/// A zstd compression context for frames that each borrow a prefix for one call.
pub(crate) struct PrefixCompressor(NonNull<zstd_sys::ZSTD_CCtx>);

// SAFETY: a ZSTD_CCtx holds no thread-bound state; it is used by one thread at a time
// (`&mut self`), and holds no borrowed prefix between calls.
unsafe impl Send for PrefixCompressor {}

impl PrefixCompressor {
    /// A new context; `None` when zstd cannot allocate one.
    pub(crate) fn new() -> Option<PrefixCompressor> {
        // SAFETY: plain FFI; a null result is refused.
        NonNull::new(unsafe { zstd_sys::ZSTD_createCCtx() }).map(PrefixCompressor)
    }

    /// Appends to `out` one zstd frame of `plain` at `level`, with a window of `1 <<
    /// window_log` bytes and a hash table of `1 << hash_log` entries, matching against
    /// `prefix`; false (and `out` as it was) when the frame would not fit in `room` bytes
    /// or zstd refuses the parameters.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn compress(
        &mut self,
        plain: &[u8],
        prefix: &[u8],
        level: i32,
        window_log: u32,
        hash_log: u32,
        out: &mut Vec<u8>,
        room: usize,
    ) -> bool {
        use zstd_sys::ZSTD_cParameter::{ZSTD_c_compressionLevel, ZSTD_c_hashLog, ZSTD_c_windowLog};
        let cctx = self.0.as_ptr();
        let ok = |code: usize| unsafe { zstd_sys::ZSTD_isError(code) } == 0;
        out.reserve(room);
        let start = out.len();
        // SAFETY: `cctx` is a live context owned by `self`; a frame a failed call left
        // unfinished is dropped first (parameters are only taken between frames). The prefix
        // is referenced from `refPrefix` until the frame starts, when `ZSTD_compress2`
        // consumes it (a prefix serves one frame); the NULL prefix set last drops a reference
        // that a call failing before then left, so nothing of `prefix` is kept after this
        // call. `out` has `room` bytes of spare capacity after `start`, which zstd never
        // writes past, and its length grows by what zstd reports written.
        unsafe {
            let set = |p, v: i32| ok(zstd_sys::ZSTD_CCtx_setParameter(cctx, p, v));
            let dst = out.as_mut_ptr().add(start).cast();
            let written = (ok(zstd_sys::ZSTD_CCtx_reset(cctx, zstd_sys::ZSTD_ResetDirective::ZSTD_reset_session_only))
                && set(ZSTD_c_compressionLevel, level)
                && set(ZSTD_c_windowLog, window_log as i32)
                && set(ZSTD_c_hashLog, hash_log as i32)
                && ok(zstd_sys::ZSTD_CCtx_refPrefix(cctx, prefix.as_ptr().cast(), prefix.len())))
            .then(|| zstd_sys::ZSTD_compress2(cctx, dst, room, plain.as_ptr().cast(), plain.len()))
            .filter(|&n| ok(n));
            zstd_sys::ZSTD_CCtx_refPrefix(cctx, std::ptr::null(), 0);
            match written {
                Some(n) => {
                    out.set_len(start + n);
                    true
                }
                None => false,
            }
        }
    }
}

impl Drop for PrefixCompressor {
    fn drop(&mut self) {
        // SAFETY: the context is owned by `self` and freed once.
        unsafe { zstd_sys::ZSTD_freeCCtx(self.0.as_ptr()) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(frame: &[u8], prefix: &[u8], len: usize) -> Vec<u8> {
        let mut d = zstd::zstd_safe::DCtx::create();
        d.ref_prefix(prefix).unwrap();
        let mut out = Vec::with_capacity(len);
        d.decompress(&mut out, frame).unwrap();
        out
    }

    #[test]
    fn one_context_makes_frames_against_each_prefix_and_a_frame_too_big_leaves_nothing() {
        let mut c = PrefixCompressor::new().unwrap();
        for k in 0..4u32 {
            let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ k as u64;
            let prefix: Vec<u8> = (0..65_536)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect();
            let mut plain = prefix.clone();
            plain[1000..1100].fill(k as u8);
            // Too small a room first: refused, `out` untouched, the context fine for the next.
            let mut out = vec![9, 9];
            assert!(!c.compress(&plain, &prefix, 1, 17, 15, &mut out, 10));
            assert_eq!(out, [9, 9]);
            assert!(c.compress(&plain, &prefix, 1, 17, 15, &mut out, plain.len()));
            assert!(out.len() < 1000, "k {k}: a 100-byte change stored in {} bytes", out.len());
            assert_eq!(decode(&out[2..], &prefix, plain.len()), plain);
        }
        // Parameters zstd refuses: no frame.
        let mut out = Vec::new();
        assert!(!c.compress(b"abc", b"abc", 1, 40, 15, &mut out, 100));
        assert!(out.is_empty());
    }
}
