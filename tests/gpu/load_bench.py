"""Baselines and data for the VRAM load benchmark (tests/gpu/load_bench.sh).
Usage: load_bench.py make DIR GIB      writes DIR/raw/*.bin (random bits: stored raw) and
                                       DIR/bf16/*.bin (randn bf16: zstd-compressible), 1 GiB shards,
                                       and DIR/st/ (the raw shards as safetensors, if installed)
       load_bench.py baselines DIR      prints pinned and pageable host->device GB/s and the
                                       time to load DIR/raw with safetensors (or numpy) + .cuda()"""
import glob
import os
import sys
import time

import torch

GIB = 1 << 30


def make(root, gib):
    for kind in ("raw", "bf16"):
        os.makedirs(os.path.join(root, kind), exist_ok=True)
    g = torch.Generator(device="cuda").manual_seed(11)
    for i in range(gib):
        bits = torch.randint(-32768, 32767, (GIB // 2,), dtype=torch.int16, device="cuda", generator=g)
        bits.cpu().numpy().tofile(os.path.join(root, "raw", f"shard-{i:02}.bin"))
        vals = torch.randn(GIB // 2, dtype=torch.bfloat16, device="cuda", generator=g)
        vals.view(torch.int16).cpu().numpy().tofile(os.path.join(root, "bf16", f"shard-{i:02}.bin"))
    try:
        from safetensors.torch import save_file

        os.makedirs(os.path.join(root, "st"), exist_ok=True)
        for path in sorted(glob.glob(os.path.join(root, "raw", "*.bin"))):
            t = torch.from_file(path, size=GIB // 2, dtype=torch.int16)
            save_file({"w": t}, os.path.join(root, "st", os.path.basename(path) + ".safetensors"))
    except ImportError:
        pass


def gbps(nbytes, secs):
    return nbytes / 1e9 / secs


def baselines(root):
    n = GIB
    pinned = torch.empty(n, dtype=torch.uint8).pin_memory()
    pageable = torch.empty(n, dtype=torch.uint8)
    dev = torch.empty(n, dtype=torch.uint8, device="cuda")
    for name, src in (("pinned", pinned), ("pageable", pageable)):
        dev.copy_(src, non_blocking=True)
        torch.cuda.synchronize()
        t = time.time()
        for _ in range(8):
            dev.copy_(src, non_blocking=True)
        torch.cuda.synchronize()
        print(f"{name} host->device: {gbps(8 * n, time.time() - t):.2f} GB/s")
    del dev
    files = sorted(glob.glob(os.path.join(root, "raw", "*.bin")))
    st = sorted(glob.glob(os.path.join(root, "st", "*.safetensors")))
    total = sum(os.path.getsize(f) for f in files)
    for f in st or files:  # warm the page cache, as for the store
        with open(f, "rb") as h:
            while h.read(64 << 20):
                pass
    torch.cuda.synchronize()
    t = time.time()
    if st:
        from safetensors.torch import load_file

        out = [load_file(f)["w"].cuda() for f in st]
        how = "safetensors load_file + .cuda()"
    else:
        import numpy as np

        out = [torch.from_numpy(np.fromfile(f, dtype=np.int16)).cuda() for f in files]
        how = "numpy fromfile + .cuda() (safetensors not installed)"
    torch.cuda.synchronize()
    print(f"{how}: {total / 1e9:.2f} GB in {time.time() - t:.2f} s: {gbps(total, time.time() - t):.2f} GB/s")
    del out


if sys.argv[1] == "make":
    make(sys.argv[2], int(sys.argv[3]))
else:
    baselines(sys.argv[2])
