"""A CPU process for the process-restore benchmark: holds GIB of seeded memory (half
pseudo-random, half compressible float-like text) and answers requests.
Usage: cpu_holder.py GIB OUTDIR [arrays]

With `arrays` (NumPy required; issue #48) it holds NumPy arrays instead — half float32
weights, N(0, 0.02), a quarter int64 token ids below 50257, a quarter int32 counters — and
reads every word of them before it answers, so a restored process's first answer needs all
its memory back.

Writes OUTDIR/ready (the memory's checksum) once set up. On SIGUSR2, or when OUTDIR/ask exists
(it is then removed), it answers: OUTDIR/pong (a request count, via rename). A request file
made before a restore starts is answered as soon as the restored process runs. On SIGUSR1 it recomputes the checksum into OUTDIR/checksum.
It keeps no file open, so CRIU sees no file change between dump and restore."""
import hashlib
import os
import random
import signal
import sys
import time

gib, out = float(sys.argv[1]), sys.argv[2]
arrays = sys.argv[3:] == ["arrays"]
block = 64 << 20
rng = random.Random(1234)
blocks = []
if arrays:
    import numpy as np

    total = int(gib * 2**30) // 64 * 64
    generator = np.random.default_rng(1234)
    blocks = [
        generator.normal(0, 0.02, total // 8).astype(np.float32),
        generator.integers(0, 50257, total // 32, dtype=np.int64),
        np.arange(total // 16, dtype=np.int32),
    ]
else:
    for i in range(max(1, int(gib * 2**30 / block))):
        if i % 2 == 0:
            blocks.append(bytearray(rng.randbytes(block)))
        else:
            text = " ".join(f"{rng.gauss(0, 0.02):.5f}" for _ in range(4096)).encode()
            blocks.append(bytearray((text * (block // len(text) + 1))[:block]))


def answer(count):
    """The answer to request `count`: with arrays, after reading every word of them."""
    if not arrays:
        return str(count)
    words = [np.bitwise_xor.reduce(b.view(np.uint64)) for b in blocks]
    return f"{count} {int(np.bitwise_xor.reduce(words)):x}"


def checksum():
    h = hashlib.blake2b()
    for b in blocks:
        h.update(b)
    return h.hexdigest()


def put(name, text):
    tmp = os.path.join(out, name + ".tmp")
    with open(tmp, "w") as f:
        f.write(text)
    os.rename(tmp, os.path.join(out, name))


asked = {"ping": 0, "check": False}
signal.signal(signal.SIGUSR1, lambda *_: asked.update(check=True))
signal.signal(signal.SIGUSR2, lambda *_: asked.update(ping=asked["ping"] + 1))
put("ready", checksum())
answered = 0
while True:
    if os.path.exists(os.path.join(out, "ask")):
        os.remove(os.path.join(out, "ask"))
        asked["ping"] += 1
    if asked["ping"] != answered:
        answered = asked["ping"]
        put("pong", answer(answered))
    if asked["check"]:
        asked["check"] = False
        put("checksum", checksum())
    time.sleep(0.002)
