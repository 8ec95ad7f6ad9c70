"""Serving processes whose weights stay out of their checkpoints: one call, and ``gstore
checkpoint`` leaves the weights out of the process image, because the store already holds
them as the model image they came from; ``gstore restore --run`` has the process load them
back from that image, straight into GPU memory, while the rest of it is filled lazily.

    model = build_model().to("cuda")
    store = gstore.Store("/var/lib/gstore")
    store.load_into(model, "qwen3-8b:v1")              # or any loader of the same weights
    gstore.serving.weights_from(model, "qwen3-8b:v1", store=store.location)
    serve_forever(model)                               # unchanged

A serving engine that loads through its model's ``load_weights`` (fused parameters) passes it:
``weights_from(model, "qwen3-8b:v1", store=..., load=model.load_weights)``.

How it goes (docs/ARCHITECTURE.md, "Weights out of the image"): ``gstore checkpoint``
finds the registration under ``$GSTORE_COOP_DIR`` (default ``/dev/shm/gstore-coop``), writes
``ctl`` (``{"action": "release", "controller": PID}``) and sends the registered signal. The
handler runs on the process's main thread, between two steps of its loop: it waits for the
GPUs, frees the weights' memory (their storages resized to nothing, the allocator's cache
emptied), writes ``state`` = ``released`` and waits. The checkpoint then takes the process
without its weights. The handler refills them, and only then lets the loop go on, when ``ctl``
says ``refill`` (after a ``--leave-running`` dump, or on the restored process, which finds
the request written before it ran), or when the controller that asked is gone. Every chunk is
checked against its hash on the way in; a refill that fails ends the process (exit 70,
``state`` saying why) rather than let it run on missing weights.

The module may live on a GPU (the driver's checkpoint then copies none of its weights) or in
host memory (CRIU then dumps none of it). The refill opens the store through index slot
``4096 + LOCAL_RANK`` (see :class:`Store`), so that it never waits for the ``gstore`` command
that asked for it, which holds the default index.

Weights changed since they were registered (a fine-tune step, a parameter replaced) are no
longer the image's: the handler then frees nothing and answers ``changed: WHY``, the checkpoint
stores them in the process image as for any process, and the registration ends (its file is
removed). Each tensor's version counter and a checksum of its bytes (taken when it registered)
tell; a write that neither sees (through ``.data`` of a tensor made in inference mode, or a
raw pointer) is the process's to avoid. Nor may it keep raw pointers to the weights' memory (a
captured CUDA graph): after a refill they live at new addresses, with the image's bytes.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import threading
import time
import traceback
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

from . import CorruptError, InvalidError, NotFoundError, Store, _state_of
from . import structure as _structure

__all__ = ["weights_from", "Registration", "COOP_DIR"]

COOP_DIR = os.environ.get("GSTORE_COOP_DIR", "/dev/shm/gstore-coop")
"""Where cooperating processes register, one directory per pid (``GSTORE_COOP_DIR``); the
controller (``gstore checkpoint``, ``gstore restore``) looks in the same place."""

FAILED_EXIT = 70
"""The exit status of a process whose weights could not be refilled."""

_POLL_S = 0.001

INDEX_SLOT = 4096
"""The first index slot refills open the store through (plus ``LOCAL_RANK``)."""


class Registration:
    """The weights of one module that checkpoints leave out (see :func:`weights_from`)."""

    def __init__(
        self,
        module: Any,
        image: str,
        store: Optional[str],
        signum: int,
        device: str,
        load: Optional[Callable[[Iterator[Tuple[str, Any]]], Any]],
    ) -> None:
        self.module = module
        self.load = load
        self.store = store
        self.device = device
        self.signum = signum
        info = _store(store).show(image)
        self.image = info["manifest"]
        """The model image's manifest id: what the refill loads, whatever its tag says later."""
        self.tag = image
        self.tensors = _weights_of(module, device)
        self._storages = _storages_of(self.tensors)
        self._sums = _checksums(self.tensors)
        self._versions = _versions(self.tensors)
        self.bytes = sum(n for _, n in self._storages)
        self.dir = os.path.join(COOP_DIR, str(os.getpid()))
        self.last: Dict[str, float] = {}
        """Seconds the last release (``release_s``) and refill (``refill_s``) took."""

    def record(self) -> dict:
        """What the registration file (``weights.json``) holds; the checkpoint stores it in the
        image (docs/FORMAT.md, ``released_weights``)."""
        return {
            "version": 1,
            "pid": os.getpid(),
            "signal": self.signum,
            "store": self.store,
            "image": self.image,
            "tag": self.tag,
            "tensors": len(self.tensors),
            "bytes": self.bytes,
            "device": self.device,
            "cmdline": _cmdline(),
        }

    def _put(self, name: str, text: str) -> None:
        tmp = os.path.join(self.dir, f".{name}.tmp")
        with open(tmp, "w") as f:
            f.write(text)
        os.rename(tmp, os.path.join(self.dir, name))

    def _ctl(self) -> dict:
        try:
            with open(os.path.join(self.dir, "ctl")) as f:
                return json.load(f)
        except (OSError, ValueError):
            return {}

    def _on_signal(self, signum: int, frame: Any) -> None:
        ctl_path = os.path.join(self.dir, "ctl")
        asked = _version(ctl_path)
        ctl = self._ctl()
        if ctl.get("action") != "release":
            return
        changed = self._changed()
        if changed is not None:
            # Not the image's bytes any more: the checkpoint stores them, and this process
            # leaves no weights out from now on.
            self._end()
            self._put("state", f"changed: {changed}")
            print(f"gstore.serving: {changed}; this process's weights are stored in its images from now on", flush=True)
            return
        try:
            self._release()
        except Exception as e:  # the weights are put back: the checkpoint goes no further
            self._refill_or_exit({})
            self._put("state", f"failed release: {type(e).__name__}: {e}")
            return
        self._put("state", "released")
        # The process may be frozen and dumped at any moment now: it holds no file open
        # (CRIU would record it, and refuse to restore once ctl has changed), so it watches
        # ctl by stat alone until a controller writes a new one.
        controller = ctl.get("controller")
        while True:
            now = _version(ctl_path)
            if now != asked:
                asked = now
                ctl = self._ctl()
                if ctl.get("action") == "refill":
                    break
            elif not _alive(controller):
                ctl = {}
                break
            time.sleep(_POLL_S)
        self._refill_or_exit(ctl)
        self._put("state", "refilled")

    def _release(self) -> None:
        torch = _torch()
        start = time.perf_counter()
        _synchronize(torch, self.tensors)
        for storage, _ in self._storages:
            storage.resize_(0)
        if self.device.startswith("cuda"):
            torch.cuda.empty_cache()
        self.last["release_s"] = time.perf_counter() - start

    def _refill_or_exit(self, ctl: dict) -> None:
        try:
            self._refill(ctl)
        except Exception as e:
            kind = "corrupt" if isinstance(e, CorruptError) else "not-found" if isinstance(e, NotFoundError) else "failed"
            self._put("state", f"failed {kind}: {type(e).__name__}: {e}")
            traceback.print_exc()
            os._exit(FAILED_EXIT)

    def _refill(self, ctl: dict) -> None:
        torch = _torch()
        start = time.perf_counter()
        for storage, nbytes in self._storages:
            if storage.nbytes() != nbytes:
                storage.resize_(nbytes)
        offered = self._prefetched(ctl)
        if offered is not None:
            try:
                with _Mapped(offered) as files:
                    self._apply(t for path, blob in files for t in _state_of(blob, False, f"{self.tag}: {path}").items())
                    _synchronize(torch, self.tensors)
                self.last["source"] = "prefetched"
            except Exception as e:  # the store has the same bytes
                print(f"gstore.serving: the prefetched weights could not be used ({e}); loading from the store", flush=True)
                offered = None
        if offered is None:
            self._apply(_store(self.store).weights(self.image, device=self.device))
            self.last["source"] = "store"
        _synchronize(torch, self.tensors)
        self._versions = _versions(self.tensors)  # the refill's own writes
        self.last["refill_s"] = time.perf_counter() - start

    def _changed(self) -> Optional[str]:
        """Why the registered weights may no longer be the image's bytes: a tensor no longer
        the module's (replaced), or one written in place since it registered or was last
        refilled; ``None`` when they are unchanged."""
        now = self.module.state_dict()
        for name, t in self.tensors.items():
            cur = now.get(name)
            if cur is None or cur.untyped_storage().data_ptr() != t.untyped_storage().data_ptr():
                return f"{name} is no longer the registered tensor"
        for (name, t), before in zip(self.tensors.items(), self._versions):
            if before is not None and _tensor_version(t) != before:
                return f"{name} was written in place"
        for name, before, after in zip(self.tensors, self._sums, _checksums(self.tensors)):
            if before != after:
                return f"{name}'s bytes changed"
        return None

    def _end(self) -> None:
        """Ends the registration: its file removed, so no controller asks this process again."""
        with _lock:
            if self in _registrations:
                _registrations.remove(self)
        try:
            os.remove(os.path.join(self.dir, "weights.json"))
        except FileNotFoundError:
            pass

    def _apply(self, loaded: Iterator[Tuple[str, Any]]) -> None:
        """Puts the image's ``(name, tensor)`` pairs into the module: through the engine's own
        loader when one was registered, else each into the registered tensor of its name, all
        of which must be filled."""
        if self.load is not None:
            self.load(loaded)
            return
        left = dict(self.tensors)
        self._fill(left, loaded)
        if left:
            raise NotFoundError(f"{self.tag} (image {self.image}) holds no tensor named {sorted(left)[:5]}")

    def _fill(self, left: Dict[str, Any], loaded: Any) -> None:
        """Copies each ``(name, tensor)`` of ``loaded`` into the registered tensor of that name
        still ``left`` (which it then is not)."""
        for name, src in loaded:
            dst = left.pop(name, None)
            if dst is None:
                continue
            if dst.shape != src.shape or dst.dtype != src.dtype:
                raise InvalidError(
                    f"{self.tag}: {name} is {src.dtype} {tuple(src.shape)} in the image, "
                    f"{dst.dtype} {tuple(dst.shape)} in the process"
                )
            dst.copy_(src)

    def _prefetched(self, ctl: dict) -> Optional[dict]:
        """What the controller published of the weights in its GPU memory (``prefetched.json``),
        when ``ctl`` says it will; ``None``: load from the store."""
        if not ctl.get("prefetch"):
            return None
        path = os.path.join(self.dir, "prefetched.json")
        while not os.path.exists(path):
            if not _alive(ctl.get("controller")):
                return None
            time.sleep(_POLL_S)
        with open(path) as f:
            offered = json.load(f)
        return offered if "files" in offered else None


_registrations: List[Registration] = []
_lock = threading.Lock()


def weights_from(
    module: Any,
    image: str,
    store: Optional[str] = None,
    signum: int = signal.SIGUSR2,
    load: Optional[Callable[[Iterator[Tuple[str, Any]]], Any]] = None,
) -> Registration:
    """Leaves ``module``'s weights (its state dict's tensors) out of every checkpoint
    of this process, because they are the tensors of the stored image ``image`` (a model
    folder pushed with ``gstore push DIR``, or saved with :meth:`Store.save`) in store
    ``store`` (as :class:`Store` takes it). The image is pinned by its manifest id now; a
    checkpoint keeps it from ``gstore gc`` for as long as the process image is kept.

    Call it once the weights are loaded, from the main thread; ``signum`` (default
    ``SIGUSR2``) becomes this module's: ``gstore checkpoint`` sends it. ``load``: how the
    module takes the image's ``(name, tensor)`` pairs back, for a module whose parameters are
    not the image's tensors one for one (a serving engine's fused ones: pass its own
    ``model.load_weights``, which it loaded them through); by default each tensor is copied
    into the state-dict tensor of its name, and every one must be there. Raises
    :class:`InvalidError` when a tensor cannot be freed and refilled where it is (memory not
    torch's own, e.g. tensors that share gstore's load buffers: copy them into the module's
    parameters, as :meth:`Store.load_into` does)."""
    if threading.current_thread() is not threading.main_thread():
        raise InvalidError("gstore.serving.weights_from must be called from the main thread (it sets a signal handler)")
    placement, _ = _structure.placement_of(module)
    reg = Registration(module, image, store, int(signum), placement, load)
    with _lock:
        if _registrations:
            raise InvalidError("this process has registered its weights already (one module per process)")
        os.makedirs(reg.dir, exist_ok=True)
        for stale in ("ctl", "state"):
            try:
                os.remove(os.path.join(reg.dir, stale))
            except FileNotFoundError:
                pass
        reg._put("weights.json", json.dumps(reg.record()))
        signal.signal(signum, reg._on_signal)
        _registrations.append(reg)
    return reg


def _weights_of(module: Any, device: str) -> Dict[str, Any]:
    """The module's state-dict tensors on ``device``'s kind (a GPU, or the host), by name
    (tied weights under each name)."""
    on_gpu = device.startswith("cuda")
    found = {name: t for name, t in module.state_dict().items() if getattr(t, "is_cuda", None) == on_gpu}
    if not found:
        raise InvalidError("the module holds no tensors: there is nothing to leave out")
    return found


def _tensor_version(t: Any) -> Optional[int]:
    """``t``'s version counter (bumped by every in-place write), or ``None`` for a tensor made
    in inference mode, which keeps none."""
    try:
        return int(t._version)
    except RuntimeError:
        return None


def _versions(tensors: Dict[str, Any]) -> List[Optional[int]]:
    return [_tensor_version(t) for t in tensors.values()]


def _checksums(tensors: Dict[str, Any]) -> List[int]:
    """A checksum of each tensor's bytes: the sum of its 8-byte words (wrapping), or of its
    bytes where it does not divide into aligned words; computed where the tensor lives, read
    back once."""
    torch = _torch()
    sums = []
    for t in tensors.values():
        b = t.detach().contiguous().reshape(-1).view(torch.uint8)
        if b.numel() % 8 == 0 and b.data_ptr() % 8 == 0:
            sums.append(b.view(torch.int64).sum())
        else:
            sums.append(b.sum(dtype=torch.int64))
    if not sums:
        return []
    by_device: Dict[Any, List[int]] = {}
    for i, s in enumerate(sums):
        by_device.setdefault(s.device, []).append(i)
    out = [0] * len(sums)
    for idx in by_device.values():
        for i, v in zip(idx, torch.stack([sums[i] for i in idx]).tolist()):
            out[i] = int(v)
    return out


def _storages_of(tensors: Dict[str, Any]) -> List[Tuple[Any, int]]:
    """Each distinct storage under ``tensors`` with its size in bytes; refused when one
    cannot be resized (memory that torch does not own)."""
    seen: Dict[int, Tuple[Any, int]] = {}
    for name, t in tensors.items():
        storage = t.untyped_storage()
        if storage.data_ptr() in seen:
            continue
        if not storage.resizable():
            raise InvalidError(
                f"{name}: its memory is not torch's own and cannot be freed and refilled in place; "
                "copy the weights into the module's parameters (Store.load_into does)"
            )
        seen[storage.data_ptr()] = (storage, storage.nbytes())
    return list(seen.values())


class _Mapped:
    """The files of a prefetched image, mapped from the controller's GPU memory
    (``cuIpcOpenMemHandle``) as uint8 tensors, unmapped on exit; each was checked against its
    chunk ids as the controller loaded it."""

    def __init__(self, offered: dict) -> None:
        self.device = int(offered["device"])
        self.files = offered["files"]
        self.ptrs: List[int] = []

    def __enter__(self) -> List[Tuple[str, Any]]:
        torch = _torch()
        cu = _libcuda()
        torch.cuda.set_device(self.device)
        torch.cuda.synchronize(self.device)  # the primary context current on this thread
        out = []
        for f in self.files:
            if not f["path"].endswith(".safetensors") or int(f["len"]) == 0:
                continue
            handle = _IpcHandle.from_buffer_copy(bytes.fromhex(f["handle"]))
            ptr = ctypes.c_uint64()
            code = cu.cuIpcOpenMemHandle_v2(ctypes.byref(ptr), handle, 1)  # lazy peer access
            if code != 0:
                raise RuntimeError(f"cuIpcOpenMemHandle: CUDA error {code}")
            self.ptrs.append(ptr.value)
            out.append((f["path"], torch.as_tensor(_DeviceBytes(ptr.value, int(f["len"])), device=f"cuda:{self.device}")))
        return out

    def __exit__(self, *exc: Any) -> None:
        cu = _libcuda()
        for ptr in self.ptrs:
            cu.cuIpcCloseMemHandle(ptr)


class _DeviceBytes:
    """``len`` bytes of device memory at ``ptr``, for ``torch.as_tensor`` (no copy)."""

    def __init__(self, ptr: int, length: int) -> None:
        self.__cuda_array_interface__ = {"shape": (length,), "typestr": "|u1", "data": (ptr, False), "version": 3}


def _libcuda() -> Any:
    cu = ctypes.CDLL("libcuda.so.1")
    cu.cuIpcOpenMemHandle_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), _IpcHandle, ctypes.c_uint]
    cu.cuIpcCloseMemHandle.argtypes = [ctypes.c_uint64]
    return cu


class _IpcHandle(ctypes.Structure):
    """A ``CUipcMemHandle``: 64 opaque bytes."""

    _fields_ = [("reserved", ctypes.c_ubyte * 64)]


def _synchronize(torch: Any, tensors: Dict[str, Any]) -> None:
    for device in sorted({t.device.index or 0 for t in tensors.values() if t.is_cuda}):
        torch.cuda.synchronize(device)


def _store(location: Optional[str]) -> Store:
    return Store(location, index_slot=INDEX_SLOT + int(os.environ.get("LOCAL_RANK", "0")))


def _cmdline() -> Optional[str]:
    """This process's command line, its arguments joined by spaces, as the controller reads
    it from ``/proc/PID/cmdline`` (a registration is this process's only while it matches)."""
    try:
        with open("/proc/self/cmdline", "rb") as f:
            return f.read().decode("utf-8", "replace").replace("\0", " ").rstrip()
    except OSError:
        return None


def _version(path: str) -> Optional[Tuple[int, int, int]]:
    """Which file ``path`` names now (inode, change time, size), by stat: no file is opened."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size)


def _alive(pid: Any) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _torch() -> Any:
    import torch

    return torch
