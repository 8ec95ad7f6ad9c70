//! gstore's chunk check on the GPU: the `verify_chunks` kernel (kernels/verify.cu, built to
//! the PTX embedded here by scripts/build-ptx.sh) hashes chunks already in device memory with
//! BLAKE3, compares each with its id, and copies the bytes on to where they belong.
//!
//! The PTX targets compute capability 7.5 and is compiled by the driver when loaded; a driver
//! older than the PTX (CUDA 13.0, driver 580) refuses it, and loads then check on the host.

use libc::c_void;

use super::{Context, Kernel, Stream};
use crate::error::Result;

/// The kernel's PTX, NUL-terminated as `cuModuleLoadData` wants it.
const PTX: &str = concat!(include_str!("kernels/verify.ptx"), "\0");
/// Threads per block, as the kernel is built for (`THREADS` in verify.cu).
const THREADS: u32 = 128;
/// Flag: hash the job's bytes and compare with `expect`.
pub const JOB_HASH: u32 = 1;
/// The value of the failure word while no job has failed.
pub const NO_FAILURE: u32 = u32::MAX;

/// One chunk for the kernel to check and place (`struct Job` in verify.cu).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CheckJob {
    /// Device address of the bytes to hash.
    pub src: u64,
    /// Device address to copy them to; 0 copies nothing.
    pub dst: u64,
    /// Device address of a u64 decoded length that must equal `len`; 0 checks none.
    pub actual_len: u64,
    /// Device address of an i32 decode status that must be 0; 0 checks none.
    pub status: u64,
    /// The chunk's plain length.
    pub len: u32,
    /// What a failure of this job writes to the failure word (the lowest failing tag wins).
    pub tag: u32,
    /// `JOB_*` flags.
    pub flags: u32,
    /// Zero.
    pub reserved: u32,
    /// The expected BLAKE3, as eight little-endian words.
    pub expect: [u32; 8],
}

const _: () = {
    assert!(std::mem::size_of::<CheckJob>() == 80);
    assert!(std::mem::offset_of!(CheckJob, len) == 32);
    assert!(std::mem::offset_of!(CheckJob, expect) == 48);
};

impl CheckJob {
    /// A job hashing `len` bytes at `src` against the 32-byte `id`, copying them to `dst`.
    pub fn new(src: u64, dst: u64, len: u32, tag: u32, id: &[u8; 32]) -> CheckJob {
        let mut expect = [0u32; 8];
        for (w, b) in expect.iter_mut().zip(id.chunks_exact(4)) {
            *w = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        }
        CheckJob { src, dst, actual_len: 0, status: 0, len, tag, flags: JOB_HASH, reserved: 0, expect }
    }

    /// The job as the bytes the kernel reads.
    pub fn as_bytes(&self) -> &[u8; 80] {
        // SAFETY: CheckJob is repr(C), 80 bytes of integers with no padding (asserted above).
        unsafe { &*(self as *const CheckJob).cast::<[u8; 80]>() }
    }
}

/// The loaded kernel.
#[derive(Debug)]
pub struct ChunkCheck {
    kernel: Kernel,
}

impl ChunkCheck {
    /// Loads the kernel into `ctx`. Fails when the driver lacks the kernel API or cannot
    /// compile the PTX (a driver older than CUDA 13.0).
    pub fn load(ctx: &Context) -> Result<ChunkCheck> {
        Ok(ChunkCheck { kernel: ctx.load_kernel(PTX, c"verify_chunks")? })
    }

    /// Queues the check of `count` jobs stored at device address `jobs` on `stream`; a failing
    /// job lowers the u32 at device address `failed` to its tag. With `key`, a chunk's expected
    /// id is its BLAKE3 keyed with it; without, its plain BLAKE3.
    ///
    /// # Safety
    /// `jobs` must hold `count` [`CheckJob`]s whose addresses are readable (and writable where
    /// copied to) device memory, and all of it must stay allocated until the kernel has run.
    pub unsafe fn launch(
        &self,
        stream: &Stream,
        jobs: u64,
        count: u32,
        failed: u64,
        key: Option<&[u8; 32]>,
    ) -> Result<()> {
        if count == 0 {
            return Ok(());
        }
        let (mut jobs, mut failed) = (jobs, failed);
        let mut key = IdKey::new(key);
        let mut params = [
            (&mut jobs as *mut u64).cast::<c_void>(),
            (&mut failed as *mut u64).cast::<c_void>(),
            (&mut key as *mut IdKey).cast::<c_void>(),
        ];
        stream.launch(&self.kernel, count, THREADS, &mut params)
    }
}

/// The kernel's `IdKey` parameter (passed by value): the key's bytes as little-endian words,
/// and whether there is one.
#[repr(C)]
struct IdKey {
    words: [u32; 8],
    keyed: u32,
}

impl IdKey {
    fn new(key: Option<&[u8; 32]>) -> IdKey {
        let mut words = [0u32; 8];
        for (w, b) in words.iter_mut().zip(key.iter().flat_map(|k| k.chunks_exact(4))) {
            *w = u32::from_le_bytes(b.try_into().expect("4 bytes"));
        }
        IdKey { words, keyed: u32::from(key.is_some()) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_carries_the_id_as_little_endian_words() {
        let mut id = [0u8; 32];
        id[0] = 1;
        id[4..8].copy_from_slice(&[0x78, 0x56, 0x34, 0x12]);
        let job = CheckJob::new(0x1000, 0x2000, 65536, 7, &id);
        assert_eq!(job.expect[0], 1);
        assert_eq!(job.expect[1], 0x1234_5678);
        let bytes = job.as_bytes();
        assert_eq!(&bytes[0..8], &0x1000u64.to_le_bytes());
        assert_eq!(&bytes[32..36], &65536u32.to_le_bytes());
        assert_eq!(&bytes[36..40], &7u32.to_le_bytes());
        assert_eq!(&bytes[40..44], &JOB_HASH.to_le_bytes());
        assert_eq!(&bytes[48..52], &1u32.to_le_bytes());
    }

    #[test]
    fn the_ptx_defines_the_kernel_for_the_job_layout() {
        assert!(PTX.contains(".entry verify_chunks("), "scripts/build-ptx.sh regenerates the PTX");
        assert!(PTX.ends_with('\0'));
    }
}
