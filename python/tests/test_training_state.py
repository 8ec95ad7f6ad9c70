"""Whole training state through the store (issue #47), with NumPy: nested state with its types,
the flat layout kept as it was, background saves, images of several safetensors files, and
the newest image of a name. torch-specific paths are in test_torch.py."""

import json
import math
import os
import pathlib
import shutil
import struct
import subprocess
import sys
import time

import numpy as np
import pytest
import safetensors
import safetensors.numpy

import gstore


@pytest.fixture
def store(tmp_path):
    return gstore.Store.init(str(tmp_path / "store"))


def gstore_cli(store, *args):
    return subprocess.run(
        [os.environ["GSTORE_BIN"], "--store", store._native.describe(), *args],
        check=True,
        capture_output=True,
        text=True,
    )


def training_state(seed=0):
    """What a training loop saves: a model, an optimizer's state dict (integer keys, 0-d step
    tensors, hyperparameters), a scheduler, RNG states and the step."""
    rng = np.random.default_rng(seed)
    w = lambda *shape: (rng.standard_normal(shape) * 0.02).astype(np.float32)  # noqa: E731
    model = {"embed.weight": w(64, 32), "layers.0.weight": w(32, 32), "layers.0.bias": w(32), "head.weight": w(8, 32)}
    return {
        "model": model,
        "optimizer": {
            "state": {
                i: {"step": np.array(12.0, dtype=np.float32), "exp_avg": w(*v.shape), "exp_avg_sq": np.abs(w(*v.shape))}
                for i, v in enumerate(model.values())
            },
            "param_groups": [
                {
                    "lr": 3e-4,
                    "betas": (0.9, 0.999),
                    "eps": 1e-08,
                    "weight_decay": 0.01,
                    "amsgrad": False,
                    "foreach": None,
                    "maximize": False,
                    "params": [0, 1, 2, 3],
                }
            ],
        },
        "scheduler": {"base_lrs": [3e-4], "last_epoch": 12, "_last_lr": [2.9e-4], "verbose": False},
        "rng": {
            "numpy": np.random.RandomState(seed).get_state(),  # a tuple with an array and ints
            "numpy_pcg64": np.random.default_rng(seed).bit_generator.state,  # 128-bit ints
            "python": (3, tuple(range(5)), None),
        },
        "step": 12,
        "loss": 2.5,
        "best": float("inf"),
        "missing": float("nan"),
        "run": "gpt-small",
        "done": True,
        "np_scalar": np.float64(0.125),
        "ids": np.arange(5, dtype=np.int16),
    }


def assert_same(a, b, where="state"):
    """Equal values of exactly the same types, dict keys (and their types and order) included."""
    assert type(a) is type(b), f"{where}: {type(a).__name__} != {type(b).__name__}"
    if isinstance(a, dict):
        assert [(type(k), k) for k in a] == [(type(k), k) for k in b], where
        for k in a:
            assert_same(a[k], b[k], f"{where}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}[{i}]")
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b), where
    elif isinstance(a, float) and math.isnan(a):
        assert math.isnan(b), where
    else:
        assert a == b, where


def test_a_nested_training_state_comes_back_with_its_structure_and_types(store):
    state = training_state()
    report = store.save(state, "run:step-12", meta={"note": "nested"})
    assert report["tag"] == "run:step-12" and report["blocked_s"] > 0
    loaded = store.load("run:step-12", framework="numpy")
    assert_same(state, loaded)
    np.random.RandomState().set_state(loaded["rng"]["numpy"])  # what the state is for
    assert store.show("run:step-12")["meta"] == {"format": "safetensors", "note": "nested"}


def test_a_nested_state_is_a_safetensors_file_a_reader_of_the_documented_layout_reads(store, tmp_path):
    """The layout of docs/PYTHON.md, read without gstore: tensors named by their path, the
    structure in __metadata__["gstore.tree"]."""
    state = training_state(1)
    store.save(state, "run:v1", meta={"note": "x"})
    out = tmp_path / "restored"
    gstore_cli(store, "restore", "run:v1", "--to", str(out))
    path = out / gstore.FILE_NAME
    tensors = safetensors.numpy.load_file(str(path))
    assert np.array_equal(tensors["model.layers.0.weight"], state["model"]["layers.0.weight"])
    assert np.array_equal(tensors["optimizer.state.2.exp_avg"], state["optimizer"]["state"][2]["exp_avg"])
    assert np.array_equal(tensors["rng.numpy.1"], state["rng"]["numpy"][1])
    with safetensors.safe_open(str(path), framework="numpy") as f:
        meta = f.metadata()
    assert meta["note"] == "x"
    tree = json.loads(meta["gstore.tree"])
    assert tree["version"] == 1
    root = dict((k, v) for k, v in tree["root"]["dict"])
    assert root["step"] == 12 and root["loss"] == 2.5 and root["run"] == "gpt-small" and root["done"] is True
    assert root["best"] == {"float": "inf"} and root["missing"] == {"float": "nan"}
    assert root["np_scalar"] == {"npscalar": "np_scalar"} and root["ids"] == {"ndarray": "ids"}
    optimizer = dict((k, v) for k, v in root["optimizer"]["dict"])
    assert [k for k, _ in optimizer["state"]["dict"]] == [0, 1, 2, 3]
    group = dict((k, v) for k, v in optimizer["param_groups"]["list"][0]["dict"])
    assert group["betas"] == {"tuple": [0.9, 0.999]} and group["foreach"] is None
    assert group["params"] == {"list": [0, 1, 2, 3]}


def test_names_that_collide_and_values_that_cannot_be_saved(store):
    a, b, c = (np.full(3, i, dtype=np.float32) for i in range(3))
    state = {"x.y": a, "x": {"y": b}, "__metadata__": c, "n": 1}
    store.save(state, "m:v1")
    assert_same(state, store.load("m:v1", framework="numpy"))
    names = safetensors.numpy.load(bytes(store.load_file("m:v1", framework="numpy")))
    assert sorted(names) == ["__metadata__#2", "x.y", "x.y#2"]
    with pytest.raises(gstore.InvalidError, match=r"state\['opt'\]\[0\] is a builtins.object"):
        store.save({"opt": [object()]}, "m:v2")
    with pytest.raises(gstore.InvalidError, match="keys must be str or int"):
        store.save({"opt": {(1, 2): 3}}, "m:v2")
    with pytest.raises(gstore.InvalidError, match="keys must be str or int"):
        store.save({"opt": {True: 3}}, "m:v2")
    with pytest.raises(gstore.InvalidError, match="gstore's own"):
        store.save({"w": a}, "m:v2", meta={"gstore.tree": "{}"})
    with pytest.raises(gstore.InvalidError, match="expected a mapping"):
        store.save([a], "m:v2")


def old_encode(state, meta):
    """The flat layout as gstore wrote it before nested states (commit 83c2d26): tensors by
    element size then name, the header padded so the data starts on a page."""
    items = sorted(state.items(), key=lambda kv: (-kv[1].dtype.itemsize, kv[0]))
    header = {"__metadata__": dict(meta)} if meta else {}
    offset = 0
    dtypes = {"<f4": "F32", "<f8": "F64", "<i8": "I64", "<f2": "F16", "|b1": "BOOL", "<i2": "I16"}
    for name, a in items:
        header[name] = {"dtype": dtypes[a.dtype.str], "shape": list(a.shape), "data_offsets": [offset, offset + a.nbytes]}
        offset += a.nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-(-(8 + len(text)) // 4096) * 4096 - 8 - len(text))
    return struct.pack("<Q", len(text)) + text + b"".join(a.tobytes() for _, a in items)


def test_a_flat_dict_is_saved_as_before_and_old_images_load(store, tmp_path):
    rng = np.random.default_rng(2)
    flat = {
        "w": rng.standard_normal((16, 8)).astype(np.float32),
        "b": rng.standard_normal(8),
        "step": np.array(7, dtype=np.int64),
        "mask": np.array([True, False]),
        "h": np.linspace(0, 1, 5, dtype=np.float16),
    }
    store.save(flat, "flat:new", meta={"k": "v"})
    out = tmp_path / "new"
    gstore_cli(store, "restore", "flat:new", "--to", str(out))
    assert (out / gstore.FILE_NAME).read_bytes() == old_encode(flat, {"k": "v"})
    # An image the old code wrote loads as the flat dict it is.
    store._native.push_buffers("flat:old", [(gstore.FILE_NAME, [old_encode(flat, None)])], "{}", False)
    old = store.load("flat:old", framework="numpy")
    assert sorted(old) == sorted(flat)  # in file order, as before
    assert_same({k: flat[k] for k in old}, old)


def test_a_background_save_stores_the_values_of_when_it_returned(store):
    state = training_state(3)
    big = {f"layers.{i}": np.random.default_rng(i).standard_normal((512, 512)).astype(np.float32) for i in range(24)}
    state["model"].update(big)
    expected = {"model": {k: v.copy() for k, v in state["model"].items()}, "step": state["step"]}
    handle = store.save({"model": state["model"], "step": state["step"]}, "run:async", blocking=False)
    assert isinstance(handle, gstore.SaveHandle)
    # Training goes on at once, changing the arrays in place.
    for v in state["model"].values():
        v[...] = 7
    report = handle.wait()
    assert handle.done()
    assert report["tag"] == "run:async" and report["new_chunks"] > 0
    # How long the caller was held (the copy) and how long the store took are both reported;
    # which is shorter depends on the machine, so it is measured by benches/train_save.py, not
    # asserted here. What a background save must do is checked above and below: it returned a
    # handle at once, and it stores the values of when it returned, not the ones after.
    assert report["blocked_s"] > 0 and report["seconds"] > 0
    staged = sum(v.nbytes for v in expected["model"].values())
    assert report["staged_bytes"] == staged and store.staging_bytes == staged
    assert_same(expected, store.load("run:async", framework="numpy"))
    # The pool is reused while the state fits, grows for a larger one, and can be let go.
    store.save({"model": state["model"], "step": 13}, "run:async2", blocking=False).wait()
    assert store.staging_bytes == staged
    state["model"]["extra"] = np.zeros(1 << 20, dtype=np.uint8)
    store.save({"model": state["model"], "step": 14}, "run:async3", blocking=False)
    store.release_staging()  # waits for that save first
    assert store.staging_bytes == 0
    assert store.load("run:async3", framework="numpy")["step"] == 14
    # A blocking save of host arrays reads them in place: nothing staged.
    assert store.save(expected, "run:blocking")["staged_bytes"] == 0


def break_store(store):
    """Makes every later push fail: packs/ becomes a file (root may write anywhere, so
    permissions would not do)."""
    packs = pathlib.Path(store._native.describe()) / "packs"
    shutil.rmtree(packs, ignore_errors=True)  # made by the first push
    packs.write_text("")
    return packs


def test_a_failed_background_save_is_raised_by_wait_or_by_the_next_save(store):
    arrays = {"w": np.random.default_rng(4).standard_normal(4096).astype(np.float32), "step": 1}
    packs = break_store(store)
    # Told through wait(): the next save goes ahead.
    first = store.save(arrays, "run:1", blocking=False)
    with pytest.raises(gstore.GstoreError, match="Not a directory"):
        first.wait()
    with pytest.raises(gstore.GstoreError, match="Not a directory"):
        first.wait()  # every time
    second = store.save(arrays, "run:2", blocking=False)
    # Nobody waited: the next save raises it and does not start.
    with pytest.raises(gstore.GstoreError, match="background save of run:2 failed, so this save was not started"):
        store.save(arrays, "run:3")
    packs.unlink()
    packs.mkdir()
    # Once told, it is not raised again.
    assert store.save(arrays, "run:4")["tag"] == "run:4"
    with pytest.raises(gstore.GstoreError):
        second.wait()
    assert [r["tag"] for r in store.list()] == ["run:4"]
    assert_same(arrays, store.load("run:4", framework="numpy"))


def run_python(code, store_path):
    return subprocess.run(
        [sys.executable, "-c", code, store_path], capture_output=True, text=True, timeout=120, env=dict(os.environ)
    )


def test_a_background_save_outlives_the_last_line_and_a_failure_is_never_silent(store):
    path = store._native.describe()
    code = (
        "import sys, numpy as np, gstore\n"
        "s = gstore.Store(sys.argv[1])\n"
        "s.save({'w': np.ones((256, 1024), np.float32), 'step': 5}, 'run:exit', blocking=False)\n"
    )
    done = run_python(code, path)
    assert done.returncode == 0, done.stderr
    assert store.load("run:exit", framework="numpy")["step"] == 5
    break_store(store)
    failed = run_python(code.replace("run:exit", "run:lost"), path)
    assert "gstore: the background save of run:lost failed and nobody waited for it" in failed.stderr, failed.stderr


def test_an_image_of_several_safetensors_files_loads_as_one_dict(store, tmp_path):
    """A Hugging Face model's folder: shards, their index and a config, pushed by the CLI."""
    rng = np.random.default_rng(5)
    shard1 = {f"model.layers.{i}.weight": rng.standard_normal((32, 32)).astype(np.float32) for i in range(3)}
    shard2 = {"lm_head.weight": rng.standard_normal((10, 32)).astype(np.float32), "model.norm": np.ones(32, np.float16)}
    src = tmp_path / "hf"
    src.mkdir()
    safetensors.numpy.save_file(shard1, str(src / "model-00001-of-00002.safetensors"))
    safetensors.numpy.save_file(shard2, str(src / "model-00002-of-00002.safetensors"))
    weight_map = {**{k: "model-00001-of-00002.safetensors" for k in shard1}, **{k: "model-00002-of-00002.safetensors" for k in shard2}}
    (src / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    (src / "config.json").write_text("{}")
    gstore_cli(store, "push", str(src), "--tag", "hf:v1")
    loaded = store.load("hf:v1", framework="numpy")
    assert sorted(loaded) == sorted({**shard1, **shard2})
    for name, value in {**shard1, **shard2}.items():
        assert_same(value, loaded[name], name)
    only = store.load("hf:v1", framework="numpy", file="model-00002-of-00002.safetensors")
    assert sorted(only) == sorted(shard2)
    with pytest.raises(gstore.NotFoundError, match="holds no file 'nope.safetensors'"):
        store.load("hf:v1", file="nope.safetensors")
    # The same name in two files.
    safetensors.numpy.save_file({"lm_head.weight": shard2["lm_head.weight"]}, str(src / "extra.safetensors"))
    gstore_cli(store, "push", str(src), "--tag", "hf:v2")
    with pytest.raises(gstore.InvalidError, match=r"'lm_head.weight' is in both .*extra.safetensors.* and .*model-00002"):
        store.load("hf:v2")


def test_latest_is_the_newest_image_of_a_name(store):
    tiny = {"w": np.zeros(4, np.float32)}
    with pytest.raises(gstore.NotFoundError, match="no image named run"):
        store.latest("run")
    store.save(tiny, "run:zz-first")
    time.sleep(1.1)  # creation times are whole seconds
    store.save(tiny, "run:step-9")
    store.save(tiny, "run:step-10")  # the same second, most likely: the version decides
    store.save(tiny, "runner:v1")
    store.save(tiny, "other:v1")
    assert store.latest("run") == "run:step-10"
    assert store.latest("runner") == "runner:v1"
    with pytest.raises(gstore.InvalidError, match="without ':VERSION'"):
        store.latest("run:step-10")


def test_a_checkpoint_a_few_steps_later_is_stored_against_the_previous_one(store):
    rng = np.random.default_rng(7)
    w = (rng.standard_normal(1 << 20) * 0.02).astype(np.float32)
    first = store.save({"w": w}, "train:step-100")
    later = (w + rng.standard_normal(w.size).astype(np.float32) * 1e-4).astype(np.float32)
    second = store.save({"w": later}, "train:step-110")
    assert first["new_stored_bytes"] > 0.8 * w.nbytes, first  # the float codec alone: ~0.85
    assert second["delta_chunks"] > 0, second
    assert second["new_stored_bytes"] < 0.8 * first["new_stored_bytes"], (first, second)
    np.testing.assert_array_equal(store.load("train:step-110")["w"], later)
    np.testing.assert_array_equal(store.load("train:step-100")["w"], w)


def test_retention_per_run_keeps_pinned_checkpoints(store):
    tiny = {"w": np.zeros(4, np.float32)}
    for step in (1, 2, 3):
        store.save({"w": np.full(4, step, np.float32)}, f"run-a:step-{step}")
        store.save(tiny, f"run-b:step-{step}")
        time.sleep(1.1)  # set times order the checkpoints; make them differ
    assert store.pin("run-a:step-1")["pinned"] is True
    # The store checks the rules, for the command line and Python alike.
    with pytest.raises(gstore.InvalidError, match="a prefix limits retention rules"):
        store.gc(prefix="run-a")
    with pytest.raises(gstore.InvalidError, match="would remove every image"):
        store.gc(keep_last=0)
    with pytest.raises(gstore.InvalidError, match="positive"):
        store.gc(keep_daily=-1)
    dry = store.gc(keep_last=1, prefix="run-a", dry_run=True)
    assert dry["tags_removed"] == ["run-a:step-2"]
    assert len(store.list()) == 6, "a dry run changes nothing"
    report = store.gc(keep_last=1, prefix="run-a")
    assert report["tags_removed"] == ["run-a:step-2"]
    tags = sorted(r["tag"] for r in store.list())
    assert tags == ["run-a:step-1", "run-a:step-3", "run-b:step-1", "run-b:step-2", "run-b:step-3"]
    assert [r["pinned"] for r in store.list() if r["tag"] == "run-a:step-1"] == [True]
    np.testing.assert_array_equal(store.load("run-a:step-1")["w"], np.full(4, 1, np.float32))
    store.pin("run-a:step-1", pinned=False)
    assert store.gc(keep_last=1, prefix="run-a")["tags_removed"] == ["run-a:step-1"]
    assert store.latest("run-a") == "run-a:step-3"


class Stateful:
    """An object restored through load_state_dict, as an optimizer or a scheduler is."""

    def __init__(self):
        self.loaded = None

    def state_dict(self):
        return {}

    def load_state_dict(self, state):
        self.loaded = state


def test_load_into_fills_a_nested_target(store):
    state = training_state(6)
    store.save(state, "run:v1")
    model = {k: np.zeros_like(v) for k, v in state["model"].items()}
    addresses = {k: v.__array_interface__["data"][0] for k, v in model.items()}
    optimizer = Stateful()
    rng_state = np.zeros_like(state["rng"]["numpy"][1])
    target = {"model": model, "optimizer": optimizer, "rng": {"numpy": ("MT19937", rng_state, 0, 0, 0.0)}, "step": 0}
    loaded = store.load_into(target, "run:v1", strict=False)
    for k, v in state["model"].items():
        assert np.array_equal(model[k], v), k
        assert model[k].__array_interface__["data"][0] == addresses[k], "not filled in place"
    assert_same(state["optimizer"], optimizer.loaded)
    exp_avg = optimizer.loaded["state"][0]["exp_avg"]
    assert not np.shares_memory(exp_avg, loaded["optimizer"]["state"][0]["exp_avg"]), "keeps the loaded buffer alive"
    assert np.array_equal(rng_state, state["rng"]["numpy"][1])
    assert target["step"] == 0 and loaded["step"] == 12  # plain values come back, the target keeps its own
    with pytest.raises(gstore.InvalidError, match=r"state\['model'\]: names differ: missing from the image \['nope'\]"):
        store.load_into({**state, "model": {**model, "nope": np.zeros(1)}}, "run:v1")
    with pytest.raises(gstore.InvalidError, match=r"names differ: missing from the image \[\], not in the target \['optimizer'"):
        store.load_into({"model": model}, "run:v1")
    with pytest.raises(gstore.InvalidError, match=r"tensor 'model.head.weight': the image has float32 \(8, 32\)"):
        store.load_into({"model": {"head.weight": np.zeros((8, 31), np.float32)}}, "run:v1", strict=False)
