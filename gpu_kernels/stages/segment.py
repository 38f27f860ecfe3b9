"""Segment (docs/architecture.md, step 3): once per image, by the model or the classical fallback.

Events that ask for ``background="keep"`` are not segmented (their mask is None); events that
ask for ``segmentation="classical"``, and every event when no model is configured, go to the
classical segmenter. One step (span ``segment``) per segmenter.

With ``refine_later`` (the default stage list), a model on the CPU that offers ``infer_batch``
(:class:`~gpu_kernels.segment.bucketed.BucketedSegmenter`) runs only up to its probabilities
here: the item's mask is an :class:`~gpu_kernels.segment.bucketed.Unrefined` until
:class:`RefineStage` (span ``refine``) turns it into the alpha, in the output lane's threads,
so the device thread goes back to the model while other threads refine. On a GPU the refinement
stays in the segment step, where the probabilities already are.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from gpu_kernels.backends import ModelSegmenter, RetouchOptions, Segmenter
from gpu_kernels.segment.bucketed import Unrefined, output_work_pixels
from gpu_kernels.stages.base import BatchContext, Lane, Stage, Step

__all__ = ["RefineStage", "SegmentStage"]


class SegmentStage(Stage):
    name = "segment"

    def __init__(self, model: Segmenter | None, classical: Segmenter | None, *, refine_later: bool = False) -> None:
        self.model, self.classical = model, classical
        first = model or classical
        self.device = first.device if first is not None else "cpu"
        self.refine_later = refine_later

    def segmenter_for(self, options: RetouchOptions) -> Segmenter | None:
        if options.background == "keep":
            return None
        if options.segmentation == "classical" or self.model is None:
            return self.classical
        return self.model

    def steps(self, ctx: BatchContext) -> Iterable[Step]:
        groups: dict[int, tuple[Segmenter, list[int]]] = {}
        for i in ctx.alive():
            ctx.masks[i] = None
            seg = self.segmenter_for(ctx.jobs[i].options)
            if seg is not None:
                groups.setdefault(id(seg), (seg, []))[1].append(i)
        for seg, idx in groups.values():
            later = self.refine_later and seg.device == "cpu"  # a model's refinement runs in RefineStage
            run = seg.infer_batch if later and isinstance(seg, ModelSegmenter) else seg.segment_batch
            yield Step(self.name, seg.device, idx,
                       lambda ix, r=run: r([ctx.images[i] for i in ix]),  # type: ignore[misc]
                       lambda i, m: _keep_mask(ctx, i, m))


class RefineStage(Stage):
    """The mask refinement of the items :class:`SegmentStage` left :class:`Unrefined` (none when
    it refines in its own step): one step per segmenter, each item's alpha from its probability
    and its image, in ``lane`` (the output lane on a CPU, beside correct and render), refined at
    no more pixels than the item's presets reach (:func:`~gpu_kernels.segment.bucketed.output_work_pixels`:
    a 12 MP photo for 800² and 1080x1440 canvases is refined at ~1-2 MP, then enlarged)."""

    name = "refine"

    def __init__(self, lane: Lane = "output") -> None:
        self.lane = lane

    def steps(self, ctx: BatchContext) -> Iterable[Step]:
        groups: dict[int, tuple[str, list[int]]] = {}
        for i in ctx.alive():
            mask = ctx.masks.get(i)
            if isinstance(mask, Unrefined):
                groups.setdefault(id(mask.segmenter), (mask.segmenter.device, []))[1].append(i)
        for device, idx in groups.values():
            yield Step(self.name, device, idx,
                       lambda ix: _refined(ctx, ix),
                       lambda i, m: _keep_mask(ctx, i, m))


def _refined(ctx: BatchContext, idx: list[int]) -> list[Any]:
    """The items' alphas (one segmenter's), each refined at no more pixels than its presets'
    canvases reach, in one :meth:`~gpu_kernels.segment.bucketed.BucketedSegmenter.refine_batch`."""
    masks = [ctx.masks[i] for i in idx]
    todo = [m for m in masks if isinstance(m, Unrefined)]
    assert todo and len(todo) == len(masks)
    limits = []
    for i, m in zip(idx, todo, strict=True):
        h, w = ctx.images[i].shape[:2]
        limits.append(output_work_pixels(m.prob, h, w, [(p.width, p.height, p.fill) for p in ctx.jobs[i].presets]))
    alphas: list[Any] = todo[0].segmenter.refine_batch([m.prob for m in todo], [ctx.images[i] for i in idx], limits)
    return alphas


def _keep_mask(ctx: BatchContext, i: int, mask: Any) -> None:
    ctx.masks[i] = mask
