"""Issue #13: can pack bytes in the page cache reach VRAM without a host copy? Moves FILE (warm
in the page cache) into device memory in slices of SLICE_MIB on THREADS threads, two ways,
each twice, alternating: `pread` into pinned buffers and DMA from them (gstore's path), and
the slice mapped (mmap), registered with the driver (cuMemHostRegister, read-only), DMA'd from
the page cache itself, unregistered and unmapped. Prints GB/s for each (docs/BENCHMARKS.md).
Driver API through ctypes; no checks of the bytes, only the movement.
A mix: with REG_THREADS > 0, that many of the THREADS register slices and the rest copy, all
taking slices from one queue (registration is serialised in the driver, copying is bound by
host memory bandwidth; a mix may pass either alone).
Usage: python3 tests/gpu/register_probe.py FILE THREADS SLICE_MIB [REG_THREADS...]"""
import ctypes as C, os, sys, threading, time
path, nthreads, slice_mib = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
mixes = [int(a) for a in sys.argv[4:]]
cu = C.CDLL("libcuda.so.1")
def ck(r, what):
    if r != 0:
        s = C.c_char_p(); cu.cuGetErrorString(r, C.byref(s)); raise SystemExit(f"{what}: {r} {s.value}")
ck(cu.cuInit(0), "init")
ctx = C.c_void_p(); ck(cu.cuDevicePrimaryCtxRetain(C.byref(ctx), 0), "ctx")
ck(cu.cuCtxSetCurrent(ctx), "set")
size = os.path.getsize(path)
dptr = C.c_uint64(); ck(cu.cuMemAlloc_v2(C.byref(dptr), C.c_size_t(size)), "alloc")
fd = os.open(path, os.O_RDONLY)
libc = C.CDLL("libc.so.6", use_errno=True)
libc.mmap.restype = C.c_void_p
libc.mmap.argtypes = [C.c_void_p, C.c_size_t, C.c_int, C.c_int, C.c_int, C.c_long]
os.system(f"cat {path} > /dev/null")
sl = slice_mib << 20
slices = [(o, min(sl, size - o)) for o in range(0, size, sl)]

pinned = []
for _ in range(2 * nthreads):
    h = C.c_void_p(); ck(cu.cuMemHostAlloc(C.byref(h), C.c_size_t(sl), 0), "hostalloc"); pinned.append(h)

def run(fn, reg_threads=0):
    it = iter(slices); lock = threading.Lock(); errs = []
    def worker(k):
        ck(cu.cuCtxSetCurrent(ctx), "set")
        st = C.c_void_p(); ck(cu.cuStreamCreate(C.byref(st), 1), "stream")
        state = {"bufs": pinned[2 * k:2 * k + 2], "i": 0}
        while True:
            with lock:
                nxt = next(it, None)
            if nxt is None: break
            try: (registered if k < reg_threads else fn)(st, state, *nxt)
            except BaseException as e: errs.append(e); break
        ck(cu.cuStreamSynchronize(st), "sync")
    t = time.time()
    th = [threading.Thread(target=worker, args=(k,)) for k in range(nthreads)]
    [x.start() for x in th]; [x.join() for x in th]
    if errs: raise errs[0]
    return time.time() - t

# A: map + register (read-only) + DMA + unregister, per slice.
def registered(st, state, off, n):
    p = libc.mmap(None, n, 1, 1, fd, off)  # PROT_READ, MAP_SHARED
    ck(cu.cuMemHostRegister_v2(C.c_void_p(p), C.c_size_t(n), 0x08), "register")
    ck(cu.cuMemcpyHtoDAsync_v2(C.c_uint64(dptr.value + off), C.c_void_p(p), C.c_size_t(n), st), "copy")
    ck(cu.cuStreamSynchronize(st), "sync")
    ck(cu.cuMemHostUnregister(C.c_void_p(p)), "unregister")
    libc.munmap(C.c_void_p(p), C.c_size_t(n))

# B: pread into this thread's pinned buffer + DMA (two buffers, alternating: a buffer is
# read into again once its own DMA is done, so one buffer's read overlaps the other's DMA).
def pread_pinned(st, state, off, n):
    k = state["i"] % 2; state["i"] += 1
    h, done = state["bufs"][k], state.setdefault("events", {}).get(k)
    if done is not None:
        ck(cu.cuEventSynchronize(done), "event sync")
    else:
        done = C.c_void_p(); ck(cu.cuEventCreate(C.byref(done), 2), "event"); state["events"][k] = done
    view = (C.c_char * n).from_address(h.value)
    got = os.preadv(fd, [memoryview(view).cast("B")], off)
    assert got == n
    ck(cu.cuMemcpyHtoDAsync_v2(C.c_uint64(dptr.value + off), h, C.c_size_t(n), st), "copy")
    ck(cu.cuEventRecord(done, st), "record")

for mix in mixes:
    for _ in range(2):
        s = run(pread_pinned, mix)
        print(f"mix: {mix} registering + {nthreads - mix} copying, {slice_mib} MiB slices: {s:.3f} s, {size / s / 1e9:.1f} GB/s", flush=True)

for name, fn in [] if mixes else [("pread+pinned", pread_pinned), ("mmap+register", registered), ("pread+pinned", pread_pinned), ("mmap+register", registered)]:
    s = run(fn)
    print(f"{name}: {nthreads} threads, {slice_mib} MiB slices: {s:.3f} s, {size / s / 1e9:.1f} GB/s", flush=True)
