"""Quality measures (span ``quality``): subject coverage of the mask, whiteness of the first
variant's border, sharpness (variance of the Laplacian of its luminance). Output lane.

Host canvases are measured on the host, one item at a time; device canvases on the device for
the whole batch, with only the counts copied back (:mod:`gpu_kernels.stages.measure`, which also
keeps the compliance stage's counts, so the batch's measures cost one copy to the host)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gpu_kernels.backends import Array
from gpu_kernels.stages.base import BatchContext, Lane, Quality, Stage, to_host
from gpu_kernels.stages.measure import Counts, batch_counts, host_counts, quality_of
from schemas.errors import per_item

__all__ = ["QualityStage", "measure_quality", "quality_from"]


def quality_from(counts: Counts) -> Quality:
    return Quality(*quality_of(counts))


def measure_quality(mask: Array | None, first: Array) -> Quality:
    """One item's quality from its mask (None: coverage 1) and first variant (copied to the host)."""
    return quality_from(host_counts(None if mask is None else to_host(mask), [to_host(first)], variants=False))


class QualityStage(Stage):
    """``xp``: the array module of the device path (default: the canvases' own, CuPy)."""

    name = "quality"
    lane: Lane = "output"
    device = "cpu"

    def __init__(self, xp: Any = None) -> None:
        self.xp = xp

    def apply(self, ctx: BatchContext, idx: list[int]) -> Sequence[object]:
        counts = batch_counts(ctx, idx, self.xp)
        return per_item(lambda i: quality_from(counts[i]), idx)

    def keep(self, ctx: BatchContext, i: int, value: Any) -> None:
        ctx.results[i].quality = value
