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
from typing import Any, Dict, List, Mapping, Optional, Tuple

import numpy as np

from . import _gstore
from ._gstore import InvalidError

#: The tensors' bytes start at a multiple of this (the header is padded with spaces).
DATA_ALIGN = 4096

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


def _torch():
    try:
        import torch
    except ImportError:
        return None
    return torch


def _is_torch(value: Any) -> bool:
    return type(value).__module__.split(".")[0] == "torch"


def _as_bytes(name: str, value: Any) -> Tuple[str, List[int], np.ndarray]:
    """The safetensors dtype, shape and bytes (a uint8 NumPy array sharing the tensor's memory
    where it can) of one value."""
    if _is_torch(value):
        torch = _torch()
        t = value.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        t = t.contiguous()
        dtype = _FROM_TORCH.get(str(t.dtype).removeprefix("torch."))
        if dtype is None:
            raise InvalidError(f"tensor {name!r}: dtype {t.dtype} has no safetensors equivalent")
        return dtype, list(t.shape), t.reshape(-1).view(torch.uint8).numpy()
    a = np.asarray(value)
    if a.dtype.byteorder == ">":
        a = a.astype(a.dtype.newbyteorder("<"))
    dtype = _FROM_NUMPY.get(a.dtype.str)
    if dtype is None:
        raise InvalidError(f"tensor {name!r}: dtype {a.dtype} has no safetensors equivalent")
    return dtype, list(a.shape), np.ascontiguousarray(a).reshape(-1).view(np.uint8)


def encode(state_dict: Mapping[str, Any], meta: Optional[Mapping[str, str]]) -> Tuple[bytes, List[np.ndarray]]:
    """The header (length prefix included, padded) and the tensors' bytes, in file order."""
    if not isinstance(state_dict, Mapping):
        raise InvalidError(f"expected a mapping of names to tensors, not {type(state_dict).__name__}")
    items = []
    for name, value in state_dict.items():
        if not isinstance(name, str):
            raise InvalidError(f"tensor names must be strings, not {name!r}")
        if name == "__metadata__":
            raise InvalidError("'__metadata__' is reserved by the safetensors format")
        items.append((name, *_as_bytes(name, value)))
    items.sort(key=lambda it: (-_DTYPES[it[1]][0], it[0]))
    header: Dict[str, Any] = {}
    if meta:
        bad = [k for k, v in meta.items() if not isinstance(k, str) or not isinstance(v, str)]
        if bad:
            raise InvalidError(f"meta must map strings to strings; not so for {bad[0]!r}")
        header["__metadata__"] = dict(meta)
    offset = 0
    for name, dtype, shape, data in items:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + data.nbytes]}
        offset += data.nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    padded = -(-(8 + len(text)) // DATA_ALIGN) * DATA_ALIGN - 8
    text += b" " * (padded - len(text))
    return struct.pack("<Q", len(text)) + text, [data for _, _, _, data in items]


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
        framework = "torch" if _torch() is not None else "numpy"
    if framework == "numpy" and kind != "cpu":
        raise InvalidError("NumPy arrays live in host memory: load onto a GPU with framework='torch'")
    if framework == "torch" and _torch() is None:
        raise InvalidError("framework='torch' needs torch installed")
    return framework


def as_array(blob: Any, framework: str, index: int) -> Any:
    """The loaded file as a 1-D uint8 array of ``framework`` sharing its memory (host memory
    for NumPy; host or GPU ``index`` for torch)."""
    if framework == "numpy":
        return np.asarray(blob)
    torch = _torch()
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


def decode(blob: Any) -> Dict[str, Any]:
    """Views of every tensor in a loaded safetensors file (no copies)."""
    header, start = _header(blob)
    data = blob[start:]
    torch = _torch() if _is_torch(blob) else None
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
    return out


def placement_of(state: Mapping[str, Any]) -> Tuple[str, str]:
    """Where the tensors of ``state`` are (``"cpu"`` or ``"cuda:N"``; they must agree) and
    what they are (``"torch"`` or ``"numpy"``)."""
    devices = {str(v.device) if _is_torch(v) else "cpu" for v in state.values()}
    if len(devices) > 1:
        raise InvalidError(f"the tensors to fill are on several devices ({', '.join(sorted(devices))}): load each apart")
    device = devices.pop() if devices else "cpu"
    framework = "torch" if any(_is_torch(v) for v in state.values()) else "numpy"
    return ("cuda:0" if device == "cuda" else device), framework


def copy_into(state: Mapping[str, Any], loaded: Mapping[str, Any], strict: bool) -> None:
    """Copies every loaded tensor into the tensor of the same name in ``state``."""
    if strict:
        missing = sorted(set(state) - set(loaded))
        extra = sorted(set(loaded) - set(state))
        if missing or extra:
            raise InvalidError(f"names differ: missing from the image {missing[:5]}, not in the target {extra[:5]}")
    for name, dst in state.items():
        src = loaded.get(name)
        if src is None:
            continue
        if tuple(dst.shape) != tuple(src.shape) or str(dst.dtype) != str(src.dtype):
            raise InvalidError(
                f"tensor {name!r}: the image has {src.dtype} {tuple(src.shape)}, the target {dst.dtype} {tuple(dst.shape)}"
            )
        if _is_torch(dst):
            torch = _torch()
            with torch.no_grad():
                dst.copy_(src if _is_torch(src) else torch.from_numpy(src))
        else:
            np.copyto(dst, src)
