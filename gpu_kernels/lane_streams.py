"""One CUDA stream per lane, with events at the hand-offs between lanes.

The runner drives the lanes (``decode`` → ``device`` → ``output``) on their own threads. On the
GPU each lane issues its CuPy work on its own non-blocking stream (:class:`CudaLaneStream`,
entered as CuPy's current stream for the lane's call), so one batch's output-lane measures
overlap the next batch's model and render instead of queueing behind them on the legacy default
stream. A batch passes from one lane to the next with an event: the producing lane records one
on its stream when its stages are done, the consuming lane's stream waits on it before its first
stage (the wait is on the device; the host does not block).

The device lane's stream is also the model's: ONNX Runtime's CUDA and TensorRT providers take its
handle as ``user_compute_stream`` when their session is built, and PyTorch runs under a
``torch.cuda.ExternalStream`` over CuPy's current stream, so the model's kernels are ordered with
the lane's CuPy work without a host wait.

On the CPU the same interface is a no-op (:class:`HostLaneStream`: no events, handle 0).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Protocol

__all__ = ["CudaLaneStream", "HostLaneStream", "LaneStream", "LaneStreams", "current_stream_ptr", "lane_streams"]

LANE_NAMES: tuple[str, ...] = ("decode", "device", "output")


class LaneStream(Protocol):
    """A lane's stream: a context that makes it the current one for the lane's work, an event
    at the end of that work, and a wait for another lane's event."""

    lane: str
    ptr: int  # the cudaStream_t handle (0: none, the host)

    def enter(self) -> Any: ...  # a context manager

    def record(self) -> Any: ...

    def wait(self, event: Any) -> None: ...


class HostLaneStream:
    """The CPU's lane stream: nothing to order, nothing to wait for."""

    ptr = 0

    def __init__(self, lane: str) -> None:
        self.lane = lane

    @contextmanager
    def enter(self) -> Iterator[HostLaneStream]:
        yield self

    def record(self) -> None:
        return None

    def wait(self, event: Any) -> None:
        return None


class CudaLaneStream:
    """A non-blocking ``cupy.cuda.Stream`` of one lane. ``cuda`` is the ``cupy.cuda`` module
    (injectable: the tests, without a GPU, pass a recording stand-in)."""

    def __init__(self, lane: str, cuda: Any) -> None:
        self.lane = lane
        self.stream = cuda.Stream(non_blocking=True)
        self.ptr = int(self.stream.ptr)

    @contextmanager
    def enter(self) -> Iterator[CudaLaneStream]:
        with self.stream:  # CuPy's current stream, for this thread, while the lane runs
            yield self

    def record(self) -> Any:
        """An event after every piece of work issued on this stream so far."""
        return self.stream.record()

    def wait(self, event: Any) -> None:
        """Later work on this stream starts after ``event`` (a device-side wait)."""
        if event is not None:
            self.stream.wait_event(event)


class LaneStreams:
    """The streams of the three lanes: CUDA streams when ``device`` is "gpu", else host no-ops."""

    def __init__(self, device: str, cuda: Any = None) -> None:
        self.device = device
        if device == "gpu":
            if cuda is None:
                import cupy

                cuda = cupy.cuda
            self.streams: dict[str, LaneStream] = {lane: CudaLaneStream(lane, cuda) for lane in LANE_NAMES}
        else:
            self.streams = {lane: HostLaneStream(lane) for lane in LANE_NAMES}

    def __getitem__(self, lane: str) -> LaneStream:
        return self.streams[lane]

    @contextmanager
    def run(self, lane: str, after: Any = None) -> Iterator[LaneStream]:
        """Enter ``lane``'s stream, make it wait on ``after`` (the previous lane's hand-off event),
        and give it back as the context's value; the caller records the hand-off at the end."""
        stream = self.streams[lane]
        with stream.enter():
            stream.wait(after)
            yield stream


_SHARED: dict[str, LaneStreams] = {}
_LOCK = threading.Lock()


def lane_streams(device: str) -> LaneStreams:
    """The process's lane streams for ``device`` (one set per process: the model's session is
    built on the device lane's stream before the pipeline exists)."""
    with _LOCK:
        if device not in _SHARED:
            _SHARED[device] = LaneStreams(device)
        return _SHARED[device]


def current_stream_ptr() -> int:
    """CuPy's current stream handle on this thread (0: the legacy default stream or no CuPy)."""
    try:
        import cupy
    except ImportError:
        return 0
    return int(cupy.cuda.get_current_stream().ptr)
