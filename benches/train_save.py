"""Training checkpoints on a GPU (issue #47's table), all in one run on one disk: a
GPT-2-large-shaped fp32 model and its AdamW state on the GPU (774 M parameters, 1309 tensors
with the optimizer's, ~9.3 GB), trained WARMUP steps with gradient noise, then saved with

  torch.save, dcp.save, dcp.async_save (twice: the first pays its setup), gstore Store.save
  (blocking=False, twice), and gstore Store.save again STEPS steps later (the second checkpoint),

each timed as the training stall (until the call returns) and durable (until the bytes are
synced to disk: the future / handle done, then sync). The disk's own rate is measured with
`dd conv=fsync` in the same run. Then the second checkpoint is loaded back with load_into and
compared bit for bit.

Usage: python benches/train_save.py DIR [--steps 10] [--warmup 20] [--layers 36]
"""

import argparse
import os
import shutil
import subprocess
import time

import torch
import torch.distributed.checkpoint as dcp

import gstore

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def gpt2_like(layers, d=1280, vocab=50257, ctx=1024):
    """Parameters shaped like GPT-2 large's (fp32, on the GPU)."""
    shapes = {"wte": (vocab, d), "wpe": (ctx, d)}
    for i in range(layers):
        p = f"h.{i}."
        shapes.update({
            p + "ln_1.weight": (d,), p + "ln_1.bias": (d,),
            p + "attn.c_attn.weight": (d, 3 * d), p + "attn.c_attn.bias": (3 * d,),
            p + "attn.c_proj.weight": (d, d), p + "attn.c_proj.bias": (d,),
            p + "ln_2.weight": (d,), p + "ln_2.bias": (d,),
            p + "mlp.c_fc.weight": (d, 4 * d), p + "mlp.c_fc.bias": (4 * d,),
            p + "mlp.c_proj.weight": (4 * d, d), p + "mlp.c_proj.bias": (d,),
        })
    shapes.update({"ln_f.weight": (d,), "ln_f.bias": (d,)})
    g = torch.Generator(device=DEV).manual_seed(0)
    return {k: torch.nn.Parameter(torch.randn(*s, device=DEV, generator=g) * 0.02) for k, s in shapes.items()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--layers", type=int, default=36)
    a = ap.parse_args()
    shutil.rmtree(a.dir, ignore_errors=True)
    os.makedirs(a.dir)

    def sync():
        os.sync()

    dd = subprocess.run(["dd", "if=/dev/zero", f"of={a.dir}/dd", "bs=64M", "count=64", "conv=fsync"],
                        capture_output=True, text=True).stderr.strip().splitlines()[-1]
    t = float(dd.split(",")[-2].split()[0])
    disk = 64 * 64 * 2**20 / t
    os.remove(f"{a.dir}/dd")
    print(f"disk: dd conv=fsync {disk / 1e9:.2f} GB/s ({dd})", flush=True)

    params = gpt2_like(a.layers)
    opt = torch.optim.AdamW(params.values(), lr=1e-4)
    gen = torch.Generator(device=DEV).manual_seed(1)

    def train(n):
        for _ in range(n):
            for p in params.values():
                p.grad = torch.randn(p.shape, device=DEV, generator=gen) * 1e-2
            opt.step()
        if DEV == "cuda":
            torch.cuda.synchronize()

    def state(step):
        return {"model": dict(params), "optim": opt.state_dict(), "step": step}

    train(a.warmup)
    tensors = len(params) * 3
    nbytes = sum(p.numel() * 4 for p in params.values()) * 3
    print(f"state: {tensors} tensors (+ steps), {nbytes / 1e9:.2f} GB on the GPU", flush=True)
    rows = []

    def timed(name, save, wait=None, stored=None):
        t0 = time.perf_counter()
        r = save()
        stall = time.perf_counter() - t0
        if wait:
            r = wait(r)
        sync()
        durable = time.perf_counter() - t0
        rows.append((name, stall, durable, stored(r) if stored else None))
        print(f"{name}: stall {stall:.2f} s, durable {durable:.2f} s", flush=True)
        return r

    du = lambda p: int(subprocess.check_output(["du", "-sb", p]).split()[0])  # noqa: E731
    f = f"{a.dir}/torch.pt"
    timed("torch.save", lambda: torch.save(state(0), f), stored=lambda _: du(f))
    os.remove(f)
    timed("dcp.save", lambda: dcp.save(state(0), checkpoint_id=f"{a.dir}/dcp"), stored=lambda _: du(f"{a.dir}/dcp"))
    shutil.rmtree(f"{a.dir}/dcp")
    for i in (1, 2):
        try:
            timed(f"dcp.async_save #{i}", lambda: dcp.async_save(state(0), checkpoint_id=f"{a.dir}/adcp{i}"),
                  wait=lambda fut: fut.result(), stored=lambda _: du(f"{a.dir}/adcp{i}"))
        except Exception as e:  # noqa: BLE001 - reported, and the rest still runs
            print(f"dcp.async_save #{i} failed: {e!r}", flush=True)
            rows.append((f"dcp.async_save #{i}", float("nan"), float("nan"), None))
        shutil.rmtree(f"{a.dir}/adcp{i}", ignore_errors=True)

    store = gstore.Store.init(f"{a.dir}/store")
    reports = []
    for i in (1, 2):
        r = timed(f"gstore save #{i} (blocking=False)", lambda: store.save(state(a.warmup), f"run:try-{i}", progress=False,
                                                                         blocking=False),
                  wait=lambda h: h.wait(), stored=lambda r: r["new_stored_bytes"])
        reports.append(r)
    train(a.steps)
    r = timed(f"gstore save {a.steps} steps later", lambda: store.save(state(a.warmup + a.steps), "run:later",
                                                                      progress=False, blocking=False),
              wait=lambda h: h.wait(), stored=lambda r: r["new_stored_bytes"])
    later = r
    expected = {k: v.detach().clone() for k, v in params.items()}
    moments = [(s["exp_avg"].clone(), s["exp_avg_sq"].clone()) for s in opt.state_dict()["state"].values()]

    # Load the later checkpoint back: the model into changed tensors (load_into), everything
    # as loaded (the optimizer's step counters are host tensors); bit for bit.
    train(1)
    t0 = time.perf_counter()
    loaded = store.load_into({"model": dict(params)}, "run:later", progress=False, strict=False)
    if DEV == "cuda":
        torch.cuda.synchronize()
    load_s = time.perf_counter() - t0
    whole = store.load("run:later", device=DEV, progress=False)
    exact = all(torch.equal(params[k], v) for k, v in expected.items()) and all(
        torch.equal(s["exp_avg"].to(DEV), m) and torch.equal(s["exp_avg_sq"].to(DEV), v)
        for s, (m, v) in zip(whole["optim"]["state"].values(), moments))
    print(f"load + load_into of the later checkpoint's model: {load_s:.2f} s; all of it bit-exact: {exact}, "
          f"step {loaded.get('step')}")

    print(f"\n| save | training stalls | durable after | stored |")
    print("|---|---|---|---|")
    for name, stall, durable, stored in rows:
        print(f"| {name} | {stall:.2f} s | {durable:.2f} s | {stored / 1e9:.2f} GB |" if stored else
              f"| {name} | {stall:.2f} s | {durable:.2f} s | |")
    by_name = {n: (stall, durable) for n, stall, durable, _ in rows}
    adcp = by_name["dcp.async_save #2"]
    first = reports[0]["new_stored_bytes"]
    g1 = by_name["gstore save #1 (blocking=False)"]
    gl = by_name[f"gstore save {a.steps} steps later"]
    print(f"\ngstore stall (the later save, pool pinned) / dcp.async_save #2's: {gl[0] / adcp[0]:.2f}")
    print(f"durable vs stored bytes / the disk's fsynced rate: first save {g1[1]:.2f} s vs {first / disk:.2f} s "
          f"({g1[1] / (first / disk):.2f}x); later save {gl[1]:.2f} s vs {later['new_stored_bytes'] / disk:.2f} s "
          f"({gl[1] / (later['new_stored_bytes'] / disk):.2f}x)")
    print(f"the checkpoint {a.steps} steps later added {later['new_stored_bytes'] / 1e9:.2f} GB of "
          f"{later['logical_bytes'] / 1e9:.2f} GB ({later['new_stored_bytes'] / later['logical_bytes']:.2f}), "
          f"{later['delta_chunks']} XOR-delta chunks")


if __name__ == "__main__":
    main()
