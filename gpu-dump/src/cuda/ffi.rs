//! Raw types of the CUDA driver API that gstore calls, as the C headers define them.
//!
//! Only what the checkpoint path needs. Every checkpoint argument struct is 64 bytes in every
//! CUDA release; each gets its own type (rather than one shared "64 reserved bytes" type) so the
//! CUDA 13.4 custom-storage fields (`customStorageInfo_out` in the checkpoint and restore args)
//! can later be added to exactly the structs that carry them, with the layout asserts below
//! guarding the change.
//!
//! The memory API types and entry points at the end serve [`super::Context`] (a restore
//! engine filling GPU memory).

use libc::{c_char, c_int, c_uint, c_void, size_t};

/// `CUresult`: 0 is `CUDA_SUCCESS`, anything else an error code.
pub type CuResult = c_int;
/// `CUdevice`: a device ordinal handle.
pub type CuDevice = c_int;

/// `CUDA_SUCCESS`.
pub const CUDA_SUCCESS: CuResult = 0;
/// `CUDA_ERROR_INVALID_VALUE`.
pub const CUDA_ERROR_INVALID_VALUE: CuResult = 1;
/// `CUDA_ERROR_OUT_OF_MEMORY`.
pub const CUDA_ERROR_OUT_OF_MEMORY: CuResult = 2;
/// `CUDA_ERROR_INVALID_CONTEXT`.
pub const CUDA_ERROR_INVALID_CONTEXT: CuResult = 201;

/// `CUdeviceptr`: a device address (64-bit on every platform gstore supports).
pub type CuDevicePtr = u64;
/// `CUcontext`: an opaque context handle.
pub type CuContext = *mut c_void;
/// `CUstream`: an opaque stream handle (null is the legacy default stream).
pub type CuStream = *mut c_void;
/// `CUevent`: an opaque event handle.
pub type CuEvent = *mut c_void;

/// `CU_STREAM_NON_BLOCKING`: the stream does not synchronise with the legacy default stream.
pub const CU_STREAM_NON_BLOCKING: c_uint = 1;
/// `CU_EVENT_DISABLE_TIMING`: the event records no timestamp (cheaper to record and wait on).
pub const CU_EVENT_DISABLE_TIMING: c_uint = 2;

/// `CUcheckpointLockArgs` (CUDA 12.8 and later).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LockArgs {
    /// Milliseconds to wait for the lock; 0 waits forever. On expiry the process stays RUNNING.
    pub timeout_ms: c_uint,
    /// Must be zero.
    pub reserved0: c_uint,
    /// Must be zero.
    pub reserved1: [u64; 7],
}

/// `CUcheckpointCheckpointArgs` up to CUDA 13.3 (all reserved). In 13.4 the first 8 bytes
/// become `customStorageInfo_out`; zero (NULL) still means "checkpoint into host memory".
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CheckpointArgs {
    /// Must be zero.
    pub reserved: [u64; 8],
}

/// `CUuuid`: a GPU's 16-byte UUID.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CuUuid {
    /// The UUID's bytes, in the order `nvidia-smi` prints them.
    pub bytes: [u8; 16],
}

/// `CUcheckpointGpuPair` (CUDA 13.0 and later): restore what was on GPU `old` onto GPU `new`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GpuPair {
    /// The GPU that was checkpointed.
    pub old: CuUuid,
    /// The GPU to restore onto.
    pub new: CuUuid,
}

/// `CUcheckpointRestoreArgs`. In every version from CUDA 13.0 on, `gpuPairs` sits at offset 0
/// and `gpuPairsCount` at 8; what follows is reserved up to 13.3 and holds 13.4's custom
/// storage pointer at 16, which zero (NULL) leaves off. Up to CUDA 12.8 the whole struct is
/// reserved, so only an all-zero struct ("restore onto the same GPUs") is valid there.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RestoreArgs {
    /// The GPU pairs, or null for none.
    pub gpu_pairs: *mut GpuPair,
    /// How many pairs `gpu_pairs` points to.
    pub gpu_pairs_count: c_uint,
    /// Must be zero.
    pub reserved0: c_uint,
    /// Must be zero.
    pub reserved: [u64; 6],
}

impl Default for RestoreArgs {
    fn default() -> Self {
        RestoreArgs { gpu_pairs: std::ptr::null_mut(), gpu_pairs_count: 0, reserved0: 0, reserved: [0; 6] }
    }
}

/// `CUcheckpointUnlockArgs` (all reserved in every version).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UnlockArgs {
    /// Must be zero.
    pub reserved: [u64; 8],
}

const _: () = {
    assert!(std::mem::size_of::<LockArgs>() == 64);
    assert!(std::mem::offset_of!(LockArgs, timeout_ms) == 0);
    assert!(std::mem::offset_of!(LockArgs, reserved0) == 4);
    assert!(std::mem::offset_of!(LockArgs, reserved1) == 8);
    assert!(std::mem::size_of::<CheckpointArgs>() == 64);
    assert!(std::mem::size_of::<RestoreArgs>() == 64);
    assert!(std::mem::offset_of!(RestoreArgs, gpu_pairs) == 0);
    assert!(std::mem::offset_of!(RestoreArgs, gpu_pairs_count) == 8);
    assert!(std::mem::offset_of!(RestoreArgs, reserved0) == 12);
    assert!(std::mem::size_of::<GpuPair>() == 32);
    assert!(std::mem::offset_of!(GpuPair, new) == 16);
    assert!(std::mem::size_of::<UnlockArgs>() == 64);
};

/// `cuInit(unsigned int flags)`.
pub type CuInit = unsafe extern "C" fn(flags: c_uint) -> CuResult;
/// `cuDriverGetVersion(int *version)`.
pub type CuDriverGetVersion = unsafe extern "C" fn(version: *mut c_int) -> CuResult;
/// `cuDeviceGetCount(int *count)`.
pub type CuDeviceGetCount = unsafe extern "C" fn(count: *mut c_int) -> CuResult;
/// `cuDeviceGet(CUdevice *device, int ordinal)`.
pub type CuDeviceGet = unsafe extern "C" fn(device: *mut CuDevice, ordinal: c_int) -> CuResult;
/// `cuDeviceGetName(char *name, int len, CUdevice dev)`.
pub type CuDeviceGetName = unsafe extern "C" fn(name: *mut c_char, len: c_int, dev: CuDevice) -> CuResult;
/// `cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)`.
pub type CuDeviceTotalMem = unsafe extern "C" fn(bytes: *mut size_t, dev: CuDevice) -> CuResult;
/// `cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev)`.
pub type CuDeviceGetUuid = unsafe extern "C" fn(uuid: *mut CuUuid, dev: CuDevice) -> CuResult;
/// `cuGetErrorName` / `cuGetErrorString(CUresult error, const char **str)`.
pub type CuGetErrorText = unsafe extern "C" fn(error: CuResult, text: *mut *const c_char) -> CuResult;
/// `cuCheckpointProcessGetState(int pid, CUprocessState *state)`.
pub type CuCheckpointProcessGetState = unsafe extern "C" fn(pid: c_int, state: *mut c_int) -> CuResult;
/// `cuCheckpointProcessLock(int pid, CUcheckpointLockArgs *args)`.
pub type CuCheckpointProcessLock = unsafe extern "C" fn(pid: c_int, args: *mut LockArgs) -> CuResult;
/// `cuCheckpointProcessCheckpoint(int pid, CUcheckpointCheckpointArgs *args)`.
pub type CuCheckpointProcessCheckpoint = unsafe extern "C" fn(pid: c_int, args: *mut CheckpointArgs) -> CuResult;
/// `cuCheckpointProcessRestore(int pid, CUcheckpointRestoreArgs *args)`.
pub type CuCheckpointProcessRestore = unsafe extern "C" fn(pid: c_int, args: *mut RestoreArgs) -> CuResult;
/// `cuCheckpointProcessUnlock(int pid, CUcheckpointUnlockArgs *args)`.
pub type CuCheckpointProcessUnlock = unsafe extern "C" fn(pid: c_int, args: *mut UnlockArgs) -> CuResult;
/// `cuCheckpointProcessGetRestoreThreadId(int pid, int *tid)`.
pub type CuCheckpointProcessGetRestoreThreadId = unsafe extern "C" fn(pid: c_int, tid: *mut c_int) -> CuResult;

/// `cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)`.
pub type CuDevicePrimaryCtxRetain = unsafe extern "C" fn(ctx: *mut CuContext, dev: CuDevice) -> CuResult;
/// `cuDevicePrimaryCtxRelease_v2(CUdevice dev)`.
pub type CuDevicePrimaryCtxRelease = unsafe extern "C" fn(dev: CuDevice) -> CuResult;
/// `cuCtxSetCurrent(CUcontext ctx)`.
pub type CuCtxSetCurrent = unsafe extern "C" fn(ctx: CuContext) -> CuResult;
/// `cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)`.
pub type CuMemAlloc = unsafe extern "C" fn(dptr: *mut CuDevicePtr, bytes: size_t) -> CuResult;
/// `cuMemFree_v2(CUdeviceptr dptr)`.
pub type CuMemFree = unsafe extern "C" fn(dptr: CuDevicePtr) -> CuResult;
/// `cuMemHostRegister_v2(void *p, size_t bytesize, unsigned int flags)`.
pub type CuMemHostRegister = unsafe extern "C" fn(p: *mut c_void, bytes: size_t, flags: c_uint) -> CuResult;
/// `cuMemHostUnregister(void *p)`.
pub type CuMemHostUnregister = unsafe extern "C" fn(p: *mut c_void) -> CuResult;
/// `cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t bytes)`.
pub type CuMemcpyHtoD = unsafe extern "C" fn(dst: CuDevicePtr, src: *const c_void, bytes: size_t) -> CuResult;
/// `cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t bytes)`.
pub type CuMemcpyDtoH = unsafe extern "C" fn(dst: *mut c_void, src: CuDevicePtr, bytes: size_t) -> CuResult;
/// `cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t bytes, CUstream stream)`.
pub type CuMemcpyHtoDAsync =
    unsafe extern "C" fn(dst: CuDevicePtr, src: *const c_void, bytes: size_t, stream: CuStream) -> CuResult;
/// `cuStreamCreate(CUstream *stream, unsigned int flags)`.
pub type CuStreamCreate = unsafe extern "C" fn(stream: *mut CuStream, flags: c_uint) -> CuResult;
/// `cuStreamDestroy_v2(CUstream stream)`.
pub type CuStreamDestroy = unsafe extern "C" fn(stream: CuStream) -> CuResult;
/// `cuStreamSynchronize(CUstream stream)`.
pub type CuStreamSynchronize = unsafe extern "C" fn(stream: CuStream) -> CuResult;
/// `cuMemGetInfo_v2(size_t *free, size_t *total)`.
pub type CuMemGetInfo = unsafe extern "C" fn(free: *mut size_t, total: *mut size_t) -> CuResult;
/// `cuEventCreate(CUevent *event, unsigned int flags)`.
pub type CuEventCreate = unsafe extern "C" fn(event: *mut CuEvent, flags: c_uint) -> CuResult;
/// `cuEventRecord(CUevent event, CUstream stream)`.
pub type CuEventRecord = unsafe extern "C" fn(event: CuEvent, stream: CuStream) -> CuResult;
/// `cuEventSynchronize(CUevent event)`.
pub type CuEventSynchronize = unsafe extern "C" fn(event: CuEvent) -> CuResult;
/// `cuEventDestroy_v2(CUevent event)`.
pub type CuEventDestroy = unsafe extern "C" fn(event: CuEvent) -> CuResult;
/// `CUipcMemHandle`: 64 opaque bytes naming a device allocation to other processes.
#[repr(C)]
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct CuIpcMemHandle {
    /// The driver's bytes.
    pub reserved: [u8; 64],
}
/// `cuIpcGetMemHandle(CUipcMemHandle *handle, CUdeviceptr dptr)`.
pub type CuIpcGetMemHandle = unsafe extern "C" fn(handle: *mut CuIpcMemHandle, dptr: CuDevicePtr) -> CuResult;
/// `cuIpcOpenMemHandle_v2(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int flags)`: the
/// handle is passed by value.
pub type CuIpcOpenMemHandle =
    unsafe extern "C" fn(dptr: *mut CuDevicePtr, handle: CuIpcMemHandle, flags: c_uint) -> CuResult;
/// `cuIpcCloseMemHandle(CUdeviceptr dptr)`.
pub type CuIpcCloseMemHandle = unsafe extern "C" fn(dptr: CuDevicePtr) -> CuResult;
/// `CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS`, the one flag `cuIpcOpenMemHandle` takes.
pub const CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS: c_uint = 1;

/// `CUmodule`: an opaque loaded-module handle.
pub type CuModule = *mut c_void;
/// `CUfunction`: an opaque kernel handle inside a module.
pub type CuFunction = *mut c_void;
/// `cuModuleLoadData(CUmodule *module, const void *image)`: `image` is PTX text (NUL-terminated),
/// a cubin or a fatbin; PTX is compiled by the driver for the current device.
pub type CuModuleLoadData = unsafe extern "C" fn(module: *mut CuModule, image: *const c_void) -> CuResult;
/// `cuModuleUnload(CUmodule module)`.
pub type CuModuleUnload = unsafe extern "C" fn(module: CuModule) -> CuResult;
/// `cuModuleGetFunction(CUfunction *f, CUmodule module, const char *name)`.
pub type CuModuleGetFunction =
    unsafe extern "C" fn(function: *mut CuFunction, module: CuModule, name: *const c_char) -> CuResult;
/// `cuLaunchKernel(CUfunction f, grid x/y/z, block x/y/z, unsigned int sharedMemBytes,
/// CUstream stream, void **kernelParams, void **extra)`.
pub type CuLaunchKernel = unsafe extern "C" fn(
    function: CuFunction,
    grid_x: c_uint,
    grid_y: c_uint,
    grid_z: c_uint,
    block_x: c_uint,
    block_y: c_uint,
    block_z: c_uint,
    shared_bytes: c_uint,
    stream: CuStream,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CuResult;
/// `cuMemsetD8Async(CUdeviceptr dst, unsigned char value, size_t n, CUstream stream)`.
pub type CuMemsetD8Async = unsafe extern "C" fn(dst: CuDevicePtr, value: u8, n: size_t, stream: CuStream) -> CuResult;
/// `cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream stream)`.
pub type CuMemcpyDtoDAsync =
    unsafe extern "C" fn(dst: CuDevicePtr, src: CuDevicePtr, bytes: size_t, stream: CuStream) -> CuResult;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arg_structs_are_64_bytes_and_zeroed_by_default() {
        assert_eq!(std::mem::size_of::<LockArgs>(), 64);
        assert_eq!(std::mem::size_of::<CheckpointArgs>(), 64);
        assert_eq!(std::mem::size_of::<RestoreArgs>(), 64);
        assert_eq!(std::mem::size_of::<UnlockArgs>(), 64);
        assert_eq!(std::mem::align_of::<LockArgs>(), 8);
        let lock = LockArgs { timeout_ms: 0x0102_0304, ..LockArgs::default() };
        // SAFETY: LockArgs is repr(C), 64 bytes, with no padding (4 + 4 + 56).
        let bytes: [u8; 64] = unsafe { std::mem::transmute(lock) };
        assert_eq!(&bytes[..4], &0x0102_0304u32.to_ne_bytes());
        assert!(bytes[4..].iter().all(|b| *b == 0));
        // SAFETY: RestoreArgs is repr(C), 64 bytes, with no padding (8 + 4 + 4 + 48).
        let zero: [u8; 64] = unsafe { std::mem::transmute(RestoreArgs::default()) };
        assert!(zero.iter().all(|b| *b == 0));
    }
}
