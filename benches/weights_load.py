"""Model weights into GPU memory: gstore against the plain-file loaders serving engines use, on
the same files in the same run (issue #62).

    python3 benches/weights_load.py --gib 16 --work DIR --gstore-bin BIN [--rounds 2] [--cold]
        [--loaders pinned,safetensors,fastsafetensors,instanttensor,gstore,gstore-iter,gstore-into,gstore-cli]
        [--random-bits] [--variant 'LABEL ENV=V ... [--budget BYTES]'...]

Writes GIB of bf16 weights shaped like a Qwen3-8B checkpoint (embeddings, attention and MLP
projections, norms; N(0, 0.02), norms near 1) as safetensors shards of about 1 GiB under
DIR/model, pushes the folder into a fresh local store (DIR/store, the embedded default), then
loads every tensor onto cuda:0 with each loader, ROUNDS times, loaders interleaved. Every
loader but the CLI runs in a process of its own that has CUDA up before the clock starts (the
case of a serving engine), so each one's peak RSS is its own; `gstore load` is timed command
to command (its CUDA start included) and as it reports itself. Warm: every file is read once
before each round (the machine's memory holds them all); with --cold the page cache is dropped (root) just before each load instead,
and the disk's own read rate is measured. The first round checks every tensor of every loader
against checksums taken when the weights were made.

Loaders: `pinned` (pinned host -> device copy rate: the ceiling), `safetensors` (`load_file`
per shard), `fastsafetensors` (0.5.0, `fastsafe_open(..., nogds=True)`: its host path, on any machine),
`instanttensor` (0.2.2, `BackendPolicy.BUFFERED`; with --cold also `instanttensor-
direct`, its default O_DIRECT path), `gstore` (`Store.load`), `gstore-iter` (`Store.weights`,
the (name, tensor) iterator), `gstore-into` (`Store.load_into` preallocated parameters),
`gstore-cli` (`gstore load --device cuda:0`). Two more are timed command to command like the
CLI: `instanttensor-cli` (a fresh Python process that starts torch and loads with InstantTensor,
the peer in the CLI's shape) and `cuda-floor` (a fresh process that only starts the CUDA driver,
makes a context, allocates the set's bytes on cuda:0 as 1 GiB buffers and exits: what any fresh
process pays before and after its bytes move; the table adds that floor plus the bytes at the
pinned rate, the best a command could do). --variant adds the gstore loads again under
other environment variables or memory budgets, labelled: e.g. `'old PYTHONPATH=DIR
GSTORE_BENCH_BIN=BIN'` loads with another build of the package and the binary, for A/B runs.

Prints one JSON object per load, then a table: best seconds, GB/s of tensor bytes, x pinned, x
the best plain-file loader, peak RSS.
"""

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import time

HIDDEN, INTER, KV, VOCAB, HEAD = 4096, 12288, 1024, 151936, 128
SHARD = 1 << 30


def layer_shapes(i):
    p = f"model.layers.{i}."
    return [
        (p + "input_layernorm.weight", (HIDDEN,)),
        (p + "self_attn.q_proj.weight", (HIDDEN, HIDDEN)),
        (p + "self_attn.k_proj.weight", (KV, HIDDEN)),
        (p + "self_attn.v_proj.weight", (KV, HIDDEN)),
        (p + "self_attn.o_proj.weight", (HIDDEN, HIDDEN)),
        (p + "self_attn.q_norm.weight", (HEAD,)),
        (p + "self_attn.k_norm.weight", (HEAD,)),
        (p + "post_attention_layernorm.weight", (HIDDEN,)),
        (p + "mlp.gate_proj.weight", (INTER, HIDDEN)),
        (p + "mlp.up_proj.weight", (INTER, HIDDEN)),
        (p + "mlp.down_proj.weight", (HIDDEN, INTER)),
    ]


def shapes(gib):
    """Tensor names and shapes adding up to about `gib` GiB of bf16, embeddings first."""
    out = [("model.embed_tokens.weight", (VOCAB, HIDDEN)), ("lm_head.weight", (VOCAB, HIDDEN))]
    total, i = 2 * VOCAB * HIDDEN * 2, 0
    while total < gib << 30:
        for name, shape in layer_shapes(i):
            out.append((name, shape))
            total += 2 * math.prod(shape)
        i += 1
    out.append(("model.norm.weight", (HIDDEN,)))
    return out


def checksum(t):
    """A positional checksum of the tensor's 16-bit words (on its device): the sum, wrapping
    at 64 bits (the same in any order), of each word times its position plus one, so that a
    moved word counts too."""
    import torch

    w = t.contiguous().view(torch.int16).flatten().to(torch.int64) & 0xFFFF
    pos = torch.arange(1, w.numel() + 1, device=w.device, dtype=torch.int64)
    return int((w * pos).sum().item())


def make(work, gib, random_bits):
    """Writes the shards and their checksums (once per work folder and settings)."""
    import safetensors.torch
    import torch

    model = os.path.join(work, "model")
    stamp = os.path.join(work, "made.json")
    want = {"gib": gib, "random_bits": random_bits}
    if os.path.exists(stamp) and json.load(open(stamp)) == want:
        return json.load(open(os.path.join(work, "checksums.json")))
    shutil.rmtree(model, ignore_errors=True)
    os.makedirs(model)
    g = torch.Generator(device="cuda").manual_seed(0)
    sums, shard, size, k = {}, {}, 0, 0

    def flush():
        nonlocal shard, size, k
        if shard:
            safetensors.torch.save_file(shard, os.path.join(model, f"model-{k:05d}.safetensors"))
            shard, size, k = {}, 0, k + 1

    for name, shape in shapes(gib):
        if random_bits:
            w = torch.randint(-(1 << 15), 1 << 15, shape, generator=g, device="cuda", dtype=torch.int16).view(torch.bfloat16)
        elif len(shape) == 1:
            w = (1.0 + 0.02 * torch.randn(shape, generator=g, device="cuda")).to(torch.bfloat16)
        else:
            w = (0.02 * torch.randn(shape, generator=g, device="cuda")).to(torch.bfloat16)
        sums[name] = checksum(w)
        nbytes = w.numel() * 2
        if size and size + nbytes > SHARD:
            flush()
        shard[name] = w.cpu()
        size += nbytes
    flush()
    json.dump(sums, open(os.path.join(work, "checksums.json"), "w"))
    json.dump(want, open(stamp, "w"))
    return sums


def files_under(path):
    return sorted(os.path.join(d, f) for d, _, fs in os.walk(path) for f in fs)


def warm(path):
    subprocess.run(["sh", "-c", 'find "$1" -type f -exec cat {} + > /dev/null', "warm", path], check=True)


def drop_caches():
    subprocess.run(["sync"], check=True)
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def status_mib(field, pid="self"):
    """A memory figure of /proc/PID/status (VmRSS, VmHWM: the peak), in MiB."""
    for line in open(f"/proc/{pid}/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return 0.0


# ---- the child: one load in a process with CUDA up -------------------------------------------


def cuda_floor(args):
    """`cuda-floor`: the CUDA driver started, the primary context made current, the set's
    bytes allocated on cuda:0 in 1 GiB buffers (nothing copied); the exit frees them."""
    import ctypes

    cu = ctypes.CDLL("libcuda.so.1")
    dev, ctx, ptr = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_uint64()

    def ok(rc, what):
        if rc != 0:
            raise SystemExit(f"cuda-floor: {what} failed with CUDA error {rc}")

    ok(cu.cuInit(0), "cuInit")
    ok(cu.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
    ok(cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
    ok(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    nbytes = sum(2 * math.prod(s) for _, s in shapes(args.gib))
    left = nbytes
    while left > 0:
        ok(cu.cuMemAlloc_v2(ctypes.byref(ptr), min(left, 1 << 30)), "cuMemAlloc")
        left -= 1 << 30
    print(json.dumps({"seconds": 0.0, "bytes": nbytes, "peak_rss_mib": status_mib("VmHWM")}), flush=True)


def child(args):
    if args.child == "cuda-floor":
        return cuda_floor(args)
    import torch

    torch.cuda.init()
    torch.empty(1, device="cuda:0")
    base_rss = status_mib("VmRSS")
    model = os.path.join(args.work, "model")
    files = [f for f in files_under(model) if f.endswith(".safetensors")]
    loader, report, params = args.child, None, None
    if loader == "gstore-into":
        # The preallocated parameters a serving engine has before it loads (untimed).
        params = {n: torch.empty(s, dtype=torch.bfloat16, device="cuda:0") for n, s in shapes(args.gib)}
    if loader.startswith("gstore"):
        import gstore

        store = gstore.Store(os.path.join(args.work, "store"))
    if not args.fresh:
        print("ready", flush=True)
        sys.stdin.readline()
    torch.cuda.synchronize()
    t = time.perf_counter()
    if loader == "pinned":
        src = torch.empty(1 << 30, dtype=torch.uint8, pin_memory=True)
        dst = torch.empty(1 << 30, dtype=torch.uint8, device="cuda:0")
        best = 0.0
        for _ in range(6):
            torch.cuda.synchronize()
            s = time.perf_counter()
            dst.copy_(src, non_blocking=True)
            torch.cuda.synchronize()
            best = max(best, (1 << 30) / (time.perf_counter() - s) / 1e9)
        print(json.dumps({"gbps": best}), flush=True)
        return
    if loader == "safetensors":
        import safetensors.torch

        out = {}
        for f in files:
            out.update(safetensors.torch.load_file(f, device="cuda:0"))
    elif loader.startswith("instanttensor"):
        from instanttensor import BackendPolicy, safe_open

        kw = {} if loader == "instanttensor-direct" else {"backend": BackendPolicy.BUFFERED}
        out = {}
        with safe_open(files, framework="pt", device=0, **kw) as f:
            for name, tensor in f.tensors():
                out[name] = tensor
    elif loader == "fastsafetensors":
        from fastsafetensors import fastsafe_open

        # Without GPUDirect Storage (`nogds`): its host path, on every machine.
        with fastsafe_open(filenames=files, device="cuda:0", nogds=True) as f:
            out = {name: f.get_tensor(name) for name in f.keys()}
    elif loader == "gstore":
        out = store.load("w", device="cuda:0", progress=False, memory_budget=args.budget)
        report = store.last_load
    elif loader == "gstore-iter":
        out = dict(store.weights("w", device="cuda:0", memory_budget=args.budget))
        report = store.last_load
    elif loader == "gstore-into":
        store.load_into(params, "w", progress=False, memory_budget=args.budget)
        out, report = params, store.last_load
    else:
        raise SystemExit(f"unknown loader {loader}")
    torch.cuda.synchronize()
    seconds = time.perf_counter() - t
    nbytes = sum(v.numel() * v.element_size() for v in out.values())
    result = {"seconds": seconds, "bytes": nbytes, "base_rss_mib": base_rss, "report": report}
    if args.check:
        want = json.load(open(os.path.join(args.work, "checksums.json")))
        bad = [n for n in want if n not in out or checksum(out[n]) != want[n]]
        result["checked"] = not bad
        if bad:
            result["wrong"] = bad[:5]
    result["peak_rss_mib"] = status_mib("VmHWM")
    print(json.dumps(result), flush=True)


# ---- the parent -----------------------------------------------------------------------------


class Variant:
    """A labelled gstore setting: environment variables, a memory budget, and `--nocheck` for
    settings that do not place the bytes (diagnostics)."""

    def __init__(self, text):
        words = text.split()
        self.label, self.env, self.budget, self.check = words[0], {}, 1 << 30, True
        rest = words[1:]
        while rest:
            w = rest.pop(0)
            if w == "--budget":
                self.budget = int(rest.pop(0))
            elif w == "--nocheck":
                self.check = False
            else:
                k, v = w.split("=", 1)
                self.env[k] = v


def run_child(args, loader, variant, check, cold):
    env = dict(os.environ, **variant.env)
    cmd = [sys.executable, __file__, "--child", loader, "--work", args.work, "--gib", str(args.gib),
           "--budget", str(variant.budget)] + (["--check"] if check else [])
    p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    line = p.stdout.readline()
    if line.strip() != "ready":
        p.wait()
        raise SystemExit(f"{loader}: child failed to start: {line}")
    if cold:
        drop_caches()
    p.stdin.write("go\n")
    p.stdin.flush()
    out = p.stdout.read()
    if p.wait() != 0:
        raise SystemExit(f"{loader} failed (exit {p.returncode}): {out}")
    return json.loads(out.strip().splitlines()[-1])


def run_cli(args, variant, check, cold):
    env = dict(os.environ, **variant.env)
    store = os.path.join(args.work, "store")
    # No --check: reading 16 GiB back to the host and hashing it takes ~20 s; the Python loads
    # of the same store check every tensor.
    cmd = [variant.env.get("GSTORE_BENCH_BIN", args.gstore_bin), "--store", store, "--json", "load", "w", "--device", "cuda:0",
           "--memory-budget", str(variant.budget)]
    if cold:
        drop_caches()
    t = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env)
    out = p.stdout.read()
    # Its peak RSS (which starts from this small process's at the fork).
    _, status, usage = os.wait4(p.pid, 0)
    seconds = time.perf_counter() - t
    if status != 0:
        raise SystemExit(f"gstore load failed: {out}")
    rep = json.loads(out)
    return {"seconds": seconds, "reported_s": rep["seconds"], "bytes": rep.get("bytes") or rep.get("logical_bytes"),
            "peak_rss_mib": usage.ru_maxrss / 1024, "report": {k: rep.get(k) for k in ("phases", "context_s", "waits", "path")},
            "checked": rep.get("checked")}


def run_fresh(args, loader, check, cold):
    """A loader in a fresh process, timed command to command (`instanttensor-cli`,
    `cuda-floor`); the seconds it reports itself are kept as `reported_s`."""
    child_loader = "instanttensor" if loader == "instanttensor-cli" else loader
    cmd = [sys.executable, __file__, "--child", child_loader, "--fresh", "--work", args.work, "--gib", str(args.gib)]
    if check and loader != "cuda-floor":
        cmd.append("--check")
    if cold:
        drop_caches()
    t = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    out = p.stdout.read()
    _, status, usage = os.wait4(p.pid, 0)
    seconds = time.perf_counter() - t
    if status != 0:
        raise SystemExit(f"{loader} failed: {out}")
    res = json.loads(out.strip().splitlines()[-1])
    res["reported_s"], res["seconds"] = res["seconds"], seconds
    res["peak_rss_mib"] = usage.ru_maxrss / 1024
    return res


def disk_rate(path):
    drop_caches()
    t = time.perf_counter()
    n = 0
    for f in files_under(path):
        with open(f, "rb", buffering=0) as fh:
            while True:
                b = fh.read(16 << 20)
                if not b:
                    break
                n += len(b)
    return n / (time.perf_counter() - t) / 1e9


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gib", type=int, default=16)
    ap.add_argument("--work", required=True)
    ap.add_argument("--gstore-bin")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--cold", action="store_true")
    ap.add_argument("--random-bits", action="store_true")
    ap.add_argument("--loaders", default="pinned,safetensors,instanttensor,gstore,gstore-iter,gstore-into,gstore-cli")
    ap.add_argument("--variant", action="append", default=[])
    ap.add_argument("--child")
    ap.add_argument("--make", action="store_true")
    ap.add_argument("--budget", type=int, default=1 << 30)
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--fresh", action="store_true")
    args = ap.parse_args()
    if args.child:
        return child(args)
    os.makedirs(args.work, exist_ok=True)
    if args.make:
        return make(args.work, args.gib, args.random_bits)
    t = time.perf_counter()
    # In a process of its own: this one stays small (a child's peak memory starts from its
    # parent's), and imports no torch.
    subprocess.run([sys.executable, __file__, "--make", "--work", args.work, "--gib", str(args.gib)]
                   + (["--random-bits"] if args.random_bits else []), check=True)
    print(json.dumps({"made_s": time.perf_counter() - t}), flush=True)
    store = os.path.join(args.work, "store")
    model = os.path.join(args.work, "model")
    if not os.path.exists(os.path.join(store, "tags")) or not os.path.exists(os.path.join(args.work, "pushed")):
        shutil.rmtree(store, ignore_errors=True)
        subprocess.run([args.gstore_bin, "--store", store, "-q", "init"], check=True)
        t = time.perf_counter()
        subprocess.run([args.gstore_bin, "--store", store, "-q", "push", model, "--tag", "w"], check=True)
        subprocess.run(["sync"], check=True)  # the push's pages written out before any load
        open(os.path.join(args.work, "pushed"), "w").close()
        print(json.dumps({"pushed_s": time.perf_counter() - t}), flush=True)
    du = json.loads(subprocess.run([args.gstore_bin, "--store", store, "--json", "du"], check=True,
                                   capture_output=True, text=True).stdout)
    print(json.dumps({"du": {k: du.get(k) for k in ("logical_bytes", "stored_bytes")}}), flush=True)
    loaders = args.loaders.split(",")
    if args.cold and "instanttensor" in loaders:
        loaders.insert(loaders.index("instanttensor") + 1, "instanttensor-direct")
    plain = Variant("default")
    jobs = [(l, plain) for l in loaders]
    for v in map(Variant, args.variant):
        jobs += [(l, v) for l in loaders if l.startswith("gstore")]
    if args.cold:
        print(json.dumps({"disk_gbps": {"model": disk_rate(model), "store": disk_rate(store)}}), flush=True)
    results = {}
    for r in range(args.rounds):
        if not args.cold:
            warm(args.work)  # the machine holds both folders in its page cache at once
        for loader, v in jobs:
            label = loader if v is plain else f"{loader}[{v.label}]"
            check = r == 0 and loader != "pinned" and v.check
            if loader == "gstore-cli":
                res = run_cli(args, v, check, args.cold)
            elif loader in ("instanttensor-cli", "cuda-floor"):
                res = run_fresh(args, loader, check, args.cold)
            else:
                res = run_child(args, loader, v, check, args.cold)
            res.update(loader=label, round=r)
            print(json.dumps(res), flush=True)
            if check and loader not in ("gstore-cli", "cuda-floor") and not res.get("checked"):
                raise SystemExit(f"{label}: tensors differ from the originals: {res}")
            results.setdefault(label, []).append(res)
    pinned = max((x["gbps"] for x in results.pop("pinned", [])), default=None)
    rate = {k: max(x["bytes"] / x["seconds"] / 1e9 for x in v) for k, v in results.items()}
    floor = results.pop("cuda-floor", None)
    rate = {k: g for k, g in rate.items() if k != "cuda-floor"}
    plain_best = max((g for k, g in rate.items() if not k.startswith("gstore") and not k.endswith("-cli")), default=None)
    print(f"\n{'cold' if args.cold else 'warm'}, {args.gib} GiB{' random bits' if args.random_bits else ' bf16'}; "
          f"pinned host->device {pinned or 0:.1f} GB/s")
    print(f"{'loader':34} {'best s':>8} {'GB/s':>7} {'x pinned':>9} {'x best plain':>13} {'peak RSS MiB':>13}")
    peak = lambda v: max((x["peak_rss_mib"] or 0) for x in v)
    for k, v in results.items():
        best = min(v, key=lambda x: x["seconds"])
        g = rate[k]
        extra = f"  (reports {best['reported_s']:.3f} s)" if "reported_s" in best else ""
        print(f"{k:34} {best['seconds']:8.3f} {g:7.1f} {g / pinned if pinned else 0:9.2f} "
              f"{g / plain_best if plain_best else 0:13.2f} {peak(v):13.0f}{extra}")
    if floor and pinned:
        f = min(x["seconds"] for x in floor)
        nbytes = floor[0]["bytes"]
        best = f + nbytes / pinned / 1e9
        print(f"a fresh process's floor (CUDA start, context, {nbytes / 2**30:.1f} GiB allocated, exit): {f:.3f} s; "
              f"with the bytes at the pinned rate {best:.3f} s = {nbytes / best / 1e9 / pinned:.2f} x pinned at best")


if __name__ == "__main__":
    main()
