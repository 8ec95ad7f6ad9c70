"""``torch.distributed.checkpoint`` (DCP) into a gstore store: one image per checkpoint, written
by every rank side by side and tagged once all of it is stored.

    import torch.distributed.checkpoint as dcp
    import gstore.torch

    dcp.save(state, storage_writer=gstore.torch.Writer("/data/store", "run:step-1000"))
    dcp.load(state, storage_reader=gstore.torch.Reader("/data/store", "run:step-1000"))

Each rank pushes its own items as one file, ``__R_0.distcp`` (each tensor's raw bytes, its
dtype and shape in DCP's metadata, every item starting at a multiple of 64 bytes, so that a
load uses the bytes where they lie), under a part tag ``NAME.dcp-part-R:VERSION``, through
its own index slot (ranks on one machine do not wait for each other's index lock). The
coordinator then pushes DCP's ``.metadata`` and composes the step's image from the parts (their
chunks referenced, not stored again), tags it ``NAME:VERSION``, and removes the part tags: the
tag appears all at once, or, if a rank or the coordinator fails, not at all (part tags may be
left; ``gstore rm`` them). :class:`Reader` reads the image back on any number of ranks, each
loading only the byte ranges its plan names; DCP's planner reshards.
"""

import dataclasses
import io
import json
import os
import pickle
from typing import Any, Dict, List, Optional, Tuple, Union

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex, StorageMeta
from torch.distributed.checkpoint.planner import (
    LoadItemType,
    LoadPlan,
    LoadPlanner,
    ReadItem,
    SavePlan,
    SavePlanner,
    WriteItemType,
)
from torch.distributed.checkpoint.storage import StorageReader, StorageWriter, WriteResult
from torch.futures import Future

from . import Store, _gstore

__all__ = ["Writer", "Reader"]

METADATA = ".metadata"
"""The file holding DCP's metadata (pickled), as DCP's file system writer names it."""


@dataclasses.dataclass(frozen=True)
class _Part:
    """Which rank file a save plan writes."""

    index: int


@dataclasses.dataclass(frozen=True)
class StoredItem:
    """Where one item's bytes are: file ``path`` of the image, ``length`` bytes at ``offset``;
    ``part`` is the manifest id of the part image that holds the file (for the commit). A
    tensor is stored as its raw bytes, ``dtype`` (a ``torch`` dtype's name) and ``shape``
    saying what they are; one stored with ``dtype`` empty is in ``torch.save``'s form (as
    checkpoints before the raw form, and tensors whose dtype has no byte view, are)."""

    path: str
    offset: int
    length: int
    part: str = ""
    dtype: str = ""
    shape: Tuple[int, ...] = ()


ALIGN = 64
"""Items start at multiples of this many bytes of their rank file, so a loaded tensor's bytes
are aligned for any dtype and are used where they lie."""


def _byte_view(t: torch.Tensor) -> Optional[np.ndarray]:
    """A contiguous CPU tensor's bytes as a flat ``uint8`` array sharing its memory, or
    ``None`` where its dtype has no byte view."""
    try:
        return t.reshape(-1).view(torch.uint8).numpy()
    except (RuntimeError, TypeError):
        return None


def _location_of(store: Union[Store, str, None]) -> Optional[str]:
    return store.location if isinstance(store, Store) else store


def _split_tag(tag: str):
    name, _, version = tag.partition(":")
    return name, version or "latest"


def _rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _slot() -> int:
    """This process's index slot: its rank on this machine."""
    return int(os.environ.get("LOCAL_RANK", _rank()))


class Writer(StorageWriter):
    """Saves a DCP checkpoint as image ``tag`` (``NAME:VERSION``) of ``store`` (a
    :class:`gstore.Store`, or its location). Works with ``dcp.save`` and ``dcp.async_save``."""

    def __init__(self, store: Union[Store, str, None], tag: str) -> None:
        super().__init__()
        self.location = _location_of(store)
        self.tag = tag
        self._native = None
        self._is_coordinator = False

    def reset(self, checkpoint_id: Union[str, os.PathLike, None] = None) -> None:
        if checkpoint_id is not None:
            self.tag = str(checkpoint_id)
        self._native = None
        self.__dict__.pop("_parent_tag", None)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: Union[str, os.PathLike]) -> bool:
        return isinstance(checkpoint_id, str) and ":" in checkpoint_id and "/" not in checkpoint_id

    def storage_meta(self) -> Optional[StorageMeta]:
        return StorageMeta(checkpoint_id=self.tag)

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        self._is_coordinator = is_coordinator
        self._native = _gstore.Store(self.location, _slot())

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        return plan

    def prepare_global_plan(self, plans: List[SavePlan]) -> List[SavePlan]:
        return [dataclasses.replace(p, storage_data=_Part(i)) for i, p in enumerate(plans)]

    def _part_tag(self, index: Union[int, str]) -> str:
        name, version = _split_tag(self.tag)
        return f"{name}.dcp-part-{index}:{version}"

    def _parent(self) -> Optional[str]:
        """The newest earlier checkpoint of this tag's name: each rank's file is stored
        against its file there (unchanged chunks shared, changed ones as XOR deltas)."""
        if not hasattr(self, "_parent_tag"):
            name, _ = _split_tag(self.tag)
            rows = [r for r in json.loads(self._native.list()) if r["tag"].split(":", 1)[0] == name]
            rows = [r for r in rows if r["tag"] != self.tag and r.get("created_unix") is not None]
            self._parent_tag = max(rows, key=lambda r: r["created_unix"])["tag"] if rows else None
        return self._parent_tag

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> "Future[List[WriteResult]]":
        part: _Part = plan.storage_data
        path = f"__{part.index}_0.distcp"
        buffers: List[Any] = []
        placed = []
        offset = 0
        for item in plan.items:
            data = planner.resolve_data(item)
            dtype, shape = "", ()
            if item.type == WriteItemType.BYTE_IO:
                raw = data.getvalue() if isinstance(data, io.BytesIO) else bytes(data)
            else:
                tensor = data.detach().cpu().contiguous()
                raw = _byte_view(tensor)
                if raw is None:
                    out = io.BytesIO()
                    torch.save(tensor, out)
                    raw = out.getvalue()
                else:
                    dtype, shape = str(tensor.dtype).removeprefix("torch."), tuple(tensor.shape)
            if offset % ALIGN:
                buffers.append(bytes(ALIGN - offset % ALIGN))
                offset += ALIGN - offset % ALIGN
            buffers.append(raw)
            placed.append((item, StoredItem(path, offset, len(raw), dtype=dtype, shape=shape)))
            offset += len(raw)
        manifest = ""
        if buffers:
            meta = json.dumps({"parent": self._parent()} if self._parent() else {})
            report = json.loads(self._native.push_buffers(self._part_tag(part.index), [(path, buffers)], meta, False))
            manifest = report["manifest"]
        results = [
            WriteResult(index=item.index, size_in_bytes=d.length, storage_data=dataclasses.replace(d, part=manifest))
            for item, d in placed
        ]
        fut: Future = Future()
        fut.set_result(results)
        return fut

    def finish(self, metadata: Metadata, results: List[List[WriteResult]]) -> None:
        """On the coordinator: pushes the metadata, composes the image from every rank's
        part and tags it, then removes the part tags."""
        parts: Dict[str, None] = {}
        storage: Dict[MetadataIndex, StoredItem] = {}
        for per_rank in results:
            for r in per_rank:
                d: StoredItem = r.storage_data
                parts[d.part] = None
                storage[r.index] = dataclasses.replace(d, part="")
        metadata.storage_data = storage
        meta_tag = self._part_tag("meta")
        report = json.loads(
            self._native.push_buffers(meta_tag, [(METADATA, [pickle.dumps(metadata)])], "{}", False)
        )
        ids = [p for p in parts if p] + [report["manifest"]]
        meta = {"kind": "dcp-checkpoint", "dcp": {"ranks": len(results)}}
        self._native.compose(self.tag, ids, json.dumps(meta))
        for t in [self._part_tag(i) for i in range(len(results))] + [meta_tag]:
            try:
                self._native.rm(t)
            except _gstore.NotFoundError:
                pass  # a rank with nothing to write pushed no part


class Reader(StorageReader):
    """Loads a DCP checkpoint from image ``tag`` of ``store`` (a :class:`gstore.Store`, or
    its location), on any number of ranks. Raises :class:`gstore.NotFoundError` naming the tag
    when there is no such image, before DCP runs (DCP reports a reader's failure differently
    across torch versions, some only as "metadata is None")."""

    def __init__(self, store: Union[Store, str, None], tag: str) -> None:
        super().__init__()
        self.location = _location_of(store)
        self.tag = tag
        self._native = None
        self._storage: Dict[MetadataIndex, StoredItem] = {}
        self._check_tag()

    def reset(self, checkpoint_id: Union[str, os.PathLike, None] = None) -> None:
        if checkpoint_id is not None:
            self.tag = str(checkpoint_id)
            self._check_tag()
        self._native = None

    def _check_tag(self) -> None:
        """Raises NotFoundError when the store holds no image ``self.tag``."""
        _gstore.Store(self.location, None).show(self.tag)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: Union[str, os.PathLike]) -> bool:
        return Writer.validate_checkpoint_id(checkpoint_id)

    def _store(self):
        if self._native is None:
            self._native = _gstore.Store(self.location, _slot())
        return self._native

    def _files(self, paths: List[str]) -> Dict[str, np.ndarray]:
        loaded = self._store().load_host(self.tag, 1 << 30, False, paths)
        return {p: np.asarray(f) for p, f in loaded}

    def read_metadata(self) -> Metadata:
        files = self._files([METADATA])
        if METADATA not in files:
            raise _gstore.NotFoundError(f"{self.tag} holds no DCP {METADATA}: not a checkpoint gstore.torch.Writer made")
        return pickle.loads(files[METADATA].tobytes())

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        self._storage = metadata.storage_data

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: List[LoadPlan]) -> List[LoadPlan]:
        return plans

    def _ranges(self, items: List[StoredItem]) -> List[np.ndarray]:
        """The bytes of each item, read as few ranges: items of one file that touch (or lie
        only alignment padding apart) share one range, and only the chunks covering the ranges
        are read (a rank resharding, or reading a few items another rank wrote, does not read
        whole files)."""
        spans: List[List[Any]] = []  # [path, start, end, [item indices]]
        for i in sorted(range(len(items)), key=lambda i: (items[i].path, items[i].offset)):
            it = items[i]
            last = spans[-1] if spans else None
            if last is not None and last[0] == it.path and it.offset <= last[2] + ALIGN:
                last[2] = max(last[2], it.offset + it.length)
                last[3].append(i)
            else:
                spans.append([it.path, it.offset, it.offset + it.length, [i]])
        loaded = self._store().load_ranges(self.tag, [(p, a, b - a) for p, a, b, _ in spans])
        out: List[Any] = [None] * len(items)
        for (path, start, _, members), (buf, skip) in zip(spans, loaded):
            data = np.asarray(buf)
            for i in members:
                at = skip + items[i].offset - start
                out[i] = data[at : at + items[i].length]
        return out

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> "Future[None]":
        stored = [self._storage[r.storage_index] for r in plan.items]
        for req, loc, raw in zip(plan.items, stored, self._ranges(stored) if stored else []):
            if req.type == LoadItemType.BYTE_IO:
                planner.load_bytes(req, io.BytesIO(raw))
                continue
            tensor = _narrow(_tensor(loc, raw), req)
            target = planner.resolve_tensor(req).detach()
            if target.size() != tensor.size():
                raise ValueError(f"{req.storage_index}: stored {tuple(tensor.size())}, asked {tuple(target.size())}")
            target.copy_(tensor)
            planner.commit_tensor(req, target)
        fut: Future = Future()
        fut.set_result(None)
        return fut


def _tensor(loc: StoredItem, raw: np.ndarray) -> torch.Tensor:
    """The tensor stored at ``loc``, whose bytes are ``raw``: a view of them in the raw form."""
    if not loc.dtype:
        return torch.load(io.BytesIO(raw), map_location="cpu", weights_only=True)
    dtype = getattr(torch, loc.dtype, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"{loc.path} at {loc.offset}: {loc.dtype!r} is no torch dtype")
    if not len(raw):
        return torch.empty(loc.shape, dtype=dtype)
    return torch.frombuffer(raw, dtype=torch.uint8).view(dtype).reshape(loc.shape)


def _narrow(tensor: torch.Tensor, req: ReadItem) -> torch.Tensor:
    """The part of a stored tensor (chunk) a read asks for."""
    for dim, (start, length) in enumerate(zip(req.storage_offsets, req.lengths)):
        tensor = tensor.narrow(dim, start, length)
    return tensor
