"""A CPU process for the process-restore benchmark that reads all its memory before it answers
(issue #48): holds GIB of NumPy arrays (half float32 weights, N(0, 0.02); a quarter int64 token
ids below 50257; a quarter int32 counters) and speaks cpu_holder.py's protocol: OUTDIR/ready
(the memory's checksum) once set up; OUTDIR/ask (then removed) or SIGUSR2 is answered with
OUTDIR/pong only after every array has been read (an XOR of all its words); SIGUSR1 writes the
checksum to OUTDIR/checksum. A restored process answering a request therefore needs all its
memory back. Usage: readall_holder.py GIB OUTDIR (NumPy required)."""
import hashlib
import os
import signal
import sys
import time

import numpy as np

gib, out = float(sys.argv[1]), sys.argv[2]
total = int(gib * 2**30)
rng = np.random.default_rng(1234)
arrays = [
    rng.normal(0, 0.02, total // 8).astype(np.float32),
    rng.integers(0, 50257, total // 32, dtype=np.int64),
    np.arange(total // 16, dtype=np.int32),
]


def read_all():
    """Reads every word of every array."""
    return int(np.bitwise_xor.reduce([np.bitwise_xor.reduce(a.view(np.uint64)) for a in arrays]))


def checksum():
    h = hashlib.blake2b()
    for a in arrays:
        h.update(a.tobytes())
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
        put("pong", f"{answered} {read_all():x}")
    if asked["check"]:
        asked["check"] = False
        put("checksum", checksum())
    time.sleep(0.002)
