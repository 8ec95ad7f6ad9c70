//! The CUDA memory API (context, device and pinned buffers, streams, events, copies) against a
//! fake libcuda (tests/fake_libcuda.c) that backs device memory with host memory, checks every
//! copy's ranges, keeps a per-thread current context (so a call that forgot to bind fails with
//! CUDA_ERROR_INVALID_CONTEXT) and counts what is alive.
//!
//! Safety of the async copies below: each test waits for its stream or event before it
//! writes or drops a pinned buffer a copy reads, and copies only into its own device buffers.

mod common;

use std::path::PathBuf;
use std::sync::{Barrier, Mutex, MutexGuard, OnceLock};

use gstore_gpu_dump::cuda::{CudaDriver, GpuInfo, HostMemory, ProcessState};
use gstore_gpu_dump::GpuDumpError;

struct FakeBuild {
    /// The fake driver with the memory API.
    lib: PathBuf,
    /// The same without it (checkpoint API only).
    no_memory_lib: PathBuf,
}

/// Builds the fake drivers once per source version (shared by the test processes nextest runs
/// at the same time: each builds into a private folder and renames it into place).
fn build() -> &'static FakeBuild {
    static BUILD: OnceLock<FakeBuild> = OnceLock::new();
    BUILD.get_or_init(|| {
        let (build_dir, _state) =
            common::build_fake_libcuda("fake-cuda-memory", &[("full", None), ("no-memory", Some("-DNO_MEMORY"))]);
        FakeBuild {
            lib: build_dir.join("full").join("libcuda.so.1"),
            no_memory_lib: build_dir.join("no-memory").join("libcuda.so.1"),
        }
    })
}

/// The fake driver's test hooks, through the same loaded library the driver binding uses.
struct Fake {
    lib: libloading::Library,
}

/// What the fake driver holds at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct Live {
    device_allocs: libc::c_long,
    host_allocs: libc::c_long,
    streams: libc::c_long,
    events: libc::c_long,
    primary_ctx_refs: libc::c_long,
}

const NOTHING: Live = Live { device_allocs: 0, host_allocs: 0, streams: 0, events: 0, primary_ctx_refs: 0 };

impl Fake {
    fn counter(&self, name: &str) -> libc::c_long {
        // SAFETY: the fake exports these as `long f(void)`.
        let f = unsafe { self.lib.get::<unsafe extern "C" fn() -> libc::c_long>(name.as_bytes()) }.expect(name);
        // SAFETY: no arguments; reads a counter under the fake's lock.
        unsafe { f() }
    }

    fn live(&self) -> Live {
        Live {
            device_allocs: self.counter("fake_cuda_live_device_allocs"),
            host_allocs: self.counter("fake_cuda_live_host_allocs"),
            streams: self.counter("fake_cuda_live_streams"),
            events: self.counter("fake_cuda_live_events"),
            primary_ctx_refs: self.counter("fake_cuda_primary_ctx_refs"),
        }
    }

    /// Makes every cuMemAlloc_v2 fail with CUDA_ERROR_OUT_OF_MEMORY until the guard drops.
    fn fail_alloc(&self) -> impl Drop + '_ {
        struct Reset<'a>(&'a Fake);
        impl Drop for Reset<'_> {
            fn drop(&mut self) {
                self.0.set_fail_alloc(0);
            }
        }
        self.set_fail_alloc(1);
        Reset(self)
    }

    fn set_fail_alloc(&self, fail: libc::c_int) {
        // SAFETY: the fake exports `void fake_cuda_fail_alloc(int)`.
        let f = unsafe { self.lib.get::<unsafe extern "C" fn(libc::c_int)>(b"fake_cuda_fail_alloc") }.expect("setter");
        // SAFETY: sets an int under no other contract.
        unsafe { f(fail) };
    }

    /// Calls cuMemAlloc_v2 directly, without binding anything: the CUresult and the pointer.
    fn raw_alloc(&self, bytes: usize) -> (i32, u64) {
        // SAFETY: cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytes).
        let f = unsafe { self.lib.get::<unsafe extern "C" fn(*mut u64, libc::size_t) -> i32>(b"cuMemAlloc_v2") }
            .expect("cuMemAlloc_v2");
        let mut ptr = 0u64;
        // SAFETY: a valid out-pointer.
        let code = unsafe { f(&mut ptr, bytes) };
        (code, ptr)
    }

    fn raw_free(&self, ptr: u64) -> i32 {
        // SAFETY: cuMemFree_v2(CUdeviceptr dptr).
        let f = unsafe { self.lib.get::<unsafe extern "C" fn(u64) -> i32>(b"cuMemFree_v2") }.expect("cuMemFree_v2");
        // SAFETY: the fake checks the pointer against its allocations.
        unsafe { f(ptr) }
    }
}

/// The tests share the fake's process-wide counters: under plain `cargo test` (one process,
/// many threads) they take turns; nextest runs each in its own process anyway.
fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn setup() -> (MutexGuard<'static, ()>, CudaDriver, Fake) {
    let guard = serial();
    let path = build().lib.to_str().expect("utf-8 path");
    let cuda = CudaDriver::load_from(&[path]).expect("load the fake driver");
    // SAFETY: the fake driver's initialisers are trivial; this maps the same library again.
    let fake = Fake { lib: unsafe { libloading::Library::new(path) }.expect("dlopen the fake") };
    assert_eq!(fake.live(), NOTHING, "a fresh test starts with nothing allocated");
    (guard, cuda, fake)
}

/// Runs `f` on a new thread, where no context is current yet.
fn on_fresh_thread<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|s| s.spawn(f).join().expect("thread panicked"))
}

/// Bytes that do not repeat with any short period.
fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

const GIB: u64 = 1 << 30;

#[test]
fn pinned_to_device_round_trip_on_a_stream_with_events() {
    let (_guard, cuda, fake) = setup();
    let ctx = cuda.context(0).expect("context");
    assert_eq!(ctx.device(), 0);
    assert_eq!(ctx.mem_info().expect("mem info"), (GIB, GIB));

    const N: usize = (1 << 20) + 123;
    const CHUNK: usize = 64 << 10;
    let mut pinned = ctx.alloc_pinned(N).expect("pinned");
    assert_eq!(pinned.len(), N);
    assert!(pinned.as_slice().iter().all(|b| *b == 0), "pinned memory is handed out zeroed");
    let input = pattern(1, N);
    pinned.as_mut_slice().copy_from_slice(&input);

    let dev = ctx.alloc(N).expect("device buffer");
    assert_eq!((dev.len(), dev.is_empty()), (N, false));
    assert_ne!(dev.ptr(), 0);
    let rounded = N.div_ceil(256) * 256;
    assert_eq!(ctx.mem_info().expect("mem info"), (GIB - rounded as u64, GIB));

    // Two staging "slots", one event each; chunks go last to first so offsets matter.
    let stream = ctx.stream().expect("stream");
    let events = [ctx.event().expect("event"), ctx.event().expect("event")];
    let chunks: Vec<usize> = (0..N).step_by(CHUNK).collect();
    for (i, &offset) in chunks.iter().enumerate().rev() {
        let len = CHUNK.min(N - offset);
        unsafe { stream.copy_to_device_async(dev.ptr() + offset as u64, &pinned, offset, len) }.expect("async copy");
        events[i % 2].record(&stream).expect("record");
    }
    for event in &events {
        event.synchronize().expect("event sync");
    }
    stream.synchronize().expect("stream sync");
    let mut back = vec![0u8; N];
    ctx.copy_to_host(&mut back, dev.ptr()).expect("copy back");
    assert!(back == input, "what landed in device memory differs from the input");

    // A slot refilled after its event completed carries the new bytes.
    let again = pattern(2, CHUNK);
    pinned.as_mut_slice()[..CHUNK].copy_from_slice(&again);
    unsafe { stream.copy_to_device_async(dev.ptr() + 5, &pinned, 0, CHUNK) }.expect("async copy");
    events[0].record(&stream).expect("record");
    events[0].synchronize().expect("event sync");
    let mut back = vec![0u8; CHUNK];
    ctx.copy_to_host(&mut back, dev.ptr() + 5).expect("copy back");
    assert!(back == again);

    // The synchronous pageable baseline.
    let baseline = pattern(3, 10_000);
    ctx.copy_to_device(dev.ptr() + 1000, &baseline).expect("sync copy");
    let mut back = vec![0u8; 10_000];
    ctx.copy_to_host(&mut back, dev.ptr() + 1000).expect("copy back");
    assert!(back == baseline);
    let mut head = vec![0u8; 5];
    ctx.copy_to_host(&mut head, dev.ptr()).expect("copy back");
    assert_eq!(head, input[..5], "bytes before the copies are untouched");

    let live = fake.live();
    assert_eq!(live, Live { device_allocs: 1, host_allocs: 1, streams: 1, events: 2, primary_ctx_refs: 1 });
}

#[test]
fn every_call_binds_the_context_itself_on_any_thread() {
    let (_guard, cuda, fake) = setup();
    // The fake catches a missing bind: a thread where no context is current is refused.
    assert_eq!(on_fresh_thread(|| fake.raw_alloc(4096).0), 201, "CUDA_ERROR_INVALID_CONTEXT");
    let ctx = on_fresh_thread(|| cuda.context(0).expect("context"));
    assert_eq!(on_fresh_thread(|| fake.raw_alloc(4096).0), 201, "context() leaves no thread bound for good");
    // An explicit bind makes raw driver calls on that thread work.
    on_fresh_thread(|| {
        ctx.bind().expect("bind");
        let (code, ptr) = fake.raw_alloc(4096);
        assert_eq!(code, 0);
        assert_eq!(fake.raw_free(ptr), 0);
    });

    // Each call below runs first thing on a thread of its own.
    const N: usize = 4096;
    let dev = on_fresh_thread(|| ctx.alloc(N).expect("alloc"));
    let mut pinned = on_fresh_thread(|| ctx.alloc_pinned(N).expect("alloc_pinned"));
    let stream = on_fresh_thread(|| ctx.stream().expect("stream"));
    let event = on_fresh_thread(|| ctx.event().expect("event"));
    let (free, total) = on_fresh_thread(|| ctx.mem_info().expect("mem_info"));
    assert_eq!((free, total), (GIB - N as u64, GIB));
    on_fresh_thread(|| ctx.copy_to_device(dev.ptr(), &[9u8; N]).expect("copy_to_device"));
    let input = pattern(4, N);
    pinned.as_mut_slice().copy_from_slice(&input);
    on_fresh_thread(|| unsafe { stream.copy_to_device_async(dev.ptr(), &pinned, 0, N) }.expect("copy_to_device_async"));
    on_fresh_thread(|| event.record(&stream).expect("record"));
    on_fresh_thread(|| event.synchronize().expect("event synchronize"));
    on_fresh_thread(|| stream.synchronize().expect("stream synchronize"));
    let back = on_fresh_thread(|| {
        let mut back = vec![0u8; N];
        ctx.copy_to_host(&mut back, dev.ptr()).expect("copy_to_host");
        back
    });
    assert!(back == input);
    assert_eq!(fake.live(), Live { device_allocs: 1, host_allocs: 1, streams: 1, events: 1, primary_ctx_refs: 1 });

    // Drops bind too: a drop that did not would leave its object alive in the fake.
    on_fresh_thread(move || drop(dev));
    on_fresh_thread(move || drop(pinned));
    on_fresh_thread(move || drop(stream));
    on_fresh_thread(move || drop(event));
    on_fresh_thread(move || drop(ctx));
    assert_eq!(fake.live(), NOTHING);
}

#[test]
fn many_threads_use_one_context_at_once() {
    let (_guard, cuda, fake) = setup();
    const THREADS: usize = 6;
    const SLICE: usize = 256 << 10;
    const ROUNDS: u64 = 20;
    let ctx = cuda.context(0).expect("context");
    // Shared by all threads: one device buffer (a slice each) and one stream.
    let shared = ctx.alloc(THREADS * SLICE).expect("shared buffer");
    let shared_stream = ctx.stream().expect("shared stream");
    let start = Barrier::new(THREADS);
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let (ctx, cuda, shared, shared_stream, start) = (ctx.clone(), &cuda, &shared, &shared_stream, &start);
            s.spawn(move || {
                // Half the threads retain the primary context themselves.
                let ctx = if t % 2 == 0 { ctx } else { cuda.context(0).expect("context") };
                let mut pinned = ctx.alloc_pinned(SLICE).expect("pinned");
                let dev = ctx.alloc(SLICE).expect("device");
                let stream = ctx.stream().expect("stream");
                let event = ctx.event().expect("event");
                let mut back = vec![0u8; SLICE];
                start.wait();
                for round in 0..ROUNDS {
                    let input = pattern(1000 * t as u64 + round, SLICE);
                    pinned.as_mut_slice().copy_from_slice(&input);
                    unsafe { stream.copy_to_device_async(dev.ptr(), &pinned, 0, SLICE) }.expect("async copy");
                    event.record(&stream).expect("record");
                    event.synchronize().expect("event sync");
                    ctx.copy_to_host(&mut back, dev.ptr()).expect("copy back");
                    assert!(back == input, "thread {t} round {round}: wrong bytes in device memory");
                }
                let dst = shared.ptr() + (t * SLICE) as u64;
                unsafe { shared_stream.copy_to_device_async(dst, &pinned, 0, SLICE) }.expect("async copy to shared");
                shared_stream.synchronize().expect("shared stream sync");
            });
        }
    });
    let mut back = vec![0u8; THREADS * SLICE];
    ctx.copy_to_host(&mut back, shared.ptr()).expect("copy back");
    for (t, slice) in back.chunks(SLICE).enumerate() {
        assert!(slice == pattern(1000 * t as u64 + ROUNDS - 1, SLICE), "thread {t}'s slice of the shared buffer");
    }
    assert_eq!(fake.live(), Live { device_allocs: 1, host_allocs: 0, streams: 1, events: 0, primary_ctx_refs: 1 });
    drop((shared, shared_stream, ctx));
    assert_eq!(fake.live(), NOTHING);
}

#[test]
fn dropping_everything_frees_everything() {
    let (_guard, cuda, fake) = setup();
    let ctx = cuda.context(0).expect("context");
    let second = cuda.context(0).expect("second context");
    let clone = ctx.clone();
    assert_eq!(fake.live().primary_ctx_refs, 2, "each context() retains once; clones do not");

    let devs: Vec<_> = (1..=3).map(|i| ctx.alloc(i * 1000).expect("alloc")).collect();
    let pinned: Vec<_> = (1..=2).map(|i| second.alloc_pinned(i * 1000).expect("pinned")).collect();
    let streams = [clone.stream().expect("stream"), ctx.stream().expect("stream")];
    let events: Vec<_> = (0..3).map(|_| second.event().expect("event")).collect();
    // 0-byte requests reach no driver call and hold nothing.
    let empty = ctx.alloc(0).expect("empty alloc");
    assert_eq!((empty.ptr(), empty.len(), empty.is_empty()), (0, 0, true));
    let mut empty_pinned = ctx.alloc_pinned(0).expect("empty pinned");
    assert!(empty_pinned.is_empty() && empty_pinned.as_slice().is_empty() && empty_pinned.as_mut_slice().is_empty());
    unsafe { streams[0].copy_to_device_async(devs[0].ptr(), &empty_pinned, 0, 0) }.expect("empty copy");
    assert_eq!(fake.live(), Live { device_allocs: 3, host_allocs: 2, streams: 2, events: 3, primary_ctx_refs: 2 });

    // The contexts go first: the handles keep them retained.
    drop((ctx, second, clone));
    assert_eq!(fake.live().primary_ctx_refs, 2);
    drop(devs);
    drop(pinned);
    assert_eq!(fake.live(), Live { device_allocs: 0, host_allocs: 0, streams: 2, events: 3, primary_ctx_refs: 2 });
    drop(streams);
    drop(events);
    assert_eq!(fake.live().primary_ctx_refs, 1, "the empty buffers still hold one context");
    drop((empty, empty_pinned));
    assert_eq!(fake.live(), NOTHING);

    let ctx = cuda.context(0).expect("context again");
    assert_eq!(ctx.mem_info().expect("mem info"), (GIB, GIB), "all device memory is free again");
}

#[test]
fn memory_mapped_before_the_context_is_registered_copied_from_and_unregistered() {
    let (_guard, cuda, fake) = setup();
    const N: usize = (3 << 20) + 777;
    // Mapped (and touched) with no context yet, as a load does while the driver starts.
    let memory = on_fresh_thread(|| HostMemory::map(N).expect("map"));
    let ctx = cuda.context(0).expect("context");
    let mut pinned = ctx.register(memory).expect("register");
    assert_eq!(pinned.len(), N);
    assert_eq!(pinned.as_slice().as_ptr() as usize % (2 << 20), 0, "huge-page aligned");
    assert!(pinned.as_slice().iter().all(|b| *b == 0), "mapped memory starts zeroed");
    assert_eq!(fake.live().host_allocs, 1, "registered as pinned");
    let input = pattern(7, N);
    pinned.as_mut_slice().copy_from_slice(&input);
    let dev = ctx.alloc(N).expect("device buffer");
    let stream = ctx.stream().expect("stream");
    // The fake refuses an asynchronous copy whose source is not pinned: this one is.
    unsafe { stream.copy_to_device_async(dev.ptr(), &pinned, 0, N) }.expect("async copy from registered memory");
    stream.synchronize().expect("sync");
    let mut back = vec![0u8; N];
    ctx.copy_to_host(&mut back, dev.ptr()).expect("copy back");
    assert!(back == input, "what landed differs from the registered bytes");
    let empty = ctx.register(HostMemory::map(0).expect("map nothing")).expect("register nothing");
    assert!(empty.is_empty());
    drop((pinned, empty));
    assert_eq!(fake.live().host_allocs, 0, "dropping the buffer unregisters it");
    drop((stream, dev, ctx));
    assert_eq!(fake.live(), NOTHING);
}

#[test]
fn shareable_buffers_round_up_and_map_through_their_ipc_handles() {
    let (_guard, cuda, fake) = setup();
    let ctx = cuda.context(0).expect("context");
    const N: usize = (1 << 20) + 123;
    let (free, _) = ctx.mem_info().expect("mem info");
    let dev = ctx.alloc_shareable(N).expect("alloc");
    assert_eq!(dev.len(), N, "the buffer keeps the length asked for");
    let (after, _) = ctx.mem_info().expect("mem info");
    assert_eq!(free - after, 2 << 20, "the allocation is rounded up to the 2 MiB large page");
    // The fake maps a handle of its own process (its device memory is this process's).
    let handle = dev.ipc_handle().expect("handle");
    let mapped = ctx.open_ipc(&handle, N).expect("open");
    assert_eq!((mapped.ptr(), mapped.len()), (dev.ptr(), N));
    let input = pattern(3, N);
    ctx.copy_to_device(mapped.ptr(), &input).expect("write through the mapping");
    let mut back = vec![0u8; N];
    ctx.copy_to_host(&mut back, dev.ptr()).expect("read the buffer");
    assert!(back == input, "the mapping and the buffer are the same memory");
    drop(mapped);
    drop(dev);
    let err = ctx.open_ipc(&handle, N).err().expect("a handle of freed memory is refused");
    assert!(err.to_string().starts_with("cuIpcOpenMemHandle_v2("), "{err}");
    drop(ctx);
    assert_eq!(fake.live(), NOTHING);
}

#[test]
fn out_of_memory_names_the_call_and_the_code() {
    let (_guard, cuda, fake) = setup();
    let ctx = cuda.context(0).expect("context");
    let err = ctx.alloc(8 << 30).expect_err("8 GiB on a 1 GiB device");
    assert!(matches!(err, GpuDumpError::Cuda { code: 2, .. }), "{err:?}");
    let msg = err.to_string();
    assert!(msg.starts_with("cuMemAlloc_v2(8589934592 bytes): CUDA_ERROR_OUT_OF_MEMORY (2): "), "{msg}");
    assert!(msg.contains("not enough free GPU memory"), "{msg}");

    let dev = ctx.alloc(4096).expect("4 KiB fits");
    {
        let _failing = fake.fail_alloc();
        let err = ctx.alloc(4096).expect_err("the fake refuses every allocation");
        assert!(err.to_string().starts_with("cuMemAlloc_v2(4096 bytes): CUDA_ERROR_OUT_OF_MEMORY (2)"), "{err}");
    }
    let again = ctx.alloc(4096).expect("allocations work again");
    assert_eq!(fake.live().device_allocs, 2, "failed allocations hold nothing");
    drop((dev, again, ctx));
    assert_eq!(fake.live(), NOTHING);
}

#[test]
fn copies_outside_the_pinned_buffer_are_refused_before_the_driver() {
    let (_guard, cuda, fake) = setup();
    let ctx = cuda.context(0).expect("context");
    let mut pinned = ctx.alloc_pinned(4096).expect("pinned");
    pinned.as_mut_slice().fill(7);
    let dev = ctx.alloc(8192).expect("device");
    ctx.copy_to_device(dev.ptr(), &[0u8; 8192]).expect("zero the device buffer");
    let stream = ctx.stream().expect("stream");

    for (offset, len) in [(4000, 200), (0, 4097), (4097, 0), (usize::MAX, 2), (1, usize::MAX)] {
        let err =
            unsafe { stream.copy_to_device_async(dev.ptr() + 4096, &pinned, offset, len) }.expect_err("out of bounds");
        assert!(matches!(err, GpuDumpError::Cuda { code: 1, .. }), "{err:?}");
        let msg = err.to_string();
        let head = format!(
            "cuMemcpyHtoDAsync_v2(dst {:#x}, src offset {offset}, {len} bytes): CUDA_ERROR_INVALID_VALUE (1): the \
             source range runs past the end of the 4096-byte pinned buffer (refused before calling the driver)",
            dev.ptr() + 4096
        );
        assert_eq!(msg, head);
    }
    // Ranges that end exactly at the end are fine.
    unsafe { stream.copy_to_device_async(dev.ptr(), &pinned, 4000, 96) }.expect("the last 96 bytes");
    unsafe { stream.copy_to_device_async(dev.ptr(), &pinned, 4096, 0) }.expect("an empty range at the end");
    stream.synchronize().expect("sync");
    let mut back = vec![0u8; 8192];
    ctx.copy_to_host(&mut back, dev.ptr()).expect("copy back");
    assert!(back[..96].iter().all(|b| *b == 7) && back[96..].iter().all(|b| *b == 0), "only the valid copy landed");

    // The device side is the caller's to get right; a driver that checks it (the fake does)
    // reports the call.
    let err = ctx.copy_to_device(dev.ptr() + 8000, &[1u8; 200]).expect_err("runs past the device buffer");
    assert!(
        err.to_string().starts_with(&format!(
            "cuMemcpyHtoD_v2(dst {:#x}, 200 bytes): CUDA_ERROR_INVALID_VALUE (1)",
            dev.ptr() + 8000
        )),
        "{err}"
    );
    drop((stream, dev, pinned, ctx));
    assert_eq!(fake.live(), NOTHING);
}

#[test]
fn a_missing_device_is_an_error_and_retains_nothing() {
    let (_guard, cuda, fake) = setup();
    let err = cuda.context(1).expect_err("the fake has one device");
    assert!(err.to_string().starts_with("cuDeviceGet(1): CUDA_ERROR_INVALID_VALUE (1)"), "{err}");
    assert_eq!(fake.live(), NOTHING);
}

#[test]
fn a_driver_without_the_memory_api_still_serves_checkpoints() {
    let _guard = serial();
    let path = build().no_memory_lib.to_str().expect("utf-8 path");
    let cuda = CudaDriver::load_from(&[path]).expect("the checkpoint API is all load needs");
    assert_eq!(cuda.driver_version().expect("version"), (13, 0));
    assert_eq!(
        cuda.devices().expect("devices"),
        vec![GpuInfo {
            index: 0,
            name: "Fake GPU".into(),
            total_mem_bytes: GIB,
            uuid: Some("GPU-fa4e0000-0000-0000-0000-000000000000".into())
        }]
    );
    assert_eq!(cuda.state(std::process::id()).expect("state"), ProcessState::Running);

    let err = cuda.context(0).expect_err("no memory API");
    match &err {
        GpuDumpError::CudaSymbol { symbol, library, .. } => {
            assert_eq!(*symbol, "cuDevicePrimaryCtxRetain");
            assert_eq!(library, path);
        }
        other => panic!("unexpected error {other:?}"),
    }
    let msg = err.to_string();
    assert!(msg.starts_with(&format!("{path} lacks cuDevicePrimaryCtxRetain: ")), "{msg}");
    assert!(msg.contains("the CUDA memory API needs it"), "{msg}");
}
