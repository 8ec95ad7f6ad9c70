"""A CPU process holding model-like weights for the borg comparison (benches/borg_compare.sh):
GIB of N(0, 0.02) float32 weights in NumPy arrays of 64 MiB. Every second it changes one
random row in a hundred (an optimizer step touching a few rows), so a second dump differs in
scattered pages. Writes OUTDIR/ready once set up.
Usage: weights_holder.py GIB OUTDIR"""
import os
import sys
import time

import numpy as np

gib, out = float(sys.argv[1]), sys.argv[2]
rng = np.random.default_rng(7)
rows = 4096
blocks = [
    (rng.standard_normal((rows, (64 << 20) // 4 // rows), dtype=np.float32) * 0.02)
    for _ in range(max(1, int(gib * 2**30 / (64 << 20))))
]
with open(os.path.join(out, "ready.tmp"), "w") as f:
    f.write(str(len(blocks)))
os.rename(os.path.join(out, "ready.tmp"), os.path.join(out, "ready"))
while True:
    time.sleep(1)
    for b in blocks:
        picked = rng.choice(rows, rows // 100, replace=False)
        b[picked] += rng.standard_normal((len(picked), b.shape[1]), dtype=np.float32) * 1e-4
