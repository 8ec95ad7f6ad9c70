//! A binding to the CUDA driver (libcuda) loaded at run time: device queries and the process
//! checkpoint API (driver >= 570 / CUDA 12.8). Nothing of CUDA is needed at build time; on a
//! machine without the driver [`CudaDriver::load`] returns [`GpuDumpError::NoCudaDriver`].
//!
//! The CUDA 13.4 custom-storage path (checkpoint data handed over as device memory, finished
//! by `cuCheckpointOperationComplete`) is not implemented; it would add its own symbol, resolved
//! optionally, and its own args structs in [`ffi`].
//!
//! For a restore engine that fills GPU memory itself, [`CudaDriver::context`] opens the memory
//! API: [`Context`] (a device's primary context), [`DeviceBuffer`], [`PinnedBuffer`],
//! [`Stream`] and [`Event`]. Its symbols are resolved optionally, so a driver without them
//! still serves the checkpoint API. [`Context::load_kernel`] and the stream's kernel launches,
//! fills and device copies are optional the same way; [`check`] (BLAKE3 of chunks in VRAM) and
//! [`join`] (float lanes back into words) are gstore's own kernels, and [`nvcomp`] NVIDIA's
//! batched GPU decoder, loaded at run time when present.

pub mod ffi;
mod kernel;
pub mod load;
mod memory;
pub mod nvcomp;
pub mod state;

use std::ffi::CStr;
use std::sync::{Arc, OnceLock};

use libc::{c_char, c_int, c_uint};
use libloading::Library;

use crate::error::{GpuDumpError, Result};
use ffi::CuResult;
pub use kernel::Kernel;
pub use memory::{Context, DeviceBuffer, Event, HostMemory, IpcBuffer, IpcHandle, PinnedBuffer, Stream};
pub use state::ProcessState;

/// The library names tried by [`CudaDriver::load`], in order.
pub const LIBCUDA_NAMES: [&str; 2] = ["libcuda.so.1", "libcuda.so"];

/// A GPU as the driver describes it (the format crate's record: images list their capturing
/// machine's GPUs in it).
pub use gstore_format::meta::GpuInfo;

/// Formats a UUID's 16 bytes as `nvidia-smi` does: `GPU-` and 8-4-4-4-12 hex digits.
pub fn format_uuid(bytes: &[u8; 16]) -> String {
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!("GPU-{}-{}-{}-{}-{}", &hex[..8], &hex[8..12], &hex[12..16], &hex[16..20], &hex[20..])
}

/// Reads a UUID written as [`format_uuid`] does (the `GPU-` prefix optional, any case).
pub fn parse_uuid(text: &str) -> Option<[u8; 16]> {
    let body = text.strip_prefix("GPU-").unwrap_or(text);
    let groups: Vec<&str> = body.split('-').collect();
    if groups.iter().map(|g| g.len()).collect::<Vec<_>>() != [8, 4, 4, 4, 12] {
        return None;
    }
    let hex: String = groups.concat();
    let mut out = [0u8; 16];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

/// The driver entry points gstore uses, resolved once at load.
struct Api {
    init: ffi::CuInit,
    driver_get_version: ffi::CuDriverGetVersion,
    device_get_count: ffi::CuDeviceGetCount,
    device_get: ffi::CuDeviceGet,
    device_get_name: ffi::CuDeviceGetName,
    device_total_mem: ffi::CuDeviceTotalMem,
    device_get_uuid: ffi::CuDeviceGetUuid,
    get_error_name: ffi::CuGetErrorText,
    get_error_string: ffi::CuGetErrorText,
    get_state: ffi::CuCheckpointProcessGetState,
    lock: ffi::CuCheckpointProcessLock,
    checkpoint: ffi::CuCheckpointProcessCheckpoint,
    restore: ffi::CuCheckpointProcessRestore,
    unlock: ffi::CuCheckpointProcessUnlock,
    get_restore_thread_id: ffi::CuCheckpointProcessGetRestoreThreadId,
}

/// The loaded CUDA driver. Safe to share between threads (the driver API is thread-safe).
pub struct CudaDriver {
    api: Api,
    library: String,
    /// The result of the one `cuInit(0)` this controller makes.
    init_result: OnceLock<CuResult>,
    /// The memory API, or the first of its symbols the library lacks (and the loader's message).
    memory: std::result::Result<memory::MemApi, (&'static str, String)>,
    /// The kernel entry points, or the first of them the library lacks.
    kernels: std::result::Result<kernel::KernelApi, (&'static str, String)>,
    /// Keeps the library mapped while `api` (and any [`Context`], which holds a clone) points
    /// into it.
    lib: Arc<Library>,
}

impl std::fmt::Debug for CudaDriver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaDriver").field("library", &self.library).finish_non_exhaustive()
    }
}

/// Resolves `name` in `lib` as a function pointer of type `T`.
///
/// # Safety
/// `T` must be the symbol's true C signature.
unsafe fn resolve<T: Copy>(lib: &Library, name: &str) -> std::result::Result<T, String> {
    lib.get::<T>(name.as_bytes()).map(|symbol| *symbol).map_err(|e| e.to_string())
}

impl CudaDriver {
    /// Loads the driver: `libcuda.so.1`, else `libcuda.so`.
    pub fn load() -> Result<Self> {
        Self::load_from(&LIBCUDA_NAMES)
    }

    /// Loads the first of `names` (library names or paths) that the dynamic loader accepts.
    pub fn load_from(names: &[&str]) -> Result<Self> {
        let mut failures = Vec::new();
        for name in names {
            // SAFETY: loading libcuda runs only its (trusted, driver-supplied) initialisers.
            match unsafe { Library::new(name) } {
                Ok(lib) => return Self::bind(lib, name),
                Err(e) => failures.push(e.to_string()),
            }
        }
        let detail = if failures.is_empty() { "no library names given".to_string() } else { failures.join("; ") };
        Err(GpuDumpError::NoCudaDriver { detail })
    }

    fn bind(lib: Library, library: &str) -> Result<Self> {
        macro_rules! basic {
            ($name:literal) => {
                // SAFETY: the type alias in ffi matches the documented C signature of $name.
                unsafe { resolve(&lib, $name) }.map_err(|detail| GpuDumpError::CudaSymbol {
                    library: library.to_string(),
                    symbol: $name,
                    detail,
                })?
            };
        }
        macro_rules! checkpoint {
            ($name:literal) => {
                // SAFETY: the type alias in ffi matches the documented C signature of $name.
                unsafe { resolve(&lib, $name) }
                    .map_err(|_| GpuDumpError::DriverTooOld { library: library.to_string(), symbol: $name })?
            };
        }
        let api = Api {
            init: basic!("cuInit"),
            driver_get_version: basic!("cuDriverGetVersion"),
            device_get_count: basic!("cuDeviceGetCount"),
            device_get: basic!("cuDeviceGet"),
            device_get_name: basic!("cuDeviceGetName"),
            device_total_mem: basic!("cuDeviceTotalMem_v2"),
            device_get_uuid: basic!("cuDeviceGetUuid_v2"),
            get_error_name: basic!("cuGetErrorName"),
            get_error_string: basic!("cuGetErrorString"),
            get_state: checkpoint!("cuCheckpointProcessGetState"),
            lock: checkpoint!("cuCheckpointProcessLock"),
            checkpoint: checkpoint!("cuCheckpointProcessCheckpoint"),
            restore: checkpoint!("cuCheckpointProcessRestore"),
            unlock: checkpoint!("cuCheckpointProcessUnlock"),
            get_restore_thread_id: checkpoint!("cuCheckpointProcessGetRestoreThreadId"),
        };
        let memory = memory::MemApi::resolve(&lib);
        let kernels = kernel::KernelApi::resolve(&lib);
        Ok(CudaDriver {
            api,
            library: library.to_string(),
            init_result: OnceLock::new(),
            memory,
            kernels,
            lib: Arc::new(lib),
        })
    }

    /// The library name or path that was loaded.
    pub fn library(&self) -> &str {
        &self.library
    }

    /// The CUDA version the driver supports, as (major, minor), e.g. (13, 0).
    pub fn driver_version(&self) -> Result<(u32, u32)> {
        let mut version: c_int = 0;
        // SAFETY: a valid out-pointer to an int.
        let code = unsafe { (self.api.driver_get_version)(&mut version) };
        self.check(code, || "cuDriverGetVersion".to_string())?;
        Ok(split_version(version))
    }

    /// The devices this process can see (initialises the driver on first use).
    pub fn devices(&self) -> Result<Vec<GpuInfo>> {
        self.init()?;
        let mut count: c_int = 0;
        // SAFETY: a valid out-pointer to an int.
        let code = unsafe { (self.api.device_get_count)(&mut count) };
        self.check(code, || "cuDeviceGetCount".to_string())?;
        (0..count.max(0)).map(|ordinal| self.device(ordinal)).collect()
    }

    fn device(&self, ordinal: c_int) -> Result<GpuInfo> {
        let mut device: ffi::CuDevice = 0;
        // SAFETY: a valid out-pointer; the ordinal is below cuDeviceGetCount.
        let code = unsafe { (self.api.device_get)(&mut device, ordinal) };
        self.check(code, || format!("cuDeviceGet({ordinal})"))?;
        let mut name = [0 as c_char; 256];
        // SAFETY: the buffer holds `len` bytes; the driver NUL-terminates within them.
        let code = unsafe { (self.api.device_get_name)(name.as_mut_ptr(), name.len() as c_int, device) };
        self.check(code, || format!("cuDeviceGetName({ordinal})"))?;
        let mut bytes: libc::size_t = 0;
        // SAFETY: a valid out-pointer to a size_t.
        let code = unsafe { (self.api.device_total_mem)(&mut bytes, device) };
        self.check(code, || format!("cuDeviceTotalMem_v2({ordinal})"))?;
        let mut uuid = ffi::CuUuid::default();
        // SAFETY: a valid out-pointer to a 16-byte CUuuid.
        let code = unsafe { (self.api.device_get_uuid)(&mut uuid, device) };
        self.check(code, || format!("cuDeviceGetUuid_v2({ordinal})"))?;
        // SAFETY: the buffer is NUL-terminated (zero-filled, the driver writes at most len bytes).
        let name = unsafe { CStr::from_ptr(name.as_ptr()) }.to_string_lossy().into_owned();
        Ok(GpuInfo { index: ordinal as u32, name, total_mem_bytes: bytes as u64, uuid: Some(format_uuid(&uuid.bytes)) })
    }

    /// The checkpoint state of process `pid`.
    pub fn state(&self, pid: u32) -> Result<ProcessState> {
        self.init()?;
        let mut raw: c_int = 0;
        // SAFETY: a valid out-pointer to an int (CUprocessState is a C enum, int-sized).
        let code = unsafe { (self.api.get_state)(pid as c_int, &mut raw) };
        self.check(code, || format!("cuCheckpointProcessGetState(pid {pid})"))?;
        Ok(ProcessState::from_raw(raw))
    }

    /// Locks `pid`'s CUDA API (RUNNING → LOCKED), waiting up to `timeout_ms` (0: no limit)
    /// for submitted work to finish; on timeout the process stays RUNNING.
    pub fn lock(&self, pid: u32, timeout_ms: u32) -> Result<()> {
        self.init()?;
        let mut args = ffi::LockArgs { timeout_ms, ..ffi::LockArgs::default() };
        // SAFETY: a valid pointer to a 64-byte args struct with zeroed reserved fields.
        let code = unsafe { (self.api.lock)(pid as c_int, &mut args) };
        self.check(code, || format!("cuCheckpointProcessLock(pid {pid})"))
    }

    /// Moves `pid`'s GPU memory into its host memory and releases its GPUs
    /// (LOCKED → CHECKPOINTED).
    pub fn checkpoint(&self, pid: u32) -> Result<()> {
        self.init()?;
        let mut args = ffi::CheckpointArgs::default();
        // SAFETY: a valid pointer to a zeroed 64-byte args struct.
        let code = unsafe { (self.api.checkpoint)(pid as c_int, &mut args) };
        self.check(code, || format!("cuCheckpointProcessCheckpoint(pid {pid})"))
    }

    /// Re-acquires `pid`'s GPUs and copies its memory back (CHECKPOINTED → LOCKED): onto the
    /// GPUs it was checkpointed from when `pairs` is empty, else each pair's `old` GPU onto its
    /// `new` one (CUDA 13.0 and later).
    pub fn restore(&self, pid: u32, pairs: &[ffi::GpuPair]) -> Result<()> {
        self.init()?;
        let mut pairs = pairs.to_vec();
        let mut args = ffi::RestoreArgs::default();
        if !pairs.is_empty() {
            args.gpu_pairs = pairs.as_mut_ptr();
            args.gpu_pairs_count = pairs.len() as c_uint;
        }
        // SAFETY: a valid pointer to a 64-byte args struct with zeroed reserved fields, whose
        // pair pointer (if any) points to `gpu_pairs_count` pairs that outlive the call.
        let code = unsafe { (self.api.restore)(pid as c_int, &mut args) };
        self.check(code, || format!("cuCheckpointProcessRestore(pid {pid})"))
    }

    /// Unlocks `pid`'s CUDA API (LOCKED → RUNNING).
    pub fn unlock(&self, pid: u32) -> Result<()> {
        self.init()?;
        let mut args = ffi::UnlockArgs::default();
        // SAFETY: a valid pointer to a zeroed 64-byte args struct.
        let code = unsafe { (self.api.unlock)(pid as c_int, &mut args) };
        self.check(code, || format!("cuCheckpointProcessUnlock(pid {pid})"))
    }

    /// The thread id of `pid`'s CUDA restore thread.
    pub fn restore_thread_id(&self, pid: u32) -> Result<u32> {
        self.init()?;
        let mut tid: c_int = 0;
        // SAFETY: a valid out-pointer to an int.
        let code = unsafe { (self.api.get_restore_thread_id)(pid as c_int, &mut tid) };
        self.check(code, || format!("cuCheckpointProcessGetRestoreThreadId(pid {pid})"))?;
        Ok(tid as u32)
    }

    /// Initialises the driver in this (controller) process with `cuInit(0)`, once; later calls
    /// return the first result. Every GPU method does this itself, and restore needs it (or
    /// persistence mode); call it early to take its cost (seconds on big machines) off the
    /// critical path.
    pub fn init(&self) -> Result<()> {
        // SAFETY: cuInit takes a flags word that must be 0.
        let code = *self.init_result.get_or_init(|| unsafe { (self.api.init)(0) });
        self.check(code, || "cuInit(0)".to_string())
    }

    fn check(&self, code: CuResult, call: impl FnOnce() -> String) -> Result<()> {
        if code == ffi::CUDA_SUCCESS {
            return Ok(());
        }
        Err(self.error_texts().error(code, call(), hint_for(code)))
    }

    /// The driver's error-text entry points, for errors raised away from the driver object.
    fn error_texts(&self) -> ErrorTexts {
        ErrorTexts { name: self.api.get_error_name, string: self.api.get_error_string }
    }
}

/// `cuGetErrorName` and `cuGetErrorString`, to turn a `CUresult` into a [`GpuDumpError::Cuda`].
#[derive(Clone, Copy)]
struct ErrorTexts {
    name: ffi::CuGetErrorText,
    string: ffi::CuGetErrorText,
}

impl ErrorTexts {
    /// The error for a failed `call` that returned `code`.
    fn error(&self, code: CuResult, call: String, hint: &'static str) -> GpuDumpError {
        GpuDumpError::Cuda {
            call,
            code,
            name: error_text(self.name, code).unwrap_or_else(|| "CUDA_ERROR_UNKNOWN".into()),
            description: error_text(self.string, code).unwrap_or_else(|| "unrecognized error code".into()),
            hint,
        }
    }
}

fn error_text(get: ffi::CuGetErrorText, code: CuResult) -> Option<String> {
    let mut text: *const c_char = std::ptr::null();
    // SAFETY: a valid out-pointer; on success the driver points it at a static C string.
    let status = unsafe { get(code, &mut text) };
    if status != ffi::CUDA_SUCCESS || text.is_null() {
        return None;
    }
    // SAFETY: non-null and NUL-terminated (static string owned by the driver).
    Some(unsafe { CStr::from_ptr(text) }.to_string_lossy().into_owned())
}

/// Splits a `cuDriverGetVersion` number (1000 × major + 10 × minor) into (major, minor).
pub fn split_version(version: i32) -> (u32, u32) {
    let version = version.max(0) as u32;
    (version / 1000, (version % 1000) / 10)
}

/// Advice for CUDA error codes that the checkpoint path meets in practice.
fn hint_for(code: CuResult) -> &'static str {
    match code {
        1 => "; check that the pid is a live process that has initialised CUDA",
        2 => "; not enough free GPU memory to bring the process back",
        3 => "; the process holds no CUDA context (it maps libcuda but never initialised CUDA): the driver keeps no GPU state of it",
        100 => "; this machine has no CUDA device the driver can use (check CUDA_VISIBLE_DEVICES and nvidia-smi)",
        304 => "; an OS call inside the driver failed; a process whose GPU restore failed before cannot be recovered and must be killed",
        401 => "; the process is not in the state this step needs; if it was just starting CUDA, retry",
        600 => "; the process did not reach a point where it could be locked in time (it keeps running); retry or raise the lock timeout",
        801 => "; this process cannot be checkpointed by the driver (MIG, MPS, managed/UVM or IPC memory, or an unsupported GPU)",
        _ => "",
    }
}

/// True when process `pid` has libcuda mapped, i.e. it has initialised the CUDA driver and may
/// hold GPU state. False for CPU-only processes and when `/proc/PID/maps` cannot be read.
pub fn process_uses_cuda(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/maps")).map(|maps| maps_mention_libcuda(&maps)).unwrap_or(false)
}

/// True when a `/proc/PID/maps` text maps a file named `libcuda.so*`.
fn maps_mention_libcuda(maps: &str) -> bool {
    maps.lines()
        .filter_map(|line| line.split_whitespace().nth(5))
        .any(|path| path.rsplit('/').next().is_some_and(|file| file.starts_with("libcuda.so")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn load_without_driver_is_a_clear_error() {
        if std::path::Path::new("/proc/driver/nvidia").exists() {
            // A GPU machine: the driver must load and answer instead.
            let driver = CudaDriver::load().expect("the NVIDIA driver is installed here");
            assert!(driver.driver_version().expect("version").0 >= 12);
            return;
        }
        let err = CudaDriver::load().expect_err("no libcuda on this machine");
        let msg = err.to_string();
        assert!(matches!(err, GpuDumpError::NoCudaDriver { .. }), "{err:?}");
        assert!(msg.starts_with("no CUDA driver (libcuda.so.1) found: "), "{msg}");
        assert!(msg.contains("libcuda.so.1:") && msg.contains("libcuda.so:"), "both names tried: {msg}");
    }

    #[test]
    fn load_of_a_library_without_cuda_symbols_names_the_symbol() {
        // libc is a real shared library but not a CUDA driver.
        let err = CudaDriver::load_from(&["libc.so.6"]).expect_err("libc is no driver");
        match &err {
            GpuDumpError::CudaSymbol { symbol, library, .. } => {
                assert_eq!(*symbol, "cuInit");
                assert_eq!(library, "libc.so.6");
            }
            other => panic!("unexpected error {other:?}"),
        }
        assert!(err.to_string().contains("libc.so.6 lacks cuInit"), "{err}");
        let err = CudaDriver::load_from(&[]).expect_err("nothing to load");
        assert!(err.to_string().contains("no library names given"), "{err}");
    }

    #[test]
    fn process_state_mapping() {
        assert_eq!(ProcessState::from_raw(0), ProcessState::Running);
        assert_eq!(ProcessState::from_raw(1), ProcessState::Locked);
        assert_eq!(ProcessState::from_raw(2), ProcessState::Checkpointed);
        assert_eq!(ProcessState::from_raw(3), ProcessState::Failed);
        assert_eq!(ProcessState::from_raw(5), ProcessState::Other(5));
        assert_eq!(ProcessState::from_raw(-1), ProcessState::Other(-1));
        assert_eq!(ProcessState::Checkpointed.to_string(), "checkpointed");
        assert_eq!(ProcessState::Other(4).to_string(), "state 4");
    }

    #[test]
    fn driver_version_split() {
        assert_eq!(split_version(13000), (13, 0));
        assert_eq!(split_version(12080), (12, 8));
        assert_eq!(split_version(12020), (12, 2));
        assert_eq!(split_version(-5), (0, 0));
    }

    #[test]
    fn libcuda_detection_in_maps() {
        let gpu =
            "7f0000000000-7f0000100000 r-xp 00000000 08:01 1234   /usr/lib/x86_64-linux-gnu/libcuda.so.580.159.04\n";
        let runtime_only = "7f0000000000-7f0000100000 r-xp 00000000 08:01 1234   /opt/lib/libcudart.so.12\n\
                            7f0000200000-7f0000300000 rw-p 00000000 00:00 0 \n";
        assert!(maps_mention_libcuda(gpu));
        assert!(!maps_mention_libcuda(runtime_only));
        assert!(!maps_mention_libcuda(""));
        // This test process does not use CUDA; a pid that does not exist does not either.
        assert!(!process_uses_cuda(std::process::id()));
        assert!(!process_uses_cuda(u32::MAX));
    }

    #[test]
    fn error_hints_cover_lock_timeout() {
        assert!(hint_for(600).contains("lock timeout"));
        assert_eq!(hint_for(12345), "");
    }
}
