"""How fast can a load's host pipeline go on this machine, without gstore's own work? (issue #62)

    python3 benches/staging_pipeline.py STORE_DIR

Reads every file of at least 4 MiB under STORE_DIR (a store's packs, page cache warm) in 4 MiB
pieces on 12 or 16 threads: `pread` into a pinned buffer, a DMA to the GPU, and (but for `dma`)
a ~0.3 ms kernel behind it, as a GPU-checked load queues each read. Modes: `dma` (the copy
only), `same` (the kernel on the copy's stream, two streams per buffer, as gstore does),
`split` (copies on 1 or 2 shared copy streams, the kernel on its own stream behind an event).
Pinned memory from `cuMemHostAlloc` or registered (`mmap`, huge pages, `cuMemHostRegister`, as
gstore's staging). One or two buffers per thread. Prints GB/s of two passes per setting.
Needs the CUDA driver (libcuda) only."""
import ctypes as C, os, sys, threading, time, mmap
cu = C.CDLL("libcuda.so.1")
def ck(r, what):
    if r != 0: raise SystemExit(f"{what}: {r}")
ck(cu.cuInit(0), "init")
ctx = C.c_void_p(); ck(cu.cuDevicePrimaryCtxRetain(C.byref(ctx), 0), "ctx"); ck(cu.cuCtxSetCurrent(ctx), "set")
PTX = b"""
.version 7.0
.target sm_80
.address_size 64
.visible .entry spin(.param .u64 cycles) {
  .reg .u64 %rd<5>; .reg .pred %p;
  ld.param.u64 %rd1, [cycles];
  mov.u64 %rd2, %clock64;
L: mov.u64 %rd3, %clock64; sub.u64 %rd4, %rd3, %rd2; setp.lt.u64 %p, %rd4, %rd1; @%p bra L;
  ret;
}
"""
mod = C.c_void_p(); ck(cu.cuModuleLoadData(C.byref(mod), C.c_char_p(PTX + b"\0")), "module")
fn = C.c_void_p(); ck(cu.cuModuleGetFunction(C.byref(fn), mod, b"spin"), "fn")
SIZE = 4 << 20
DEV = 2 << 30
dptr = C.c_uint64(); ck(cu.cuMemAlloc_v2(C.byref(dptr), C.c_size_t(DEV)), "alloc")
packdir = sys.argv[1]  # every file of at least SIZE bytes under it
pieces = []
for root, _, files in os.walk(packdir):
    for f in sorted(files):
        p = os.path.join(root, f); n = os.path.getsize(p)
        if n < SIZE: continue
        fd = os.open(p, os.O_RDONLY)
        pieces += [(fd, o, min(SIZE, n - o)) for o in range(0, n, SIZE)]
TOTAL = sum(l for _, _, l in pieces)
def pinned(kind):
    if kind == "hostalloc":
        h = C.c_void_p(); ck(cu.cuMemHostAlloc(C.byref(h), C.c_size_t(SIZE), 1), "hostalloc"); return h.value, None
    m = mmap.mmap(-1, SIZE + (2 << 20))
    addr = C.addressof(C.c_char.from_buffer(m)); a = (addr + (2 << 20) - 1) & ~((2 << 20) - 1)
    C.CDLL(None).madvise(C.c_void_p(a), C.c_size_t(SIZE), 14)
    C.memset(a, 1, SIZE)
    ck(cu.cuMemHostRegister_v2(C.c_void_p(a), C.c_size_t(SIZE), 1), "register"); return a, m
def run(mode, kind, nthreads, per, copy_streams, cycles):
    bufs = [pinned(kind) for _ in range(nthreads * per)]
    cstreams = []
    for _ in range(copy_streams):
        st = C.c_void_p(); ck(cu.cuStreamCreate(C.byref(st), 1), "cstream"); cstreams.append(st)
    lock = threading.Lock(); nxt = [0]
    def worker(k):
        ck(cu.cuCtxSetCurrent(ctx), "set")
        sts, evs, dev = [], [], []
        for j in range(per * 2):
            st = C.c_void_p(); ck(cu.cuStreamCreate(C.byref(st), 1), "stream"); sts.append(st)
        for j in range(per):
            ev = C.c_void_p(); ck(cu.cuEventCreate(C.byref(ev), 2), "ev"); evs.append(ev)
        used = [False] * per; j = 0; d = 0
        arg = C.c_uint64(cycles); args = (C.c_void_p * 1)(C.cast(C.pointer(arg), C.c_void_p))
        while True:
            with lock:
                i = nxt[0]; nxt[0] += 1
            if i >= len(pieces): break
            if used[j]: ck(cu.cuEventSynchronize(evs[j]), "sync")
            b = bufs[k * per + j][0]
            fd, off, n = pieces[i]
            os.preadv(fd, [(C.c_char * n).from_address(b)], off)
            dst = C.c_uint64(dptr.value + (i * SIZE) % DEV)
            st = sts[d]
            cs = cstreams[i % copy_streams] if mode == "split" else st
            ck(cu.cuMemcpyHtoDAsync_v2(dst, C.c_void_p(b), C.c_size_t(n), cs), "cpy")
            ck(cu.cuEventRecord(evs[j], cs), "rec")
            if mode == "split": ck(cu.cuStreamWaitEvent(st, evs[j], 0), "wait")
            if mode != "dma":
                ck(cu.cuLaunchKernel(fn, 70, 1, 1, 64, 1, 1, 0, st, args, None), "launch")
            used[j] = True; j = (j + 1) % per; d = (d + 1) % len(sts)
        for st in sts: ck(cu.cuStreamSynchronize(st), "ss")
    ts = [threading.Thread(target=worker, args=(k,)) for k in range(nthreads)]
    t = time.perf_counter()
    for th in ts: th.start()
    for th in ts: th.join()
    for st in cstreams: ck(cu.cuStreamSynchronize(st), "cs")
    dt = time.perf_counter() - t
    for b, m in bufs:
        if m is None: cu.cuMemFreeHost(C.c_void_p(b))
        else: cu.cuMemHostUnregister(C.c_void_p(b))
    return TOTAL / dt / 1e9
print(f"probe: {TOTAL/1e9:.2f} GB in {len(pieces)} pieces of {SIZE>>20} MiB", flush=True)
# a 0.3 ms kernel: cycles at the SM clock
clk = C.c_int(); ck(cu.cuDeviceGetAttribute(C.byref(clk), 13, 0), "clock")  # kHz
cycles = int(clk.value * 1000 * 0.0003)
for kind in ("hostalloc", "register"):
    for mode, cs in (("dma", 1), ("same", 1), ("split", 1), ("split", 2)):
        for nthreads, per in ((12, 1), (12, 2), (16, 2)):
            r = [run(mode, kind, nthreads, per, cs, cycles) for _ in range(2)]
            print(f"{kind:9} {mode:5} cs{cs} t{nthreads} x{per}: " + " ".join(f"{x:.1f}" for x in r) + " GB/s", flush=True)
