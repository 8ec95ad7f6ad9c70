"""Can the GPU copy straight from the page cache? (issue #62)

    python3 benches/page_cache_dma.py FILE GIB

Writes FILE (GIB GiB of random bytes) unless it is there at that size, reads it once (warm),
then moves it into VRAM 64 MiB at a time on a thread pool, two ways, twice: `pread` into
pinned buffers (one per thread) then a copy to the device, as gstore's loads do; and `mmap`
the piece, `cuMemHostRegister` it read-only, copy from it, unregister (with and without
`MAP_POPULATE`, and once without the read-only flag, which the driver refuses for a read-only
mapping). The first and last MiB are compared with the file after each. Prints a JSON line
per case: seconds, GB/s, and per thread the seconds spent mapping, registering, copying and
unregistering (pread's time in the first)."""
import ctypes
import json
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

path, gib = sys.argv[1], int(sys.argv[2])
size = gib << 30
PIECE = 64 << 20
if not os.path.exists(path) or os.path.getsize(path) != size:
    rng = np.random.default_rng(1)
    with open(path, "wb") as f:
        for _ in range(size // PIECE):
            f.write(rng.bytes(PIECE))
with open(path, "rb") as f:
    while f.read(1 << 26):
        pass

libc = ctypes.CDLL("libc.so.6", use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
libc.pread.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_long]
libc.pread.restype = ctypes.c_ssize_t
cu = ctypes.CDLL("libcuda.so.1")
for name, args in {
    "cuMemHostRegister_v2": [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint],
    "cuMemHostUnregister": [ctypes.c_void_p],
    "cuMemcpyHtoD_v2": [ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t],
    "cuCtxGetCurrent": [ctypes.c_void_p],
    "cuCtxSetCurrent": [ctypes.c_void_p],
}.items():
    getattr(cu, name).argtypes = args
PROT_READ, MAP_SHARED, MAP_POPULATE = 1, 1, 0x8000
READ_ONLY = 0x08

dev = torch.empty(size, dtype=torch.uint8, device="cuda:0")
torch.cuda.synchronize()
ctx = ctypes.c_void_p()
cu.cuCtxGetCurrent(ctypes.byref(ctx))
fd = os.open(path, os.O_RDONLY)


def check(rc, what):
    if rc != 0:
        raise RuntimeError(f"{what}: CUresult {rc}")


def piece_mmap(i, populate, flags=READ_ONLY):
    cu.cuCtxSetCurrent(ctx)
    off = i * PIECE
    t0 = time.perf_counter()
    p = libc.mmap(None, PIECE, PROT_READ, MAP_SHARED | (MAP_POPULATE if populate else 0), fd, off)
    t1 = time.perf_counter()
    check(cu.cuMemHostRegister_v2(p, PIECE, flags), "register")
    t2 = time.perf_counter()
    check(cu.cuMemcpyHtoD_v2(dev.data_ptr() + off, p, PIECE), "copy")
    t3 = time.perf_counter()
    check(cu.cuMemHostUnregister(p), "unregister")
    libc.munmap(p, PIECE)
    t4 = time.perf_counter()
    return (t1 - t0, t2 - t1, t3 - t2, t4 - t3)


local = threading.local()


def piece_pread(i):
    cu.cuCtxSetCurrent(ctx)
    if not hasattr(local, "buf"):
        local.buf = torch.empty(PIECE, dtype=torch.uint8, pin_memory=True)
    buf = local.buf
    off = i * PIECE
    t0 = time.perf_counter()
    n = libc.pread(fd, buf.data_ptr(), PIECE, off)
    assert n == PIECE
    t1 = time.perf_counter()
    check(cu.cuMemcpyHtoD_v2(dev.data_ptr() + off, buf.data_ptr(), PIECE), "copy")
    return (t1 - t0, 0, time.perf_counter() - t1, 0)


def run(label, fn, threads):
    n = size // PIECE
    t = time.perf_counter()
    with ThreadPoolExecutor(threads) as ex:
        parts = list(ex.map(fn, range(n)))
    dt = time.perf_counter() - t
    torch.cuda.synchronize()
    # Check the bytes: the first and last pieces compared with the file.
    for i in (0, n - 1):
        want = np.fromfile(path, dtype=np.uint8, count=1 << 20, offset=i * PIECE)
        got = dev[i * PIECE : i * PIECE + (1 << 20)].cpu().numpy()
        assert (want == got).all(), label
    dev.zero_()
    torch.cuda.synchronize()
    sums = [round(sum(p[k] for p in parts) / threads, 4) for k in range(4)]
    print(json.dumps({"case": label, "threads": threads, "s": round(dt, 4), "GB/s": round(size / dt / 1e9, 1),
                      "per_thread_map_reg_copy_unreg": sums}), flush=True)


for rnd in range(2):
    run("pread->pinned->dma", piece_pread, 16)
    for threads in (8, 16):
        run("mmap+populate+register", lambda i: piece_mmap(i, True), threads)
    run("mmap+register (no populate)", lambda i: piece_mmap(i, False), 16)
    try:
        run("mmap+register flags 0", lambda i: piece_mmap(i, True, 0), 16)
    except RuntimeError as e:
        print(json.dumps({"case": "flags 0", "error": str(e)}), flush=True)

