"""The retouch pipeline over one batch: decode once, segment once, correct once, then per
preset render and encode (DESIGN.md steps 2-7). Pure: no Kafka, no Faust, no event loop.

Failures are per item: an item that fails any stage carries its
:class:`~schemas.errors.LightboxError` and leaves the batch; the others go on.
"""

from __future__ import annotations

import functools
import hashlib
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from gpu_kernels.backends import Array, Decoder, Encoder, Retoucher, RetouchOptions, Segmenter
from gpu_kernels.presets import Preset
from gpu_kernels.spans import SpanRecorder
from schemas.errors import LightboxError, ProcessingFailed, per_item

__all__ = ["Decoded", "Job", "JobResult", "Quality", "RetouchPipeline", "Variant"]


@dataclass(slots=True)
class Job:
    """One image to process. ``spans`` is the item's recorder (fetch already in it)."""

    data: bytes
    presets: Sequence[Preset]
    options: RetouchOptions
    spans: SpanRecorder


@dataclass(frozen=True, slots=True)
class Variant:
    preset: str
    width: int
    height: int
    format: str
    data: bytes
    sha256: str

    @property
    def size(self) -> int:
        return len(self.data)


@dataclass(frozen=True, slots=True)
class Quality:
    subject_coverage: float
    background_whiteness: float
    sharpness: float


@dataclass(slots=True)
class JobResult:
    variants: list[Variant] = field(default_factory=list)
    quality: Quality | None = None
    error: LightboxError | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


def _to_host(a: Array) -> np.ndarray:
    return a.get() if hasattr(a, "get") and not isinstance(a, np.ndarray) else np.asarray(a)


def measure_quality(mask: Array | None, first: Array) -> Quality:
    """Subject coverage of the mask, whiteness of the rendered border, sharpness (var of Laplacian)."""
    import cv2

    img = _to_host(first)
    coverage = 1.0 if mask is None else float((_to_host(mask) > 127).mean())
    rgb = img[..., :3]
    border = np.concatenate([rgb[0], rgb[-1], rgb[:, 0], rgb[:, -1]]).astype(np.float32)
    gray = cv2.cvtColor(np.ascontiguousarray(rgb), cv2.COLOR_RGB2GRAY)
    sharp = float(cv2.Laplacian(gray, cv2.CV_32F).var())
    return Quality(coverage, float(border.mean() / 255.0), sharp)


class _Batch:
    """One batch's jobs and results, and the per-stage bookkeeping shared by all stages."""

    def __init__(self, jobs: Sequence[Job], results: list[JobResult], clock: Callable[[], int]) -> None:
        self.jobs, self.results, self.clock = jobs, results, clock

    def stage(self, name: str, idx: list[int], fn: Callable[[list[int]], list[object]], device: str) -> list[object]:
        """Run ``fn`` over items ``idx``; record one span per item; catch per-item failures."""
        start = self.clock()
        try:
            out = fn(idx)
        except LightboxError as exc:
            out = [exc] * len(idx)
        except Exception as exc:  # a stage bug must not take the batch-mates down with it
            out = [ProcessingFailed(f"{type(exc).__name__}: {exc}", stage=name)] * len(idx)
        end = self.clock()
        for i, o in zip(idx, out, strict=True):
            self.jobs[i].spans.add(name, start, end, batch_size=len(idx), device=device)
            if isinstance(o, LightboxError):
                if not o.stage:
                    o.stage = name
                self.results[i].error = o
        return out


@dataclass(slots=True)
class Decoded:
    """A batch after decode: the images that decoded, by item index (the rest carry errors)."""

    batch: _Batch
    images: dict[int, Array]


class RetouchPipeline:
    """Runs one batch through the injected stages. Build one with ``gpu_kernels.build``."""

    def __init__(self, decoder: Decoder, retoucher: Retoucher, encoder: Encoder,
                 segmenter: Segmenter | None = None, classical: Segmenter | None = None,
                 clock: Callable[[], int] = time.monotonic_ns) -> None:
        """``segmenter`` is the model; ``classical`` the fallback for plain backgrounds, used for
        events that ask for it and for every event when no model is configured."""
        self.decoder, self.retoucher, self.encoder = decoder, retoucher, encoder
        self.segmenter, self.classical = segmenter, classical
        self.clock = clock

    def _segmenter_for(self, options: RetouchOptions) -> Segmenter | None:
        if options.background == "keep":
            return None
        if options.segmentation == "classical" or self.segmenter is None:
            return self.classical
        return self.segmenter

    @property
    def device(self) -> str:
        return self.retoucher.device

    def close(self) -> None:
        self.decoder.close()
        self.encoder.close()
        for seg in (self.segmenter, self.classical):
            if seg is not None:
                seg.close()

    def run_batch(self, jobs: Sequence[Job]) -> list[JobResult]:
        """All stages for one batch; results in input order."""
        return self.finish(self.decode(jobs))

    def decode(self, jobs: Sequence[Job]) -> Decoded:
        """Step 2 alone, so a runner can decode the next batch while this one finishes."""
        batch = _Batch(jobs, [JobResult() for _ in jobs], self.clock)
        # decode once per image, at the size the largest preset needs
        max_side = max((max(p.width, p.height) for j in jobs for p in j.presets), default=None)
        idx = list(range(len(jobs)))
        out = batch.stage("decode", idx,
                          lambda ix: list(self.decoder.decode_batch([jobs[i].data for i in ix], max_side=max_side)),
                          self.decoder.device)
        return Decoded(batch, {i: d for i, d in zip(idx, out, strict=True) if not isinstance(d, LightboxError)})

    def finish(self, decoded: Decoded) -> list[JobResult]:
        """Steps 3-7 for a decoded batch."""
        batch, images = decoded.batch, decoded.images
        jobs, results, stage = batch.jobs, batch.results, batch.stage
        live = [i for i in range(len(jobs)) if i in images]

        # 3. segment, once per image, by the model or the classical fallback (none for "keep")
        masks: dict[int, Array | None] = {i: None for i in live}
        by_segmenter: dict[int, tuple[Segmenter, list[int]]] = {}
        for i in live:
            seg = self._segmenter_for(jobs[i].options)
            if seg is not None:
                by_segmenter.setdefault(id(seg), (seg, []))[1].append(i)
        for seg, seg_idx in by_segmenter.values():
            out = stage("segment", seg_idx, functools.partial(_segment, seg, images), seg.device)
            masks.update({i: m for i, m in zip(seg_idx, out, strict=True) if not isinstance(m, LightboxError)})
        live = [i for i in live if results[i].ok]

        # 4-5. colour + composite, one fused pass per image, grouped by options
        groups: dict[RetouchOptions, list[int]] = defaultdict(list)
        for i in live:
            groups[jobs[i].options].append(i)
        corrected: dict[int, Array] = {}
        def correct(ix: list[int], opts: RetouchOptions) -> list[object]:
            return list(self.retoucher.correct([images[i] for i in ix], [masks[i] for i in ix], opts))

        for opts, idx in groups.items():
            out = stage("correct", idx, functools.partial(correct, opts=opts), self.retoucher.device)
            corrected.update({i: c for i, c in zip(idx, out, strict=True) if not isinstance(c, LightboxError)})
        live = [i for i in live if results[i].ok]

        # 6-7. per preset, one batched render over every image that asked for it, then encode
        live = [i for i in live if i in corrected]
        rendered: dict[tuple[int, str], Array] = {}
        encoded: dict[tuple[int, str], bytes] = {}

        def render_group(ix: list[int], preset: Preset) -> list[object]:
            return list(self.retoucher.render_batch([corrected[i] for i in ix], [masks[i] for i in ix], preset))

        def encode_group(ix: list[int], preset: Preset) -> list[object]:
            return list(per_item(lambda i: self.encoder.encode(rendered[i, preset.name], preset), ix))
        for preset in dict.fromkeys(p for i in live for p in jobs[i].presets):
            idx = [i for i in live if preset in jobs[i].presets and results[i].ok]
            if not idx:
                continue
            out = stage(f"preset:{preset.name}", idx, functools.partial(render_group, preset=preset),
                        self.retoucher.device)
            done = [(i, r) for i, r in zip(idx, out, strict=True) if not isinstance(r, LightboxError)]
            rendered.update({(i, preset.name): r for i, r in done})
            blobs = stage(f"encode:{preset.name}", [i for i, _ in done], functools.partial(encode_group, preset=preset),
                          self.encoder.device)
            encoded.update({(i, preset.name): d for (i, _), d in zip(done, blobs, strict=True)
                            if isinstance(d, bytes)})
        for i in live:
            if not results[i].ok:
                continue
            for preset in jobs[i].presets:
                img, data = rendered[i, preset.name], encoded[i, preset.name]
                h, w = img.shape[:2]
                results[i].variants.append(Variant(preset.name, int(w), int(h), preset.format, data,
                                                   hashlib.sha256(data).hexdigest()))
            results[i].quality = measure_quality(masks[i], rendered[i, jobs[i].presets[0].name])
        return results



def _segment(seg: Segmenter, images: Mapping[int, Array], idx: list[int]) -> list[object]:
    return list(seg.segment_batch([images[i] for i in idx]))
