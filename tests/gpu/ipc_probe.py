"""What mapping another process's device memory costs (`cuIpcOpenMemHandle`, issue #13's
`gstore hold`): one process exports N buffers of TOTAL/N bytes; another, started first and
waiting, maps and unmaps them, bare and then after each of the things a holder has made
(device buffers, streams, a module, pinned and registered host memory, threads that copied,
events). Driver API through ctypes. Prints the milliseconds per stage (docs/BENCHMARKS.md).
Usage (from the repository root):
    rm -f /tmp/h*; python3 tests/gpu/ipc_probe.py import /tmp/h & sleep 2
    python3 tests/gpu/ipc_probe.py export $((8<<30)) 8 /tmp/h [EXTRA_BYTES_EACH]; wait
"""
import ctypes as C, os, sys, threading, time
cu = C.CDLL("libcuda.so.1")
class H(C.Structure): _fields_ = [("r", C.c_ubyte * 64)]
cu.cuIpcOpenMemHandle_v2.argtypes = [C.POINTER(C.c_uint64), H, C.c_uint]
def ck(r, w):
    if r: raise SystemExit(f"{w}: {r}")
ck(cu.cuInit(0), "init"); ctx = C.c_void_p(); ck(cu.cuDevicePrimaryCtxRetain(C.byref(ctx), 0), "ctx"); ck(cu.cuCtxSetCurrent(ctx), "set")
if sys.argv[1] == "export":
    total, n = int(sys.argv[2]), int(sys.argv[3])
    extra = int(sys.argv[5]) if len(sys.argv) > 5 else 0  # bytes added to each buffer
    ptrs = []
    out = open(sys.argv[4], "wb")
    for _ in range(n):
        p = C.c_uint64(); ck(cu.cuMemAlloc_v2(C.byref(p), C.c_size_t(total // n + extra)), "alloc"); ptrs.append(p)
        h = H(); ck(cu.cuIpcGetMemHandle(C.byref(h), p), "get"); out.write(bytes(h.r))
    out.close(); open(sys.argv[4] + ".done", "w").close(); print("ready", flush=True)
    while not os.path.exists(sys.argv[4] + ".finished"): time.sleep(0.01)
else:
    while not os.path.exists(sys.argv[2] + ".done"): time.sleep(0.0005)
    data = open(sys.argv[2], "rb").read(); hs = [data[i:i+64] for i in range(0, len(data), 64)]
    def measure(label):
        got = []
        t = time.time()
        for hb in hs:
            h = H(); h.r[:] = hb; p = C.c_uint64(); ck(cu.cuIpcOpenMemHandle_v2(C.byref(p), h, 1), "open"); got.append(p)
        o = time.time() - t; t = time.time()
        for p in got: ck(cu.cuIpcCloseMemHandle(p), "close")
        print(f"{label}: {len(hs)} handles open {o*1000:.1f} ms, close {(time.time()-t)*1000:.1f} ms", flush=True)
    measure("bare")
    keep = []
    for _ in range(60):
        p = C.c_uint64(); ck(cu.cuMemAlloc_v2(C.byref(p), C.c_size_t(48 << 20)), "alloc"); keep.append(p)
    measure("+60 device allocs of 48 MiB")
    for _ in range(20):
        st = C.c_void_p(); ck(cu.cuStreamCreate(C.byref(st), 1), "stream"); keep.append(st)
    measure("+20 streams")
    ptx = b""".version 7.0\n.target sm_50\n.address_size 64\n.visible .entry k() { ret; }\n\0"""
    mod = C.c_void_p(); ck(cu.cuModuleLoadData(C.byref(mod), ptx), "module")
    measure("+module")
    for _ in range(20):
        h = C.c_void_p(); ck(cu.cuMemHostAlloc(C.byref(h), C.c_size_t(16 << 20), 1), "hostalloc"); keep.append(h)
    measure("+20 pinned 16 MiB")
    libc = C.CDLL("libc.so.6"); libc.mmap.restype = C.c_void_p
    libc.mmap.argtypes = [C.c_void_p, C.c_size_t, C.c_int, C.c_int, C.c_int, C.c_long]
    for _ in range(14):
        m = libc.mmap(None, 1 << 30, 3, 0x22, -1, 0); libc.madvise(C.c_void_p(m), C.c_size_t(1 << 30), 14)
        C.memset(m, 1, 1 << 30)
        ck(cu.cuMemHostRegister_v2(C.c_void_p(m), C.c_size_t(1 << 30), 1), "register")
    measure("+14 GiB registered")
    import threading
    def spin(): 
        x = 0
        for i in range(10**7): x += i
    th = [threading.Thread(target=spin) for _ in range(16)]; [x.start() for x in th]; [x.join() for x in th]
    measure("+16 threads ran")
    for _ in range(20):
        ev = C.c_void_p(); ck(cu.cuEventCreate(C.byref(ev), 2), "event"); keep.append(ev)
    measure("+20 events")
    dev = C.c_uint64(); ck(cu.cuMemAlloc_v2(C.byref(dev), C.c_size_t(16 << 20)), "alloc")
    def work(i):
        ck(cu.cuCtxSetCurrent(ctx), "set")
        st = C.c_void_p(); ck(cu.cuStreamCreate(C.byref(st), 1), "stream")
        for _ in range(20):
            ck(cu.cuMemcpyHtoDAsync_v2(dev, keep[80 + i], C.c_size_t(16 << 20), st), "copy")
        ck(cu.cuStreamSynchronize(st), "sync")
    th = [threading.Thread(target=work, args=(i,)) for i in range(16)]; [x.start() for x in th]; [x.join() for x in th]
    measure("+16 threads copied on their streams")
    def reg(i):
        ck(cu.cuCtxSetCurrent(ctx), "set")
        m = libc.mmap(None, 1 << 30, 3, 0x22, -1, 0); libc.madvise(C.c_void_p(m), C.c_size_t(1 << 30), 14)
        C.memset(m, 1, 1 << 30)
        ck(cu.cuMemHostRegister_v2(C.c_void_p(m), C.c_size_t(1 << 30), 1), "register")
    th = [threading.Thread(target=reg, args=(i,)) for i in range(8)]; [x.start() for x in th]; [x.join() for x in th]
    measure("+8 GiB registered on 8 threads")
    th = [threading.Thread(target=work, args=(i,)) for i in range(16)]; [x.start() for x in th]; [x.join() for x in th]
    measure("+16 threads copied again")
    open(sys.argv[2] + ".finished", "w").close()
