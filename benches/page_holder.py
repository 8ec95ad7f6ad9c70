"""A process holding MIB MiB of small-magnitude bf16 weights (pages as CRIU dumps them), for the
page-level benchmarks (benches/page_dedup_criu.sh, benches/cold_restore.sh).
Usage: page_holder.py WORK MIB PCT

Writes WORK/ready (its pid) once its memory is filled. On SIGUSR1 it rewrites PCT % of its 4 KiB
pages at scattered places with new weights, writing each new page to WORK/changed as it is
made (it keeps no second copy of them), then WORK/changed.done (the number of pages)."""
import os
import random
import signal
import struct
import sys
import time

work, mib, pct = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
rng = random.Random(5)
# The high bytes of N(0, 0.02) floats: bf16 weights' sign and exponent bytes.
table = bytes(struct.unpack("<I", struct.pack("<f", rng.gauss(0, 0.02)))[0] >> 24 for _ in range(256))


def weights(words):
    w = bytearray(2 * words)
    w[0::2] = os.urandom(words)
    w[1::2] = os.urandom(words).translate(table)
    return w


mem = bytearray(mib << 20)
for i in range(mib):
    mem[i << 20 : (i + 1) << 20] = weights(1 << 19)


def change(signum, frame):
    pages = len(mem) // 4096
    picked = sorted(rng.sample(range(pages), int(pages * pct / 100)))
    with open(os.path.join(work, "changed"), "wb") as out:
        for p in picked:
            page = weights(2048)
            mem[p * 4096 : (p + 1) * 4096] = page
            out.write(page)
    open(os.path.join(work, "changed.done"), "w").write(str(len(picked)))


signal.signal(signal.SIGUSR1, change)
open(os.path.join(work, "ready"), "w").write(str(os.getpid()))
while True:
    time.sleep(0.05)
