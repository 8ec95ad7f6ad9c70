"""torch tensors through the store, on the CPU and (where there is one) a CUDA GPU. Skipped
where torch is not installed (CI); run on a GPU machine (tests/gpu/README.md)."""

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
