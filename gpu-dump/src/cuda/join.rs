//! gstore's float-codec decode on the GPU: the `join_lanes` kernel (kernels/floats.cu, built
//! to the PTX embedded here by scripts/build-ptx.sh) interleaves the byte lanes of float-coded
//! chunks, already in device memory, back into their words. The joined bytes are then checked
//! by [`super::check`] like any decoded chunk.

use libc::c_void;

use super::{Context, Kernel, Stream};
use crate::error::Result;

/// The kernel's PTX, NUL-terminated as `cuModuleLoadData` wants it.
const PTX: &str = concat!(include_str!("kernels/floats.ptx"), "\0");
/// Threads per block, as the kernel is built for (`JOIN_THREADS` in floats.cu).
const THREADS: u32 = 256;

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

/// The loaded kernel.
#[derive(Debug)]
pub struct LaneJoin {
    kernel: Kernel,
}

impl LaneJoin {
    /// Loads the kernel into `ctx`. Fails when the driver lacks the kernel API or cannot
    /// compile the PTX (a driver older than CUDA 13.0).
    pub fn load(ctx: &Context) -> Result<LaneJoin> {
        Ok(LaneJoin { kernel: ctx.load_kernel(PTX, c"join_lanes")? })
    }

    /// Queues the join of `count` jobs stored at device address `jobs` on `stream`.
    ///
    /// # Safety
    /// `jobs` must hold `count` [`LaneJob`]s whose addresses are readable (and, for `dst` and
    /// `joined_len`, writable) device memory, all of it allocated until the kernel has run.
    pub unsafe fn launch(&self, stream: &Stream, jobs: u64, count: u32) -> Result<()> {
        if count == 0 {
            return Ok(());
        }
        let mut jobs = jobs;
        let mut params = [(&mut jobs as *mut u64).cast::<c_void>()];
        stream.launch(&self.kernel, count, THREADS, &mut params)
    }
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
    fn the_ptx_defines_the_kernel_for_the_job_layout() {
        assert!(PTX.contains(".entry join_lanes("), "scripts/build-ptx.sh regenerates the PTX");
        assert!(PTX.ends_with('\0'));
    }
}
