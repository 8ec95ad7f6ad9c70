"""Loads an N GiB bf16 state dict into GPU memory through the gstore Python package, and
compares it in the same run with safetensors.torch.load_file(device="cuda"), torch.load and
`gstore load` on the same image; also what a fine-tune (10 % of tensors changed) adds.

    python3 benches/python_load.py --gib 8 --work /tmp/bench [--gstore-bin PATH] [--rounds 3] [--hold]
        [--random-bits] [--no-torch-load]

With --hold (needs --gstore-bin), `gstore hold` keeps the image in pinned memory and the loads
also run through it: `Store.load(..., held=SOCKET)` and `gstore load --held SOCKET`.

Needs torch with a CUDA GPU and the gstore wheel installed. Weights are N(0, 0.02) in bf16
(small-magnitude floats, as models hold); with --random-bits every bit is random instead (the
store keeps such chunks raw: the incompressible case). --no-torch-load leaves out torch.load,
the slowest loader. Warm page cache: every file is read once before the
timed rounds. Prints one JSON object per measurement, then a summary.
"""

import argparse
import json
import os
import shutil
import subprocess
import time

import safetensors.torch
import torch

import gstore

TENSOR_BYTES = 128 << 20


def make_state(gib, random_bits):
    g = torch.Generator(device="cuda").manual_seed(0)
    n = (gib << 30) // TENSOR_BYTES
    elems = TENSOR_BYTES // 2
    out = {}
    for i in range(n):
        if random_bits:
            bits = torch.randint(-(1 << 15), 1 << 15, (elems // 4096, 4096), generator=g, device="cuda", dtype=torch.int16)
            w = bits.view(torch.bfloat16)
        else:
            w = (torch.randn(elems // 4096, 4096, generator=g, device="cuda") * 0.02).to(torch.bfloat16)
        out[f"layers.{i:03d}.weight"] = w.cpu()
    return out


def warm(path):
    """Reads every file under `path` once, so the timed loads find them in the page cache."""
    subprocess.run(["sh", "-c", 'find "$1" -type f -exec cat {} + > /dev/null', "warm", path], check=True)


def timed(fn):
    torch.cuda.synchronize()
    t = time.perf_counter()
    result = fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t, result


def pinned_ceiling():
    src = torch.empty(1 << 30, dtype=torch.uint8, pin_memory=True)
    dst = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst.copy_(src, non_blocking=True)
    best = 0.0
    for _ in range(5):
        s, _ = timed(lambda: dst.copy_(src, non_blocking=True))
        best = max(best, (1 << 30) / s / 1e9)
    del src, dst
    return best


def emit(**kv):
    print(json.dumps(kv), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gib", type=int, default=8)
    ap.add_argument("--work", required=True)
    ap.add_argument("--gstore-bin", default=None)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--hold", action="store_true")
    ap.add_argument("--random-bits", action="store_true")
    ap.add_argument("--no-torch-load", action="store_true")
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    store_dir = os.path.join(a.work, "store")
    shutil.rmtree(store_dir, ignore_errors=True)
    s = gstore.Store.init(store_dir)
    torch.cuda.init()
    ceiling = pinned_ceiling()
    emit(what="pinned_ceiling_gb_s", value=round(ceiling, 1))

    state = make_state(a.gib, a.random_bits)
    logical = sum(t.numel() * t.element_size() for t in state.values())
    t = time.perf_counter()
    r = s.save(state, "bench:base", progress=False)
    emit(what="gstore_save", seconds=round(time.perf_counter() - t, 2), logical=logical, stored=r["new_stored_bytes"])
    st_path = os.path.join(a.work, "model.safetensors")
    pt_path = os.path.join(a.work, "model.pt")
    t = time.perf_counter()
    safetensors.torch.save_file(state, st_path)
    emit(what="safetensors_save", seconds=round(time.perf_counter() - t, 2))
    if not a.no_torch_load:
        torch.save(state, pt_path)

    tuned = dict(state)
    changed = sorted(state)[::10]
    for name in changed:
        tuned[name] = (state[name].float() + 1e-3).to(torch.bfloat16)
    r = s.save(tuned, "bench:tuned", progress=False)
    changed_bytes = sum(state[n].numel() * 2 for n in changed)
    emit(
        what="fine_tune_save",
        changed_bytes=changed_bytes,
        new_plain_bytes=r["new_plain_bytes"],
        new_stored_bytes=r["new_stored_bytes"],
        logical=logical,
    )
    del tuned

    for p in (st_path, store_dir) if a.no_torch_load else (st_path, pt_path, store_dir):
        warm(p)
    sock = os.path.join(a.work, "hold.sock")
    holder = None
    if a.hold:
        t = time.perf_counter()
        holder = subprocess.Popen(
            [a.gstore_bin, "--store", store_dir, "-q", "hold", "bench:base", "--socket", sock],
            stderr=subprocess.PIPE,
            text=True,
        )
        for line in holder.stderr:
            if "holding" in line:
                break
        else:
            raise SystemExit("gstore hold stopped before holding the image")
        emit(what="gstore_hold_ready", seconds=round(time.perf_counter() - t, 2), line=line.strip())

    def check(loaded):
        for name, value in state.items():
            # compared as bits: random bits hold NaNs, which never equal themselves
            if not torch.equal(loaded[name].cpu().view(torch.int16), value.view(torch.int16)):
                raise SystemExit(f"{name}: loaded bytes differ")

    loaders = {
        "gstore_python": lambda: s.load("bench:base", device="cuda:0", progress=False),
        "safetensors": lambda: safetensors.torch.load_file(st_path, device="cuda:0"),
    }
    if not a.no_torch_load:
        loaders["torch_load"] = lambda: torch.load(pt_path, map_location="cuda:0", weights_only=True)
    if holder:
        loaders["gstore_python_held"] = lambda: s.load("bench:base", device="cuda:0", progress=False, held=sock)
    results = {k: [] for k in loaders}
    results["gstore_cli"] = []
    results["gstore_cli_held"] = []
    for rnd in range(a.rounds):
        for name, fn in loaders.items():
            seconds, loaded = timed(fn)
            if rnd == 0:
                check(loaded)
            del loaded
            torch.cuda.empty_cache()
            results[name].append(seconds)
            emit(what=name, round=rnd, seconds=round(seconds, 3), gb_s=round(logical / seconds / 1e9, 2))
        if a.gstore_bin:
            t = time.perf_counter()
            out = subprocess.run(
                [a.gstore_bin, "--store", store_dir, "--json", "load", "bench:base", "--device", "cuda:0"],
                check=True,
                capture_output=True,
                text=True,
            )
            wall = time.perf_counter() - t
            rep = json.loads(out.stdout)
            results["gstore_cli"].append(rep["seconds"])
            emit(what="gstore_cli", round=rnd, seconds=rep["seconds"], process_s=round(wall, 3), phases=rep.get("phases"))
        if holder:
            t = time.perf_counter()
            out = subprocess.run(
                [a.gstore_bin, "--json", "load", "bench:base", "--device", "cuda:0", "--held", sock]
                + (["--check", "--store", store_dir] if rnd == 0 else []),
                check=True,
                capture_output=True,
                text=True,
            )
            wall = time.perf_counter() - t
            rep = json.loads(out.stdout)
            results["gstore_cli_held"].append(wall)
            emit(what="gstore_cli_held", round=rnd, process_s=round(wall, 3), checked=rep["checked"], phases=rep.get("phases"))
    if holder:
        holder.terminate()
        holder.wait()

    best = {k: min(v) for k, v in results.items() if v}
    summary = {k: {"best_s": round(v, 3), "gb_s": round(logical / v / 1e9, 2)} for k, v in best.items()}
    if "gstore_python_held" in best:
        summary["held_vs_pinned_ceiling"] = round(logical / best["gstore_python_held"] / 1e9 / ceiling, 2)
        summary["held_vs_safetensors"] = round(best["safetensors"] / best["gstore_python_held"], 2)
    for k in ("safetensors", "torch_load", "gstore_cli"):
        if k in best:
            summary["gstore_python_vs_" + k] = round(best[k] / best["gstore_python"], 2)
    emit(what="summary", gib=a.gib, random_bits=a.random_bits, **summary)


if __name__ == "__main__":
    main()
