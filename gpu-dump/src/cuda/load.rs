//! gstore's load kernel on the GPU (`load_chunks` in kernels/load.cu, built to the fatbin
//! embedded here by scripts/build-kernels.sh): for every chunk of a range read already in
//! device memory, in one launch, one thread block decodes it where the GPU can (a float-coded
//! chunk's Huffman lanes, then its lanes joined into words), hashes it with BLAKE3, compares
//! the hash with its id and copies the bytes on to where they belong.
//!
//! The fatbin holds machine code for compute capability 8.0, 9.0 and 10.0, loaded as it is, and
//! PTX for 7.5, which the driver compiles for other GPUs when loaded; a driver older than the
//! fatbin (CUDA 13.0, driver 580) refuses it, and loads then check on the host.

use libc::c_void;

use super::{Context, Kernel, Stream};
use crate::error::Result;

/// Bytes aligned as `A` (the driver reads a fatbin's header in 8-byte words).
#[repr(C)]
struct AlignedAs<A, B: ?Sized> {
    _align: [A; 0],
    bytes: B,
}

static ALIGNED: &AlignedAs<u64, [u8]> = &AlignedAs { _align: [], bytes: *include_bytes!("kernels/load.fatbin") };

/// The kernel's fatbin.
const FATBIN: &[u8] = &ALIGNED.bytes;
/// Threads per block, as the kernel is built for (`THREADS` in load.cu).
const THREADS: u32 = 128;
/// Flag: hash the job's bytes and compare with `expect`.
pub const JOB_HASH: u32 = 1;
/// The value of the failure word while no job has failed.
pub const NO_FAILURE: u32 = u32::MAX;

/// One chunk for the kernel to check and place (`struct Job` in load.cu).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CheckJob {
    /// Device address of the bytes to hash; a float-coded chunk's lanes are joined here first.
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
    /// 1 + the index of the chunk's [`LaneJob`] (a float-coded chunk the GPU decodes), or 0.
    pub lanes: u32,
    /// The expected BLAKE3, as eight little-endian words.
    pub expect: [u32; 8],
}

const _: () = {
    assert!(std::mem::size_of::<CheckJob>() == 80);
    assert!(std::mem::offset_of!(CheckJob, len) == 32);
    assert!(std::mem::offset_of!(CheckJob, lanes) == 44);
    assert!(std::mem::offset_of!(CheckJob, expect) == 48);
};

impl CheckJob {
    /// A job hashing `len` bytes at `src` against the 32-byte `id`, copying them to `dst`.
    pub fn new(src: u64, dst: u64, len: u32, tag: u32, id: &[u8; 32]) -> CheckJob {
        let mut expect = [0u32; 8];
        for (w, b) in expect.iter_mut().zip(id.chunks_exact(4)) {
            *w = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        }
        CheckJob { src, dst, actual_len: 0, status: 0, len, tag, flags: JOB_HASH, lanes: 0, expect }
    }

    /// The job as the bytes the kernel reads.
    pub fn as_bytes(&self) -> &[u8; 80] {
        // SAFETY: CheckJob is repr(C), 80 bytes of integers with no padding (asserted above).
        unsafe { &*(self as *const CheckJob).cast::<[u8; 80]>() }
    }
}

/// The lanes of one float-coded chunk for the kernel to decode and join into its job's `src`
/// (`struct LaneJob` in load.cu).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LaneJob {
    /// Device address of each lane's `words` decoded bytes (the first `width` are used): a raw
    /// lane's stored bytes, where nvCOMP decodes a zstd lane, where the kernel decodes a
    /// Huffman lane.
    pub lane: [u64; 4],
    /// Device address of a zstd lane's u64 decoded length, which must equal `words`; else 0.
    pub lane_len: [u64; 4],
    /// Device address of a zstd lane's i32 decode status, which must be 0; else 0.
    pub lane_status: [u64; 4],
    /// Device address of a Huffman lane's stored bytes; else 0.
    pub huff: [u64; 4],
    /// A Huffman lane's stored length.
    pub huff_len: [u32; 4],
    /// Device address of the `tail_len` bytes past the last whole word.
    pub tail: u64,
    /// Words per lane.
    pub words: u32,
    /// Bytes per word: 2 or 4.
    pub width: u16,
    /// Plain length modulo `width`.
    pub tail_len: u16,
}

const _: () = {
    assert!(std::mem::size_of::<LaneJob>() == 160);
    assert!(std::mem::offset_of!(LaneJob, huff) == 96);
    assert!(std::mem::offset_of!(LaneJob, huff_len) == 128);
    assert!(std::mem::offset_of!(LaneJob, tail) == 144);
    assert!(std::mem::offset_of!(LaneJob, words) == 152);
};

impl LaneJob {
    /// The job as the bytes the kernel reads.
    pub fn as_bytes(&self) -> &[u8; 160] {
        // SAFETY: LaneJob is repr(C), 160 bytes of integers with no padding (asserted above).
        unsafe { &*(self as *const LaneJob).cast::<[u8; 160]>() }
    }
}

/// The loaded kernel.
#[derive(Debug)]
pub struct ChunkLoad {
    kernel: Kernel,
}

impl ChunkLoad {
    /// Loads the kernel into `ctx`. Fails when the driver lacks the kernel API or cannot
    /// load the fatbin (a driver older than CUDA 13.0).
    pub fn load(ctx: &Context) -> Result<ChunkLoad> {
        Ok(ChunkLoad { kernel: ctx.load_kernel(FATBIN, c"load_chunks")? })
    }

    /// Queues the `count` jobs stored at device address `jobs` on `stream`, their lane jobs at
    /// `lane_jobs`; a failing job lowers the u32 at device address `failed` to its tag. With
    /// `key`, a chunk's expected id is its BLAKE3 keyed with it; without, its plain BLAKE3.
    ///
    /// # Safety
    /// `jobs` must hold `count` [`CheckJob`]s, and `lane_jobs` every [`LaneJob`] they name,
    /// whose addresses are readable (and writable where decoded, joined or copied to) device
    /// memory, and all of it must stay allocated until the kernel has run.
    pub unsafe fn launch(
        &self,
        stream: &Stream,
        jobs: u64,
        lane_jobs: u64,
        count: u32,
        failed: u64,
        key: Option<&[u8; 32]>,
    ) -> Result<()> {
        if count == 0 {
            return Ok(());
        }
        let (mut jobs, mut lane_jobs, mut failed) = (jobs, lane_jobs, failed);
        let mut key = IdKey::new(key);
        let mut params = [
            (&mut jobs as *mut u64).cast::<c_void>(),
            (&mut lane_jobs as *mut u64).cast::<c_void>(),
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
        let job = CheckJob { lanes: 3, ..CheckJob::new(0x1000, 0x2000, 65536, 7, &id) };
        assert_eq!(job.expect[0], 1);
        assert_eq!(job.expect[1], 0x1234_5678);
        let bytes = job.as_bytes();
        assert_eq!(&bytes[0..8], &0x1000u64.to_le_bytes());
        assert_eq!(&bytes[32..36], &65536u32.to_le_bytes());
        assert_eq!(&bytes[36..40], &7u32.to_le_bytes());
        assert_eq!(&bytes[40..44], &JOB_HASH.to_le_bytes());
        assert_eq!(&bytes[44..48], &3u32.to_le_bytes());
        assert_eq!(&bytes[48..52], &1u32.to_le_bytes());
    }

    #[test]
    fn a_lane_job_is_laid_out_as_the_kernel_reads_it() {
        let job = LaneJob {
            lane: [1, 2, 0, 0],
            lane_len: [0, 0x20, 0, 0],
            huff: [0x60, 0, 0, 0],
            huff_len: [0x70, 0, 0, 0],
            tail: 0x30,
            words: 32768,
            width: 2,
            tail_len: 1,
            ..LaneJob::default()
        };
        let b = job.as_bytes();
        assert_eq!(&b[8..16], &2u64.to_le_bytes());
        assert_eq!(&b[40..48], &0x20u64.to_le_bytes());
        assert_eq!(&b[96..104], &0x60u64.to_le_bytes());
        assert_eq!(&b[128..132], &0x70u32.to_le_bytes());
        assert_eq!(&b[144..152], &0x30u64.to_le_bytes());
        assert_eq!(&b[152..156], &32768u32.to_le_bytes());
        assert_eq!(&b[156..158], &2u16.to_le_bytes());
        assert_eq!(&b[158..160], &1u16.to_le_bytes());
    }

    #[test]
    fn the_fatbin_is_one_and_names_the_kernel() {
        assert_eq!(FATBIN.as_ptr() as usize % 8, 0);
        assert_eq!(&FATBIN[..4], &0xBA55_ED50u32.to_le_bytes(), "scripts/build-kernels.sh regenerates it");
        assert!(FATBIN.windows(11).any(|w| w == b"load_chunks"));
    }
}
