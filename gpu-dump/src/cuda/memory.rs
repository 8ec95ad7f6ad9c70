//! The CUDA memory API a restore engine needs to fill GPU memory: a device's primary context,
//! device and page-locked host buffers, streams, events and copies.
//!
//! Every handle keeps a [`Context`] clone, so the primary context (and the mapped driver
//! library) outlives every buffer, stream and event made in it. Every call makes the context
//! current on the calling thread first (`cuCtxSetCurrent`, a cheap thread-local store in the
//! driver), so any thread may use any handle without binding it itself.

use std::ptr::NonNull;
use std::sync::Arc;

use libc::{c_int, size_t};
use libloading::Library;

use super::kernel::KernelApi;
use super::{ffi, hint_for, resolve, CudaDriver, ErrorTexts};
use crate::error::{GpuDumpError, Result};
use ffi::CuResult;

/// `CU_MEMHOSTREGISTER_PORTABLE`: the memory counts as pinned for every context, not only the
/// one that registered it (else a copy from it on another device's stream silently goes through
/// a slow pageable staging path).
const CU_MEMHOSTREGISTER_PORTABLE: libc::c_uint = 1;

/// The memory API entry points, resolved at load but optional: a driver without them still
/// serves the checkpoint API.
#[derive(Clone, Copy)]
pub(super) struct MemApi {
    primary_ctx_retain: ffi::CuDevicePrimaryCtxRetain,
    primary_ctx_release: ffi::CuDevicePrimaryCtxRelease,
    ctx_set_current: ffi::CuCtxSetCurrent,
    mem_alloc: ffi::CuMemAlloc,
    mem_free: ffi::CuMemFree,
    mem_host_register: ffi::CuMemHostRegister,
    mem_host_unregister: ffi::CuMemHostUnregister,
    memcpy_htod: ffi::CuMemcpyHtoD,
    memcpy_dtoh: ffi::CuMemcpyDtoH,
    memcpy_htod_async: ffi::CuMemcpyHtoDAsync,
    stream_create: ffi::CuStreamCreate,
    stream_destroy: ffi::CuStreamDestroy,
    stream_synchronize: ffi::CuStreamSynchronize,
    mem_get_info: ffi::CuMemGetInfo,
    event_create: ffi::CuEventCreate,
    event_record: ffi::CuEventRecord,
    event_synchronize: ffi::CuEventSynchronize,
    event_destroy: ffi::CuEventDestroy,
    ipc_get: ffi::CuIpcGetMemHandle,
    ipc_open: ffi::CuIpcOpenMemHandle,
    ipc_close: ffi::CuIpcCloseMemHandle,
}

impl MemApi {
    /// Resolves every memory symbol, or names the first one `lib` lacks (with the loader's
    /// message).
    pub(super) fn resolve(lib: &Library) -> std::result::Result<Self, (&'static str, String)> {
        macro_rules! optional {
            ($name:literal) => {
                // SAFETY: the type alias in ffi matches the documented C signature of $name.
                unsafe { resolve(lib, $name) }.map_err(|detail| ($name, detail))?
            };
        }
        Ok(MemApi {
            primary_ctx_retain: optional!("cuDevicePrimaryCtxRetain"),
            primary_ctx_release: optional!("cuDevicePrimaryCtxRelease_v2"),
            ctx_set_current: optional!("cuCtxSetCurrent"),
            mem_alloc: optional!("cuMemAlloc_v2"),
            mem_free: optional!("cuMemFree_v2"),
            mem_host_register: optional!("cuMemHostRegister_v2"),
            mem_host_unregister: optional!("cuMemHostUnregister"),
            memcpy_htod: optional!("cuMemcpyHtoD_v2"),
            memcpy_dtoh: optional!("cuMemcpyDtoH_v2"),
            memcpy_htod_async: optional!("cuMemcpyHtoDAsync_v2"),
            stream_create: optional!("cuStreamCreate"),
            stream_destroy: optional!("cuStreamDestroy_v2"),
            stream_synchronize: optional!("cuStreamSynchronize"),
            mem_get_info: optional!("cuMemGetInfo_v2"),
            event_create: optional!("cuEventCreate"),
            event_record: optional!("cuEventRecord"),
            event_synchronize: optional!("cuEventSynchronize"),
            event_destroy: optional!("cuEventDestroy_v2"),
            ipc_get: optional!("cuIpcGetMemHandle"),
            ipc_open: optional!("cuIpcOpenMemHandle_v2"),
            ipc_close: optional!("cuIpcCloseMemHandle"),
        })
    }
}

/// Advice for CUDA error codes that the memory calls meet in practice.
fn memory_hint(code: CuResult) -> &'static str {
    match code {
        ffi::CUDA_ERROR_OUT_OF_MEMORY => {
            "; not enough free GPU memory for this allocation (Context::mem_info says how much is free)"
        }
        ffi::CUDA_ERROR_INVALID_CONTEXT => "; no usable CUDA context is current on this thread",
        3 | 100 => hint_for(code),
        _ => "",
    }
}

impl CudaDriver {
    /// Retains the primary context of device `device` (an ordinal, as in [`CudaDriver::devices`])
    /// for the memory API, initialising the driver first. Each call retains once; the context is
    /// released when the last clone of the returned [`Context`] (and of every buffer, stream
    /// and event made from it) is dropped.
    ///
    /// Fails with [`GpuDumpError::CudaSymbol`] naming the first memory symbol the driver lacks,
    /// else with the failing driver call.
    pub fn context(&self, device: u32) -> Result<Context> {
        let api = match &self.memory {
            Ok(api) => *api,
            Err((symbol, detail)) => {
                return Err(GpuDumpError::CudaSymbol {
                    library: self.library.clone(),
                    symbol,
                    detail: format!("{detail} (the CUDA memory API needs it; the checkpoint API does not)"),
                })
            }
        };
        self.init()?;
        let errors = self.error_texts();
        let ordinal = c_int::try_from(device).unwrap_or(c_int::MAX);
        let mut dev: ffi::CuDevice = 0;
        // SAFETY: a valid out-pointer; the driver checks the ordinal.
        let code = unsafe { (self.api.device_get)(&mut dev, ordinal) };
        if code != ffi::CUDA_SUCCESS {
            return Err(errors.error(code, format!("cuDeviceGet({device})"), memory_hint(code)));
        }
        let mut raw: ffi::CuContext = std::ptr::null_mut();
        // SAFETY: a valid out-pointer; `dev` came from cuDeviceGet.
        let code = unsafe { (api.primary_ctx_retain)(&mut raw, dev) };
        if code != ffi::CUDA_SUCCESS {
            return Err(errors.error(code, format!("cuDevicePrimaryCtxRetain(device {device})"), memory_hint(code)));
        }
        Ok(Context {
            inner: Arc::new(ContextInner {
                api,
                errors,
                raw,
                device: dev,
                ordinal: device,
                kernels: self.kernels.clone(),
                _lib: Arc::clone(&self.lib),
            }),
        })
    }
}

/// A device's primary CUDA context, retained. Cheap to clone (an `Arc`), usable from any
/// thread: every method makes the context current on the calling thread itself.
#[derive(Clone)]
pub struct Context {
    inner: Arc<ContextInner>,
}

struct ContextInner {
    api: MemApi,
    errors: ErrorTexts,
    raw: ffi::CuContext,
    device: ffi::CuDevice,
    ordinal: u32,
    /// The kernel entry points, or the first one the driver lacks.
    kernels: std::result::Result<KernelApi, (&'static str, String)>,
    /// Keeps the driver mapped while `api` points into it.
    _lib: Arc<Library>,
}

// SAFETY: a CUDA context handle is not tied to a thread: the driver API is thread-safe and a
// context may be made current on (and used from) several threads at once.
unsafe impl Send for ContextInner {}
// SAFETY: as for Send; the handle is never mutated after creation.
unsafe impl Sync for ContextInner {}

impl Drop for ContextInner {
    fn drop(&mut self) {
        // SAFETY: balances the retain in CudaDriver::context. Every buffer, stream and event
        // holds a Context clone, so none of them outlives this release.
        unsafe { (self.api.primary_ctx_release)(self.device) };
    }
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context").field("device", &self.inner.ordinal).finish_non_exhaustive()
    }
}

impl Context {
    /// The device ordinal this context belongs to.
    pub fn device(&self) -> u32 {
        self.inner.ordinal
    }

    /// Makes this context current on the calling thread (`cuCtxSetCurrent`). Every other
    /// method does this itself; call it only before driver calls made outside this API.
    pub fn bind(&self) -> Result<()> {
        // SAFETY: the handle came from cuDevicePrimaryCtxRetain and is retained while `self` lives.
        let code = unsafe { (self.inner.api.ctx_set_current)(self.inner.raw) };
        self.check(code, || format!("cuCtxSetCurrent(device {})", self.inner.ordinal))
    }

    fn api(&self) -> &MemApi {
        &self.inner.api
    }

    /// The kernel entry points, or the first one the driver lacks (with the loader's message).
    pub(super) fn kernels(&self) -> std::result::Result<KernelApi, (&'static str, String)> {
        self.inner.kernels.clone()
    }

    pub(super) fn check(&self, code: CuResult, call: impl FnOnce() -> String) -> Result<()> {
        if code == ffi::CUDA_SUCCESS {
            return Ok(());
        }
        Err(self.inner.errors.error(code, call(), memory_hint(code)))
    }

    /// Free and total memory of the device, in bytes (`cuMemGetInfo_v2`).
    pub fn mem_info(&self) -> Result<(u64, u64)> {
        self.bind()?;
        let (mut free, mut total): (size_t, size_t) = (0, 0);
        // SAFETY: valid out-pointers to size_t.
        let code = unsafe { (self.api().mem_get_info)(&mut free, &mut total) };
        self.check(code, || "cuMemGetInfo_v2".to_string())?;
        Ok((free as u64, total as u64))
    }

    /// Allocates `bytes` of device memory (`cuMemAlloc_v2`), uninitialised, freed when the
    /// buffer drops. A 0-byte request does not reach the driver and gives a null (0) pointer.
    pub fn alloc(&self, bytes: usize) -> Result<DeviceBuffer> {
        let mut ptr: ffi::CuDevicePtr = 0;
        if bytes > 0 {
            self.bind()?;
            // SAFETY: a valid out-pointer.
            let code = unsafe { (self.api().mem_alloc)(&mut ptr, bytes) };
            self.check(code, || format!("cuMemAlloc_v2({bytes} bytes)"))?;
        }
        Ok(DeviceBuffer { ptr, len: bytes, ctx: self.clone() })
    }

    /// Allocates `bytes` of device memory to share with another process
    /// ([`DeviceBuffer::ipc_handle`]): as [`Context::alloc`], but the allocation is rounded up
    /// to a multiple of 2 MiB (the buffer's length stays `bytes`). The importer maps such an
    /// allocation in ~0.1 ms, one of any other size in ~8 ms (measured on an H200, driver 580:
    /// tests/gpu/ipc_probe.py).
    pub fn alloc_shareable(&self, bytes: usize) -> Result<DeviceBuffer> {
        let mut buffer = self.alloc(bytes.div_ceil(IPC_GRANULE) * IPC_GRANULE)?;
        buffer.len = bytes;
        Ok(buffer)
    }

    /// Allocates `bytes` of page-locked host memory, zero-filled, freed when the buffer drops:
    /// mapped and faulted in here ([`HostMemory::map`]), then registered ([`Context::register`]).
    /// Not `cuMemHostAlloc`: it pins 4 KiB page by page while it holds the driver's lock, 2-5 ms
    /// for 4 MiB on the H200 machine, and every other thread's copy call waits that long
    /// (docs/BENCHMARKS.md, issue #62). A 0-byte request does not reach the driver.
    pub fn alloc_pinned(&self, bytes: usize) -> Result<PinnedBuffer> {
        self.register(HostMemory::map(bytes)?)
    }

    /// Page-locks `memory` (`cuMemHostRegister`, portable to every context) for fast
    /// asynchronous copies: its pages are already there, so this only locks them, a few
    /// milliseconds for hundreds of MiB in huge pages. Unregistered, then unmapped, when the
    /// buffer drops.
    pub fn register(&self, memory: HostMemory) -> Result<PinnedBuffer> {
        let (ptr, len) = (memory.ptr, memory.len);
        if len == 0 {
            return Ok(PinnedBuffer { ptr, len, ctx: self.clone(), _mapped: memory });
        }
        self.bind()?;
        // SAFETY: `memory` maps `len` bytes at `ptr`, kept mapped (the buffer owns it) until
        // they are unregistered.
        let code = unsafe { (self.api().mem_host_register)(ptr.as_ptr().cast(), len, CU_MEMHOSTREGISTER_PORTABLE) };
        self.check(code, || format!("cuMemHostRegister({len} bytes)"))?;
        Ok(PinnedBuffer { ptr, len, ctx: self.clone(), _mapped: memory })
    }

    /// Maps device memory another process exported with [`DeviceBuffer::ipc_handle`]
    /// (`cuIpcOpenMemHandle_v2`) into this context: `len` bytes from its start, which must lie
    /// on this context's device. Unmapped (`cuIpcCloseMemHandle`) when dropped; the memory
    /// stays the exporter's.
    pub fn open_ipc(&self, handle: &IpcHandle, len: usize) -> Result<IpcBuffer> {
        self.bind()?;
        let mut ptr: ffi::CuDevicePtr = 0;
        // SAFETY: a valid out-pointer; the handle is 64 plain bytes passed by value.
        let code = unsafe {
            (self.api().ipc_open)(
                &mut ptr,
                ffi::CuIpcMemHandle { reserved: handle.0 },
                ffi::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS,
            )
        };
        self.check(code, || format!("cuIpcOpenMemHandle_v2({len} bytes)"))?;
        Ok(IpcBuffer { ptr, len, ctx: self.clone() })
    }

    /// Creates a non-blocking stream (`cuStreamCreate` with `CU_STREAM_NON_BLOCKING`),
    /// destroyed when dropped.
    pub fn stream(&self) -> Result<Stream> {
        self.bind()?;
        let mut raw: ffi::CuStream = std::ptr::null_mut();
        // SAFETY: a valid out-pointer; the flags are a documented value.
        let code = unsafe { (self.api().stream_create)(&mut raw, ffi::CU_STREAM_NON_BLOCKING) };
        self.check(code, || "cuStreamCreate(non-blocking)".to_string())?;
        Ok(Stream { raw, ctx: self.clone() })
    }

    /// Creates an event without timing (`cuEventCreate` with `CU_EVENT_DISABLE_TIMING`),
    /// destroyed when dropped.
    pub fn event(&self) -> Result<Event> {
        self.bind()?;
        let mut raw: ffi::CuEvent = std::ptr::null_mut();
        // SAFETY: a valid out-pointer; the flags are a documented value.
        let code = unsafe { (self.api().event_create)(&mut raw, ffi::CU_EVENT_DISABLE_TIMING) };
        self.check(code, || "cuEventCreate(disable timing)".to_string())?;
        Ok(Event { raw, ctx: self.clone() })
    }

    /// Copies `src` to device address `dst` and waits for the copy (`cuMemcpyHtoD_v2`, from
    /// pageable memory: the driver stages it, so this is the slow baseline). `dst` must start
    /// `src.len()` bytes of device memory of this context (e.g. `buffer.ptr() + offset` of a
    /// [`DeviceBuffer`] with room for them); the driver rejects addresses that are not device
    /// memory but cannot catch a run into a neighbouring allocation.
    pub fn copy_to_device(&self, dst: u64, src: &[u8]) -> Result<()> {
        if src.is_empty() {
            return Ok(());
        }
        self.bind()?;
        // SAFETY: `src` is readable for its length for the whole (synchronous) call.
        let code = unsafe { (self.api().memcpy_htod)(dst, src.as_ptr().cast(), src.len()) };
        self.check(code, || format!("cuMemcpyHtoD_v2(dst {dst:#x}, {} bytes)", src.len()))
    }

    /// Copies `dst.len()` bytes from device address `src` into `dst` and waits for the copy
    /// (`cuMemcpyDtoH_v2`); e.g. to check what landed in GPU memory.
    pub fn copy_to_host(&self, dst: &mut [u8], src: u64) -> Result<()> {
        if dst.is_empty() {
            return Ok(());
        }
        self.bind()?;
        // SAFETY: `dst` is writable for its length, exclusively ours, for the whole call.
        let code = unsafe { (self.api().memcpy_dtoh)(dst.as_mut_ptr().cast(), src, dst.len()) };
        self.check(code, || format!("cuMemcpyDtoH_v2(src {src:#x}, {} bytes)", dst.len()))
    }
}

/// Device memory from [`Context::alloc`], freed (`cuMemFree_v2`) on drop. Holds its context.
pub struct DeviceBuffer {
    ptr: ffi::CuDevicePtr,
    len: usize,
    ctx: Context,
}

impl DeviceBuffer {
    /// The device address of the first byte (0 for an empty buffer).
    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    /// The size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for a 0-byte buffer.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The context the buffer was allocated in.
    pub fn context(&self) -> &Context {
        &self.ctx
    }

    /// A handle another process can map this buffer with ([`Context::open_ipc`] there;
    /// `cuIpcGetMemHandle`). The buffer must outlive every mapping of it.
    pub fn ipc_handle(&self) -> Result<IpcHandle> {
        self.ctx.bind()?;
        let mut handle = ffi::CuIpcMemHandle { reserved: [0; 64] };
        // SAFETY: a valid out-pointer; `ptr` is this context's live allocation.
        let code = unsafe { (self.ctx.api().ipc_get)(&mut handle, self.ptr) };
        self.ctx.check(code, || format!("cuIpcGetMemHandle({} bytes)", self.len))?;
        Ok(IpcHandle(handle.reserved))
    }
}

/// The 64 bytes that name a device allocation to another process
/// ([`DeviceBuffer::ipc_handle`], [`Context::open_ipc`]).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct IpcHandle(pub [u8; 64]);

/// Another process's device memory mapped into a context ([`Context::open_ipc`]), unmapped
/// on drop. Holds its context.
pub struct IpcBuffer {
    ptr: ffi::CuDevicePtr,
    len: usize,
    ctx: Context,
}

impl IpcBuffer {
    /// The device address of the first byte in this context.
    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    /// The size in bytes that the opener asked for.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for a 0-byte mapping.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for IpcBuffer {
    fn drop(&mut self) {
        let _ = self.ctx.bind();
        // SAFETY: `ptr` came from cuIpcOpenMemHandle_v2 in this (still retained) context and
        // is closed once.
        unsafe { (self.ctx.api().ipc_close)(self.ptr) };
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        if self.ptr != 0 {
            let _ = self.ctx.bind();
            // SAFETY: `ptr` came from cuMemAlloc_v2 in this (still retained) context and is
            // freed once.
            unsafe { (self.ctx.api().mem_free)(self.ptr) };
        }
    }
}

impl std::fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceBuffer")
            .field("ptr", &format_args!("{:#x}", self.ptr))
            .field("len", &self.len)
            .field("device", &self.ctx.device())
            .finish()
    }
}

/// Page-locked host memory: a mapping registered with the driver ([`Context::register`],
/// [`Context::alloc_pinned`]), unregistered, then unmapped, when dropped. The source of fast
/// asynchronous copies ([`Stream::copy_to_device_async`]). Holds its context.
pub struct PinnedBuffer {
    ptr: NonNull<u8>,
    len: usize,
    ctx: Context,
    /// The mapping it locks, unmapped after it is unregistered (fields drop after `drop`).
    _mapped: HostMemory,
}

// SAFETY: the buffer owns its memory like a Box<[u8]>; nothing about it is tied to a thread.
unsafe impl Send for PinnedBuffer {}
// SAFETY: shared access only reads (as_slice, copies from it); writing needs &mut.
unsafe impl Sync for PinnedBuffer {}

impl PinnedBuffer {
    /// The bytes. While an asynchronous copy from the buffer is in flight the device reads
    /// them, so writing through [`PinnedBuffer::as_mut_slice`] then changes what lands.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `len` initialised (zero-filled at allocation) bytes owned by self, or a
        // dangling pointer with length 0.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The bytes, writable. Do not write a range that an asynchronous copy still reads: wait
    /// for the [`Event`] recorded after that copy (or the stream) first.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as for as_slice, and &mut self makes this the only Rust access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    /// The size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for a 0-byte buffer.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The context the buffer was allocated in.
    pub fn context(&self) -> &Context {
        &self.ctx
    }
}

impl Drop for PinnedBuffer {
    fn drop(&mut self) {
        if self.len > 0 {
            let _ = self.ctx.bind();
            let p = self.ptr.as_ptr().cast();
            // SAFETY: `ptr` was registered in this (still retained) context and is unregistered
            // once; no slice of it outlives self. Its mapping is unmapped after (when `_mapped`
            // drops).
            unsafe { (self.ctx.api().mem_host_unregister)(p) };
        }
    }
}

/// Anonymous host memory for staging, mapped and touched before any CUDA context is needed
/// (so a load can prepare it while the driver starts): in 2 MiB huge pages where the kernel
/// has them (`MADV_HUGEPAGE`), every page faulted in, zero-filled. [`Context::register`] then
/// only locks it — pinning memory that `cuMemHostAlloc` hands out costs about as much again as
/// faulting it, page by 4 KiB page. Unmapped on drop.
pub struct HostMemory {
    /// The mapping, from its 2 MiB-aligned start: `len` bytes used, `map_len` mapped.
    base: NonNull<u8>,
    map_len: usize,
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is owned like a Box<[u8]>; nothing about it is tied to a thread.
unsafe impl Send for HostMemory {}
// SAFETY: HostMemory hands out no access to its bytes; PinnedBuffer governs that.
unsafe impl Sync for HostMemory {}

/// What shareable device allocations are rounded up to: the GPU's large page.
const IPC_GRANULE: usize = 2 << 20;

/// Huge page size the staging mappings align to.
const HUGE_PAGE: usize = 2 << 20;

impl HostMemory {
    /// Maps and touches `len` bytes.
    pub fn map(len: usize) -> Result<HostMemory> {
        if len == 0 {
            return Ok(HostMemory { base: NonNull::dangling(), map_len: 0, ptr: NonNull::dangling(), len: 0 });
        }
        let map_len = len.div_ceil(HUGE_PAGE) * HUGE_PAGE + HUGE_PAGE;
        // SAFETY: an anonymous private mapping at an address the kernel picks.
        let raw = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if raw == libc::MAP_FAILED {
            return Err(GpuDumpError::io(
                format!("mapping {len} bytes of staging memory"),
                std::io::Error::last_os_error(),
            ));
        }
        let base = NonNull::new(raw.cast::<u8>()).expect("mmap does not return null on success");
        let start = (raw as usize).next_multiple_of(HUGE_PAGE) - raw as usize;
        // SAFETY: `start + len` <= `map_len`, inside the mapping.
        let ptr = unsafe { NonNull::new_unchecked(base.as_ptr().add(start)) };
        let memory = HostMemory { base, map_len, ptr, len };
        // SAFETY: advice on our own mapping; without huge pages it is ignored (4 KiB pages).
        unsafe { libc::madvise(ptr.as_ptr().cast(), len, libc::MADV_HUGEPAGE) };
        for page in (0..len).step_by(4096) {
            // SAFETY: inside the mapping; a volatile write so every page is faulted in now.
            unsafe { ptr.as_ptr().add(page).write_volatile(0) };
        }
        Ok(memory)
    }
}

impl Drop for HostMemory {
    fn drop(&mut self) {
        if self.map_len > 0 {
            // SAFETY: our own mapping, unmapped once; no PinnedBuffer slice outlives it (it is
            // dropped after the buffer's unregister).
            unsafe { libc::munmap(self.base.as_ptr().cast(), self.map_len) };
        }
    }
}

impl std::fmt::Debug for HostMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostMemory").field("len", &self.len).finish()
    }
}

impl std::fmt::Debug for PinnedBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PinnedBuffer").field("len", &self.len).field("device", &self.ctx.device()).finish()
    }
}

/// A non-blocking CUDA stream from [`Context::stream`], destroyed (`cuStreamDestroy_v2`) on
/// drop; work still queued then completes in the background. Usable from any thread.
pub struct Stream {
    raw: ffi::CuStream,
    ctx: Context,
}

// SAFETY: CUDA stream handles may be used from any thread (the driver API is thread-safe).
unsafe impl Send for Stream {}
// SAFETY: as for Send; the handle is never mutated after creation.
unsafe impl Sync for Stream {}

impl Stream {
    /// Queues a copy of `src[src_offset..src_offset + len]` to device address `dst` on this
    /// stream (`cuMemcpyHtoDAsync_v2`) and returns at once. A source range that ends past the
    /// buffer is refused (`CUDA_ERROR_INVALID_VALUE`) without calling the driver; `len` 0 does
    /// nothing.
    ///
    /// # Safety
    /// The copy reads `src` after this returns: the caller must not write that range of `src`
    /// (nor drop `src`) until the copy is done, i.e. until an [`Event`] recorded on this stream
    /// after it, or the stream itself, has been synchronised. `dst..dst + len` must be device
    /// memory of this context that nothing else uses meanwhile (e.g. inside a
    /// [`DeviceBuffer`]); the driver rejects addresses that are not device memory but cannot
    /// catch a run into a neighbouring allocation.
    pub unsafe fn copy_to_device_async(
        &self,
        dst: u64,
        src: &PinnedBuffer,
        src_offset: usize,
        len: usize,
    ) -> Result<()> {
        if src_offset.checked_add(len).is_none_or(|end| end > src.len) {
            return Err(GpuDumpError::Cuda {
                call: format!(
                    "cuMemcpyHtoDAsync_v2(dst {dst:#x}, src offset {src_offset}, {len} bytes)"
                ),
                code: ffi::CUDA_ERROR_INVALID_VALUE,
                name: "CUDA_ERROR_INVALID_VALUE".to_string(),
                description: format!(
                    "the source range runs past the end of the {}-byte pinned buffer (refused before calling the driver)",
                    src.len
                ),
                hint: "",
            });
        }
        if len == 0 {
            return Ok(());
        }
        self.ctx.bind()?;
        // SAFETY: the range lies inside `src` (checked above), page-locked memory that stays
        // allocated at least as long as the caller keeps `src` (documented contract above);
        // `raw` is a live stream of this context.
        let code =
            unsafe { (self.ctx.api().memcpy_htod_async)(dst, src.ptr.as_ptr().add(src_offset).cast(), len, self.raw) };
        self.ctx.check(code, || format!("cuMemcpyHtoDAsync_v2(dst {dst:#x}, src offset {src_offset}, {len} bytes)"))
    }

    /// The raw `CUstream` (also a `cudaStream_t`), for libraries that queue work on it.
    pub(crate) fn raw(&self) -> ffi::CuStream {
        self.raw
    }

    /// Waits until all work queued on this stream has finished (`cuStreamSynchronize`).
    pub fn synchronize(&self) -> Result<()> {
        self.ctx.bind()?;
        // SAFETY: `raw` is a live stream of this context.
        let code = unsafe { (self.ctx.api().stream_synchronize)(self.raw) };
        self.ctx.check(code, || "cuStreamSynchronize".to_string())
    }

    /// The context the stream belongs to.
    pub fn context(&self) -> &Context {
        &self.ctx
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        let _ = self.ctx.bind();
        // SAFETY: `raw` came from cuStreamCreate in this (still retained) context and is
        // destroyed once.
        unsafe { (self.ctx.api().stream_destroy)(self.raw) };
    }
}

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stream").field("device", &self.ctx.device()).finish_non_exhaustive()
    }
}

/// A CUDA event without timing from [`Context::event`], destroyed (`cuEventDestroy_v2`) on
/// drop: record it on a stream after some copies, then wait for it to know they are done
/// (e.g. one event per staging slot, waited on before the slot is refilled).
pub struct Event {
    raw: ffi::CuEvent,
    ctx: Context,
}

// SAFETY: CUDA event handles may be used from any thread (the driver API is thread-safe).
unsafe impl Send for Event {}
// SAFETY: as for Send; the handle is never mutated after creation.
unsafe impl Sync for Event {}

impl Event {
    /// Records the event on `stream` (`cuEventRecord`): it completes when all work queued on
    /// the stream before now has. Recording again replaces the earlier capture.
    pub fn record(&self, stream: &Stream) -> Result<()> {
        self.ctx.bind()?;
        // SAFETY: both handles are live.
        let code = unsafe { (self.ctx.api().event_record)(self.raw, stream.raw) };
        self.ctx.check(code, || "cuEventRecord".to_string())
    }

    /// Waits until the work captured by the last [`Event::record`] has finished
    /// (`cuEventSynchronize`); returns at once for a never-recorded event.
    pub fn synchronize(&self) -> Result<()> {
        self.ctx.bind()?;
        // SAFETY: `raw` is a live event of this context.
        let code = unsafe { (self.ctx.api().event_synchronize)(self.raw) };
        self.ctx.check(code, || "cuEventSynchronize".to_string())
    }

    /// The context the event belongs to.
    pub fn context(&self) -> &Context {
        &self.ctx
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        let _ = self.ctx.bind();
        // SAFETY: `raw` came from cuEventCreate in this (still retained) context and is
        // destroyed once.
        unsafe { (self.ctx.api().event_destroy)(self.raw) };
    }
}

impl std::fmt::Debug for Event {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Event").field("device", &self.ctx.device()).finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send_sync<T: Send + Sync>() {}

    #[test]
    fn handles_are_send_and_sync() {
        assert_send_sync::<Context>();
        assert_send_sync::<DeviceBuffer>();
        assert_send_sync::<PinnedBuffer>();
        assert_send_sync::<Stream>();
        assert_send_sync::<Event>();
    }

    #[test]
    fn memory_hints() {
        assert!(memory_hint(2).contains("not enough free GPU memory"));
        assert!(memory_hint(201).contains("context"));
        assert_eq!(memory_hint(1), "", "the checkpoint hint for 1 is about pids");
    }
}
