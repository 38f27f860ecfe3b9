"""What every model-backed segmenter shares, whatever runs the model (ONNX Runtime, OpenVINO).

A :class:`BucketedSegmenter` cuts a batch into chunks of at most the largest bucket, pads each
chunk up to its bucket, runs the model (``_infer``, the one method a runtime implements), turns
the output into probabilities (``ModelSpec``) and each probability map into an alpha mask at
the image's own size (``MaskPostprocess``). The mask refinement runs on a copy of the photo
scaled down to at most ``mask_work_pixels`` (2048², the largest preset, by default: the model
itself sees 320 px, so a finer working copy only costs time; on a 12 MP photo the refinement at
full size took ~1 s of CPU), and the finished alpha is enlarged bilinearly to the photo's size,
its faint outer ring (under ``ENLARGE_FLOOR``) zeroed. ``None`` refines at full size. A
pipeline that knows the presets an image is for refines it at no more pixels than those reach
(:func:`output_work_pixels`: a 12 MP photo whose subject fills an 800² canvas needs ~1-2 MP). RGBA
images that already carry transparency skip the model: their alpha is the mask (stray specks
far from the subject zeroed, ``clean_cutout``).
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from gpu_kernels.array import Array
from gpu_kernels.segment.inputs import precut_alpha, validate_image
from gpu_kernels.segment.model import ModelSpec, output_to_probability, preprocess
from gpu_kernels.segment.ops import ArrayOps
from gpu_kernels.segment.postprocess import MaskPostprocess, clean_cutout
from gpu_kernels.segment.postprocess_batch import alpha_batch
from schemas.errors import LightboxError, per_item

__all__ = ["LONE_GAP_S", "MASK_WORK_PIXELS", "OUTPUT_MARGIN", "WORK_FLOOR_PIXELS", "BucketedSegmenter", "Callers",
           "Unrefined", "batch_buckets", "mask_work_size", "output_work_pixels", "plan_chunks"]

MASK_WORK_PIXELS = 2048 * 2048  # the largest preset (shopify 2048²): no output needs a finer alpha
ENLARGE_FLOOR = 16  # alpha levels (~6 % opacity) below which an enlarged alpha is zeroed
OUTPUT_MARGIN = 1.5  # how much finer than the finest canvas needs the working alpha stays
WORK_FLOOR_PIXELS = 512 * 512  # never refine at fewer pixels than this (the model sees 320²)


def mask_work_size(h: int, w: int, limit: int | None) -> tuple[int, int]:
    """``(h, w)`` scaled down (aspect kept) to at most ``limit`` pixels; unchanged when smaller."""
    if limit is None or h * w <= limit:
        return h, w
    s = math.sqrt(limit / (h * w))
    wh = max(1, int(h * s))
    return wh, max(1, min(int(w * s), limit // wh))


def output_work_pixels(prob: Array, height: int, width: int, canvases: Sequence[tuple[int, int, float]],
                       margin: float = OUTPUT_MARGIN) -> int | None:
    """The most pixels an ``height`` x ``width`` image's mask refinement needs for its canvases
    (``(width, height, fill)`` per preset), or None (no limit: no canvas, or no subject in the
    probability map ``prob``, a host array). A canvas scales the subject's box to ``fill`` of
    its limiting side (the scale :func:`gpu_kernels.retouch.geometry.placement` gives): with the
    box taken from ``prob >= 0.5``, the image needs at most ``margin`` times the finest canvas's
    scale along each side, never less than :data:`WORK_FLOOR_PIXELS`; an image the canvases
    enlarge needs its own size."""
    from gpu_kernels.retouch.geometry import subject_box

    if not canvases or not bool((prob >= 0.5).any()):
        return None
    ph, pw = prob.shape[:2]
    x0, y0, x1, y1 = (int(v) for v in subject_box(np, prob, ph, pw, 0.5))
    box_h, box_w = (y1 - y0) / ph * height, (x1 - x0) / pw * width
    scale = max(fill * min(cw / box_w, ch / box_h) for cw, ch, fill in canvases) * margin
    if scale >= 1:
        return None
    return max(WORK_FLOOR_PIXELS, math.ceil(float(scale) ** 2 * height * width))


def batch_buckets(max_batch: int) -> tuple[int, ...]:
    """Powers of two below ``max_batch``, then ``max_batch``: 6 -> (1, 2, 4, 6)."""
    if max_batch < 1:
        raise ValueError(f"max_batch must be >= 1, got {max_batch}")
    out, b = [], 1
    while b < max_batch:
        out.append(b)
        b *= 2
    out.append(max_batch)
    return tuple(out)


def plan_chunks(n: int, buckets: Sequence[int], *, pad: bool = True) -> list[tuple[int, int, int]]:
    """``(start, stop, size)`` per chunk: chunks of at most the largest bucket, each padded up to
    its bucket (``pad``) or run at its own size."""
    largest, plan, start = max(buckets), [], 0
    while start < n:
        stop = min(start + largest, n)
        plan.append((start, stop, min(b for b in buckets if b >= stop - start) if pad else stop - start))
        start = stop
    return plan


LONE_GAP_S = 0.25  # a call with no other thread's call in progress nor ended within this long is alone


class Callers:
    """Which model calls run alone, for a CPU model that runs images side by side on streams of
    one thread each (OpenVINO's): with several callers
    (``concurrent``), a single image takes a stream while other threads' calls come and go,
    and every thread when it is alone (``lone_latency``): one image on one thread takes ~230 ms
    against ~115 ms on two, so a worker at light load keeps its latency, while a backlog's device
    threads, which come back after their mask refinement, keep to the streams."""

    def __init__(self, streams: int) -> None:
        self.streams = streams
        self.concurrent = False  # several threads call at once
        self.lone_latency = True  # ...and a lone image still runs on every thread
        self._lock = threading.Lock()
        self._active = 0
        self._ends: dict[int, float] = {}  # calling thread -> when its last call ended (time.monotonic)

    @contextlib.contextmanager
    def call(self, images: int) -> Iterator[bool]:
        """Around one model call of ``images`` images: yields whether it takes the streams."""
        me = threading.get_ident()
        with self._lock:
            now = time.monotonic()
            alone = self.lone_latency and self._active == 0 and all(
                now - t > LONE_GAP_S for k, t in self._ends.items() if k != me)
            self._active += 1
        try:
            yield self.streams >= 2 and (images >= 2 or (self.concurrent and not alone))
        finally:
            with self._lock:
                self._active -= 1
                self._ends[me] = time.monotonic()


@dataclass(frozen=True, slots=True)
class Unrefined:
    """One image's foreground probability at the model's resolution, from
    :meth:`BucketedSegmenter.infer_batch`: the mask refinement (:meth:`alpha`) is still to run.
    The refinement is CPU work of its own (on a CPU, ~30 ms for a small photo and ~250 ms for a
    large one): a pipeline runs it after the model, on another thread than the model's."""

    prob: Array
    segmenter: BucketedSegmenter

    def alpha(self, image: Array, max_pixels: int | None = None) -> Array:
        """The refined alpha ``(H, W)`` uint8 of ``image`` (the image this came from), refined at
        no more than ``max_pixels`` (and the segmenter's own limit)."""
        return self.segmenter.refine(self.prob, image, max_pixels)


class BucketedSegmenter:
    """Base of the model segmenters (see the module docstring). Subclasses set ``device``,
    ``spec``, ``post``, ``_ops``, ``buckets`` and ``version``, and implement ``_infer``."""

    device: str
    spec: ModelSpec
    post: MaskPostprocess
    buckets: tuple[int, ...]
    version: str
    _ops: ArrayOps
    mask_work_pixels: int | None = MASK_WORK_PIXELS
    model_s: float = 0.0  # wall seconds spent inside ``_infer`` so far (the model alone)
    streams: int = 1  # images one call runs side by side (a CPU runtime with streams: see Callers)
    # Pad a chunk up to its bucket: fixed shapes for CUDA graphs and TensorRT profiles. A CPU
    # runtime runs a chunk at its own size: there the model's time is linear in the batch
    # (u2netp, ONNX Runtime on 2 threads: 152, 302, 453, 624 ms for 1-4 images), so three images
    # padded to four would pay for a fourth.
    pad_chunks: bool = True
    callers: Callers | None = None  # set by such a runtime (``ImagePipeline.device_callers`` tells it)

    def _infer(self, x: Array) -> Array:
        """The model's output ``spec.output_index`` for a prepared, padded batch ``x``."""
        raise NotImplementedError

    def warm_up(self) -> None:
        """Run every bucket once so each shape is planned now rather than on the first event."""
        xp = self._ops.xp
        h, w = self.spec.input_size
        for b in self.buckets:
            self._infer(xp.zeros((b, 3, h, w) if self.spec.layout == "NCHW" else (b, h, w, 3), xp.float32))

    def segment_batch(self, images: Sequence[Array]) -> list[Array | LightboxError]:
        """Alpha ``(H, W)`` uint8 per image (0 background, 255 subject), same H, W as the image;
        an image of the wrong shape or dtype gets its ``ProcessingFailed`` in its place, and a
        chunk the model fails on gets that error for each of its images (the next chunk runs).
        :meth:`infer_batch` then :meth:`Unrefined.alpha` for each image, in one call."""
        masks = self.infer_batch(images)
        todo = [(k, m) for k, m in enumerate(masks) if isinstance(m, Unrefined)]
        alphas = self.refine_batch([m.prob for _, m in todo], [images[k] for k, _ in todo])
        out: list[Array | LightboxError] = [m.prob if isinstance(m, Unrefined) else m for m in masks]
        for (k, _), alpha in zip(todo, alphas, strict=True):
            out[k] = alpha
        return out

    def infer_batch(self, images: Sequence[Array]) -> list[Array | Unrefined | LightboxError]:
        """:meth:`segment_batch` up to the model's probabilities: per image an :class:`Unrefined`
        (its mask refinement still to run, on any thread), the finished alpha of an RGBA image
        that carries its own cut-out, or the image's error."""
        ops, xp = self._ops, self._ops.xp

        def checked(item: tuple[int, Array]) -> Array | None:
            validate_image(*item)
            precut = precut_alpha(item[1], xp)
            return None if precut is None else clean_cutout(precut, self.post, ops)

        masks: list[Array | Unrefined | LightboxError | None] = per_item(checked, enumerate(images))
        todo = [i for i, m in enumerate(masks) if m is None]
        for start, stop, bucket in plan_chunks(len(todo), self.buckets, pad=self.pad_chunks):
            idx = todo[start:stop]
            try:
                x = preprocess([images[i] for i in idx], self.spec, bucket, ops)
                t0 = time.perf_counter()
                raw = self._infer(x)
                self.model_s += time.perf_counter() - t0
            except LightboxError as exc:
                for i in idx:
                    masks[i] = exc
                continue
            probs = output_to_probability(raw[: len(idx)], self.spec, xp)
            for i, prob in zip(idx, probs, strict=True):
                masks[i] = Unrefined(prob, self)
        return [m for m in masks if m is not None]

    def refine(self, prob: Array, image: Array, max_pixels: int | None = None) -> Array:
        """The refined alpha of ``image`` from the model's probability map, refined at the
        working size (see the module docstring; ``max_pixels`` lowers it: see
        :func:`output_work_pixels`) and returned at the image's size."""
        return self.refine_batch([prob], [image], [max_pixels])[0]

    def refine_batch(self, probs: Sequence[Array], images: Sequence[Array],
                     max_pixels: Sequence[int | None] | None = None) -> list[Array]:
        """:meth:`refine` of each image, the same values: on a device backend the refinements
        of one working size run as one stack (:func:`~gpu_kernels.segment.postprocess_batch.alpha_batch`:
        a few hundred array calls and three host reads for the batch, not per image)."""
        ops = self._ops
        work_probs, work_images, shrunk = [], [], []
        for prob, image, most in zip(probs, images, max_pixels or [None] * len(probs), strict=True):
            h, w = image.shape[:2]
            limits = [n for n in (self.mask_work_pixels, most) if n is not None]
            wh, ww = mask_work_size(h, w, min(limits) if limits else None)
            work_probs.append(ops.resize_map(prob, wh, ww))
            work_images.append(image if (wh, ww) == (h, w) else ops.resize_u8(image[..., :3], wh, ww))
            shrunk.append((wh, ww) != (h, w))
        alphas = alpha_batch(work_probs, work_images, self.post, ops)
        # the faint ring bilinear enlargement spreads past the edge is background
        return [ops.zero_below(ops.resize_u8(alpha, *image.shape[:2]), ENLARGE_FLOOR) if small else alpha
                for alpha, image, small in zip(alphas, images, shrunk, strict=True)]

    def set_callers(self, n: int, *, lone_latency: bool) -> None:
        """``n`` threads run the model at once (a runtime with :class:`Callers` uses it)."""
        if self.callers is not None:
            self.callers.concurrent, self.callers.lone_latency = n > 1, lone_latency

    def prepare(self) -> None:
        """Compile what the callers will run on, now (a runtime that compiles per use overrides it)."""

    def close(self) -> None:
        """Release the runtime; the segmenter cannot be used afterwards."""

    def __enter__(self) -> BucketedSegmenter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
