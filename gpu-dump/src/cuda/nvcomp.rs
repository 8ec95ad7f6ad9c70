//! NVIDIA nvCOMP's batched zstd decoder, loaded at run time when present (like libcuda): many
//! zstd frames decoded on the GPU in one call, so compressed bytes cross PCIe.
//!
//! GPU decoding is opt-in: gstore loads `libnvcomp.so.6` (nvCOMP 6, e.g. from the
//! `nvidia-libnvcomp-cu13` wheel) only from the path in `GSTORE_NVCOMP`. nvCOMP's zstd decoder
//! is documented to handle valid input only, and a damaged frame was seen to make it write
//! outside its output buffer (a GPU fault, or worse, other buffers of the same process
//! overwritten): it is for stores whose packs are trusted, until stored bytes are checked
//! before they are decoded. Frame and block headers are checked on the host before nvCOMP
//! sees a frame, which catches some damage, not all. Nothing of nvCOMP is needed at build
//! time; without it, loads decode on the host, where damage is always refused cleanly.

use std::sync::Arc;

use libc::{c_int, c_void, size_t};
use libloading::Library;

use super::{resolve, Context, Stream};
use crate::error::{GpuDumpError, Result};

/// Environment variable naming the nvCOMP library to load (GPU decoding is off without it).
pub const NVCOMP_ENV: &str = "GSTORE_NVCOMP";

/// `nvcompBatchedZstdDecompressOpts_t`: the backend (0 lets nvCOMP choose) and 60 zero bytes.
#[repr(C)]
#[derive(Clone, Copy)]
struct DecompressOpts {
    backend: c_int,
    reserved: [u8; 60],
}

const DEFAULT_OPTS: DecompressOpts = DecompressOpts { backend: 0, reserved: [0; 60] };

/// `nvcompProperties_t`.
#[repr(C)]
#[derive(Default)]
struct Properties {
    version: u32,
    cudart_version: u32,
}

const _: () = assert!(std::mem::size_of::<DecompressOpts>() == 64);

type GetProperties = unsafe extern "C" fn(props: *mut Properties) -> c_int;
type ZstdDecompressGetTempSize = unsafe extern "C" fn(
    num_chunks: size_t,
    max_uncompressed_chunk_bytes: size_t,
    opts: DecompressOpts,
    temp_bytes: *mut size_t,
    max_total_uncompressed_bytes: size_t,
    stream: *mut c_void,
) -> c_int;
type ZstdDecompressAsync = unsafe extern "C" fn(
    compressed_ptrs: *const *const c_void,
    compressed_bytes: *const size_t,
    uncompressed_buffer_bytes: *const size_t,
    uncompressed_bytes: *mut size_t,
    num_chunks: size_t,
    temp: *mut c_void,
    temp_bytes: size_t,
    uncompressed_ptrs: *const *mut c_void,
    opts: DecompressOpts,
    statuses: *mut c_int,
    stream: *mut c_void,
) -> c_int;

/// The loaded library.
#[derive(Clone)]
pub struct Nvcomp {
    library: String,
    version: u32,
    temp_size: ZstdDecompressGetTempSize,
    decompress: ZstdDecompressAsync,
    /// Keeps the library mapped while the function pointers point into it.
    _lib: Arc<Library>,
}

impl std::fmt::Debug for Nvcomp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Nvcomp").field("library", &self.library).field("version", &self.version).finish()
    }
}

/// Where one batch's arrays live in device memory, `count` entries each.
#[derive(Debug, Clone, Copy)]
pub struct ZstdBatch {
    /// Number of frames.
    pub count: usize,
    /// `count` device addresses of the frames.
    pub compressed_ptrs: u64,
    /// `count` u64 frame lengths.
    pub compressed_bytes: u64,
    /// `count` u64 output capacities.
    pub out_capacity: u64,
    /// `count` u64 decoded lengths, written by the decoder.
    pub out_bytes: u64,
    /// `count` device addresses to decode into.
    pub out_ptrs: u64,
    /// `count` i32 statuses, written by the decoder (0 = decoded).
    pub statuses: u64,
    /// Scratch memory of at least [`Nvcomp::zstd_temp_bytes`] bytes, 8-byte aligned.
    pub temp: u64,
    /// Its size.
    pub temp_bytes: usize,
}

impl Nvcomp {
    /// Loads nvCOMP from the path in `GSTORE_NVCOMP`; unset, GPU decoding is off (see the
    /// module's documentation for why it is opt-in).
    pub fn load() -> Result<Nvcomp> {
        let Some(name) = std::env::var(NVCOMP_ENV).ok().filter(|s| !s.is_empty()) else {
            return Err(GpuDumpError::GpuLibrary {
                library: "nvCOMP".into(),
                detail: format!(
                    "GPU decoding is off; {NVCOMP_ENV}=PATH/libnvcomp.so.6 turns it on for stores whose packs are trusted \
                     (nvCOMP decodes valid input only)"
                ),
            });
        };
        let unavailable = |detail: String| GpuDumpError::GpuLibrary { library: name.clone(), detail };
        // SAFETY: loading nvCOMP runs only its (vendor-supplied) initialisers.
        let lib = unsafe { Library::new(&name) }.map_err(|e| {
            unavailable(format!("{e} (install nvidia-libnvcomp-cu13 and set {NVCOMP_ENV} to its lib64/libnvcomp.so.6)"))
        })?;
        // SAFETY: the type aliases above match nvCOMP 6's C signatures (nvcomp/zstd.h, nvcomp.h).
        let (props, temp_size, decompress) = unsafe {
            (
                resolve::<GetProperties>(&lib, "nvcompGetProperties").map_err(&unavailable)?,
                resolve::<ZstdDecompressGetTempSize>(&lib, "nvcompBatchedZstdDecompressGetTempSize")
                    .map_err(&unavailable)?,
                resolve::<ZstdDecompressAsync>(&lib, "nvcompBatchedZstdDecompressAsync").map_err(&unavailable)?,
            )
        };
        let mut p = Properties::default();
        // SAFETY: a valid out-pointer.
        let status = unsafe { props(&mut p) };
        if status != 0 || p.version / 1000 != 6 {
            return Err(unavailable(format!(
                "reports version {} (status {status}); gstore speaks nvCOMP 6's interface",
                p.version
            )));
        }
        Ok(Nvcomp { library: name, version: p.version, temp_size, decompress, _lib: Arc::new(lib) })
    }

    /// The library loaded and its version, e.g. "libnvcomp.so.6 (nvCOMP 6.0.0)".
    pub fn describe(&self) -> String {
        let v = self.version;
        format!("{} (nvCOMP {}.{}.{})", self.library, v / 1000, v / 100 % 10, v % 100)
    }

    fn failed(&self, call: &str, status: c_int) -> GpuDumpError {
        GpuDumpError::GpuLibrary { library: self.library.clone(), detail: format!("{call} returned status {status}") }
    }

    /// Scratch bytes a batch of up to `max_chunks` frames, each decoding to at most
    /// `max_chunk` bytes and `max_total` bytes together, needs on `ctx`'s device.
    pub fn zstd_temp_bytes(
        &self,
        ctx: &Context,
        max_chunks: usize,
        max_chunk: usize,
        max_total: usize,
    ) -> Result<usize> {
        ctx.bind()?;
        let mut temp: size_t = 0;
        // SAFETY: a valid out-pointer; a null stream is allowed (nothing is queued).
        let status = unsafe {
            (self.temp_size)(max_chunks, max_chunk, DEFAULT_OPTS, &mut temp, max_total, std::ptr::null_mut())
        };
        if status != 0 {
            return Err(self.failed("nvcompBatchedZstdDecompressGetTempSize", status));
        }
        Ok(temp)
    }

    /// Queues the decoding of `batch` on `stream`.
    ///
    /// # Safety
    /// Every address in `batch` must be device memory of `stream`'s context holding (or with
    /// room for) what [`ZstdBatch`] says, and stay allocated until the stream has run the work.
    pub unsafe fn zstd_decompress_async(&self, stream: &Stream, batch: &ZstdBatch) -> Result<()> {
        if batch.count == 0 {
            return Ok(());
        }
        stream.context().bind()?;
        let status = (self.decompress)(
            batch.compressed_ptrs as *const *const c_void,
            batch.compressed_bytes as *const size_t,
            batch.out_capacity as *const size_t,
            batch.out_bytes as *mut size_t,
            batch.count,
            batch.temp as *mut c_void,
            batch.temp_bytes,
            batch.out_ptrs as *const *mut c_void,
            DEFAULT_OPTS,
            batch.statuses as *mut c_int,
            stream.raw(),
        );
        if status != 0 {
            return Err(self.failed("nvcompBatchedZstdDecompressAsync", status));
        }
        Ok(())
    }
}
