"""Benchmark input: GIB GiB of N(0, 0.02) bf16 weights (KIND bf16: small-magnitude floats, as
trained weights are) or of random bytes (KIND random: incompressible), written 128 MiB at a
time from a fixed seed. Used by benches/push_scaling.sh and benches/push_compare.sh.
Usage: python3 benches/make_data.py PATH GIB KIND"""
import sys

import numpy as np

path, gib, kind = sys.argv[1], int(sys.argv[2]), sys.argv[3]
rng = np.random.default_rng(0)
with open(path, "wb") as f:
    for _ in range(gib * 8):
        if kind == "random":
            f.write(rng.bytes(1 << 27))
        else:
            w = (rng.standard_normal(1 << 26, dtype=np.float32) * 0.02).view(np.uint32)
            f.write((w >> 16).astype(np.uint16).tobytes())
