"""Decode (docs/architecture.md, step 2): once per image, at the size the largest preset needs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gpu_kernels.backends import Decoder
from gpu_kernels.stages.base import BatchContext, Lane, Stage

__all__ = ["DecodeStage"]


class DecodeStage(Stage):
    name = "decode"
    lane: Lane = "decode"

    def __init__(self, decoder: Decoder) -> None:
        self.decoder, self.device = decoder, decoder.device

    def apply(self, ctx: BatchContext, idx: list[int]) -> Sequence[object]:
        max_side = max((max(p.width, p.height) for i in idx for p in ctx.jobs[i].presets), default=None)
        return self.decoder.decode_batch([ctx.jobs[i].data for i in idx], max_side=max_side)

    def keep(self, ctx: BatchContext, i: int, value: Any) -> None:
        ctx.images[i] = value
