//! Large buffers that are filled once, front to back.

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
