"""Host-to-device uploads through reusable page-locked (pinned) staging buffers.

``cupy.asarray(numpy_array)`` copies from pageable memory: the driver first copies into its
own pinned bounce buffer, then DMAs, and the call blocks the host. :class:`PinnedUploader`
keeps a small ring of pinned buffers (grown to the largest image seen), copies the image into
one, and starts an asynchronous DMA on the current stream; the buffer is reused only after the
event recorded behind its copy has completed, so an upload in flight is never overwritten.
Kernels queued later on the same stream see the data. CuPy is imported lazily: importing this
module needs no GPU.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

__all__ = ["PinnedUploader", "upload"]


class _Slot:
    def __init__(self) -> None:
        self.memory: Any = None
        self.nbytes = 0
        self.event: Any = None


class PinnedUploader:
    """Uploads NumPy arrays to device ``device_id`` through ``slots`` pinned buffers (thread-safe)."""

    def __init__(self, device_id: int = 0, slots: int = 3) -> None:
        if slots < 1:
            raise ValueError(f"slots must be >= 1, got {slots}")
        self.device_id = device_id
        self._slots = [_Slot() for _ in range(slots)]
        self._next = 0
        self._lock = threading.Lock()

    def upload(self, host: np.ndarray) -> Any:
        """A new CuPy array on the device holding ``host``'s values (same shape and dtype)."""
        import cupy as cp

        src = np.ascontiguousarray(host)
        with self._lock, cp.cuda.Device(self.device_id):
            slot = self._slots[self._next]
            self._next = (self._next + 1) % len(self._slots)
            if slot.event is not None:
                slot.event.synchronize()  # the copy that last used this buffer has finished
            if slot.nbytes < src.nbytes:
                slot.memory = cp.cuda.alloc_pinned_memory(max(src.nbytes, 1))
                slot.nbytes = src.nbytes
            staging = np.frombuffer(slot.memory, np.uint8, src.nbytes).view(src.dtype).reshape(src.shape)
            np.copyto(staging, src)
            out = cp.empty(src.shape, src.dtype)
            stream = cp.cuda.get_current_stream()
            out.set(staging, stream=stream)
            slot.event = stream.record()
            return out


_uploaders: dict[int, PinnedUploader] = {}
_uploaders_lock = threading.Lock()


def upload(host: np.ndarray, device_id: int = 0) -> Any:
    """:meth:`PinnedUploader.upload` through one shared uploader per device."""
    with _uploaders_lock:
        up = _uploaders.get(device_id)
        if up is None:
            up = _uploaders[device_id] = PinnedUploader(device_id)
    return up.upload(host)
