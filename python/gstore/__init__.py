"""Save and load PyTorch / NumPy state straight through a gstore store.

>>> import gstore
>>> s = gstore.Store("/var/lib/gstore")          # or "s3://bucket/prefix", "http://host:port", None
>>> s.save({"w": torch.randn(4, 4)}, "model:v1")
>>> tensors = s.load("model:v1", device="cuda:0")

An image saved here holds one file, ``model.safetensors``: ``gstore restore`` gives a file that
``safetensors.safe_open`` reads, and fine-tunes of one base deduplicate against it. Loads go
through gstore's restore engine (every chunk checked against its hash) into host memory or
straight into GPU memory; the tensors returned share that memory, no copy is made in Python.
Errors are :class:`GstoreError` (and its subclasses) with the CLI's messages.
"""

from __future__ import annotations

import json
from typing import Any, Mapping, Optional, Union

from . import _gstore
from ._gstore import ConflictError, CorruptError, GstoreError, InvalidError, NotFoundError
from . import safetensors_layout as _layout

__all__ = [
    "Store",
    "GstoreError",
    "NotFoundError",
    "CorruptError",
    "ConflictError",
    "InvalidError",
    "FILE_NAME",
]

#: The name of the one file an image saved by :meth:`Store.save` holds.
FILE_NAME = "model.safetensors"

Tensors = Mapping[str, Any]


class Store:
    """A gstore store: a directory, ``s3://BUCKET[/PREFIX]`` or ``http://HOST:PORT``, as the
    CLI's ``--store`` takes (with the same environment variables); the default local store when
    ``None``. Each call opens what it needs and lets go of it afterwards."""

    def __init__(self, path_or_url: Optional[str] = None) -> None:
        self._native = _gstore.Store(path_or_url)

    @staticmethod
    def init(path_or_url: Optional[str] = None) -> "Store":
        """Creates an empty store (``gstore init``) and opens it."""
        _gstore.Store.init(path_or_url)
        return Store(path_or_url)

    def __repr__(self) -> str:
        return f"gstore.Store({self._native.describe()!r})"

    def save(
        self,
        state_dict: Tensors,
        tag: str,
        meta: Optional[Mapping[str, str]] = None,
        progress: bool = True,
    ) -> dict:
        """Stores ``state_dict`` (names to torch tensors, CPU or CUDA, any dtype including
        bf16 and fp8, or NumPy arrays) as a safetensors file in a new image tagged ``tag``
        (``NAME[:VERSION]``). ``meta`` (strings) goes into the safetensors header and the image's
        metadata. Returns the push report (bytes added, chunks, seconds, ...)."""
        header, buffers = _layout.encode(state_dict, meta)
        report = self._native.push_buffers(
            tag,
            [(FILE_NAME, [header, *buffers])],
            json.dumps({"format": "safetensors", **(dict(meta) if meta else {})}),
            progress,
        )
        return json.loads(report)

    def load(
        self,
        tag: str,
        device: Union[str, int] = "cpu",
        memory_budget: int = 1 << 30,
        progress: bool = True,
        framework: str = "auto",
        held: Optional[str] = None,
    ) -> dict:
        """The tensors of image ``tag`` saved by :meth:`save`, on ``device`` (``"cpu"`` or
        ``"cuda:N"``): torch tensors, or NumPy arrays with ``framework="numpy"`` (CPU only;
        ``"auto"`` gives NumPy when torch is not installed). Every chunk is checked against its
        hash before this returns; the tensors share the memory gstore filled. ``held``: the
        socket of a ``gstore hold`` holding the image (GPU loads only), which then loads it
        from pinned memory."""
        return _layout.decode(self.load_file(tag, device, memory_budget, progress, framework, held))

    def load_into(
        self,
        target: Any,
        tag: str,
        memory_budget: int = 1 << 30,
        progress: bool = True,
        strict: bool = True,
        held: Optional[str] = None,
    ) -> None:
        """Fills the existing tensors of ``target`` (a ``torch.nn.Module`` or a state dict) in
        place from image ``tag``, loading onto the device they are on. With ``strict``, names,
        shapes and dtypes must match exactly; otherwise names missing on either side are
        skipped. ``held``: as for :meth:`load`."""
        state = target.state_dict() if hasattr(target, "state_dict") else target
        device, framework = _layout.placement_of(state)
        loaded = self.load(
            tag, device=device, memory_budget=memory_budget, progress=progress, framework=framework, held=held
        )
        _layout.copy_into(state, loaded, strict)

    def load_file(
        self,
        tag: str,
        device: Union[str, int] = "cpu",
        memory_budget: int = 1 << 30,
        progress: bool = True,
        framework: str = "auto",
        held: Optional[str] = None,
    ) -> Any:
        """The raw bytes of the image's safetensors file on ``device``: a uint8 torch tensor, or
        NumPy array (see :meth:`load` for ``framework`` and ``held``), sharing gstore's memory."""
        kind, index = _layout.parse_device(device)
        framework = _layout.pick_framework(framework, kind)
        if kind == "cpu":
            if held is not None:
                raise InvalidError("held= loads into GPU memory: pass device=\"cuda:N\"")
            files = self._native.load_host(tag, memory_budget, progress)
        else:
            files, _phases = self._native.load_cuda(tag, index, memory_budget, progress, held)
        blob = dict(files).get(FILE_NAME)
        if blob is None:
            names = ", ".join(p for p, _ in files) or "none"
            raise InvalidError(f"{tag} holds no {FILE_NAME} (it was not saved by gstore.Store.save); its files: {names}")
        return _layout.as_array(blob, framework, index)

    def list(self) -> list:
        """Every tag: ``tag``, ``manifest``, ``created_unix``, ``logical_bytes``, ``error``."""
        return json.loads(self._native.list())

    def show(self, tag: str) -> dict:
        """One image: manifest id, creation time, size, metadata and entries."""
        return json.loads(self._native.show(tag))

    def du(self) -> dict:
        """Space used: logical and stored bytes, dedup and compression, bytes each image alone costs."""
        return json.loads(self._native.du())

    def tag(self, source: str, target: str) -> dict:
        """Points the new tag ``target`` at the image ``source`` names."""
        return json.loads(self._native.tag(source, target))

    def rm(self, tag: str) -> None:
        """Removes a tag; its chunks stay until ``gstore gc``."""
        self._native.rm(tag)
