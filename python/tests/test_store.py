"""The Python package against a real local store (RocksDB index, packs on disk) and the real
`gstore` binary ($GSTORE_BIN) for what the CLI must read back. NumPy only: torch is not needed."""

import json
import os
import pathlib
import subprocess

import numpy as np
import pytest
import safetensors.numpy

import gstore


def weights(seed, shapes):
    """Small-magnitude float32 weights, as a model holds (not random bits)."""
    rng = np.random.default_rng(seed)
    return {name: (rng.standard_normal(shape) * 0.02).astype(np.float32) for name, shape in shapes.items()}


SHAPES = {f"layers.{i}.{part}": (128, 256) for i in range(10) for part in ("attn", "mlp", "norm", "proj")}


@pytest.fixture
def store(tmp_path):
    return gstore.Store.init(str(tmp_path / "store"))


def gstore_cli(store, *args):
    return subprocess.run(
        [os.environ["GSTORE_BIN"], "--store", str(store), *args], check=True, capture_output=True, text=True
    )


def test_save_then_load_gives_the_same_arrays(store):
    state = weights(1, SHAPES)
    state["step"] = np.array(1234, dtype=np.int64)
    state["mask"] = np.array([True, False, True])
    state["ids"] = np.arange(7, dtype=np.int16)
    state["half"] = np.linspace(-1, 1, 33, dtype=np.float16)
    report = store.save(state, "model:v1", meta={"run": "a"})
    assert report["tag"] == "model:v1" and report["new_chunks"] > 0
    loaded = store.load("model:v1", framework="numpy")
    assert sorted(loaded) == sorted(state)
    for name, value in state.items():
        assert loaded[name].dtype == value.dtype, name
        assert loaded[name].shape == value.shape, name
        assert np.array_equal(loaded[name], value), name


def test_the_restored_file_is_read_by_safetensors(store, tmp_path):
    state = weights(2, SHAPES)
    store.save(state, "model:v1", meta={"origin": "test"})
    out = tmp_path / "restored"
    gstore_cli(store._native.describe(), "restore", "model:v1", "--to", str(out))
    path = out / gstore.FILE_NAME
    read = safetensors.numpy.load_file(str(path))
    assert sorted(read) == sorted(state)
    for name, value in state.items():
        assert np.array_equal(read[name], value), name
    with safetensors.safe_open(str(path), framework="numpy") as f:
        assert f.metadata() == {"origin": "test"}
    # The data starts on a page, and each tensor at a multiple of its element size.
    (n,) = np.frombuffer(path.read_bytes()[:8], dtype="<u8")
    assert (8 + int(n)) % 4096 == 0


def test_a_fine_tune_adds_about_what_changed(store):
    shapes = {f"layers.{i}.{part}": (512, 512) for i in range(20) for part in ("attn", "mlp")}  # 1 MiB each
    base = weights(3, shapes)
    store.save(base, "model:base")
    tuned = dict(base)
    changed = sorted(shapes)[::10]  # 10 % of the tensors
    for name in changed:
        tuned[name] = base[name] + np.float32(0.001)
    report = store.save(tuned, "model:tuned")
    changed_bytes = sum(base[n].nbytes for n in changed)
    total = sum(v.nbytes for v in base.values())
    assert report["new_plain_bytes"] >= changed_bytes
    # Chunks straddling a changed tensor's edges are stored again too, but not much more.
    assert report["new_plain_bytes"] < 1.5 * changed_bytes, (report["new_plain_bytes"], changed_bytes, total)
    for name, value in store.load("model:tuned", framework="numpy").items():
        assert np.array_equal(value, tuned[name]), name


def test_load_into_fills_arrays_in_place(store):
    state = weights(4, SHAPES)
    store.save(state, "model:v1")
    target = {name: np.zeros_like(v) for name, v in state.items()}
    before = {name: v.__array_interface__["data"][0] for name, v in target.items()}
    store.load_into(target, "model:v1")
    for name, value in state.items():
        assert np.array_equal(target[name], value), name
        assert target[name].__array_interface__["data"][0] == before[name], "not filled in place"
    wrong = {name: np.zeros((3,), dtype=np.float32) for name in state}
    with pytest.raises(gstore.InvalidError, match="the image has float32"):
        store.load_into(wrong, "model:v1")
    with pytest.raises(gstore.InvalidError, match="names differ"):
        store.load_into({"other": np.zeros(1, dtype=np.float32)}, "model:v1")


def test_everyday_calls(store):
    store.save(weights(5, {"w": (64, 64)}), "model:v1", meta={"note": "first"})
    rows = store.list()
    assert [r["tag"] for r in rows] == ["model:v1"]
    assert rows[0]["logical_bytes"] > 64 * 64 * 4 and rows[0]["created_unix"] > 0
    info = store.show("model:v1")
    assert info["entries"][0]["path"] == gstore.FILE_NAME
    assert info["meta"] == {"format": "safetensors", "note": "first"}
    assert info["manifest"] == rows[0]["manifest"]
    rec = store.tag("model:v1", "model:stable")
    assert rec["manifest"] == rows[0]["manifest"]
    usage = store.du()
    assert {i["tag"] for i in usage["images"]} == {"model:v1", "model:stable"}
    # rm removes tags, never an image by its id (as the CLI refuses it too).
    with pytest.raises(gstore.InvalidError, match="is an image id"):
        store.rm(rows[0]["manifest"][:12])
    store.rm("model:v1")
    assert [r["tag"] for r in store.list()] == ["model:stable"]
    # The CLI sees the same store.
    listed = json.loads(gstore_cli(store._native.describe(), "--json", "ls").stdout)
    assert [r["tag"] for r in listed] == ["model:stable"]


def test_errors_name_what_is_wrong(store, tmp_path):
    with pytest.raises(gstore.NotFoundError, match="model:nope"):
        store.load("model:nope")
    with pytest.raises(gstore.NotFoundError):
        gstore.Store(str(tmp_path / "no-store-here"))
    with pytest.raises(gstore.InvalidError):
        store.save({"w": np.zeros(4, dtype=np.float32)}, "bad tag name")
    with pytest.raises(gstore.InvalidError, match="no safetensors equivalent"):
        store.save({"c": np.zeros(4, dtype=np.complex64)}, "model:v1")
    with pytest.raises(gstore.InvalidError, match="device"):
        store.load("model:v1", device="tpu")
    with pytest.raises(gstore.InvalidError, match="framework='torch'"):
        store.load("model:v1", device="cuda:0", framework="numpy")
    with pytest.raises(gstore.InvalidError, match="held= loads into GPU memory"):
        store.load("model:v1", device="cpu", held=str(tmp_path / "hold.sock"))
    # An image that was not saved by Store.save: pushed by the CLI from a directory.
    src = tmp_path / "plain"
    src.mkdir()
    (src / "config.json").write_text("{}")
    gstore_cli(store._native.describe(), "push", str(src), "--tag", "plain:v1")
    with pytest.raises(gstore.InvalidError, match="config.json"):
        store.load("plain:v1")
    assert isinstance(gstore.NotFoundError("x"), gstore.GstoreError)


def test_a_damaged_pack_fails_the_load_and_names_the_chunk(store):
    state = weights(6, {"w": (256, 256)})
    store.save(state, "model:v1", progress=False)
    root = pathlib.Path(store._native.describe())
    packs = sorted(root.rglob("*.pack"))
    assert packs
    for p in packs:
        data = bytearray(p.read_bytes())
        data[len(data) // 3] ^= 0x40
        p.write_bytes(bytes(data))
    with pytest.raises(gstore.CorruptError, match="chunk"):
        store.load("model:v1")


def test_no_progress_bar_when_not_a_terminal(store, capfd):
    store.save(weights(7, {"w": (512, 512)}), "model:v1")
    store.load("model:v1")
    assert capfd.readouterr().err == ""


def test_an_encrypted_store_opens_with_its_key_only(tmp_path, monkeypatch):
    """A store made with `gstore init --encrypt` is used from Python with GSTORE_KEY_FILE."""
    key, other, path = tmp_path / "k", tmp_path / "other", tmp_path / "enc"
    for k in (key, other):
        subprocess.run([os.environ["GSTORE_BIN"], "key", "generate", str(k)], check=True, capture_output=True)
    env = dict(os.environ, GSTORE_KEY_FILE=str(key))
    subprocess.run(
        [os.environ["GSTORE_BIN"], "--store", str(path), "init", "--encrypt"], check=True, capture_output=True, env=env
    )
    monkeypatch.setenv("GSTORE_KEY_FILE", str(other))
    with pytest.raises(Exception, match="does not open"):
        gstore.Store(str(path))
    monkeypatch.setenv("GSTORE_KEY_FILE", str(key))
    state = weights(5, SHAPES)
    s = gstore.Store(str(path))
    s.save(state, "model:v1")
    loaded = s.load("model:v1", framework="numpy")
    for name, value in state.items():
        assert np.array_equal(loaded[name], value), name


def test_a_store_named_by_gstore_store_is_the_default(tmp_path, monkeypatch):
    """`gstore.Store()` opens the store GSTORE_STORE names, as the CLI does."""
    path = tmp_path / "named"
    gstore.Store.init(str(path))
    monkeypatch.setenv("GSTORE_STORE", str(path))
    s = gstore.Store()
    s.save(weights(3, {"w": (64, 64)}), "model:v1")
    assert "model:v1" in gstore_cli(path, "ls").stdout


def test_byte_ranges_load_only_the_chunks_that_cover_them(store):
    rng = np.random.default_rng(3)
    a, b = rng.bytes(3 << 20), rng.bytes(100_000)
    native = store._native
    native.push_buffers("parts:1", [("a", [a]), ("b", [b])], "{}", False)
    ranges = [("a", 1_000_000, 5_000), ("a", 0, 3 << 20), ("b", 99_000, 1_000), ("a", 17, 0)]
    loaded = native.load_ranges("parts:1", ranges)
    whole = {"a": a, "b": b}
    for (path, offset, length), (buf, skip) in zip(ranges, loaded):
        data = np.asarray(buf)
        assert data[skip : skip + length].tobytes() == whole[path][offset : offset + length]
    # A short range reads the chunks around it, not the file.
    assert len(loaded[0][0]) < 1 << 20 and len(loaded[1][0]) == 3 << 20
    with pytest.raises(gstore.NotFoundError, match="nope"):
        native.load_ranges("parts:1", [("nope", 0, 1)])
    with pytest.raises(gstore.InvalidError, match="run past the end of b"):
        native.load_ranges("parts:1", [("b", 99_999, 2)])


def test_weights_yields_every_tensor_of_a_model_folder_in_file_order(store, tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    first = weights(11, {"embed": (64, 32), "layers.0.w": (32, 32)})
    second = weights(12, {"layers.1.w": (32, 32), "head": (32, 8)})
    safetensors.numpy.save_file(first, str(model / "model-00001.safetensors"))
    safetensors.numpy.save_file(second, str(model / "model-00002.safetensors"))
    (model / "config.json").write_text('{"hidden": 32}')
    gstore_cli(store._native.describe(), "push", str(model), "--tag", "model:v1")
    got = list(store.weights("model:v1", device="cpu"))
    names = [n for n, _ in got]
    # The files in the image's order, each file's tensors in its own order; config.json is no tensor.
    assert names == list(safetensors.numpy.load_file(str(model / "model-00001.safetensors"))) + list(
        safetensors.numpy.load_file(str(model / "model-00002.safetensors"))
    )
    expected = {**first, **second}
    for name, tensor in got:
        assert np.array_equal(np.asarray(tensor), expected[name]), name


def test_stored_policies_trim_without_flags_and_pins_win(store):
    for version in ("v1", "v2", "v3"):
        store.save(weights(20 + int(version[1]), {"w": (16, 16)}), f"ckpt:{version}", progress=False)
    store.pin("ckpt:v1")
    assert store.set_policy("ckpt", keep_last=1)["policies"] == {"ckpt": {"keep_last": 1}}
    with pytest.raises(gstore.InvalidError):
        store.set_policy("ckpt")  # no rule
    report = store.gc()
    assert report["tags_removed"] == ["ckpt:v2"], report
    kept = {v["tag"]: v["why"] for v in report["retention"] if v["kept"]}
    assert kept == {"ckpt:v1": "pinned", "ckpt:v3": "one of the newest 1"}, report["retention"]
    assert store.remove_policy("ckpt")["policies"] == {}
    with pytest.raises(gstore.NotFoundError):
        store.remove_policy("ckpt")


def test_loads_through_an_index_slot_leave_its_index_as_they_found_it(tmp_path):
    """A process with an index slot (a rank) opens its slot's index read-only to load, once the
    index is up to date: nothing in it is written (a writable open writes a new manifest)."""
    location = str(tmp_path / "store")
    gstore.Store.init(location)
    ranked = gstore.Store(location, index_slot=3)
    state = weights(7, SHAPES)
    ranked.save(state, "model:v1")
    slot = pathlib.Path(location) / "index-slot-3"

    def files():
        return sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in slot.iterdir())

    ranked.load("model:v1", framework="numpy")  # catches the index up after the push
    before = files()
    loaded = ranked.load("model:v1", framework="numpy")
    assert files() == before, "a load wrote to the slot's index"
    for name, value in state.items():
        assert np.array_equal(loaded[name], value), name
