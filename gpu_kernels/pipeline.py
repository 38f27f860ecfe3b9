"""The retouch pipeline over one batch (docs/architecture.md, steps 2-7) as an ordered list of stages.

:func:`default_stages` is the list; each stage is one module of :mod:`gpu_kernels.stages` and
names its lane:

    lane     stage                        spans
    decode   DecodeStage                  decode
    device   SegmentStage                 segment        (a CPU model: up to its probabilities)
    output   RefineStage                  refine         (a CPU model's mask refinement; device lane
                                                          when correct and render are there)
    device   CorrectStage                 correct        (output lane when all is on the CPU)
    device   RenderStage                  preset:<name>  (the same)
    device   ShadowStage                  shadow:<name>  (the same; presets with shadow = "contact")
    device   EncodeStage (GPU half)       encode:<name>  (a GPU encoder's own images, batched: nvJPEG)
    output   EncodeStage (CPU)            encode:<name>  (the rest: PNG, WebP, small JPEGs; all of
                                                          them with a CPU encoder)
    output   QualityStage                 quality
    output   ComplianceStage              compliance

A runner drives the lanes on their own threads (``decode`` → ``device`` → ``output``); on the
GPU each lane's CuPy work runs on that lane's own CUDA stream, and a batch passes from one lane
to the next with an event the first records and the next waits on
(:mod:`gpu_kernels.lane_streams`). The
framework (:mod:`gpu_kernels.stages.base`) records every span and per-item error, so adding a
stage is one module plus one line in :func:`default_stages`. Pure: no Kafka, no Faust.

Failures are per item: an item that fails any stage carries its
:class:`~schemas.errors.LightboxError` and leaves the batch; the others go on.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

from gpu_kernels.backends import Decoder, Encoder, ModelSegmenter, Retoucher, Segmenter
from gpu_kernels.lane_streams import LaneStreams, lane_streams
from gpu_kernels.stages.base import (
    LANES,
    BatchContext,
    Compliance,
    Job,
    JobResult,
    Lane,
    Quality,
    Stage,
    Variant,
    run_lane,
)
from gpu_kernels.stages.compliance import ComplianceStage
from gpu_kernels.stages.correct import CorrectStage
from gpu_kernels.stages.decode import DecodeStage
from gpu_kernels.stages.encode import encode_stages
from gpu_kernels.stages.quality import QualityStage, measure_quality
from gpu_kernels.stages.render import RenderStage
from gpu_kernels.stages.segment import RefineStage, SegmentStage
from gpu_kernels.stages.shadow import ShadowStage

__all__ = [
    "BatchContext",
    "Compliance",
    "ImagePipeline",
    "Job",
    "JobResult",
    "Quality",
    "Stage",
    "Variant",
    "default_stages",
    "measure_quality",
]

log = logging.getLogger(__name__)


def default_stages(decoder: Decoder, retoucher: Retoucher, encoder: Encoder,
                   segmenter: Segmenter | None = None, classical: Segmenter | None = None) -> list[Stage]:
    """The stage list, in order. A stage's lane decides which runner thread runs it: correct,
    render and shadow run in the device lane when the retoucher or the encoder is on a GPU (the
    canvas stays there), else in the output lane's threads (several batches at once, the device
    thread free for the model)."""
    canvas: Lane = "device" if "gpu" in (retoucher.device, encoder.device) else "output"
    return [
        DecodeStage(decoder),
        SegmentStage(segmenter, classical, refine_later=True),
        RefineStage(lane=canvas),  # a CPU model's mask refinement, off the device thread
        CorrectStage(retoucher, lane=canvas),
        RenderStage(retoucher, lane=canvas),
        ShadowStage(retoucher.device, lane=canvas),  # presets with shadow = "contact"
        *encode_stages(encoder),  # a GPU encoder's own part in the device lane, the CPU formats in the output lane
        QualityStage(),
        ComplianceStage(),  # marketplace rules per variant
    ]


# A batch is "light" when its output lane is mostly Python's fixed cost per image rather than
# pixel work: every decoded image at most LIGHT_SOURCE_PIXELS and its presets' canvases together
# at most LIGHT_CANVAS_PIXELS. NumPy and OpenCV release the GIL around each call on more than a
# few hundred values, so two threads running such batches hand the GIL back and forth around
# every small call. Measured on 2 cores (8-image batches, wall time of 1 thread over 2): one
# 64x64 preset from 64x64-128x128 images 0.6-0.7x, from 256x256 0.9x, from 512x512 1.1x,
# 1536x1536 1.3x; a 400x400 canvas or larger 1.5x from any source (docs/performance.md).
LIGHT_SOURCE_PIXELS = 128 * 1024
LIGHT_CANVAS_PIXELS = 128 * 128


def light_batch(ctx: BatchContext) -> bool:
    """Whether the output lane of ``ctx`` is light (see ``LIGHT_SOURCE_PIXELS``): its live items'
    images are small and so are their presets' canvases (False for a batch with nothing alive)."""
    alive = [i for i in ctx.alive() if i in ctx.images]
    return bool(alive) and all(
        ctx.images[i].shape[0] * ctx.images[i].shape[1] <= LIGHT_SOURCE_PIXELS
        and sum(p.width * p.height for p in ctx.jobs[i].presets) <= LIGHT_CANVAS_PIXELS for i in alive)


def _default_streams(*backends: object) -> LaneStreams:
    """The process's CUDA lane streams when a backend is on the GPU and CuPy can make streams,
    else the host's no-op ones."""
    if not any(getattr(b, "device", "cpu") == "gpu" for b in backends if b is not None):
        return LaneStreams("cpu")
    try:
        return lane_streams("gpu")
    except Exception as exc:  # no CuPy, or no CUDA device (a GPU backend's NumPy twin under test)
        log.warning("lane streams: none on this host (%s: %s); lanes use the current stream",
                    type(exc).__name__, exc)
        return LaneStreams("cpu")


def _check_order(stages: Sequence[Stage]) -> None:
    """Lanes run one after another, so the list must not go back to an earlier lane."""
    rank = {lane: k for k, lane in enumerate(LANES)}
    last = 0
    for s in stages:
        if s.lane not in rank:
            raise ValueError(f"stage {s.name!r}: unknown lane {s.lane!r}; use one of {', '.join(LANES)}")
        if rank[s.lane] < last:
            raise ValueError(f"stage {s.name!r} in lane {s.lane!r} comes after a later lane's stage; "
                             "order the list decode, device, output")
        last = rank[s.lane]


class ImagePipeline:
    """Runs batches through the stage list. Build one with ``agents.wiring.build_pipeline``.

    ``stages`` defaults to :func:`default_stages` over the injected backends; pass a list to add,
    drop or reorder stages (tests do)."""

    def __init__(self, decoder: Decoder, retoucher: Retoucher, encoder: Encoder,
                 segmenter: Segmenter | None = None, classical: Segmenter | None = None,
                 clock: Callable[[], int] = time.monotonic_ns, stages: Sequence[Stage] | None = None,
                 streams: LaneStreams | None = None) -> None:
        """``segmenter`` is the model; ``classical`` the fallback for plain backgrounds, used for
        events that ask for it and for every event when no model is configured. ``streams``: the
        lanes' streams (default: the process's CUDA lane streams when a backend is on the GPU,
        else the host's no-op ones)."""
        self.decoder, self.retoucher, self.encoder = decoder, retoucher, encoder
        self.segmenter, self.classical = segmenter, classical
        self.clock = clock
        self.stages: list[Stage] = list(stages if stages is not None
                                        else default_stages(decoder, retoucher, encoder, segmenter, classical))
        _check_order(self.stages)
        self.streams = streams if streams is not None else _default_streams(
            decoder, retoucher, encoder, segmenter, classical)
        self._light_lane = threading.Lock()  # one light batch at a time in the output lane

    @property
    def device(self) -> str:
        return self.retoucher.device

    @property
    def side_by_side(self) -> int:
        """How many device-lane calls the model runs at once to good effect: OpenVINO on a CPU,
        its streams (2); 1 for every other model or none."""
        return max(1, self.segmenter.streams) if isinstance(self.segmenter, ModelSegmenter) else 1

    def device_callers(self, n: int, *, lone_latency: bool = True) -> None:
        """Tell the model that ``n`` threads run the device lane at once (``lightbox process`` and
        the worker do with ``side_by_side`` threads): OpenVINO then runs a single image on one of
        its streams, beside the other caller's, instead of on all threads; with ``lone_latency``
        (the worker: latency at light load) not when no other call is about, without it (``process``:
        throughput only) always. A model that compiles per use (OpenVINO) compiles what those calls
        run on now: a model that cannot load fails here, at start-up, not on the first image."""
        if isinstance(self.segmenter, ModelSegmenter):
            self.segmenter.set_callers(n, lone_latency=lone_latency)
            self.segmenter.prepare()

    @property
    def versions(self) -> dict[str, str]:
        """Each backend's version, for logs and the pipeline's identity."""
        out = {"decoder": self.decoder.version, "retoucher": self.retoucher.version, "encoder": self.encoder.version}
        for name, seg in (("segmenter", self.segmenter), ("classical", self.classical)):
            if seg is not None:
                out[name] = seg.version
        return out

    def lane(self, lane: Lane) -> list[Stage]:
        return [s for s in self.stages if s.lane == lane]

    def close(self) -> None:
        for stage in self.stages:
            stage.close()
        self.decoder.close()
        self.retoucher.close()
        self.encoder.close()
        for seg in (self.segmenter, self.classical):
            if seg is not None:
                seg.close()

    # -- lanes -----------------------------------------------------------------------------------
    def start(self, jobs: Sequence[Job]) -> BatchContext:
        """A fresh context for one batch (no stage run yet)."""
        return BatchContext(jobs, [JobResult() for _ in jobs], self.clock)

    def run_lane(self, ctx: BatchContext, lane: Lane) -> BatchContext:
        """Every stage of ``lane`` over the batch, in list order, on the lane's stream: it first
        waits on the event the previous lane recorded (``ctx.handoff``), and records the next one
        when its stages are done. Light batches (:func:`light_batch`) take the output lane one at
        a time, whatever number of threads call it: side by side they would spend their time
        handing the GIL to each other; heavier batches run beside them."""
        with self.streams.run(lane, ctx.handoff) as stream:
            try:
                if lane == "output" and light_batch(ctx):
                    with self._light_lane:
                        run_lane(ctx, self.stages, lane)
                else:
                    run_lane(ctx, self.stages, lane)
            finally:
                ctx.handoff = stream.record()
        return ctx

    def run_batch(self, jobs: Sequence[Job]) -> list[JobResult]:
        """All lanes for one batch; results in input order."""
        ctx = self.start(jobs)
        for lane in LANES:
            self.run_lane(ctx, lane)
        return ctx.finalize()
