"""Quality measures (span ``quality``): subject coverage of the mask, whiteness of the first
variant's border, sharpness (variance of the Laplacian of its luminance). Output lane, on the host."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from gpu_kernels.backends import Array
from gpu_kernels.stages.base import BatchContext, Lane, Quality, Stage, to_host
from schemas.errors import per_item

__all__ = ["QualityStage", "measure_quality"]


def measure_quality(mask: Array | None, first: Array) -> Quality:
    import cv2

    img = to_host(first)
    coverage = 1.0 if mask is None else float((to_host(mask) > 127).mean())
    rgb = img[..., :3]
    border = np.concatenate([rgb[0], rgb[-1], rgb[:, 0], rgb[:, -1]]).astype(np.float32)
    gray = cv2.cvtColor(np.ascontiguousarray(rgb), cv2.COLOR_RGB2GRAY)
    sharp = float(cv2.Laplacian(gray, cv2.CV_32F).var())
    return Quality(coverage, float(border.mean() / 255.0), sharp)


class QualityStage(Stage):
    name = "quality"
    lane: Lane = "output"
    device = "cpu"

    def apply(self, ctx: BatchContext, idx: list[int]) -> Sequence[object]:
        return per_item(lambda i: measure_quality(ctx.masks.get(i), ctx.rendered[i, ctx.jobs[i].presets[0].name]), idx)

    def keep(self, ctx: BatchContext, i: int, value: Any) -> None:
        ctx.results[i].quality = value
