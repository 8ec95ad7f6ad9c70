"""A GPU process for the checkpoint tests: holds seeded random tensors in VRAM and keeps
computing. Usage: holder.py GIB OUTDIR [WORKERS [FIRST_GPU]]

Its tensors are spread over every visible GPU, starting at FIRST_GPU (default 0), so on a
machine with several GPUs it is a multi-GPU process. With WORKERS > 0 it first starts that
many child processes running this script (worker k: OUTDIR/wk, WORKERS 0, FIRST_GPU k), each
holding GIB of its own: a process tree with GPU state in several processes.

Writes OUTDIR/pid, OUTDIR/ready (the tensors' checksum) once set up (and its workers are),
OUTDIR/counter (steps done, via rename) as it computes, and on SIGUSR1 OUTDIR/checksum (the
tensors' checksum, recomputed). When OUTDIR/ask exists (it is then removed) it answers with
the recomputed checksum in OUTDIR/answer, which must equal OUTDIR/expect (the checksum at
start): a request file made before a restore starts is answered as soon as the restored
process runs.
HOLDER_MARK_GIB=G puts G GiB more on the first GPU alone.
HOLDER_WORKER_GIB=G gives each worker G GiB instead of GIB. HOLDER_HALF=1 holds fp16 N(0, 0.02)
(weights' magnitudes) instead of fp32 N(0, 1). HOLDER_ANSWER_ALL=1 (with WORKERS > 0) makes the
parent's answer (and OUTDIR/expect) its checksum followed by each worker's, which it asks for
through the workers' own ask files: one request checks the whole tree.
HOLDER_CPU_PARENT=1 (with WORKERS > 0) keeps the parent off the GPUs, as torchrun's or vLLM's
parent is: it maps libcuda (as importing torch does) but never initialises CUDA, and holds its
tensors in host memory; only the workers hold GPU state.
It keeps no file open, so CRIU sees no file change between dump and restore."""
import os
import signal
import subprocess
import sys
import time

import torch

gib, out = float(sys.argv[1]), sys.argv[2]
workers = int(sys.argv[3]) if len(sys.argv) > 3 else 0
first_gpu = int(sys.argv[4]) if len(sys.argv) > 4 else 0
os.makedirs(out, exist_ok=True)


def put(name, text):
    tmp = os.path.join(out, name + ".tmp")
    with open(tmp, "w") as f:
        f.write(text)
    os.rename(tmp, os.path.join(out, name))


put("pid", str(os.getpid()))
cpu_parent = workers > 0 and os.environ.pop("HOLDER_CPU_PARENT", "") == "1"
answer_all = workers > 0 and os.environ.pop("HOLDER_ANSWER_ALL", "") == "1"
worker_gib = os.environ.get("HOLDER_WORKER_GIB", str(gib))
dtype = torch.float16 if os.environ.get("HOLDER_HALF") == "1" else torch.float32
children = [
    subprocess.Popen([sys.executable, __file__, worker_gib, os.path.join(out, f"w{k}"), "0", str(k)],
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for k in range(1, workers + 1)
]
if cpu_parent:
    import ctypes

    ctypes.CDLL("libcuda.so.1")  # mapped, never cuInit: no context
    gpus, gib = 1, min(gib, 0.25)
    device = lambda i: "cpu"  # noqa: E731
else:
    gpus = torch.cuda.device_count()
    device = lambda i: f"cuda:{(first_gpu + i) % gpus}"  # noqa: E731
torch.manual_seed(1234 + first_gpu)
n = 8
per = int(gib * 2**30 / dtype.itemsize / n) // 2 * 2
tensors = [torch.randn(per, device=device(i), dtype=dtype) for i in range(n)]
if dtype == torch.float16:
    for t in tensors:
        t.mul_(0.02)
# HOLDER_MARK_GIB: that much more on the first GPU alone, so the GPUs' memory use tells which
# GPU holds which part (the swap case checks that a restore moved it).
mark_gib = float(os.environ.get("HOLDER_MARK_GIB", "0"))
if mark_gib > 0:
    tensors.append(torch.randn(int(mark_gib * 2**30 / 4), device=device(0)))
work = torch.randn(1024, 1024, device=device(0))


def checksum():
    total = 0
    for t in tensors:
        for part in t.view(torch.int32).split(1 << 26):
            total += int(part.to(torch.int64).sum().item())
    return str(total)


def answer():
    """This process's checksum, and with HOLDER_ANSWER_ALL each worker's after it."""
    parts = [checksum()]
    for k in range(1, workers + 1) if answer_all else ():
        wd = os.path.join(out, f"w{k}")
        if os.path.exists(os.path.join(wd, "answer")):
            os.remove(os.path.join(wd, "answer"))
        open(os.path.join(wd, "ask"), "w").close()
        while not os.path.exists(os.path.join(wd, "answer")):
            time.sleep(0.005)
        parts.append(open(os.path.join(wd, "answer")).read())
    return " ".join(parts)


asked = []
signal.signal(signal.SIGUSR1, lambda *_: asked.append(1))
start_sum = checksum()
for k in range(1, workers + 1):
    while not os.path.exists(os.path.join(out, f"w{k}", "ready")):
        if children[k - 1].poll() is not None:
            sys.exit(f"worker {k} exited with {children[k - 1].returncode}")
        time.sleep(0.05)
if answer_all:
    start_sum = " ".join([start_sum] + [open(os.path.join(out, f"w{k}", "expect")).read() for k in range(1, workers + 1)])
put("expect", start_sum)
put("ready", start_sum)
step = 0
while True:
    work = torch.tanh(work @ work * 1e-3)
    if not cpu_parent:
        torch.cuda.synchronize()
    step += 1
    put("counter", str(step))
    if asked:
        asked.clear()
        put("checksum", checksum())
    if os.path.exists(os.path.join(out, "ask")):
        os.remove(os.path.join(out, "ask"))
        put("answer", answer())
    time.sleep(0.01)
