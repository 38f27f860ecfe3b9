"""One CUDA stream per lane, events at the hand-offs (gpu_kernels.lane_streams, the pipeline's
run_lane), and the stream handed to ONNX Runtime and PyTorch.

No GPU exists where these run, so the CUDA stream API is a recording stand-in of
``cupy.cuda`` (``Stream(non_blocking=...)`` as a per-thread context, ``record``,
``wait_event``, ``get_current_stream``): the tests check which stream each lane's stages run
under and the order of the events, not what a device does with them (the GPU checks of
``bench/gpu/checks.py`` run the real streams)."""

from __future__ import annotations

import contextlib
import io
import itertools
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from gpu_kernels.backends import RetouchOptions
from gpu_kernels.codec import CpuEncoder, make_decoder
from gpu_kernels.lane_streams import HostLaneStream, LaneStreams
from gpu_kernels.pipeline import ImagePipeline, Job, default_stages
from gpu_kernels.presets import load_presets
from gpu_kernels.retouch import CpuRetoucher
from gpu_kernels.segment import make_segmenter
from gpu_kernels.spans import SpanRecorder
from gpu_kernels.stages import BatchContext, Stage


class RecordingCuda:
    """Stand-in for ``cupy.cuda``: streams that log what the lanes do with them."""

    def __init__(self) -> None:
        self.log: list[tuple[Any, ...]] = []
        self.lock = threading.Lock()
        self.local = threading.local()
        ids = itertools.count(1)
        cuda = self

        class Event:
            def __init__(self) -> None:
                self.id = next(ids)

        class Stream:
            def __init__(self, non_blocking: bool = False) -> None:
                self.non_blocking, self.ptr = non_blocking, 0x1000 + next(ids)

            def __enter__(self) -> Stream:
                cuda.stack().append(self)
                return self

            def __exit__(self, *exc: object) -> None:
                assert cuda.stack().pop() is self

            def record(self) -> Event:
                event = Event()
                cuda.note("record", self.ptr, event.id)
                return event

            def wait_event(self, event: Event) -> None:
                cuda.note("wait", self.ptr, event.id)

        self.Stream = Stream

    def stack(self) -> list[Any]:
        if not hasattr(self.local, "stack"):
            self.local.stack = []
        stack: list[Any] = self.local.stack
        return stack

    def note(self, *entry: Any) -> None:
        with self.lock:
            self.log.append(entry)

    def get_current_stream(self) -> Any:
        return self.stack()[-1] if self.stack() else None


class Where(Stage):
    """Notes, per lane, the stream that is current on the thread that runs the lane."""

    def __init__(self, lane: Any, cuda: RecordingCuda) -> None:
        self.lane, self.name, self.cuda = lane, f"where_{lane}", cuda

    def apply(self, ctx: BatchContext, idx: list[int]) -> Sequence[object]:
        current = self.cuda.get_current_stream()
        self.cuda.note("stage", self.lane, None if current is None else current.ptr, threading.get_ident())
        return [None] * len(idx)


def _photo() -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.full((60, 80, 3), (200, 40, 40), np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


def test_each_lane_runs_under_its_own_stream_and_hand_offs_wait_on_events() -> None:
    cuda = RecordingCuda()
    streams = LaneStreams("gpu", cuda=cuda)
    ptr = {lane: streams[lane].ptr for lane in ("decode", "device", "output")}
    assert len(set(ptr.values())) == 3
    assert all(s.stream.non_blocking for s in streams.streams.values())  # type: ignore[attr-defined]
    decoder, retoucher, encoder = make_decoder("cpu"), CpuRetoucher(), CpuEncoder()
    classical = make_segmenter("classical")
    stages: list[Stage] = []
    for s in default_stages(decoder, retoucher, encoder, None, classical):
        if not any(getattr(x, "lane", None) == s.lane for x in stages):
            stages.append(Where(s.lane, cuda))  # first in its lane
        stages.append(s)
    pipe = ImagePipeline(decoder, retoucher, encoder, None, classical, stages=stages, streams=streams)
    ctx = pipe.start([Job(_photo(), [load_presets()["jd_main"]], RetouchOptions(), SpanRecorder())])
    with ThreadPoolExecutor(1) as a, ThreadPoolExecutor(1) as b, ThreadPoolExecutor(1) as c:  # one thread a lane
        for lane, pool in (("decode", a), ("device", b), ("output", c)):
            pool.submit(pipe.run_lane, ctx, lane).result()
    (res,) = ctx.finalize()
    assert res.ok and res.variants and res.quality is not None
    where = [e for e in cuda.log if e[0] == "stage"]
    assert [(e[1], e[2]) for e in where] == [(lane, ptr[lane]) for lane in ("decode", "device", "output")]
    assert len({e[3] for e in where}) == 3  # three threads, each under its own lane's stream
    # each lane: waits on the previous lane's event, runs its stages, records its own at the end
    assert [e[:2] for e in cuda.log] == [
        ("stage", "decode"), ("record", ptr["decode"]),
        ("wait", ptr["device"]), ("stage", "device"), ("record", ptr["device"]),
        ("wait", ptr["output"]), ("stage", "output"), ("record", ptr["output"])]
    events = [e[2] for e in cuda.log if e[0] != "stage"]
    assert events[1] == events[0] and events[3] == events[2] and len(set(events)) == 3
    assert cuda.get_current_stream() is None  # every context left


def test_a_lane_that_fails_still_hands_an_event_on() -> None:
    cuda = RecordingCuda()
    streams = LaneStreams("gpu", cuda=cuda)

    class Raise(Stage):
        name, lane = "raise", "device"

        def steps(self, ctx: BatchContext) -> Any:
            raise KeyboardInterrupt  # not a per-item error: leaves run_lane

    pipe = ImagePipeline(make_decoder("cpu"), CpuRetoucher(), CpuEncoder(), stages=[Raise()], streams=streams)
    ctx = pipe.start([])
    with contextlib.suppress(KeyboardInterrupt):
        pipe.run_lane(ctx, "device")
    assert [e[:2] for e in cuda.log] == [("record", streams["device"].ptr)] and ctx.handoff is not None


def test_on_the_cpu_the_lane_streams_are_no_ops() -> None:
    pipe = ImagePipeline(make_decoder("cpu"), CpuRetoucher(), CpuEncoder(), None, make_segmenter("classical"))
    assert all(isinstance(pipe.streams[lane], HostLaneStream) and pipe.streams[lane].ptr == 0
               for lane in ("decode", "device", "output"))
    job = Job(_photo(), [load_presets()["jd_main"]], RetouchOptions(), SpanRecorder())
    ctx = pipe.start([job])
    for lane in ("decode", "device", "output"):
        pipe.run_lane(ctx, lane)
    assert ctx.handoff is None and ctx.finalize()[0].ok


def test_onnx_runtime_gets_the_device_lane_stream_as_its_compute_stream(monkeypatch: Any, tmp_path: Path) -> None:
    from gpu_kernels.segment import onnx_runner
    from gpu_kernels.segment.model import U2NETP

    class Ort:
        @staticmethod
        def get_available_providers() -> list[str]:
            return ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"]

    monkeypatch.setattr(onnx_runner, "_onnxruntime", lambda: Ort)
    seg = onnx_runner.OnnxSegmenter.__new__(onnx_runner.OnnxSegmenter)
    seg.device_id, seg.spec, seg.compute_stream = 0, replace(U2NETP, input_name="x"), 0x5eed
    trt, cuda, cpu = seg._gpu_providers(tmp_path / "m.onnx", True, tmp_path, 8)
    want = {"has_user_compute_stream": "1", "user_compute_stream": str(0x5eed)}
    assert want.items() <= trt[1].items() and want.items() <= cuda[1].items() and cpu == "CPUExecutionProvider"
    (graph,) = seg._gpu_providers(tmp_path / "m.onnx", False, tmp_path, 8, cuda_graph=True)
    assert "user_compute_stream" not in graph[1]  # a captured graph replays on ONNX Runtime's own stream
    seg.compute_stream = 0
    assert "user_compute_stream" not in seg._gpu_providers(tmp_path / "m.onnx", False, tmp_path, 8)[0][1]
    assert onnx_runner.stream_options(0) == {} and onnx_runner.device_lane_stream() == 0  # no CuPy here


def test_torch_runs_the_model_on_cupys_current_stream() -> None:
    from gpu_kernels.segment.torch_runner import TorchSegmenter

    seen: list[tuple[str, Any]] = []

    class Cuda:
        @staticmethod
        def ExternalStream(ptr: int, device: Any = None) -> Any:
            seen.append(("external", ptr))
            return ptr

        @staticmethod
        def stream(s: Any) -> Any:
            seen.append(("current", s))
            return threading.Lock()  # any context manager

    seg = TorchSegmenter.__new__(TorchSegmenter)
    seg._torch, seg._dev = type("Torch", (), {"cuda": Cuda}), "cuda:0"
    with seg._lane_stream(0x77):
        pass
    with seg._lane_stream(0):  # the legacy default stream: torch keeps its own current stream
        pass
    assert seen == [("external", 0x77), ("current", 0x77)]
