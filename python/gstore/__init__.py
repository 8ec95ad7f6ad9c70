"""Save and load PyTorch / NumPy state straight through a gstore store.

>>> import gstore
>>> s = gstore.Store("/var/lib/gstore")          # or "s3://bucket/prefix", "http://host:port", None
>>> s.save({"w": torch.randn(4, 4)}, "model:v1")
>>> tensors = s.load("model:v1", device="cuda:0")

Whole training state saves the same way, in the background if asked:

>>> h = s.save({"model": model.state_dict(), "optim": opt.state_dict(), "step": step},
...            f"run:step-{step}", blocking=False)    # returns once the tensors are copied
>>> state = s.load(s.latest("run"))                   # the same structure, types and tensors

An image saved here holds one file, ``model.safetensors``: ``gstore restore`` gives a file that
``safetensors.safe_open`` reads, and fine-tunes of one base deduplicate against it. A nested
state's tensors are that file's entries, named by their path; the rest of its structure is
JSON in the file's ``__metadata__`` (docs/PYTHON.md). Loads go through gstore's restore engine
(every chunk checked against its hash) into host memory or straight into GPU memory; the
tensors returned share that memory, no copy is made in Python. Errors are
:class:`GstoreError` (and its subclasses) with the CLI's messages.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import json
import re
import sys
import threading
import time
from typing import Any, Dict, Iterator, List, Mapping, Optional, Tuple, Union

from . import _gstore
from ._gstore import ConflictError, CorruptError, GstoreError, InvalidError, NotFoundError
from . import safetensors_layout as _layout
from . import staging as _staging
from . import structure as _structure

__all__ = [
    "Store",
    "SaveHandle",
    "GstoreError",
    "NotFoundError",
    "CorruptError",
    "ConflictError",
    "InvalidError",
    "FILE_NAME",
]

#: The name of the one file an image saved by :meth:`Store.save` holds.
FILE_NAME = "model.safetensors"

State = Mapping[Any, Any]

# Background saves that failed and whose failure nobody has been told of yet: reported on
# stderr when the interpreter exits (after the saves still running have ended).
_untold: "set[SaveHandle]" = set()
_untold_lock = threading.Lock()


@atexit.register
def _report_untold() -> None:
    with _untold_lock:
        for h in _untold:
            print(f"gstore: the background save of {h.tag} failed and nobody waited for it: {h._error}", file=sys.stderr)
        _untold.clear()


class SaveHandle:
    """A save running in the background (``Store.save(..., blocking=False)``). The tensors were
    copied before the save returned; chunking, coding and upload go on in a thread of the
    store. Its failure is raised by :meth:`wait`; if nobody called :meth:`wait` before the
    store's next save, that save raises it instead (and is not started), and if nobody is told
    before the interpreter exits, it is printed to stderr then."""

    def __init__(self, tag: str, future: "concurrent.futures.Future[dict]", blocked_s: float, staged_bytes: int) -> None:
        self.tag = tag
        #: Seconds the caller of :meth:`Store.save` was held (waiting for the previous save and
        #: copying the tensors).
        self.blocked_s = blocked_s
        #: Bytes copied into the store's staging pool.
        self.staged_bytes = staged_bytes
        self._future = future
        self._error: Optional[BaseException] = None
        self._told = False
        self._lock = threading.Lock()
        future.add_done_callback(self._finished)

    def __repr__(self) -> str:
        state = "running" if not self.done() else ("failed" if self._future.exception() else "done")
        return f"<gstore.SaveHandle {self.tag} {state}>"

    def _finished(self, future: "concurrent.futures.Future[dict]") -> None:
        with self._lock:
            self._error = future.exception()
            if self._error is not None and not self._told:
                with _untold_lock:
                    _untold.add(self)

    def done(self) -> bool:
        """Whether the save has ended (stored and tagged, or failed)."""
        return self._future.done()

    def wait(self, timeout: Optional[float] = None) -> dict:
        """Waits for the save to end and returns its report (that of a blocking save, with
        ``blocked_s`` and ``staged_bytes``), or raises its failure. ``timeout``: seconds to wait
        at most, then :class:`TimeoutError` (the save goes on)."""
        try:
            report = self._future.result(timeout)
        except concurrent.futures.TimeoutError:
            raise TimeoutError(f"the save of {self.tag} is still running after {timeout} s") from None
        except BaseException:
            self._tell()
            raise
        return {**report, "blocked_s": self.blocked_s, "staged_bytes": self.staged_bytes}

    def _tell(self) -> bool:
        """Marks the failure as told; whether it had been told before."""
        with self._lock:
            told, self._told = self._told, True
        with _untold_lock:
            _untold.discard(self)
        return told

    def _raise_untold(self) -> None:
        """Waits for the save to end; raises its failure if nobody was told of it yet."""
        concurrent.futures.wait([self._future])
        error = self._future.exception()
        if error is None or self._tell():
            return
        cls = type(error) if isinstance(error, GstoreError) else GstoreError
        raise cls(f"the background save of {self.tag} failed, so this save was not started: {error}") from error


class Store:
    """A gstore store: a directory, ``s3://BUCKET[/PREFIX]`` or ``http://HOST:PORT``, as the
    CLI's ``--store`` takes (with the same environment variables); the default local store when
    ``None``. Each call opens what it needs and lets go of it afterwards.

    A store object keeps one staging pool (host memory that saves copy tensors into; see
    :meth:`save`) and runs at most one save at a time."""

    def __init__(self, path_or_url: Optional[str] = None, index_slot: Optional[int] = None) -> None:
        """``index_slot``: use this machine's index number ``index_slot`` of a store instead of
        the default one, so as not to wait for another process holding that (a ``gstore``
        command, another rank); each slot's index is built the first time it is used."""
        self._native = _gstore.Store(path_or_url, index_slot)
        self.location = path_or_url
        """Where the store is, as given (``None``: ``GSTORE_STORE`` or the default)."""
        self._pool = _staging.StagingPool()
        self._saving = threading.Lock()  # one save at a time, from any thread
        self._pending: Optional[SaveHandle] = None
        self._worker: Optional[concurrent.futures.ThreadPoolExecutor] = None
        self.last_load: Optional[dict] = None
        """What the last GPU load reported: seconds planning (``plan_s``), allocating
        (``alloc_s``) and transferring (``transfer_s``), where chunks were checked (``path``)
        and where its workers waited (``waits``)."""

    @staticmethod
    def init(path_or_url: Optional[str] = None) -> "Store":
        """Creates an empty store (``gstore init``) and opens it."""
        _gstore.Store.init(path_or_url)
        return Store(path_or_url)

    def __repr__(self) -> str:
        return f"gstore.Store({self._native.describe()!r})"

    def save(
        self,
        state: State,
        tag: str,
        meta: Optional[Mapping[str, str]] = None,
        progress: bool = True,
        blocking: bool = True,
    ) -> Union[dict, SaveHandle]:
        """Stores ``state`` as a safetensors file in a new image tagged ``tag``
        (``NAME[:VERSION]``).

        ``state`` is a dict: a flat one of names to tensors (torch, CPU or CUDA, any dtype
        including bf16 and fp8; or NumPy arrays) is saved as a plain safetensors file, as
        always. Anything else is a nested state: dicts (keys str or int), lists and tuples of
        tensors, NumPy scalars and plain values (int, float, str, bool, None), as
        ``model.state_dict()``, ``optimizer.state_dict()``, schedulers, RNG states and the step
        hold them; :meth:`load` gives the same structure back. ``meta`` (strings) goes into the
        safetensors header and the image's metadata.

        With ``blocking`` (the default) the call returns the push report once the image is
        stored and tagged, plus ``blocked_s`` (the seconds it took) and ``staged_bytes``; CUDA
        tensors are staged through the store's pinned pool, host tensors read in place.
        With ``blocking=False`` it returns a :class:`SaveHandle` as soon as every tensor is
        copied into the pool (CUDA tensors on a stream of their own, synchronised before
        returning; host tensors and arrays too, since training changes them), and the rest
        runs in the background. The pool is one host buffer, reused by every save that fits:
        at most the staged bytes of the largest save so far (every tensor's bytes for a
        background save), pinned once CUDA tensors were staged; :meth:`release_staging` frees
        it. A save first waits for the one in flight, and raises its failure if nobody was
        told of it (:meth:`SaveHandle.wait`)."""
        began = time.perf_counter()
        leaves, tree = _structure.flatten(state)
        metadata = _layout.check_meta(meta)
        manifest_meta = json.dumps({"format": "safetensors", **metadata})
        if tree is not None:
            metadata[_layout.TREE_KEY] = tree
        entries = _layout.file_order([_layout.describe(name, value) for name, value in leaves])
        header = _layout.encode_header(entries, metadata)
        with self._saving:
            self._wait_pending()
            buffers, staged = self._pool.stage(entries, copy_host=not blocking)
            files = [(FILE_NAME, [header, *buffers])]
            if blocking:
                report = json.loads(self._native.push_buffers(tag, files, manifest_meta, progress))
                return {**report, "blocked_s": time.perf_counter() - began, "staged_bytes": staged}
            if self._worker is None:
                self._worker = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="gstore-save")
            future = self._worker.submit(self._push, tag, files, manifest_meta, progress)
            self._pending = SaveHandle(tag, future, time.perf_counter() - began, staged)
            return self._pending

    def _push(self, tag: str, files: List[Tuple[str, List[Any]]], meta: str, progress: bool) -> dict:
        return json.loads(self._native.push_buffers(tag, files, meta, progress))

    def _wait_pending(self) -> None:
        pending, self._pending = self._pending, None
        if pending is not None:
            pending._raise_untold()

    @property
    def staging_bytes(self) -> int:
        """Bytes of host memory the staging pool holds now (see :meth:`save`)."""
        return self._pool.nbytes

    def release_staging(self) -> None:
        """Waits for the save in flight (raising its failure if nobody was told of it), then
        frees the staging pool; the next save that stages allocates it again."""
        with self._saving:
            self._wait_pending()
            self._pool.release()

    def load(
        self,
        tag: str,
        device: Union[str, int] = "cpu",
        memory_budget: int = 1 << 30,
        progress: bool = True,
        framework: str = "auto",
        held: Optional[str] = None,
        file: Optional[str] = None,
    ) -> dict:
        """The state image ``tag`` holds, on ``device`` (``"cpu"`` or ``"cuda:N"``). Every
        chunk is checked against its hash before this returns; the tensors share the memory
        gstore filled.

        An image saved by :meth:`save` gives back what was saved: a flat dict of tensors, or a
        nested state with the same dicts (key types included), lists, tuples and plain values.
        An image of several safetensors files (a Hugging Face model's shards pushed with
        ``gstore push DIR``) gives one dict of them all; a name in two files is an error
        naming both. ``file``: only that file of the image.

        Tensors are torch tensors, or NumPy arrays with ``framework="numpy"`` (CPU only).
        ``"auto"`` gives NumPy when torch is not installed; with torch, it gives what was
        saved: torch tensors, and NumPy arrays and scalars of a nested state as NumPy (copied
        to the host from a GPU load). ``held``: the socket of a ``gstore hold`` holding the
        image (GPU loads only), which then loads it from pinned memory."""
        files = self._load_files(tag, device, memory_budget, progress, framework, held)
        keep_numpy = framework == "auto"
        if file is not None:
            chosen = [(p, a) for p, a in files if p == file]
            if not chosen:
                raise NotFoundError(f"{tag} holds no file {file!r}; its files: {_names(files)}")
        else:
            chosen = [(p, a) for p, a in files if p.endswith(".safetensors")]
            if not chosen:
                raise InvalidError(f"{tag} holds no safetensors file; its files: {_names(files)}")
        parts = [(p, _state_of(a, keep_numpy, f"{tag}: {p}")) for p, a in chosen]
        return parts[0][1] if len(parts) == 1 else _structure.merge(parts, tag)

    def weights(
        self,
        tag: str,
        device: Union[str, int] = "cuda:0",
        memory_budget: int = 1 << 30,
        progress: bool = False,
        held: Optional[str] = None,
    ) -> Iterator[Tuple[str, Any]]:
        """Yields ``(name, tensor)`` for every tensor of the safetensors files of image ``tag``
        (a model folder pushed with ``gstore push DIR``), on ``device``, file by file in the
        image's order: the weights iterator serving engines load models through (vLLM's and
        SGLang's ``load_weights``). The image is loaded once, every chunk checked against its
        hash before the first tensor is yielded; each file's memory is freed as soon as the
        caller holds none of its tensors. ``held``: as for :meth:`load`."""
        files = self._load_files(tag, device, memory_budget, progress, "auto", held)
        files.reverse()
        while files:
            path, blob = files.pop()
            if not path.endswith(".safetensors"):
                continue
            tensors = _state_of(blob, False, f"{tag}: {path}")
            del blob
            while tensors:
                name = next(iter(tensors))
                yield name, tensors.pop(name)

    def load_into(
        self,
        target: Any,
        tag: str,
        memory_budget: int = 1 << 30,
        progress: bool = True,
        strict: bool = True,
        held: Optional[str] = None,
    ) -> Any:
        """Fills ``target`` from image ``tag`` and returns the whole loaded state (for the plain
        values: the step, say). Each tensor is filled where it is: the image is loaded once,
        onto the device holding most of the target's tensor bytes (``"cpu"`` if it has none;
        a GPU through the direct path), and tensors on other devices are copied there (a CUDA
        model's ``AdamW`` keeps its step counters on the CPU).

        ``target`` is a ``torch.nn.Module`` (its tensors filled in place), a state dict, or a
        nested structure shaped like the saved state whose leaves are tensors (filled in
        place), modules, or other objects with ``state_dict`` / ``load_state_dict`` (an
        optimizer, a scheduler, a grad scaler: given their part by ``load_state_dict``, with
        tensors of their own), e.g. ``{"model": model, "optim": opt, "sched": sched}``. Plain
        values in the target are not changed: read them from the returned state. With
        ``strict``, dict keys and list lengths must match at every level, and shapes and
        dtypes always; otherwise what is missing on either side is skipped. ``held``: as for
        :meth:`load`."""
        device, framework = _structure.placement_of(target)
        loaded = self.load(
            tag, device=device, memory_budget=memory_budget, progress=progress, framework=framework, held=held
        )
        _structure.fill(target, loaded, strict)
        return loaded

    def load_file(
        self,
        tag: str,
        device: Union[str, int] = "cpu",
        memory_budget: int = 1 << 30,
        progress: bool = True,
        framework: str = "auto",
        held: Optional[str] = None,
        path: str = FILE_NAME,
    ) -> Any:
        """The raw bytes of the image's file ``path`` on ``device``: a uint8 torch tensor, or
        NumPy array (see :meth:`load` for ``framework`` and ``held``), sharing gstore's memory."""
        files = self._load_files(tag, device, memory_budget, progress, framework, held)
        blob = dict(files).get(path)
        if blob is None:
            raise NotFoundError(f"{tag} holds no file {path!r}; its files: {_names(files)}")
        return blob

    def _load_files(
        self,
        tag: str,
        device: Union[str, int],
        memory_budget: int,
        progress: bool,
        framework: str,
        held: Optional[str],
    ) -> List[Tuple[str, Any]]:
        """Every file of the image as a uint8 array of the framework, in manifest order."""
        kind, index = _layout.parse_device(device)
        framework = _layout.pick_framework(framework, kind)
        if kind == "cpu":
            if held is not None:
                raise InvalidError("held= loads into GPU memory: pass device=\"cuda:N\"")
            files = self._native.load_host(tag, memory_budget, progress)
        else:
            files, phases = self._native.load_cuda(tag, index, memory_budget, progress, held)
            self.last_load = json.loads(phases)
        return [(p, _layout.as_array(blob, framework, index)) for p, blob in files]

    def latest(self, name: str) -> str:
        """The tag of the newest image named ``name`` (tags are ``NAME:VERSION``), by the
        images' creation time as :meth:`list` gives it; images created in the same second go
        by version, numbers in it compared as numbers (``step-1000`` after ``step-999``).
        Raises :class:`NotFoundError` if there is none."""
        if not name or ":" in name:
            raise InvalidError(f"latest({name!r}): give a tag's name, without ':VERSION'")
        rows = [r for r in self.list() if r["tag"].split(":", 1)[0] == name]
        readable = [r for r in rows if r.get("created_unix") is not None]
        if not readable:
            unreadable = "; ".join(f"{r['tag']}: {r['error']}" for r in rows)
            raise NotFoundError(
                f"no image named {name} in {self._native.describe()}" + (f" can be read ({unreadable})" if rows else "")
            )
        return max(readable, key=lambda r: (r["created_unix"], _natural(r["tag"].split(":", 1)[1])))["tag"]

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

    def pin(self, tag: str, pinned: bool = True) -> dict:
        """Pins a tag (``pinned=False`` unpins it): retention never removes a pinned tag or
        its current image. Returns the tag record."""
        return json.loads(self._native.pin(tag, pinned))

    def set_policy(
        self,
        pattern: str,
        keep_last: Optional[int] = None,
        keep_within_s: Optional[int] = None,
        keep_daily: Optional[int] = None,
        keep_weekly: Optional[int] = None,
    ) -> dict:
        """Stores retention rules for the tag name ``pattern``, or for every name starting with
        a prefix (``"run-*"``; ``"*"``: every name), that :meth:`gc` (and ``gstore gc``) then
        applies without being told (``gstore policy set``). Returns every stored policy."""
        return json.loads(self._native.set_policy(pattern, keep_last, keep_within_s, keep_daily, keep_weekly))

    def policies(self) -> dict:
        """The stored retention policies: ``{"format": 1, "policies": {pattern: rules}}``."""
        return json.loads(self._native.policies())

    def remove_policy(self, pattern: str) -> dict:
        """Removes the stored policy of ``pattern`` (:class:`NotFoundError` if none); returns
        what remains."""
        return json.loads(self._native.remove_policy(pattern))

    def gc(
        self,
        keep_last: Optional[int] = None,
        keep_within_s: Optional[int] = None,
        keep_daily: Optional[int] = None,
        keep_weekly: Optional[int] = None,
        prefix: Optional[str] = None,
        dry_run: bool = False,
    ) -> dict:
        """Retention, then one gc pass (``gstore gc``): keeps, per tag name, the newest
        ``keep_last`` images, those set within ``keep_within_s`` seconds, and the newest of
        each of the newest ``keep_daily`` days / ``keep_weekly`` weeks (UTC); with ``prefix``,
        only names starting with it are trimmed. Pinned tags are always kept. With no rule it
        only reclaims what no tag keeps. Returns gc's report."""
        for what, n in (("keep_last", keep_last), ("keep_within_s", keep_within_s),
                        ("keep_daily", keep_daily), ("keep_weekly", keep_weekly)):
            if n is not None and n < 0:
                raise InvalidError(f"gc({what}={n}): give a positive number, or leave it out")
        return json.loads(self._native.gc(keep_last, keep_within_s, keep_daily, keep_weekly, prefix, dry_run))


def _names(files: List[Tuple[str, Any]]) -> str:
    return ", ".join(p for p, _ in files) or "none"


def _natural(text: str) -> List[Tuple[int, Union[int, str]]]:
    """A sort key comparing runs of digits as numbers."""
    return [(0, int(p)) if p.isdigit() else (1, p) for p in re.split(r"(\d+)", text) if p]


def _state_of(blob: Any, keep_numpy: bool, where: str) -> Dict[Any, Any]:
    """The state in one loaded safetensors file: its tensors by name, or the nested state its
    tree describes (arrays and scalars saved from NumPy as NumPy when ``keep_numpy``)."""
    try:
        tensors, metadata = _layout.decode(blob)
        tree = metadata.get(_layout.TREE_KEY)
        if tree is None:
            return tensors

        def leaf(kind: str, name: str) -> Any:
            t = tensors.get(name)
            if t is None:
                raise InvalidError(f"the tree names tensor {name!r}, which the file does not hold")
            if kind == "tensor":
                return t
            if _layout.is_torch(t):
                if not keep_numpy:
                    return t
                t = t.cpu().numpy()
            return t[()] if kind == "npscalar" else t

        return _structure.unflatten(tree, leaf)
    except InvalidError as e:
        raise InvalidError(f"{where}: {e}") from None
