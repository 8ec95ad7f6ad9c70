//! Kernels and device-side stream work: loading a module from a fatbin, launching one of its
//! kernels, and the memset and device-to-device copies a restore queues beside them.
//!
//! These entry points are resolved apart from the memory API: a driver (or a test library)
//! without them still loads data through host-side paths, which ask
//! [`Context::load_kernel`] and take its error as the reason to stay on the host.

use std::ffi::CStr;

use libc::c_void;
use libloading::Library;

use super::memory::{Context, Stream};
use super::{ffi, resolve};
use crate::error::{GpuDumpError, Result};

/// The kernel entry points, all present or reported missing by the first absent one.
#[derive(Clone, Copy)]
pub(super) struct KernelApi {
    module_load_data: ffi::CuModuleLoadData,
    module_unload: ffi::CuModuleUnload,
    module_get_function: ffi::CuModuleGetFunction,
    launch_kernel: ffi::CuLaunchKernel,
    memset_d8_async: ffi::CuMemsetD8Async,
    memcpy_dtod_async: ffi::CuMemcpyDtoDAsync,
}

impl KernelApi {
    /// Resolves every kernel symbol, or names the first one `lib` lacks.
    pub(super) fn resolve(lib: &Library) -> std::result::Result<Self, (&'static str, String)> {
        macro_rules! optional {
            ($name:literal) => {
                // SAFETY: the type alias in ffi matches the documented C signature of $name.
                unsafe { resolve(lib, $name) }.map_err(|detail| ($name, detail))?
            };
        }
        Ok(KernelApi {
            module_load_data: optional!("cuModuleLoadData"),
            module_unload: optional!("cuModuleUnload"),
            module_get_function: optional!("cuModuleGetFunction"),
            launch_kernel: optional!("cuLaunchKernel"),
            memset_d8_async: optional!("cuMemsetD8Async"),
            memcpy_dtod_async: optional!("cuMemcpyDtoDAsync_v2"),
        })
    }
}

/// A module loaded into a context, unloaded on drop (once the last of its kernels goes).
struct Module {
    module: ffi::CuModule,
    ctx: Context,
}

/// One kernel of a module loaded into a context.
pub struct Kernel {
    module: std::sync::Arc<Module>,
    function: ffi::CuFunction,
}

// SAFETY: module and function handles may be used from any thread (the driver API is
// thread-safe); neither is mutated after creation.
unsafe impl Send for Module {}
// SAFETY: as for Send.
unsafe impl Sync for Module {}
// SAFETY: as for Module.
unsafe impl Send for Kernel {}
// SAFETY: as for Module.
unsafe impl Sync for Kernel {}

impl Drop for Module {
    fn drop(&mut self) {
        if let Ok(api) = self.ctx.kernel_api() {
            let _ = self.ctx.bind();
            // SAFETY: `module` came from cuModuleLoadData in this (still retained) context and
            // is unloaded once.
            unsafe { (api.module_unload)(self.module) };
        }
    }
}

impl std::fmt::Debug for Kernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kernel").field("device", &self.module.ctx.device()).finish_non_exhaustive()
    }
}

impl Context {
    fn kernel_api(&self) -> Result<KernelApi> {
        self.kernels().map_err(|(symbol, detail)| GpuDumpError::CudaSymbol {
            library: "libcuda".to_string(),
            symbol,
            detail: format!("{detail} (kernels need it; host-side loads do not)"),
        })
    }

    /// Loads `fatbin` (a fatbin embedded in the binary: the driver takes the device's machine
    /// code from it, or compiles its PTX for the device) into this context and looks up its
    /// kernel `name`.
    pub fn load_kernel(&self, fatbin: &'static [u8], name: &CStr) -> Result<Kernel> {
        let api = self.kernel_api()?;
        self.bind()?;
        let mut module: ffi::CuModule = std::ptr::null_mut();
        // SAFETY: a valid out-pointer and a fatbin (its header gives its length) that outlives
        // the call.
        let code = unsafe { (api.module_load_data)(&mut module, fatbin.as_ptr().cast()) };
        self.check(code, || "cuModuleLoadData".to_string())?;
        let module = std::sync::Arc::new(Module { module, ctx: self.clone() });
        let mut function: ffi::CuFunction = std::ptr::null_mut();
        // SAFETY: a valid out-pointer, a live module and a NUL-terminated name.
        let code = unsafe { (api.module_get_function)(&mut function, module.module, name.as_ptr()) };
        self.check(code, || format!("cuModuleGetFunction({name:?})"))?;
        Ok(Kernel { module, function })
    }
}

impl Stream {
    /// Queues `kernel` on this stream with `grid` blocks of `block` threads
    /// (`cuLaunchKernel`, one dimension each, no dynamic shared memory).
    ///
    /// # Safety
    /// `params` must hold one pointer per kernel parameter, each to a value of exactly that
    /// parameter's type, and every device address passed must stay valid until the kernel
    /// has run (until the stream, or an event recorded after it, is synchronised).
    pub unsafe fn launch(&self, kernel: &Kernel, grid: u32, block: u32, params: &mut [*mut c_void]) -> Result<()> {
        let api = self.context().kernel_api()?;
        self.context().bind()?;
        let code = (api.launch_kernel)(
            kernel.function,
            grid,
            1,
            1,
            block,
            1,
            1,
            0,
            self.raw(),
            params.as_mut_ptr(),
            std::ptr::null_mut(),
        );
        self.context().check(code, || format!("cuLaunchKernel({grid} blocks of {block} threads)"))
    }

    /// Queues setting `len` bytes at device address `dst` to `value` (`cuMemsetD8Async`).
    ///
    /// # Safety
    /// `dst..dst + len` must be device memory of this context that nothing else uses until
    /// the fill is done (the driver cannot catch a run into a neighbouring allocation).
    pub unsafe fn fill_async(&self, dst: u64, value: u8, len: usize) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        let api = self.context().kernel_api()?;
        self.context().bind()?;
        // SAFETY: a live stream; the range is the caller's to fill (contract above).
        let code = unsafe { (api.memset_d8_async)(dst, value, len, self.raw()) };
        self.context().check(code, || format!("cuMemsetD8Async(dst {dst:#x}, {len} bytes)"))
    }

    /// Queues a copy of `len` bytes between device addresses (`cuMemcpyDtoDAsync_v2`).
    ///
    /// # Safety
    /// Both ranges must be device memory of this context, the destination used by nothing
    /// else until the copy is done and the source not written meanwhile.
    pub unsafe fn copy_on_device_async(&self, dst: u64, src: u64, len: usize) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        let api = self.context().kernel_api()?;
        self.context().bind()?;
        // SAFETY: a live stream; the ranges are the caller's to use (contract above).
        let code = unsafe { (api.memcpy_dtod_async)(dst, src, len, self.raw()) };
        self.context().check(code, || format!("cuMemcpyDtoDAsync_v2(dst {dst:#x}, src {src:#x}, {len} bytes)"))
    }
}
