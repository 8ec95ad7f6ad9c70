"""torch.distributed.checkpoint through gstore.torch: two gloo ranks on the CPU save one
sharded checkpoint (DTensor shards), which one process loads back whole; and the failures.
Runs where torch is installed (skipped otherwise)."""

import os
import socket

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

import gstore  # noqa: E402
import gstore.torch  # noqa: E402

SHAPES = {"w": (64, 32), "b": (64,), "emb": (128, 16)}


def full_state(seed=0):
    g = torch.Generator().manual_seed(seed)
    return {k: torch.randn(*s, generator=g) * 0.02 for k, s in SHAPES.items()}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_save(rank, world, port, location, tag, fail_rank):
    from torch.distributed.tensor import Shard, distribute_tensor, init_device_mesh

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), LOCAL_RANK=str(rank))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        mesh = init_device_mesh("cpu", (world,))
        state = {k: distribute_tensor(v, mesh, [Shard(0)]) for k, v in full_state().items()}
        state["step"] = 3
        writer = gstore.torch.Writer(location, tag)
        if rank == fail_rank:
            def broken(plan, planner):
                raise RuntimeError("this rank's disk failed")
            writer.write_data = broken
        dcp.save(state, storage_writer=writer)
    finally:
        dist.destroy_process_group()


def save_from_two_ranks(location, tag, fail_rank=-1):
    mp.start_processes(_rank_save, args=(2, free_port(), location, tag, fail_rank), nprocs=2, start_method="spawn")


def test_two_ranks_write_one_image_that_one_process_loads_whole(tmp_path):
    location = str(tmp_path / "store")
    store = gstore.Store.init(location)
    save_from_two_ranks(location, "job:step-3")
    assert [r["tag"] for r in store.list()] == ["job:step-3"], "one tag; the parts' tags are gone"
    paths = sorted(e["path"] for e in store.show("job:step-3")["entries"])
    assert paths == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    assert store.show("job:step-3")["meta"]["dcp"]["ranks"] == 2

    # Resumed on one rank (no process group): the shards come back as whole tensors.
    loaded = {k: torch.zeros(*s) for k, s in SHAPES.items()}
    loaded["step"] = 0
    dcp.load(loaded, storage_reader=gstore.torch.Reader(store, "job:step-3"))
    for k, v in full_state().items():
        assert torch.equal(loaded[k], v), k
    assert loaded["step"] == 3


def test_a_failed_rank_tags_nothing_and_a_missing_image_is_named(tmp_path):
    location = str(tmp_path / "store")
    store = gstore.Store.init(location)
    with pytest.raises(mp.ProcessExitedException):
        save_from_two_ranks(location, "job:step-4", fail_rank=1)
    assert "job:step-4" not in [r["tag"] for r in store.list()], "no tag for a checkpoint that failed"
    # The missing image is named before DCP runs (DCP reports a reader's error differently
    # across torch versions: some only as "metadata is None").
    with pytest.raises(gstore.NotFoundError, match="tag not found: job:step-4"):
        dcp.load({"w": torch.zeros(*SHAPES["w"])}, storage_reader=gstore.torch.Reader(store, "job:step-4"))
    reader = gstore.torch.Reader(store, "job.dcp-part-0:step-4")  # the rank that did not fail
    with pytest.raises(gstore.NotFoundError, match="tag not found: job:step-5"):
        reader.reset("job:step-5")


def test_async_save_writes_the_same_image(tmp_path):
    store = gstore.Store.init(str(tmp_path / "store"))
    state = {**full_state(3), "step": 9}
    future = dcp.async_save(state, storage_writer=gstore.torch.Writer(store, "job:step-9"))
    future.result()
    loaded = {k: torch.zeros(*s) for k, s in SHAPES.items()}
    loaded["step"] = 0
    dcp.load(loaded, storage_reader=gstore.torch.Reader(store, "job:step-9"))
    for k, v in full_state(3).items():
        assert torch.equal(loaded[k], v), k
    assert loaded["step"] == 9
    assert [r["tag"] for r in store.list()] == ["job:step-9"]


def odd_state():
    """Tensors of every kind of dtype and shape, their sizes making later items start at odd
    offsets before alignment."""
    g = torch.Generator().manual_seed(5)
    return {
        "bf16": (torch.randn(7, 13, generator=g) * 0.02).to(torch.bfloat16),
        "f64": torch.randn(3, generator=g, dtype=torch.float64),
        "mask": torch.rand(11, generator=g) > 0.5,
        "ids": torch.arange(5, dtype=torch.int64),
        "scalar": torch.tensor(2.5),
        "empty": torch.zeros(0, 4),
        "bytes": torch.arange(9, dtype=torch.uint8),
    }


def test_tensors_of_any_dtype_come_back_exactly_and_aligned(tmp_path):
    store = gstore.Store.init(str(tmp_path / "store"))
    dcp.save(odd_state(), storage_writer=gstore.torch.Writer(store, "odd:1"))
    reader = gstore.torch.Reader(store, "odd:1")
    metadata = reader.read_metadata()
    items = list(metadata.storage_data.values())
    assert all(i.dtype for i in items), "every tensor stored raw"
    assert all(i.offset % gstore.torch.ALIGN == 0 for i in items)
    # In memory too: each item's bytes are used where they lie, aligned for their dtype.
    reader.set_up_storage_reader(metadata, True)
    views = reader._ranges(items)
    assert all(v.ctypes.data % gstore.torch.ALIGN == 0 for v in views if len(v))
    # One rank file, its items only padding apart: one range, so the items share its memory.
    bases = {v.base.__array_interface__["data"][0] if v.base is not None else None for v in views if len(v)}
    assert len(bases) == 1, "the items were read as separate ranges"
    loaded = {k: torch.empty_like(v) for k, v in odd_state().items()}
    dcp.load(loaded, storage_reader=reader)
    for k, v in odd_state().items():
        assert loaded[k].dtype == v.dtype and torch.equal(loaded[k], v), k


def test_checkpoints_in_torch_save_form_still_load(tmp_path, monkeypatch):
    # As checkpoints written before the raw form are: every tensor in torch.save's form.
    store = gstore.Store.init(str(tmp_path / "store"))
    with monkeypatch.context() as m:
        m.setattr(gstore.torch, "_byte_view", lambda t: None)
        dcp.save(odd_state(), storage_writer=gstore.torch.Writer(store, "old:1"))
    reader = gstore.torch.Reader(store, "old:1")
    assert not any(i.dtype for i in reader.read_metadata().storage_data.values())
    loaded = {k: torch.empty_like(v) for k, v in odd_state().items()}
    dcp.load(loaded, storage_reader=reader)
    for k, v in odd_state().items():
        assert torch.equal(loaded[k], v), k
