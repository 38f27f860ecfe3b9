"""Colour + composite (DESIGN.md steps 4-5): one fused pass per image, one step per set of options."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from gpu_kernels.backends import Retoucher, RetouchOptions
from gpu_kernels.stages.base import BatchContext, Stage, Step

__all__ = ["CorrectStage"]


class CorrectStage(Stage):
    name = "correct"

    def __init__(self, retoucher: Retoucher) -> None:
        self.retoucher, self.device = retoucher, retoucher.device

    def steps(self, ctx: BatchContext) -> Iterable[Step]:
        groups: dict[RetouchOptions, list[int]] = defaultdict(list)
        for i in ctx.alive():
            groups[ctx.jobs[i].options].append(i)
        for opts, idx in groups.items():
            yield Step(self.name, self.device, idx,
                       lambda ix, o=opts: self.retoucher.correct(  # type: ignore[misc]
                           [ctx.images[i] for i in ix], [ctx.masks.get(i) for i in ix], o),
                       lambda i, c: self._keep(ctx, i, c))

    @staticmethod
    def _keep(ctx: BatchContext, i: int, corrected: Any) -> None:
        ctx.corrected[i] = corrected
