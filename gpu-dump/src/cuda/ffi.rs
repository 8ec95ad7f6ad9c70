//! Raw types of the CUDA driver API that gstore calls, as the C headers define them.
//!
//! Only what the checkpoint path needs. Every checkpoint argument struct is 64 bytes in every
//! CUDA release; each gets its own type (rather than one shared "64 reserved bytes" type) so the
//! CUDA 13.4 custom-storage fields (`customStorageInfo_out` in the checkpoint and restore args)
//! can later be added to exactly the structs that carry them, with the layout asserts below
//! guarding the change.

use libc::{c_char, c_int, c_uint, size_t};

/// `CUresult`: 0 is `CUDA_SUCCESS`, anything else an error code.
pub type CuResult = c_int;
/// `CUdevice`: a device ordinal handle.
pub type CuDevice = c_int;

/// `CUDA_SUCCESS`.
pub const CUDA_SUCCESS: CuResult = 0;

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

/// `CUcheckpointRestoreArgs`. Its layout moved between CUDA 13.0 and 13.4 (GPU pairs at 0/8,
/// custom storage at 16 in 13.4) but an all-zero struct means "restore onto the same GPUs from
/// host memory" in every version, which is all gstore asks for today.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RestoreArgs {
    /// Must be zero.
    pub reserved: [u64; 8],
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
        // SAFETY: the other structs are 8 u64 words with no padding.
        let zero: [u8; 64] = unsafe { std::mem::transmute(RestoreArgs::default()) };
        assert!(zero.iter().all(|b| *b == 0));
    }
}
