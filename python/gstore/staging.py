"""The host memory a save copies tensors into before it returns, so that training may go on
changing them while the copy is chunked and stored.

A :class:`StagingPool` is one host buffer, kept by a :class:`gstore.Store` and reused by each
of its saves that fits in it; a save that needs more replaces it with one of exactly the size
it needs. So the pool holds, at most, the staged bytes of the largest save so far (every tensor
of a background save; the GPU tensors of a blocking one), until :meth:`StagingPool.release`.
It is page-locked (pinned) once a save has staged CUDA tensors, which are copied on a CUDA
stream of their own per device (after the work queued on the current stream, so the copy sees
the values the training step wrote) and synchronised before the save returns.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from . import safetensors_layout as _layout


class StagingPool:
    """One reusable host buffer for staged tensors (see the module)."""

    def __init__(self) -> None:
        self._host: Optional[np.ndarray] = None  # uint8, the whole buffer
        self._pinned: Any = None  # the torch tensor owning the buffer when it is pinned
        self._streams: Dict[Any, Any] = {}  # torch.device -> torch.cuda.Stream

    @property
    def nbytes(self) -> int:
        """Bytes of host memory the pool holds now."""
        return 0 if self._host is None else self._host.nbytes

    @property
    def pinned(self) -> bool:
        """Whether the pool's memory is page-locked (it has staged CUDA tensors)."""
        return self._pinned is not None

    def release(self) -> None:
        """Lets go of the buffer; the next save that stages allocates a new one."""
        self._host = None
        self._pinned = None

    def _reserve(self, nbytes: int, pinned: bool) -> np.ndarray:
        """The buffer, at least ``nbytes`` long and pinned if asked, reused when it fits."""
        if self._host is not None and self._host.nbytes >= nbytes and (self._pinned is not None or not pinned):
            return self._host
        self.release()
        if pinned:
            torch = _layout.torch_or_none()
            self._pinned = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
            self._host = self._pinned.numpy()
        else:
            self._host = np.empty(nbytes, dtype=np.uint8)
        return self._host

    def stage(self, entries: List[_layout.Entry], copy_host: bool) -> Tuple[List[np.ndarray], int]:
        """The bytes of each entry (in the order given) for the push, and how many were
        staged. Tensors on a GPU are always copied into the pool; host tensors and arrays
        too when ``copy_host``, else they are read in place. Returns once every copy is done."""
        staged = [copy_host or _layout.is_device_tensor(e.value) for e in entries]
        total = sum(e.nbytes for e, s in zip(entries, staged) if s)
        if total == 0:
            return [_layout.host_bytes(e) for e in entries], 0
        devices = {e.value.device for e in entries if _is_cuda(e.value)}
        host = self._reserve(total, bool(devices))
        streams = {d: self._stream_for(d) for d in devices}
        out: List[np.ndarray] = []
        offset = 0
        for e, s in zip(entries, staged):
            if not s:
                out.append(_layout.host_bytes(e))
                continue
            dst = host[offset : offset + e.nbytes]
            if _is_cuda(e.value):
                if e.nbytes:
                    _copy_from_cuda(e.value, self._pinned[offset : offset + e.nbytes], streams[e.value.device])
            else:
                np.copyto(dst, _layout.host_bytes(e))
            out.append(dst)
            offset += e.nbytes
        for stream in streams.values():
            stream.synchronize()
        return out, total

    def _stream_for(self, device: Any) -> Any:
        """This pool's copy stream on ``device``, made to wait for the work queued there."""
        torch = _layout.torch_or_none()
        stream = self._streams.get(device)
        if stream is None:
            stream = self._streams[device] = torch.cuda.Stream(device=device)
        stream.wait_stream(torch.cuda.current_stream(device))
        return stream


def _is_cuda(value: Any) -> bool:
    return _layout.is_torch(value) and value.device.type == "cuda"


def _copy_from_cuda(t: Any, dst: Any, stream: Any) -> None:
    """Queues the copy of CUDA tensor ``t``'s bytes into the pinned uint8 tensor ``dst``."""
    torch = _layout.torch_or_none()
    with torch.cuda.stream(stream):
        src = t.contiguous().reshape(-1).view(torch.uint8)
        dst.copy_(src, non_blocking=True)
