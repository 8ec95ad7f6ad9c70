"""torch.distributed.checkpoint through gstore vs DCP to a directory (issue #47): WORLD ranks
(gloo on the CPU, or NCCL with --cuda) hold a model of PARAMS fp32 parameters sharded over the
ranks (DTensor Shard(0)) and its AdamW state; each saves two checkpoints STEPS training steps
apart, with dcp.save to gstore.torch.Writer and to FileSystemWriter, then loads the last back
on every rank and on one process (resharded), and prints times, bytes and ratios.

The first checkpoint is taken after WARMUP steps (default 50: Adam's moments settle, as in
a run some way in). Rank 0 also prints the order-0 entropy bound of its shard's second
checkpoint: byte lanes of the fp32 words on their own (what a float codec can reach), and
of their XOR with the first checkpoint's (what a delta against it can).

Usage: python benches/dcp_compare.py [--world 2] [--params 50e6] [--steps 10] [--warmup 50] [--cuda] DIR
(DIR: a scratch directory on the disk to measure; it is emptied first).
"""

import argparse
import json
import os
import shutil
import socket
import subprocess
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp

import gstore
import gstore.torch


def du(path):
    return int(subprocess.check_output(["du", "-sb", path]).split()[0])


def shapes(params):
    # A stack of square-ish layers of about `params` parameters in all (GPT-like widths).
    width = 2048
    layers = max(1, int(params) // (width * width))
    return {f"layer{i}.weight": (width, width) for i in range(layers)}


def lane_entropy(words):
    """Order-0 entropy of the four byte lanes of 32-bit words, as a fraction of their bits."""
    lanes = words.view(np.uint8).reshape(-1, 4)
    bits = 0.0
    for i in range(4):
        p = np.bincount(lanes[:, i], minlength=256) / len(lanes)
        p = p[p > 0]
        bits += float(-(p * np.log2(p)).sum())
    return bits / 32


def rank_main(rank, args, port, out):
    from torch.distributed.tensor import Shard, distribute_tensor, init_device_mesh

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), LOCAL_RANK=str(rank))
    dev = "cuda" if args.cuda else "cpu"
    if args.cuda:
        torch.cuda.set_device(rank)
    dist.init_process_group("nccl" if args.cuda else "gloo", rank=rank, world_size=args.world)
    mesh = init_device_mesh(dev, (args.world,))
    g = torch.Generator().manual_seed(0)
    params = {
        k: torch.nn.Parameter(distribute_tensor((torch.randn(*s, generator=g) * 0.02).to(dev), mesh, [Shard(0)]))
        for k, s in shapes(args.params).items()
    }
    opt = torch.optim.AdamW(params.values(), lr=1e-4)

    def train(n):
        for _ in range(n):
            loss = sum((p * p).sum() for p in params.values())
            loss.backward()
            opt.step()
            opt.zero_grad()

    def state():
        return {"model": dict(params), "optim": opt.state_dict()}

    def flat(s):
        out = list(s["model"].values())
        for per_param in s["optim"]["state"].values():
            out.extend(v for k, v in per_param.items() if k in ("exp_avg", "exp_avg_sq"))
        return out

    snapshots = []

    times = {}
    train(args.warmup)
    for step in (1, 2):
        for kind in ("gstore", "dir"):
            dist.barrier()
            t = time.perf_counter()
            if kind == "gstore":
                dcp.save(state(), storage_writer=gstore.torch.Writer(args.store, f"bench:step-{step}"))
            else:
                dcp.save(state(), storage_writer=dcp.FileSystemWriter(f"{args.dir}/step-{step}"))
            dist.barrier()
            times[f"save_{kind}_{step}"] = time.perf_counter() - t
        if rank == 0 and step == 1:
            times["store_after_1"] = du(args.store)
        if rank == 0:
            words = np.concatenate([t.to_local().detach().cpu().numpy().view(np.uint32).ravel() for t in flat(state())])
            snapshots.append(words)
        train(args.steps)
    for kind in ("gstore", "dir"):
        target = state()
        dist.barrier()
        t = time.perf_counter()
        if kind == "gstore":
            dcp.load(target, storage_reader=gstore.torch.Reader(args.store, "bench:step-2"))
        else:
            dcp.load(target, storage_reader=dcp.FileSystemReader(f"{args.dir}/step-2"))
        dist.barrier()
        times[f"load_{kind}"] = time.perf_counter() - t
    if rank == 0:
        times["bound_own"] = lane_entropy(snapshots[1])
        times["bound_xor"] = lane_entropy(snapshots[1] ^ snapshots[0])
        with open(out, "w") as f:
            json.dump(times, f)
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("scratch")
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--params", type=float, default=50e6)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--cuda", action="store_true")
    args = ap.parse_args()
    shutil.rmtree(args.scratch, ignore_errors=True)
    os.makedirs(args.scratch)
    args.store = os.path.join(args.scratch, "store")
    args.dir = os.path.join(args.scratch, "dcp")
    os.makedirs(args.dir)
    gstore.Store.init(args.store)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = os.path.join(args.scratch, "times.json")
    mp.start_processes(rank_main, args=(args, port, out), nprocs=args.world, start_method="spawn")
    t = json.load(open(out))
    store = gstore.Store(args.store)
    logical = store.show("bench:step-2")["logical_bytes"]
    store_bytes = du(args.store)
    dir_bytes = du(args.dir)
    # One process resumes the 2-rank checkpoint (resharded to whole tensors).
    full = {k: torch.zeros(*s) for k, s in shapes(args.params).items()}
    t0 = time.perf_counter()
    dcp.load({"model": full}, storage_reader=gstore.torch.Reader(args.store, "bench:step-2"))
    one = time.perf_counter() - t0
    print(f"{args.world} ranks, {logical / 1e9:.2f} GB a checkpoint (model + AdamW), {args.steps} steps apart")
    for step in (1, 2):
        g, d = t[f"save_gstore_{step}"], t[f"save_dir_{step}"]
        print(f"save {step}: gstore {g:.2f} s, directory {d:.2f} s ({g / d:.2f}x)")
    print(f"load on {args.world} ranks: gstore {t['load_gstore']:.2f} s, directory {t['load_dir']:.2f} s "
          f"({t['load_gstore'] / t['load_dir']:.2f}x); resumed on 1 process (model): {one:.2f} s")
    added = store_bytes - t["store_after_1"]
    print(f"stored for 2 checkpoints: gstore {store_bytes / 1e9:.2f} GB, directory {dir_bytes / 1e9:.2f} GB "
          f"({store_bytes / dir_bytes:.2f}x); the second checkpoint added {added / 1e9:.2f} GB to the store "
          f"({added / logical:.2f} of its logical bytes)")
    print(f"entropy bound of rank 0's second checkpoint (fp32 byte lanes, order 0): alone {t['bound_own']:.2f}, "
          f"XOR the first {t['bound_xor']:.2f} of its bytes")


if __name__ == "__main__":
    main()
