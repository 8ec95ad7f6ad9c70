"""torch tensors through the store, on the CPU and (where there is one) a CUDA GPU. Skipped
where torch is not installed; CI installs it (scripts/python.sh) and runs the CPU cases, a GPU
machine the CUDA ones (tests/gpu/README.md)."""

import pathlib

import numpy as np
import pytest

import gstore

torch = pytest.importorskip("torch")
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU")

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.bool, torch.float8_e4m3fn]


def state(device="cpu"):
    g = torch.Generator().manual_seed(0)
    out = {}
    for i, dtype in enumerate(DTYPES):
        w = torch.randn(37, 53, generator=g) * 0.02
        out[f"t{i}.{str(dtype).removeprefix('torch.')}"] = (w > 0 if dtype == torch.bool else w.to(dtype)).to(device)
    out["scalar"] = torch.tensor(3.5, dtype=torch.float32, device=device)
    return out


@pytest.fixture
def store(tmp_path):
    return gstore.Store.init(str(tmp_path / "store"))


def same(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(
        a.cpu().reshape(-1).view(torch.uint8), b.cpu().reshape(-1).view(torch.uint8)
    )


def test_cpu_round_trip_every_dtype(store):
    s = state()
    store.save(s, "m:v1")
    loaded = store.load("m:v1")
    assert sorted(loaded) == sorted(s)
    for name in s:
        assert loaded[name].device.type == "cpu"
        assert same(loaded[name], s[name]), name


@cuda
def test_cuda_tensors_load_into_vram_without_a_copy(store):
    s = state("cuda:0")
    store.save(s, "m:v1")
    loaded = store.load("m:v1", device="cuda:0")
    blob = store.load_file("m:v1", device="cuda:0")
    assert blob.device == torch.device("cuda:0") and blob.dtype == torch.uint8
    for name in s:
        assert loaded[name].device == torch.device("cuda:0"), name
        assert same(loaded[name], s[name]), name
    # Every tensor is a view into one VRAM buffer that gstore filled.
    first = min(t.data_ptr() for t in loaded.values())
    last = max(t.data_ptr() + t.numel() * t.element_size() for t in loaded.values())
    assert last - first <= len(blob)
    # The memory stays valid after the loader's objects are gone.
    del blob
    torch.cuda.synchronize()
    assert same(loaded["t0.float32"] * 1, s["t0.float32"])


def float_state():
    """Weights the GPU decodes (float-coded chunks, Huffman lanes): bf16, fp16 and fp32 of
    realistic magnitudes in sizes that cut chunks at odd lengths, a constant tensor (lanes of
    one byte value) and a tensor of random bits (raw lanes)."""
    g = torch.Generator().manual_seed(5)
    out = {}
    for i, n in enumerate([1, 3, 1001, 65_537, 300_007, 1_000_003]):
        for dtype, scale in ((torch.bfloat16, 0.02), (torch.float16, 0.05), (torch.float32, 1.0)):
            out[f"w{i}.{str(dtype).removeprefix('torch.')}"] = (torch.randn(n, generator=g) * scale).to(dtype)
    out["ones"] = torch.ones(200_000, dtype=torch.bfloat16)
    out["bits"] = torch.randint(-(2**15), 2**15, (150_001,), generator=g, dtype=torch.int16).view(torch.bfloat16)
    return out


@cuda
def test_float_coded_weights_load_bit_exact_on_the_gpu_and_a_flipped_byte_fails(store, tmp_path):
    s = float_state()
    store.save(s, "f:v1")
    loaded = store.load("f:v1", device="cuda:0")
    for name in s:
        assert same(loaded[name], s[name]), name
    # One byte flipped at a time, at positions spread over the packs' chunk bytes: every load
    # into VRAM fails naming a chunk (Huffman code, substream ends and bits, raw lanes, tails).
    root = pathlib.Path(store._native.describe())
    packs = sorted(root.rglob("*.pack"))
    assert packs
    for trial in range(12):
        p = packs[trial % len(packs)]
        data = p.read_bytes()
        at = len(data) * (trial + 1) // 16
        p.write_bytes(data[:at] + bytes([data[at] ^ (1 << (trial % 8))]) + data[at + 1 :])
        with pytest.raises(gstore.CorruptError, match="chunk"):
            store.load("f:v1", device="cuda:0")
        p.write_bytes(data)
    loaded = store.load("f:v1", device="cuda:0")
    assert all(same(loaded[name], s[name]) for name in s)


@cuda
def test_load_into_a_module_on_the_gpu(store):
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.Linear(32, 8)).to(torch.bfloat16)
    store.save(model.state_dict(), "net:v1")
    fresh = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.Linear(32, 8)).to(torch.bfloat16).cuda()
    store.load_into(fresh, "net:v1")
    for name, value in model.state_dict().items():
        assert same(fresh.state_dict()[name], value), name
    x = torch.randn(4, 64, dtype=torch.bfloat16)
    assert torch.equal(fresh(x.cuda()).cpu(), model(x))


def test_numpy_and_torch_agree(store):
    a = (np.random.default_rng(1).standard_normal((8, 8)) * 0.02).astype(np.float32)
    store.save({"a": a}, "m:np")
    assert torch.equal(store.load("m:np")["a"], torch.from_numpy(a))


def same_tree(a, b, where="state"):
    """Equal nested states of the same types; tensors compared bit for bit."""
    if torch.is_tensor(a):
        assert torch.is_tensor(b) and same(a, b), where
        return
    if isinstance(a, np.ndarray):
        assert isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b), where
        return
    assert type(a) is type(b) or (isinstance(a, dict) and type(b) is dict), f"{where}: {type(a)} != {type(b)}"
    if isinstance(a, dict):
        assert [(type(k), k) for k in a] == [(type(k), k) for k in b], where
        for k in a:
            same_tree(a[k], b[k], f"{where}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            same_tree(x, y, f"{where}[{i}]")
    else:
        assert a == b, where


def trained(device, steps=2):
    """A small model, AdamW and a scheduler after ``steps`` steps."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 8)).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=10)
    for _ in range(steps):
        loss = model(torch.randn(16, 64, device=device)).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
    return model, opt, sched


def checkpoint(model, opt, sched, step):
    return {
        "model": model.state_dict(),
        "optim": opt.state_dict(),
        "sched": sched.state_dict(),
        "rng": {"torch": torch.get_rng_state(), "numpy": np.random.get_state()},
        "step": step,
    }


def resume_and_step(store, tag, device):
    """A fresh model, optimizer and scheduler filled from ``tag``, then one step: the loss."""
    model, opt, sched = trained(device, steps=0)
    state = store.load_into({"model": model, "optim": opt, "sched": sched}, tag, strict=False)
    torch.manual_seed(state["step"])
    loss = model(torch.randn(16, 64, device=device)).square().mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    return loss.item(), model


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda:0", marks=cuda)])
def test_a_training_state_resumes_exactly(store, device):
    model, opt, sched = trained(device)
    ckpt = checkpoint(model, opt, sched, 2)
    store.save(ckpt, "run:step-2")
    loaded = store.load("run:step-2", device=device)
    same_tree(ckpt, loaded)
    assert isinstance(loaded["rng"]["numpy"][1], np.ndarray)  # saved from NumPy, back as NumPy
    torch.manual_seed(2)
    expected = model(torch.randn(16, 64, device=device)).square().mean()
    opt.zero_grad()
    expected.backward()
    opt.step()
    loss, resumed = resume_and_step(store, "run:step-2", device)
    assert loss == expected.item()
    for (name, a), b in zip(model.state_dict().items(), resumed.state_dict().values()):
        assert same(a, b), name


@cuda
def test_a_background_save_of_cuda_state_copies_before_returning(store):
    model, opt, sched = trained("cuda:0")
    ckpt = checkpoint(model, opt, sched, 2)
    snapshot = {k: v.clone() for k, v in ckpt["model"].items()}
    handle = store.save(ckpt, "run:async", blocking=False)
    with torch.no_grad():  # the next step, at once
        for p in model.parameters():
            p.add_(1.0)
    report = handle.wait()
    tensor_bytes = sum(t.numel() * t.element_size() for t in ckpt["model"].values()) + sum(
        t.numel() * t.element_size() for s in ckpt["optim"]["state"].values() for t in s.values()
    )
    assert report["staged_bytes"] >= tensor_bytes and store._pool.pinned
    loaded = store.load("run:async", device="cuda:0")
    for k, v in snapshot.items():
        assert same(loaded["model"][k], v), k
    # A second save of the same shapes reuses the pinned pool.
    size = store.staging_bytes
    store.save(checkpoint(model, opt, sched, 3), "run:async2", blocking=False).wait()
    assert store.staging_bytes == size


def optimizer_state_on_cpu(opt):
    """A copy of an optimizer's state with every tensor on the host, for comparing."""
    return {i: {k: v.cpu().clone() for k, v in s.items()} for i, s in opt.state_dict()["state"].items()}


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda:0", marks=cuda)])
def test_load_into_an_optimizer_with_state_fills_each_tensor_where_it_is(store, device):
    # A CUDA model's AdamW keeps its step counters as CPU tensors: the documented resume
    # (docs/PYTHON.md) into an optimizer that has stepped once was refused ("the tensors to
    # fill are on several devices"). Rolled back to the saved step, every tensor stays put.
    model, opt, _ = trained(device)
    store.save({"model": model.state_dict(), "optim": opt.state_dict(), "step": 2}, "run:step-2")
    saved_model = {k: v.clone() for k, v in model.state_dict().items()}
    saved_optim = optimizer_state_on_cpu(opt)
    for _ in range(3):
        model(torch.randn(16, 64, device=device)).square().mean().backward()
        opt.step()
    state = store.load_into({"model": model, "optim": opt}, store.latest("run"), strict=False)
    assert state["step"] == 2
    for k, v in model.state_dict().items():
        assert v.device == torch.device(device) and same(v, saved_model[k]), k
    after = optimizer_state_on_cpu(opt)
    assert sorted(after) == sorted(saved_optim)
    for i, s in saved_optim.items():
        for k, v in s.items():
            assert same(after[i][k], v), (i, k)
    steps = [s["step"] for s in opt.state.values()]
    assert steps and all(t.device.type == "cpu" for t in steps), "the step counters left the host"
    moments = [s["exp_avg"] for s in opt.state.values()]
    assert all(t.device == torch.device(device) for t in moments)


def test_a_target_on_two_devices_loads_onto_the_one_holding_most_and_fills_the_other_where_it_is(store):
    # The host stands for the GPU, "meta" for the host: the image loads once onto the device
    # holding most of the target's bytes, and a tensor an object holds elsewhere gets its
    # loaded value there.
    big, small = torch.randn(64, 32), torch.zeros(())
    assert gstore.structure.placement_of({"a": big, "b": small.to("meta")}) == ("cpu", "auto")
    assert gstore.structure.placement_of({"a": big.to("meta"), "b": small}) == ("meta", "auto")
    held = gstore.structure.bytes_by_device([big, small, big.to("meta")])
    assert held == {"cpu": 64 * 32 * 4 + 4, "meta": 64 * 32 * 4}

    class Counter:
        """An object with a step counter on "meta" and a moment on the host, as AdamW's."""

        def __init__(self):
            self.held = {"step": torch.zeros((), device="meta"), "exp_avg": torch.zeros(64, 32)}

        def state_dict(self):
            return self.held

        def load_state_dict(self, state):
            self.held = state

    store.save({"model": {"w": big}, "optim": {"step": torch.tensor(5.0), "exp_avg": big * 2}}, "run:v1")
    weights, optim = {"w": torch.zeros(64, 32)}, Counter()
    store.load_into({"model": weights, "optim": optim}, "run:v1")
    assert torch.equal(weights["w"], big)
    assert optim.held["step"].device.type == "meta", "not moved to where the counter was"
    assert optim.held["exp_avg"].device.type == "cpu" and torch.equal(optim.held["exp_avg"], big * 2)


@cuda
def test_weights_yields_tensors_in_vram_and_reports_the_load(store, tmp_path):
    import safetensors.torch

    model = tmp_path / "model"
    model.mkdir()
    s = {k: v for k, v in state().items() if v.dim() > 0}
    safetensors.torch.save_file(s, str(model / "model.safetensors"))
    store.save(s, "m:v1")  # the store already holds these bytes: the push below adds little
    import subprocess, os

    subprocess.run([os.environ["GSTORE_BIN"], "--store", store._native.describe(), "push", str(model), "--tag", "w"], check=True)
    got = dict(store.weights("w", device="cuda:0"))
    assert sorted(got) == sorted(s)
    for name, value in s.items():
        assert got[name].device == torch.device("cuda:0") and same(got[name], value), name
    assert store.last_load["transfer_s"] >= 0 and "chunks checked" in store.last_load["path"]
