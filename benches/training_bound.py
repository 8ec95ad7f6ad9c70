"""How far consecutive training checkpoints can be coded below their size (issue #47): trains
a GPT-2-large-layer-shaped fp32 model (10 matrices, 39 M parameters) with AdamW (lr 1e-4) on
gradient noise, as benches/train_save.py does on the GPU, snapshots parameters and both
moments after WARMUP steps and again 10 steps later, and prints, per kind of tensor and over
all three, the fraction of the bytes each model of the second snapshot needs:
  own   order-0 entropy of the four byte lanes of its words (what the float codec can reach)
  xor   the same of the XOR with the first snapshot (what gstore's XOR deltas can reach)
  lz    the XOR as the position of its leading one (entropy) plus the bits below it
  int   the integer difference of the words (zigzag), coded the same way
  pred  the integer difference against a least-squares prediction from what a decoder already
        has: the first snapshot, and the kinds of the second decoded before it (first moment,
        then second moment, then parameters), coded as int; AdamW's update written as features
  best  the best of these per kind of tensor
and, per kind, `gauss`: the bits a coder needs if the prediction's residual is Gaussian noise
of the scale measured, log2(scale / the value's spacing) + 2.05 (its differential entropy). The
gradients are fresh Gaussian noise each step, independent of the first snapshot: for the first
moment (a sum of them) this is the bound no coder can beat; for the weights and the second
moment it is the bound under the linear model.
Usage: python benches/training_bound.py [WARMUP (default 20)] (CPU, PyTorch and NumPy)."""
import sys

import numpy as np
import torch

warmup = int(sys.argv[1]) if len(sys.argv) > 1 else 20
torch.manual_seed(0)
shapes = [(1280, 5120)] * 3 + [(5120, 1280)] * 3 + [(1280, 1280)] * 4
params = [torch.nn.Parameter(torch.randn(*s) * 0.02) for s in shapes]
opt = torch.optim.AdamW(params, lr=1e-4)
gen = torch.Generator().manual_seed(1)


def train(n):
    for _ in range(n):
        for p in params:
            p.grad = torch.randn(p.shape, generator=gen) * 1e-2
        opt.step()


def snapshot():
    kinds = {"param": [], "exp_avg": [], "exp_avg_sq": []}
    for p in params:
        kinds["param"].append(p.detach().numpy().copy().view(np.uint32).ravel())
        for k in ("exp_avg", "exp_avg_sq"):
            kinds[k].append(opt.state[p][k].numpy().copy().view(np.uint32).ravel())
    return {k: np.concatenate(v) for k, v in kinds.items()}


def entropy(counts):
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log2(p)).sum())


def lanes(words):
    b = words.view(np.uint8).reshape(-1, 4)
    return sum(entropy(np.bincount(b[:, i], minlength=256)) for i in range(4)) / 32


def leading_one(values, width):
    """Bits for values coded as the position of their leading one, then the bits below it."""
    top = np.where(values == 0, 0, np.floor(np.log2(np.maximum(values, 1).astype(np.float64))).astype(np.int64) + 1)
    return (entropy(np.bincount(top, minlength=width + 1)) + np.maximum(top - 1, 0).mean()) / 32


def int_coded(words, base):
    """Bits for words coded as the zigzagged integer difference from base, as a fraction."""
    d = words.astype(np.int64) - base.astype(np.int64)
    return leading_one(np.where(d >= 0, 2 * d, -2 * d - 1).astype(np.uint64), 33)


def floats(words):
    return words.view(np.float32).astype(np.float64)


def features(kind, first, second):
    """What a decoder of `kind` in the second snapshot knows, as the columns of a linear model."""
    m0, v0, w0 = (floats(first[k]) for k in ("exp_avg", "exp_avg_sq", "param"))
    if kind == "exp_avg":
        return [m0]
    m1 = floats(second["exp_avg"])
    if kind == "exp_avg_sq":
        return [v0, m1 * m1, m0 * m0, m0 * m1, np.ones_like(v0)]
    v1 = floats(second["exp_avg_sq"])
    return [w0, m0 / (np.sqrt(v0) + 1e-8), m1 / (np.sqrt(v1) + 1e-8), m0, m1]


def predicted(kind, first, second):
    """(pred, gauss) for one kind: see the module's doc."""
    y = floats(second[kind])
    x = np.stack(features(kind, first, second), axis=1)
    coef, *_ = np.linalg.lstsq(x, y, rcond=None)
    fit = x @ coef
    guess = fit.astype(np.float32)
    scale = float(np.std(y - fit))
    spacing = np.spacing(np.abs(second[kind].view(np.float32))).astype(np.float64)
    gauss = np.mean(np.maximum(np.log2(scale / spacing) + 2.05, 0)) / 32
    return int_coded(second[kind], guess.view(np.uint32)), float(gauss)


train(warmup)
first = snapshot()
train(10)
second = snapshot()
total = dict.fromkeys(("own", "xor", "lz", "int", "pred", "best", "gauss"), 0.0)
for kind in first:
    r = {
        "own": lanes(second[kind]),
        "xor": lanes(second[kind] ^ first[kind]),
        "lz": leading_one((second[kind] ^ first[kind]).astype(np.uint64), 32),
        "int": int_coded(second[kind], first[kind]),
    }
    r["pred"], gauss = predicted(kind, first, second)
    r["best"] = min(r.values())
    r["gauss"] = gauss
    print(f"{kind:<11}", "  ".join(f"{k} {v:.3f}" for k, v in r.items()))
    for k in total:
        total[k] += r[k] / 3
print(f"{'all':<11}", "  ".join(f"{k} {v:.3f}" for k, v in total.items()), f"(warmup {warmup}, 10 steps apart)")
