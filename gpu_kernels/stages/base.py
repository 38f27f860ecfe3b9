"""The stage framework: a batch context, the :class:`Stage` base and the loop that runs them.

A stage is a small object with a ``name``, a ``lane`` ("decode", "device" or "output") and a
``device``; :meth:`Stage.steps` yields the :class:`Step` s it wants to run over the batch (one
per group of items that share a kernel launch: a preset, a segmenter, a set of options). The
framework, not the stage, then

* runs each step over the items of the batch that are still alive (no error yet),
* records one span per item (the step's name, its batch size and device),
* turns a :class:`~schemas.errors.LightboxError` returned for an item into that item's error
  (its ``stage`` filled in);
* when a step's call raises (a ``LightboxError`` or any other exception) over several items,
  runs the halves again (bisection) until the error sits on the item(s) that cause it alone:
  they fail with their own reason (``PROCESSING_FAILED`` for a non-Lightbox exception), the
  batch-mates keep their values — one bad image never takes good ones with it,
* hands every success to the step's ``keep``.

Only a :class:`~schemas.errors.FatalError` (e.g. the output store is gone) passes through.

So a new stage is one module (kernel + CPU twin) and one line in the pipeline's stage list.
Pure: no Kafka, no Faust.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from gpu_kernels.backends import Array, RetouchOptions
from gpu_kernels.presets import Preset
from gpu_kernels.spans import SpanRecorder
from schemas.errors import FatalError, LightboxError, ProcessingFailed

__all__ = [
    "LANES",
    "BatchContext",
    "Compliance",
    "Job",
    "JobResult",
    "Lane",
    "Quality",
    "Stage",
    "Step",
    "Variant",
    "run_lane",
    "to_host",
]

log = logging.getLogger(__name__)

Lane = Literal["decode", "device", "output"]
LANES: tuple[Lane, ...] = ("decode", "device", "output")


@dataclass(slots=True)
class Job:
    """One image to process. ``spans`` is the item's recorder (fetch already in it)."""

    data: bytes
    presets: Sequence[Preset]
    options: RetouchOptions
    spans: SpanRecorder


@dataclass(frozen=True, slots=True)
class Compliance:
    """A variant against its marketplace's rules (see :mod:`gpu_kernels.stages.compliance`)."""

    white_border: float  # share of border pixels that are exactly 255 (RGB) / fully transparent
    fill: float          # max(box_w / width, box_h / height) of the subject on the canvas
    cut_off: bool        # the subject touches the source photo's or the canvas' edge
    min_side_ok: bool    # the variant's and the source's sides meet the preset's minimum
    compliant: bool


@dataclass(frozen=True, slots=True)
class Variant:
    preset: str
    width: int
    height: int
    format: str
    data: bytes
    sha256: str
    compliance: Compliance | None = None

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


def to_host(a: Array) -> np.ndarray:
    """A NumPy view/copy of a NumPy or CuPy array."""
    return a.get() if hasattr(a, "get") and not isinstance(a, np.ndarray) else np.asarray(a)


@dataclass(slots=True)
class BatchContext:
    """Everything the stages of one batch read and write, by item index (``jobs`` order).

    ``rendered``/``encoded``/``compliance`` are keyed by ``(item, preset name)``. ``memo`` is for
    values one stage computes and a later one reuses (e.g. the subject's box on a canvas before a
    shadow darkens it): key it by ``(stage name, ...)``.
    """

    jobs: Sequence[Job]
    results: list[JobResult]
    clock: Callable[[], int]
    images: dict[int, Array] = field(default_factory=dict)
    masks: dict[int, Array | None] = field(default_factory=dict)
    corrected: dict[int, Array] = field(default_factory=dict)
    rendered: dict[tuple[int, str], Array] = field(default_factory=dict)
    encoded: dict[tuple[int, str], bytes] = field(default_factory=dict)
    compliance: dict[tuple[int, str], Compliance] = field(default_factory=dict)
    memo: dict[tuple[Any, ...], Any] = field(default_factory=dict)
    isolation_calls: int = 0  # extra step calls made to isolate a raising item (see run_step)
    handoff: Any = None  # the event the last lane to run recorded on its stream (None on the CPU)

    def __len__(self) -> int:
        return len(self.jobs)

    def alive(self) -> list[int]:
        """Items without an error so far, in batch order."""
        return [i for i, r in enumerate(self.results) if r.ok]

    def presets(self) -> list[Preset]:
        """Every preset asked for by a live item, first-asked first."""
        return list(dict.fromkeys(p for i in self.alive() for p in self.jobs[i].presets))

    def asking(self, preset: Preset) -> list[int]:
        """Live items that asked for ``preset``."""
        return [i for i in self.alive() if preset in self.jobs[i].presets]

    def twins(self, order: Sequence[Preset], preset: Preset,
              key: Callable[[Preset], Hashable]) -> tuple[list[int], dict[int, str]]:
        """The live items asking for ``preset``, split: ``(own, twins)``. ``twins``: those that
        also asked for a preset before it in ``order`` (the order a stage runs its steps in) with
        the same ``key`` (:attr:`Preset.look`, :attr:`Preset.encoding`), item → that preset's
        name, whose result serves both; ``own``: the others, in batch order."""
        k = key(preset)
        before = [p for p in order[:order.index(preset)] if key(p) == k]
        own: list[int] = []
        found: dict[int, str] = {}
        for i in self.asking(preset):
            twin = next((p for p in before if p in self.jobs[i].presets), None)
            if twin is None:
                own.append(i)
            else:
                found[i] = twin.name
        return own, found

    def fail(self, i: int, exc: LightboxError, stage: str) -> None:
        if not exc.stage:
            exc.stage = stage
        if self.results[i].ok:
            self.results[i].error = exc

    def finalize(self) -> list[JobResult]:
        """Variants for every item that came through, in the order its presets were asked."""
        for i, res in enumerate(self.results):
            if not res.ok or res.variants:
                continue
            for preset in self.jobs[i].presets:
                key = (i, preset.name)
                if key not in self.encoded:  # no encode stage ran for it: the pipeline is incomplete
                    self.fail(i, ProcessingFailed(f"no encoded bytes for preset {preset.name!r}"), "finalize")
                    res.variants.clear()
                    break
                img, data = self.rendered[key], self.encoded[key]
                h, w = img.shape[:2]
                res.variants.append(Variant(preset.name, int(w), int(h), preset.format, data,
                                            hashlib.sha256(data).hexdigest(), self.compliance.get(key)))
        return self.results


@dataclass(frozen=True, slots=True)
class Step:
    """One call of a stage over some items: ``run(items)`` returns one value or
    :class:`LightboxError` per item, or raises (then the framework runs it again over halves of
    ``items`` to find the item that makes it raise: ``run`` must give an item the same result
    whichever batch-mates it runs with); ``keep(item, value)`` stores a success in the context.
    ``name`` is the span's name."""

    name: str
    device: str
    items: Sequence[int]
    run: Callable[[list[int]], Sequence[object]]
    keep: Callable[[int, Any], None]


class Stage:
    """Base of the pipeline's stages. Subclasses set ``name``/``lane``/``device`` and either
    override :meth:`apply` + :meth:`keep` (one step over every live item that :meth:`wants`) or
    :meth:`steps` (several steps, e.g. one per preset)."""

    name: str = "stage"
    lane: Lane = "device"
    device: str = "cpu"

    def steps(self, ctx: BatchContext) -> Iterable[Step]:
        idx = [i for i in ctx.alive() if self.wants(ctx, i)]
        if idx:
            yield Step(self.name, self.device, idx, lambda ix: self.apply(ctx, ix),
                       lambda i, v: self.keep(ctx, i, v))

    def wants(self, ctx: BatchContext, i: int) -> bool:
        return True

    def apply(self, ctx: BatchContext, idx: list[int]) -> Sequence[object]:
        raise NotImplementedError

    def keep(self, ctx: BatchContext, i: int, value: Any) -> None:
        """Store one item's success; the default discards it."""

    def close(self) -> None:
        """Release what the stage holds (the injected backends are closed by the pipeline)."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, lane={self.lane!r}, device={self.device!r})"


def _call(step: Step, idx: list[int]) -> list[object]:
    """``step.run(idx)``, checked: one result per item, else it raises."""
    out = step.run(idx)
    if len(out) != len(idx):
        raise ProcessingFailed(f"returned {len(out)} results for {len(idx)} items")
    return list(out)


def _bisect(step: Step, idx: list[int], exc: Exception, calls: list[int]) -> list[tuple[object, int]]:
    """Results of ``step`` over ``idx``, whose one call raised ``exc``: each half is run again on
    its own, down to single items, so only the item(s) that make the step raise get the error;
    every other item keeps its value. ``(result, size of the call that settled it)`` per item."""
    if len(idx) == 1:
        err = exc if isinstance(exc, LightboxError) else ProcessingFailed(
            f"{type(exc).__name__}: {exc}", stage=step.name)
        return [(err, 1)]
    mid = len(idx) // 2
    out: list[tuple[object, int]] = []
    for half in (idx[:mid], idx[mid:]):
        calls[0] += 1
        try:
            res = _call(step, half)
        except FatalError:
            raise
        except Exception as sub:
            out += _bisect(step, half, sub, calls)
        else:
            out += [(r, len(half)) for r in res]
    return out


def run_step(ctx: BatchContext, step: Step) -> None:
    """Run one step over its live items; spans and per-item errors as the module says.

    A call that raises (a :class:`~schemas.errors.LightboxError` or any other exception, except
    :class:`~schemas.errors.FatalError`) over several items is not taken as every item's failure:
    the items are bisected and each half run again, so the error lands on the item(s) that cause
    it alone, with its own reason, and the batch-mates go on with their values - the same outcome
    whatever the batch's grouping. Each item's span covers the whole step (retries included); its
    ``batch_size`` is the size of the call that settled the item.
    """
    idx = [i for i in step.items if ctx.results[i].ok]
    if not idx:
        return
    start = ctx.clock()
    settled: list[tuple[object, int]]
    calls = [1]
    try:
        settled = [(r, len(idx)) for r in _call(step, idx)]
    except FatalError:
        raise
    except Exception as exc:  # a per-item bug must not take the batch-mates with it
        settled = _bisect(step, idx, exc, calls)
        bad = sum(isinstance(r, LightboxError) for r, _ in settled)
        if len(idx) > 1:
            log.warning("step %s raised %s over %d items; isolated in %d calls, %d item(s) failed",
                        step.name, type(exc).__name__, len(idx), calls[0], bad)
    end = ctx.clock()
    ctx.isolation_calls += calls[0] - 1
    for i, (o, size) in zip(idx, settled, strict=True):
        ctx.jobs[i].spans.add(step.name, start, end, batch_size=size, device=step.device)
        if isinstance(o, LightboxError):
            ctx.fail(i, o, step.name)
            continue
        try:
            step.keep(i, o)
        except LightboxError as exc:
            ctx.fail(i, exc, step.name)
        except FatalError:
            raise
        except Exception as exc:
            ctx.fail(i, ProcessingFailed(f"{type(exc).__name__}: {exc}", stage=step.name), step.name)


def run_lane(ctx: BatchContext, stages: Sequence[Stage], lane: Lane) -> None:
    """Every stage of ``lane``, in list order. A stage whose ``steps`` itself raises fails the
    items it was still to run over (the live ones), not the batch's other lanes."""
    for stage in stages:
        if stage.lane != lane:
            continue
        steps: Iterator[Step] | None = None
        while True:
            try:
                steps = steps or iter(stage.steps(ctx))
                step = next(steps)
            except StopIteration:
                break
            except FatalError:
                raise
            except Exception as exc:
                err = exc if isinstance(exc, LightboxError) else ProcessingFailed(
                    f"{type(exc).__name__}: {exc}", stage=stage.name)
                for i in ctx.alive():
                    ctx.fail(i, err, stage.name)
                break
            run_step(ctx, step)
