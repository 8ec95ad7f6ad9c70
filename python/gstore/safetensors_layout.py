"""The safetensors layout gstore saves state dicts in, and the way back to tensors.

A safetensors file is an 8-byte little-endian header length, a JSON header (dtype, shape and
``data_offsets`` of each tensor, plus ``__metadata__``), then the tensors' bytes back to back.
gstore writes the tensors in the order safetensors itself uses (larger element sizes first,
then by name), so every tensor starts at a multiple of its element size, and pads the header
with spaces so the data starts on a page: tensors can be viewed in place, and the same tensors
give the same bytes in every save (fine-tunes deduplicate against their base).
"""

from __future__ import annotations

import json
import struct
from typing import Any, Dict, List, Mapping, NamedTuple, Optional, Tuple

import numpy as np

from . import _gstore
from ._gstore import InvalidError

#: The tensors' bytes start at a multiple of this (the header is padded with spaces).
DATA_ALIGN = 4096

#: The ``__metadata__`` key of the structure of a nested state (docs/PYTHON.md); the caller's
#: ``meta`` may not use it.
TREE_KEY = "gstore.tree"

# safetensors dtype name -> (element size, numpy dtype string or None, torch dtype name)
_DTYPES: Dict[str, Tuple[int, Optional[str], str]] = {
    "F64": (8, "<f8", "float64"),
    "I64": (8, "<i8", "int64"),
    "U64": (8, "<u8", "uint64"),
    "F32": (4, "<f4", "float32"),
    "I32": (4, "<i4", "int32"),
    "U32": (4, "<u4", "uint32"),
    "F16": (2, "<f2", "float16"),
    "BF16": (2, None, "bfloat16"),
    "I16": (2, "<i2", "int16"),
    "U16": (2, "<u2", "uint16"),
    "F8_E4M3": (1, None, "float8_e4m3fn"),
    "F8_E5M2": (1, None, "float8_e5m2"),
    "I8": (1, "|i1", "int8"),
    "U8": (1, "|u1", "uint8"),
    "BOOL": (1, "|b1", "bool"),
}
_FROM_NUMPY = {np.dtype(v[1]).str: k for k, v in _DTYPES.items() if v[1] is not None}
_FROM_TORCH = {v[2]: k for k, v in _DTYPES.items()}


def torch_or_none():
    """The torch module, or None where torch is not installed."""
    try:
        import torch
    except ImportError:
        return None
    return torch


def is_torch(value: Any) -> bool:
    """Whether ``value`` is one of torch's objects (a tensor, a device, ...)."""
    return type(value).__module__.split(".")[0] == "torch"


class Entry(NamedTuple):
    """One tensor as the file holds it: its name, the value (a detached torch tensor or a
    little-endian NumPy array), safetensors dtype, shape and size in bytes."""

    name: str
    value: Any
    dtype: str
    shape: List[int]
    nbytes: int


def is_tensor(value: Any) -> bool:
    """Whether ``value`` is saved as a tensor: a torch tensor or a NumPy array (not a NumPy
    scalar)."""
    if isinstance(value, np.ndarray):
        return True
    return is_torch(value) and torch_or_none().is_tensor(value)


def is_device_tensor(value: Any) -> bool:
    """Whether ``value`` is a torch tensor outside host memory."""
    return is_torch(value) and value.device.type != "cpu"


def dtype_code(value: Any) -> Optional[str]:
    """The safetensors dtype of a torch tensor or NumPy array (None if it has none)."""
    if is_torch(value):
        return _FROM_TORCH.get(str(value.dtype).removeprefix("torch."))
    return _FROM_NUMPY.get(value.dtype.newbyteorder("<").str)


def describe(name: str, value: Any) -> Entry:
    """``value`` (a torch tensor anywhere, or a NumPy array) as an :class:`Entry`, without
    copying it (a big-endian array is converted)."""
    if is_torch(value):
        t = value.detach()
        dtype = dtype_code(t)
        if dtype is None:
            raise InvalidError(f"tensor {name!r}: dtype {t.dtype} has no safetensors equivalent")
        return Entry(name, t, dtype, list(t.shape), t.numel() * t.element_size())
    a = np.asarray(value)
    if a.dtype.byteorder == ">":
        a = a.astype(a.dtype.newbyteorder("<"))
    dtype = _FROM_NUMPY.get(a.dtype.str)
    if dtype is None:
        raise InvalidError(f"tensor {name!r}: dtype {a.dtype} has no safetensors equivalent")
    return Entry(name, a, dtype, list(a.shape), a.nbytes)


def host_bytes(entry: Entry) -> np.ndarray:
    """The bytes of a tensor as a 1-D uint8 NumPy array, sharing its memory where it is
    contiguous host memory (a tensor on a GPU is copied to the host)."""
    value = entry.value
    if is_torch(value):
        torch = torch_or_none()
        t = value if value.device.type == "cpu" else value.cpu()
        return t.contiguous().reshape(-1).view(torch.uint8).numpy()
    return np.ascontiguousarray(value).reshape(-1).view(np.uint8)


def file_order(entries: List[Entry]) -> List[Entry]:
    """``entries`` in the order the file holds them: larger element sizes first, then by name
    (safetensors' own order), so every tensor starts at a multiple of its element size."""
    return sorted(entries, key=lambda e: (-_DTYPES[e.dtype][0], e.name))


def check_meta(meta: Optional[Mapping[str, str]]) -> Dict[str, str]:
    """The caller's ``meta`` checked: strings to strings, not :data:`TREE_KEY`."""
    if not meta:
        return {}
    for k, v in meta.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise InvalidError(f"meta must map strings to strings; not so for {k!r}")
        if k == TREE_KEY:
            raise InvalidError(f"meta key {k!r} is gstore's own (the structure of a nested state)")
    return dict(meta)


def encode_header(entries: List[Entry], metadata: Mapping[str, str]) -> bytes:
    """The file's header (length prefix included, padded with spaces so the data starts on a
    page) for ``entries`` in file order and the ``__metadata__`` strings."""
    header: Dict[str, Any] = {}
    if metadata:
        header["__metadata__"] = dict(metadata)
    offset = 0
    for e in entries:
        if e.name == "__metadata__":
            raise InvalidError("'__metadata__' is reserved by the safetensors format")
        header[e.name] = {"dtype": e.dtype, "shape": e.shape, "data_offsets": [offset, offset + e.nbytes]}
        offset += e.nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    padded = -(-(8 + len(text)) // DATA_ALIGN) * DATA_ALIGN - 8
    text += b" " * (padded - len(text))
    return struct.pack("<Q", len(text)) + text


def parse_device(device: Any) -> Tuple[str, int]:
    """``("cpu", 0)`` or ``("cuda", N)`` for ``"cpu"``, ``"cuda"``, ``"cuda:N"``, ``N`` or a
    ``torch.device``."""
    if isinstance(device, int):
        return "cuda", device
    text = str(device)
    if text in ("cpu", "host"):
        return "cpu", 0
    if text == "cuda":
        return "cuda", 0
    if text.startswith("cuda:") and text[5:].isdigit():
        return "cuda", int(text[5:])
    raise InvalidError(f"device {device!r}: expected 'cpu', 'cuda' or 'cuda:N'")


def pick_framework(framework: str, kind: str) -> str:
    """``"torch"`` or ``"numpy"`` for a load onto ``kind`` (``"cpu"`` or ``"cuda"``)."""
    if framework not in ("auto", "torch", "numpy"):
        raise InvalidError(f"framework {framework!r}: expected 'auto', 'torch' or 'numpy'")
    if framework == "auto":
        framework = "torch" if torch_or_none() is not None else "numpy"
    if framework == "numpy" and kind != "cpu":
        raise InvalidError("NumPy arrays live in host memory: load onto a GPU with framework='torch'")
    if framework == "torch" and torch_or_none() is None:
        raise InvalidError("framework='torch' needs torch installed")
    return framework


def as_array(blob: Any, framework: str, index: int) -> Any:
    """The loaded file as a 1-D uint8 array of ``framework`` sharing its memory (host memory
    for NumPy; host or GPU ``index`` for torch)."""
    if framework == "numpy":
        return np.asarray(blob)
    torch = torch_or_none()
    if isinstance(blob, _gstore.HostFile):
        return torch.from_numpy(np.asarray(blob))
    return torch.as_tensor(blob, device=f"cuda:{index}")


def _header(blob: Any) -> Tuple[dict, int]:
    def host_bytes(lo: int, hi: int) -> bytes:
        part = blob[lo:hi]
        if hasattr(part, "cpu"):
            part = part.cpu().numpy()
        return bytes(part)

    if len(blob) < 8:
        raise InvalidError("not a safetensors file: shorter than its header length")
    (n,) = struct.unpack("<Q", host_bytes(0, 8))
    if n > len(blob) - 8:
        raise InvalidError(f"not a safetensors file: a {n}-byte header in {len(blob)} bytes")
    try:
        return json.loads(host_bytes(8, 8 + n)), 8 + n
    except ValueError as e:
        raise InvalidError(f"not a safetensors file: its header is not JSON ({e})") from None


def decode(blob: Any) -> Tuple[Dict[str, Any], Dict[str, str]]:
    """Views of every tensor in a loaded safetensors file (no copies), and its
    ``__metadata__``."""
    header, start = _header(blob)
    data = blob[start:]
    torch = torch_or_none() if is_torch(blob) else None
    out: Dict[str, Any] = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype, shape, (lo, hi) = info["dtype"], info["shape"], info["data_offsets"]
        if dtype not in _DTYPES or not 0 <= lo <= hi <= len(data):
            raise InvalidError(f"tensor {name!r}: dtype {dtype} or offsets {lo}..{hi} unusable")
        size, np_dtype, torch_dtype = _DTYPES[dtype]
        count = int(np.prod(shape, dtype=np.int64))
        if count * size != hi - lo:
            raise InvalidError(f"tensor {name!r}: shape {shape} of {dtype} needs {count * size} bytes, not {hi - lo}")
        part = data[lo:hi]
        if torch is not None:
            out[name] = part.view(getattr(torch, torch_dtype)).reshape(shape)
        elif np_dtype is not None:
            out[name] = part.view(np.dtype(np_dtype)).reshape(shape)
        else:
            raise InvalidError(f"tensor {name!r} is {dtype}, which NumPy cannot hold: install torch")
    meta = header.get("__metadata__") or {}
    if not isinstance(meta, dict):
        raise InvalidError("not a safetensors file: its __metadata__ is not an object")
    return out, meta
