"""A GPU process for the checkpoint tests: holds seeded random tensors in VRAM and keeps
computing. Usage: holder.py GIB OUTDIR

Writes OUTDIR/ready (the tensors' checksum) once set up, OUTDIR/counter (steps done, via
rename) as it computes, and on SIGUSR1 OUTDIR/checksum (the tensors' checksum, recomputed).
When OUTDIR/ask exists (it is then removed) it answers with the recomputed checksum in
OUTDIR/answer, which must equal OUTDIR/expect (the checksum at start): a request file made
before a restore starts is answered as soon as the restored process runs.
It keeps no file open, so CRIU sees no file change between dump and restore."""
import os
import signal
import sys
import time

import torch

gib, out = float(sys.argv[1]), sys.argv[2]
torch.manual_seed(1234)
n = 8
per = int(gib * 2**30 / 4 / n)
tensors = [torch.randn(per, device="cuda") for _ in range(n)]
work = torch.randn(1024, 1024, device="cuda")


def checksum():
    total = 0
    for t in tensors:
        for part in t.view(torch.int32).split(1 << 26):
            total += int(part.to(torch.int64).sum().item())
    return str(total)


def put(name, text):
    tmp = os.path.join(out, name + ".tmp")
    with open(tmp, "w") as f:
        f.write(text)
    os.rename(tmp, os.path.join(out, name))


asked = []
signal.signal(signal.SIGUSR1, lambda *_: asked.append(1))
start_sum = checksum()
put("expect", start_sum)
put("ready", start_sum)
step = 0
while True:
    work = torch.tanh(work @ work * 1e-3)
    torch.cuda.synchronize()
    step += 1
    put("counter", str(step))
    if asked:
        asked.clear()
        put("checksum", checksum())
    if os.path.exists(os.path.join(out, "ask")):
        os.remove(os.path.join(out, "ask"))
        put("answer", checksum())
    time.sleep(0.01)
