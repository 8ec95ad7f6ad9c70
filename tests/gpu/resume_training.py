"""The GPU training resume of docs/PYTHON.md, as written there (issue #61): a small CUDA model
trained a few steps with torch.optim.AdamW (its step counters CPU tensors, as by default),
saved through gstore, then

1. a fresh model and optimizer filled by
   ``s.load_into({"model": model, "optim": opt}, s.latest("run"), strict=False)``;
2. the trained model and optimizer, stepped on since, rolled back the same way (the optimizer
   then holds state on two devices: CUDA moments, CPU step counters).

Each must give back the saved parameters and optimizer state (step included) exactly, and
the next step must match the one the original took. Uses the installed gstore wheel and a
store at $GSTORE_STORE (a new one in a temporary directory when unset).

    python3 tests/gpu/resume_training.py
"""

import os
import sys
import tempfile

import torch

import gstore

DEVICE = "cuda:0"
STEPS = 3


def build():
    """A small model on the GPU and its AdamW, seeded alike every time."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 8)).to(DEVICE)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def train(model, opt, steps, seed):
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    for _ in range(steps):
        loss = model(torch.randn(32, 64, device=DEVICE, generator=g)).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()


def snapshot(model, opt):
    """The model's parameters and the optimizer's state, copied to the host, with devices."""
    params = {k: (v.device, v.detach().cpu().clone()) for k, v in model.state_dict().items()}
    state = {
        (i, k): (v.device, v.detach().cpu().clone())
        for i, s in opt.state_dict()["state"].items()
        for k, v in s.items()
    }
    return params, state


def assert_same(got, want, what, devices=True):
    assert sorted(got) == sorted(want), f"{what}: names differ: {sorted(got)} vs {sorted(want)}"
    for k, (device, value) in want.items():
        got_device, got_value = got[k]
        assert torch.equal(got_value, value), f"{what} {k}: values differ"
        if devices:
            assert got_device == device, f"{what} {k}: on {got_device}, was on {device}"


def open_store():
    location = os.environ.get("GSTORE_STORE")
    if location:
        return gstore.Store(location), None
    tmp = tempfile.TemporaryDirectory(prefix="gstore-resume-")
    return gstore.Store.init(os.path.join(tmp.name, "store")), tmp


def main():
    assert torch.cuda.is_available(), "no CUDA GPU"
    s, _tmp = open_store()
    model, opt = build()
    train(model, opt, STEPS, seed=1)
    steps = [t for st in opt.state.values() for k, t in st.items() if k == "step"]
    assert steps and all(t.device.type == "cpu" for t in steps), "AdamW's step counters are not on the CPU here"
    s.save({"model": model.state_dict(), "optim": opt.state_dict(), "step": STEPS}, f"run:step-{STEPS}")
    saved_params, saved_state = snapshot(model, opt)
    tag = s.latest("run")

    # 1. A fresh model and optimizer, as a resumed job builds them.
    fresh, fresh_opt = build()
    state = s.load_into({"model": fresh, "optim": fresh_opt}, s.latest("run"), strict=False)
    assert state["step"] == STEPS, state["step"]
    params, optim = snapshot(fresh, fresh_opt)
    assert_same(params, saved_params, "fresh model")
    # A fresh optimizer holds no state to say where its tensors go: the values must match.
    assert_same(optim, saved_state, "fresh optimizer", devices=False)
    print("fresh: step counters on", sorted({str(d) for (_, k), (d, _) in optim.items() if k == "step"}))

    # The next step of the resumed run is the original's next step.
    train(model, opt, 1, seed=2)
    train(fresh, fresh_opt, 1, seed=2)
    assert_same(snapshot(fresh, fresh_opt)[0], snapshot(model, opt)[0], "after one more step", devices=False)

    # 2. The trained model and optimizer, stepped on since, rolled back to the checkpoint.
    train(model, opt, 2, seed=3)
    s.load_into({"model": model, "optim": opt}, tag, strict=False)
    params, optim = snapshot(model, opt)
    assert_same(params, saved_params, "rolled-back model")
    assert_same(optim, saved_state, "rolled-back optimizer")
    print(f"resume_training: ok ({len(saved_params)} parameters, {len(saved_state)} optimizer tensors)")


if __name__ == "__main__":
    try:
        main()
    except (AssertionError, gstore.GstoreError) as e:
        print(f"resume_training: FAILED: {type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(1)
