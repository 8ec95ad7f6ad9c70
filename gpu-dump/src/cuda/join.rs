//! gstore's float-codec decode on the GPU (kernels/floats.cu, built to the PTX embedded here by
//! scripts/build-ptx.sh): the `decode_huffman` kernel decodes Huffman-coded lanes, and the
//! `join_lanes` kernel interleaves the byte lanes of float-coded chunks, already in device
//! memory, back into their words. The joined bytes are then checked by [`super::check`] like
//! any decoded chunk.

use libc::c_void;

use super::{Context, Kernel, Stream};
use crate::error::Result;

/// The kernel's PTX, NUL-terminated as `cuModuleLoadData` wants it.
const PTX: &str = concat!(include_str!("kernels/floats.ptx"), "\0");
/// Threads per block, as the join is built for (`JOIN_THREADS` in floats.cu).
const THREADS: u32 = 256;
/// Threads per block, as the Huffman decode is built for (`HUFF_THREADS` in floats.cu).
const HUFF_THREADS: u32 = 128;

/// One float-coded chunk for the kernel to join (`struct LaneJob` in floats.cu).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LaneJob {
    /// Device address of each lane's `words` bytes (the first `width` are used).
    pub lane: [u64; 4],
    /// Device address of a zstd lane's u64 decoded length, which must equal `words`; 0 for a
    /// raw lane.
    pub lane_len: [u64; 4],
    /// Device address of a zstd lane's i32 decode status, which must be 0; 0 for a raw lane.
    pub lane_status: [u64; 4],
    /// Device address of the `tail_len` bytes past the last whole word.
    pub tail: u64,
    /// Device address the joined plain bytes go to.
    pub dst: u64,
    /// Device address of a u64 the kernel sets to the plain length, or to 0 when a lane did
    /// not decode whole (nothing is joined then).
    pub joined_len: u64,
    /// Words per lane.
    pub words: u32,
    /// Bytes per word: 2 or 4.
    pub width: u16,
    /// Plain length modulo `width`.
    pub tail_len: u16,
}

const _: () = {
    assert!(std::mem::size_of::<LaneJob>() == 128);
    assert!(std::mem::offset_of!(LaneJob, tail) == 96);
    assert!(std::mem::offset_of!(LaneJob, words) == 120);
};

impl LaneJob {
    /// The job as the bytes the kernel reads.
    pub fn as_bytes(&self) -> &[u8; 128] {
        // SAFETY: LaneJob is repr(C), 128 bytes of integers with no padding (asserted above).
        unsafe { &*(self as *const LaneJob).cast::<[u8; 128]>() }
    }
}

/// One Huffman-coded lane for the decode kernel (`struct HuffJob` in floats.cu).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HuffJob {
    /// Device address of the lane's stored bytes.
    pub src: u64,
    /// Device address its `words` decoded bytes go to.
    pub out: u64,
    /// Bytes it decodes to. A [`LaneJob`] takes this field's address as the lane's decoded
    /// length ([`HuffJob::WORDS_AT`]).
    pub words: u64,
    /// Stored bytes.
    pub stored_len: u32,
    /// 0 when queued; the kernel sets 1 when the lane does not decode. A [`LaneJob`] takes
    /// this field's address as the lane's status ([`HuffJob::STATUS_AT`]).
    pub status: i32,
}

const _: () = assert!(std::mem::size_of::<HuffJob>() == 32);

impl HuffJob {
    /// Offset of `words` in the job.
    pub const WORDS_AT: u64 = std::mem::offset_of!(HuffJob, words) as u64;
    /// Offset of `status` in the job.
    pub const STATUS_AT: u64 = std::mem::offset_of!(HuffJob, status) as u64;

    /// The job as the bytes the kernel reads.
    pub fn as_bytes(&self) -> &[u8; 32] {
        // SAFETY: HuffJob is repr(C), 32 bytes of integers with no padding (asserted above).
        unsafe { &*(self as *const HuffJob).cast::<[u8; 32]>() }
    }
}

/// The loaded float-lane kernels: the Huffman lane decode and the lane join.
#[derive(Debug)]
pub struct FloatLanes {
    join: Kernel,
    huffman: Kernel,
}

impl FloatLanes {
    /// Loads the kernels into `ctx`. Fails when the driver lacks the kernel API or cannot
    /// compile the PTX (a driver older than CUDA 13.0).
    pub fn load(ctx: &Context) -> Result<FloatLanes> {
        let [join, huffman] = ctx.load_kernels(PTX, [c"join_lanes", c"decode_huffman"])?;
        Ok(FloatLanes { join, huffman })
    }

    /// Queues the decode of `count` Huffman lanes whose [`HuffJob`]s are at device address
    /// `jobs` on `stream`.
    ///
    /// # Safety
    /// `jobs` must hold `count` [`HuffJob`]s (writable: the kernel sets their status) whose
    /// `src` is readable for `stored_len` bytes and `out` writable for `words` bytes of device
    /// memory, all of it allocated until the kernel has run.
    pub unsafe fn decode(&self, stream: &Stream, jobs: u64, count: u32) -> Result<()> {
        // SAFETY: as this function requires.
        unsafe { launch_per_job(stream, &self.huffman, HUFF_THREADS, jobs, count) }
    }

    /// Queues the join of `count` jobs stored at device address `jobs` on `stream`.
    ///
    /// # Safety
    /// `jobs` must hold `count` [`LaneJob`]s whose addresses are readable (and, for `dst` and
    /// `joined_len`, writable) device memory, all of it allocated until the kernel has run.
    pub unsafe fn join(&self, stream: &Stream, jobs: u64, count: u32) -> Result<()> {
        // SAFETY: as this function requires.
        unsafe { launch_per_job(stream, &self.join, THREADS, jobs, count) }
    }
}

/// Queues `kernel`, whose one parameter is the device address of its jobs, on `stream`: one
/// block of `threads` per job, nothing for no jobs.
///
/// # Safety
/// `jobs` must hold `count` jobs of the kind `kernel` reads, every address in them valid for
/// what the kernel does there until it has run.
unsafe fn launch_per_job(stream: &Stream, kernel: &Kernel, threads: u32, jobs: u64, count: u32) -> Result<()> {
    if count == 0 {
        return Ok(());
    }
    let mut jobs = jobs;
    let mut params = [(&mut jobs as *mut u64).cast::<c_void>()];
    // SAFETY: the kernel takes one u64, as `params` holds; the caller vouches for the jobs.
    unsafe { stream.launch(kernel, count, threads, &mut params) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_is_laid_out_as_the_kernel_reads_it() {
        let job = LaneJob {
            lane: [1, 2, 0, 0],
            lane_len: [0, 0x20, 0, 0],
            tail: 0x30,
            dst: 0x40,
            joined_len: 0x50,
            words: 32768,
            width: 2,
            tail_len: 1,
            ..LaneJob::default()
        };
        let b = job.as_bytes();
        assert_eq!(&b[8..16], &2u64.to_le_bytes());
        assert_eq!(&b[40..48], &0x20u64.to_le_bytes());
        assert_eq!(&b[96..104], &0x30u64.to_le_bytes());
        assert_eq!(&b[104..112], &0x40u64.to_le_bytes());
        assert_eq!(&b[112..120], &0x50u64.to_le_bytes());
        assert_eq!(&b[120..124], &32768u32.to_le_bytes());
        assert_eq!(&b[124..126], &2u16.to_le_bytes());
        assert_eq!(&b[126..128], &1u16.to_le_bytes());
    }

    #[test]
    fn a_huffman_job_is_laid_out_as_the_kernel_reads_it() {
        let job = HuffJob { src: 1, out: 2, words: 3, stored_len: 4, status: 5 };
        let b = job.as_bytes();
        assert_eq!(&b[..8], &1u64.to_le_bytes());
        assert_eq!(&b[8..16], &2u64.to_le_bytes());
        assert_eq!(&b[HuffJob::WORDS_AT as usize..][..8], &3u64.to_le_bytes());
        assert_eq!(&b[24..28], &4u32.to_le_bytes());
        assert_eq!(&b[HuffJob::STATUS_AT as usize..][..4], &5i32.to_le_bytes());
    }

    #[test]
    fn the_ptx_defines_the_kernel_for_the_job_layout() {
        assert!(PTX.contains(".entry join_lanes("), "scripts/build-ptx.sh regenerates the PTX");
        assert!(PTX.contains(".entry decode_huffman("), "scripts/build-ptx.sh regenerates the PTX");
        assert!(PTX.ends_with('\0'));
    }
}
