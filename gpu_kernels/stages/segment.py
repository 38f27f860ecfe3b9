"""Segment (docs/architecture.md, step 3): once per image, by the model or the classical fallback.

Events that ask for ``background="keep"`` are not segmented (their mask is None); events that
ask for ``segmentation="classical"``, and every event when no model is configured, go to the
classical segmenter. One step (span ``segment``) per segmenter.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from gpu_kernels.backends import RetouchOptions, Segmenter
from gpu_kernels.stages.base import BatchContext, Stage, Step

__all__ = ["SegmentStage"]


class SegmentStage(Stage):
    name = "segment"

    def __init__(self, model: Segmenter | None, classical: Segmenter | None) -> None:
        self.model, self.classical = model, classical
        first = model or classical
        self.device = first.device if first is not None else "cpu"

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
            yield Step(self.name, seg.device, idx,
                       lambda ix, s=seg: s.segment_batch([ctx.images[i] for i in ix]),  # type: ignore[misc]
                       lambda i, m: self._keep(ctx, i, m))

    @staticmethod
    def _keep(ctx: BatchContext, i: int, mask: Any) -> None:
        ctx.masks[i] = mask
