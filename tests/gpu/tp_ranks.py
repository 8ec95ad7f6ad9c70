"""A tensor-parallel-shaped process tree: a parent that imported torch but holds no CUDA context,
and WORLD ranks forked from it, each on its own GPU (rank r on cuda:r) holding MIB of seeded
weights, joined by torch.distributed (NCCL on GPUs, gloo on the CPU) and all-reducing in a loop.

Usage: tp_ranks.py OUT_DIR [--world 2] [--mib 3072] [--backend nccl|gloo] [--period 0.02]

Each rank writes OUT_DIR/rank<r> in place: "STEP STATE WEIGHTS_CRC", STATE "ok" or "bad: WHY".
Each step every rank all-reduces a tensor of (rank + 1) * step and checks the sum
(WORLD * (WORLD + 1) / 2 * step); every 50 steps it checks its weights' checksum against the
one taken at start. The parent writes OUT_DIR/pids ("PARENT RANK0 RANK1 ...") once all ranks
stepped, then waits. A rank that finds a wrong value stops stepping (its peers then block in
the next all-reduce): a checker sees the step stop or a "bad" state.
"""
import argparse
import os
import socket
import sys
import time

import torch
import torch.distributed as dist


def weights(rank, mib, device):
    g = torch.Generator(device="cpu").manual_seed(1234 + rank)
    # Small-magnitude floats, like a model's weights, made on the host in 256 MiB pieces.
    n = (mib << 20) // 2
    out = torch.empty(n, dtype=torch.bfloat16, device=device)
    step = 128 << 20
    for at in range(0, n, step):
        m = min(step, n - at)
        out[at:at + m].copy_((torch.randn(m, generator=g) * 0.02).to(torch.bfloat16))
    return out


def checksum(t):
    # A sum of the bit patterns, in int64: equal only if the bytes are.
    return int(t.view(torch.int16).to(torch.int64).sum().item())


def rank_main(rank, args, port):
    device = torch.device(f"cuda:{rank}") if args.backend == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(args.backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=args.world)
    w = weights(rank, args.mib, device)
    crc = checksum(w)
    status = os.open(os.path.join(args.out, f"rank{rank}"), os.O_RDWR | os.O_CREAT, 0o644)
    expect = args.world * (args.world + 1) // 2
    step, state = 0, "ok"
    while state == "ok":
        step += 1
        x = torch.full((1024,), float((rank + 1) * step), device=device)
        dist.all_reduce(x)
        got = x[0].item()
        if got != expect * step or not bool((x == got).all()):
            state = f"bad: all-reduce gave {got} at step {step}, not {expect * step}"
        if state == "ok" and step % 50 == 0 and checksum(w) != crc:
            state = f"bad: weights changed by step {step}"
        os.pwrite(status, b"%020d %-70s %d\n" % (step, state.encode(), crc), 0)
        time.sleep(args.period)
    time.sleep(3600)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--mib", type=int, default=3072)
    p.add_argument("--backend", default="nccl", choices=["nccl", "gloo"])
    p.add_argument("--period", type=float, default=0.02)
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    ranks = []
    for rank in range(args.world):
        pid = os.fork()
        if pid == 0:
            try:
                rank_main(rank, args, port)
            finally:
                os._exit(1)
        ranks.append(pid)

    def stepped(r):
        try:
            with open(os.path.join(args.out, f"rank{r}")) as f:
                return int(f.read().split()[0]) > 0
        except (OSError, ValueError, IndexError):
            return False

    while not all(stepped(r) for r in range(args.world)):
        if any(os.waitpid(pid, os.WNOHANG)[0] for pid in ranks):
            sys.exit("a rank exited before it stepped")
        time.sleep(0.05)
    with open(os.path.join(args.out, "pids"), "w") as f:
        f.write(" ".join(str(p) for p in [os.getpid()] + ranks) + "\n")
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()
