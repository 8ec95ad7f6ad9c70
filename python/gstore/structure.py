"""Nested training state (a model's and an optimizer's state dicts, schedulers, RNG states, the
step) as one safetensors file: the tensors are entries named by their path, the rest of the
structure is JSON in the header's ``__metadata__`` under :data:`~gstore.safetensors_layout.TREE_KEY`.
docs/PYTHON.md gives the layout in full.

A tree node is one of:

* ``null``, ``true`` / ``false``, a JSON string: ``None``, a bool, a str;
* a JSON number: an int when written without ``.``, ``e`` or ``E``, else a float;
* ``{"float": "nan" | "inf" | "-inf"}``: a float JSON cannot spell;
* ``{"dict": [[key, node], ...]}``: a dict in its order; each key a JSON string or integer;
* ``{"list": [node, ...]}``, ``{"tuple": [node, ...]}``;
* ``{"tensor": NAME}`` (a torch tensor), ``{"ndarray": NAME}`` (a NumPy array),
  ``{"npscalar": NAME}`` (a NumPy scalar, stored as a 0-d tensor): the file's entry NAME.
"""

from __future__ import annotations

import json
import math
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

import numpy as np

from ._gstore import InvalidError
from . import safetensors_layout as _layout

#: The version of the tree's JSON this package writes and reads.
TREE_VERSION = 1

_KINDS = ("tensor", "ndarray", "npscalar")


def _where(path: Tuple[Any, ...]) -> str:
    return "state" + "".join(f"[{p!r}]" for p in path)


def is_flat(state: Mapping[Any, Any]) -> bool:
    """Whether ``state`` is a flat dict of tensors (string names to torch tensors or NumPy
    arrays), which is saved as a plain safetensors file without a tree."""
    return all(isinstance(k, str) and _layout.is_tensor(v) for k, v in state.items())


def flatten(state: Mapping[Any, Any]) -> Tuple[List[Tuple[str, Any]], Optional[str]]:
    """The tensors of ``state`` as ``(name, value)`` pairs, and the tree's JSON (None for a flat
    dict of tensors, whose names are its keys)."""
    if not isinstance(state, Mapping):
        raise InvalidError(f"expected a mapping (a state dict), not {type(state).__name__}")
    if is_flat(state):
        return list(state.items()), None
    leaves: List[Tuple[str, Any]] = []
    taken = {"__metadata__"}

    def name_for(path: Tuple[Any, ...]) -> str:
        base = ".".join(str(p) for p in path)
        name, n = base, 2
        while name in taken:
            name, n = f"{base}#{n}", n + 1
        taken.add(name)
        return name

    def walk(value: Any, path: Tuple[Any, ...]) -> Any:
        if _layout.is_tensor(value):
            name = name_for(path)
            leaves.append((name, value))
            return {"tensor" if _layout.is_torch(value) else "ndarray": name}
        if isinstance(value, np.generic):
            name = name_for(path)
            leaves.append((name, np.asarray(value)))
            return {"npscalar": name}
        if value is None or isinstance(value, (bool, str)):
            return value
        if isinstance(value, int):
            return int(value)
        if isinstance(value, float):
            if math.isfinite(value):
                return float(value)
            return {"float": "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")}
        if isinstance(value, Mapping):
            pairs = []
            for k, v in value.items():
                if isinstance(k, bool) or not isinstance(k, (str, int)):
                    raise InvalidError(f"{_where(path)}: key {k!r} is a {type(k).__name__}; keys must be str or int")
                pairs.append([k if isinstance(k, str) else int(k), walk(v, path + (k,))])
            return {"dict": pairs}
        if isinstance(value, (list, tuple)):
            return {"tuple" if isinstance(value, tuple) else "list": [walk(v, path + (i,)) for i, v in enumerate(value)]}
        raise InvalidError(
            f"{_where(path)} is a {type(value).__module__}.{type(value).__qualname__}, which cannot be saved: "
            "tensors, NumPy arrays and scalars, dicts, lists, tuples, int, float, str, bool and None can"
        )

    root = walk(state, ())
    return leaves, json.dumps({"version": TREE_VERSION, "root": root}, separators=(",", ":"), allow_nan=False)


def unflatten(tree: str, leaf: Callable[[str, str], Any]) -> Any:
    """The state the tree's JSON describes; ``leaf(kind, name)`` gives each tensor (``kind``
    ``"tensor"``, ``"ndarray"`` or ``"npscalar"``)."""
    try:
        doc = json.loads(tree)
    except ValueError as e:
        raise InvalidError(f"the file's {_layout.TREE_KEY} is not JSON ({e})") from None
    if not isinstance(doc, dict) or doc.get("version") != TREE_VERSION or "root" not in doc:
        version = doc.get("version") if isinstance(doc, dict) else None
        raise InvalidError(f"the file's {_layout.TREE_KEY} is of version {version!r}; this gstore reads {TREE_VERSION}")

    def bad(node: Any) -> InvalidError:
        return InvalidError(f"the file's {_layout.TREE_KEY} holds an unknown node {json.dumps(node)[:200]}")

    def build(node: Any) -> Any:
        if node is None or isinstance(node, (bool, str, int, float)):
            return node
        if not isinstance(node, dict) or len(node) != 1:
            raise bad(node)
        ((kind, body),) = node.items()
        if kind == "dict" and isinstance(body, list):
            out = {}
            for pair in body:
                if not (isinstance(pair, list) and len(pair) == 2 and isinstance(pair[0], (str, int))):
                    raise bad(node)
                if isinstance(pair[0], bool):
                    raise bad(node)
                out[pair[0]] = build(pair[1])
            return out
        if kind in ("list", "tuple") and isinstance(body, list):
            items = [build(n) for n in body]
            return items if kind == "list" else tuple(items)
        if kind in _KINDS and isinstance(body, str):
            return leaf(kind, body)
        if kind == "float" and body in ("nan", "inf", "-inf"):
            return float(body)
        raise bad(node)

    return build(doc["root"])


def tensors_of(target: Any) -> List[Any]:
    """Every tensor :func:`fill` would write in ``target`` (modules and other objects with a
    ``state_dict`` included)."""
    found: List[Any] = []

    def walk(value: Any) -> None:
        if _layout.is_tensor(value):
            found.append(value)
        elif _has_state(value):
            walk(value.state_dict())
        elif isinstance(value, Mapping):
            for v in value.values():
                walk(v)
        elif isinstance(value, (list, tuple)):
            for v in value:
                walk(v)

    walk(target)
    return found


def bytes_by_device(tensors: List[Any]) -> Dict[str, int]:
    """The bytes of ``tensors`` on each device they are on (``"cpu"``, ``"cuda:N"``, ...;
    NumPy arrays are on ``"cpu"``), in the order the devices first appear."""
    held: Dict[str, int] = {}
    for v in tensors:
        device = str(v.device) if _layout.is_torch(v) else "cpu"
        held[device] = held.get(device, 0) + v.nbytes
    return held


def placement_of(target: Any) -> Tuple[str, str]:
    """The device to load the image for ``target`` onto (``"cpu"`` or ``"cuda:N"``) and the
    framework to load it with (``"numpy"`` when there is nothing of torch's in it, else
    ``"auto"``, which keeps arrays saved from NumPy as NumPy).

    The tensors of ``target`` may be on several devices (a CUDA model, and its optimizer's
    step counters, CPU tensors): the image is loaded once, onto the device holding most of
    their bytes (``"cpu"`` when it has none), and :func:`fill` copies each tensor to the device
    of the one it fills."""
    found = tensors_of(target)
    held = bytes_by_device(found)
    device = max(held, key=held.__getitem__) if held else "cpu"
    torchy = any(_layout.is_torch(v) for v in found) or _any_stateful(target)
    return ("cuda:0" if device == "cuda" else device), ("auto" if torchy else "numpy")


def _has_state(value: Any) -> bool:
    return callable(getattr(value, "state_dict", None)) and callable(getattr(value, "load_state_dict", None))


def _any_stateful(value: Any) -> bool:
    if _has_state(value):
        return True
    if isinstance(value, Mapping):
        return any(_any_stateful(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(_any_stateful(v) for v in value)
    return False


def _owned(value: Any, held: Any) -> Any:
    """``value`` with every tensor copied out of the loaded buffer (so the buffer can go): onto
    the device of the torch tensor at the same place in ``held`` (what the object held before
    the load: an optimizer's CPU step counters beside its CUDA moments), else where it is."""
    if _layout.is_torch(value) and _layout.is_tensor(value):
        if _layout.is_torch(held) and _layout.is_tensor(held):
            return value.to(held.device, copy=True)
        return value.clone()
    if isinstance(value, np.ndarray):
        return value.copy()
    if isinstance(value, dict):
        return {k: _owned(v, _member(held, k)) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        items = [_owned(v, _member(held, i)) for i, v in enumerate(value)]
        return items if isinstance(value, list) else tuple(items)
    return value


def _member(container: Any, key: Any) -> Any:
    """``container[key]`` where ``container`` is a mapping holding ``key`` or a list or tuple
    that long, else None."""
    if isinstance(container, Mapping):
        return container.get(key)
    if isinstance(container, (list, tuple)) and isinstance(key, int) and 0 <= key < len(container):
        return container[key]
    return None


def fill(target: Any, loaded: Any, strict: bool, path: Tuple[Any, ...] = ()) -> None:
    """Writes ``loaded`` into ``target``, each tensor on the device of the one it fills
    (``loaded`` may be elsewhere): tensors in place; a ``torch.nn.Module`` through its state
    dict's tensors (in place); any other object with ``state_dict`` and ``load_state_dict``
    (an optimizer, a scheduler, a grad scaler) by ``load_state_dict`` with tensors of its own,
    each on the device of the tensor it held in its place (see :func:`_owned`); dicts by key
    and lists / tuples by position. Plain values in the target (ints, floats, ...) are left as
    they are. With ``strict``, keys and lengths must match."""
    torch = _layout.torch_or_none()
    if torch is not None and isinstance(target, torch.nn.Module):
        fill(target.state_dict(), loaded, strict, path)
    elif _has_state(target):
        target.load_state_dict(_owned(loaded, target.state_dict()))
    elif _layout.is_tensor(target):
        _copy_tensor(target, loaded, path)
    elif isinstance(target, Mapping):
        if not isinstance(loaded, Mapping):
            raise InvalidError(f"{_where(path)}: the target is a dict, the image has a {type(loaded).__name__}")
        if strict:
            missing = [k for k in target if k not in loaded]
            extra = [k for k in loaded if k not in target]
            if missing or extra:
                raise InvalidError(
                    f"{_where(path)}: names differ: missing from the image {missing[:5]}, not in the target {extra[:5]}"
                )
        for k, dst in target.items():
            if k in loaded:
                fill(dst, loaded[k], strict, path + (k,))
    elif isinstance(target, (list, tuple)):
        if not isinstance(loaded, (list, tuple)):
            raise InvalidError(f"{_where(path)}: the target is a {type(target).__name__}, the image has a {type(loaded).__name__}")
        if strict and len(target) != len(loaded):
            raise InvalidError(f"{_where(path)}: the target has {len(target)} items, the image {len(loaded)}")
        for i, (dst, src) in enumerate(zip(target, loaded)):
            fill(dst, src, strict, path + (i,))


def _copy_tensor(dst: Any, src: Any, path: Tuple[Any, ...]) -> None:
    if not _layout.is_tensor(src):
        raise InvalidError(f"{_where(path)}: the target is a tensor, the image has a {type(src).__name__}")
    if tuple(dst.shape) != tuple(src.shape) or _layout.dtype_code(dst) != _layout.dtype_code(src):
        raise InvalidError(
            f"tensor {'.'.join(map(str, path))!r}: the image has {src.dtype} {tuple(src.shape)}, "
            f"the target {dst.dtype} {tuple(dst.shape)}"
        )
    if _layout.is_torch(dst):
        torch = _layout.torch_or_none()
        with torch.no_grad():
            dst.copy_(src if _layout.is_torch(src) else torch.from_numpy(src))
    else:
        np.copyto(dst, src.cpu().numpy() if _layout.is_torch(src) else src)


def merge(parts: List[Tuple[str, Dict[Any, Any]]], tag: str) -> Dict[Any, Any]:
    """The states of several files of one image as one dict; a name in two files is an error
    naming both."""
    out: Dict[Any, Any] = {}
    origin: Dict[Any, str] = {}
    for path, state in parts:
        for k, v in state.items():
            if k in origin:
                raise InvalidError(f"{tag}: {k!r} is in both {origin[k]} and {path}: load the files apart (load_file)")
            out[k], origin[k] = v, path
    return out
