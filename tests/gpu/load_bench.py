"""Baselines and data for the VRAM load benchmark (tests/gpu/load_bench.sh).
Usage: load_bench.py make DIR GIB KIND...   writes DIR/KIND/shard-NN.safetensors, 1 GiB each, one
                                            tensor "w": raw = random int16 bits (stored raw by
                                            gstore), bf16 = N(0, 0.02) bf16 weights (small-magnitude,
                                            as trained weights are; zstd stores them at ~0.8),
                                            mix = a real-looking mix of bf16 tensors (MIX_TENSORS)
       load_bench.py pinned                 prints pinned and pageable host->device GB/s
       load_bench.py safetensors DIR        loads every shard in DIR with safetensors'
                                            load_file(device="cuda") and prints the GB/s"""
import glob
import os
import sys
import time

import torch
from safetensors.torch import load_file, save_file

GIB = 1 << 30

# The "mix" shard: sixteen 64 MiB bf16 tensors like a transformer's, in turn: weights of
# several scales (attention and MLP matrices of different widths are initialised and trained
# to different spreads), layer-norm gains near 1, weights with rare large outliers (as
# activation-heavy layers grow), and embeddings with a few large rows.
MIX_TENSORS = ["w0.006", "w0.01", "w0.02", "norm", "w0.035", "w0.05", "outliers", "embedding"] * 2


def mix_tensor(kind, n, g):
    randn = lambda: torch.randn(n, device="cuda", generator=g)
    if kind.startswith("w"):
        t = randn() * float(kind[1:])
    elif kind == "norm":
        t = 1.0 + randn() * 0.05
    elif kind == "outliers":
        big = torch.rand(n, device="cuda", generator=g) < 0.001
        t = randn() * 0.02 * torch.where(big, 30.0, 1.0)
    else:
        rows = randn().view(-1, 1024) * 0.02
        rows[::97] *= 20.0
        t = rows.view(-1)
    return t.to(torch.bfloat16)


def make(root, gib, kinds):
    g = torch.Generator(device="cuda").manual_seed(11)
    for kind in kinds:
        os.makedirs(os.path.join(root, kind), exist_ok=True)
        for i in range(gib):
            if kind == "raw":
                t = {"w": torch.randint(-32768, 32767, (GIB // 2,), dtype=torch.int16, device="cuda", generator=g)}
            elif kind == "mix":
                n = GIB // 2 // len(MIX_TENSORS)
                t = {f"{k}.{j}": mix_tensor(k, n, g) for j, k in enumerate(MIX_TENSORS)}
            else:
                t = {"w": (torch.randn(GIB // 2, device="cuda", generator=g) * 0.02).to(torch.bfloat16)}
            save_file({k: v.cpu() for k, v in t.items()}, os.path.join(root, kind, f"shard-{i:02}.safetensors"))


def gbps(nbytes, secs):
    return nbytes / 1e9 / secs


def pinned():
    n = GIB
    host = {"pinned": torch.empty(n, dtype=torch.uint8).pin_memory(), "pageable": torch.empty(n, dtype=torch.uint8)}
    dev = torch.empty(n, dtype=torch.uint8, device="cuda")
    for name, src in host.items():
        dev.copy_(src, non_blocking=True)
        torch.cuda.synchronize()
        t = time.time()
        for _ in range(8):
            dev.copy_(src, non_blocking=True)
        torch.cuda.synchronize()
        print(f"{name} host->device: {gbps(8 * n, time.time() - t):.2f} GB/s")


def safetensors(root):
    files = sorted(glob.glob(os.path.join(root, "*.safetensors")))
    total = sum(os.path.getsize(f) for f in files)
    torch.cuda.init()
    t = time.time()
    out = [load_file(f, device="cuda") for f in files]
    torch.cuda.synchronize()
    secs = time.time() - t
    print(f"safetensors load_file(device=cuda) {os.path.basename(root)}: {total / 1e9:.2f} GB in {secs:.2f} s: {gbps(total, secs):.2f} GB/s")
    del out


if sys.argv[1] == "make":
    make(sys.argv[2], int(sys.argv[3]), sys.argv[4:])
elif sys.argv[1] == "pinned":
    pinned()
else:
    safetensors(sys.argv[2])
