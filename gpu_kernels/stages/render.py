"""Render (docs/architecture.md, step 6): per preset, one batched crop + resize + pad + sharpen over every
image that asked for it (span ``preset:<name>``); device lane on a GPU, output lane on the CPU.
A preset with the same :attr:`~gpu_kernels.presets.Preset.look` as one before it in the batch
(two marketplaces that ask for the same canvas) takes that canvas instead of rendering it again.
When the correct stage coloured only a window of an image, the mask is cropped to the same window
(the subject box and the placement move with it, so the canvas shows the same pixels)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from gpu_kernels.backends import Retoucher
from gpu_kernels.presets import Preset
from gpu_kernels.stages.base import BatchContext, Lane, Stage, Step
from gpu_kernels.stages.correct import crop_mask, window_of

__all__ = ["RenderStage"]


class RenderStage(Stage):
    name = "preset"

    def __init__(self, retoucher: Retoucher, lane: Lane | None = None) -> None:
        self.retoucher, self.device = retoucher, retoucher.device
        # on a GPU next to the correct stage it reads from; the CPU twin runs in the output lane's
        # threads, so the one device thread does only segment and correct and several batches
        # render at once (the backfill tier's in its own, lower-priority threads)
        self.lane: Lane = lane or ("device" if self.device == "gpu" else "output")

    def steps(self, ctx: BatchContext) -> Iterable[Step]:
        order = ctx.presets()
        for preset in order:
            own, twins = ctx.twins(order, preset, lambda p: p.look)
            if own:
                yield Step(f"preset:{preset.name}", self.device, own,
                           lambda ix, p=preset: self.retoucher.render_batch(  # type: ignore[misc]
                               [ctx.corrected[i] for i in ix],
                               [crop_mask(ctx.masks.get(i), window_of(ctx, i)) for i in ix], p),
                           lambda i, img, p=preset: self._keep(ctx, i, p, img))  # type: ignore[misc]
            if twins:  # the canvas of an earlier preset with the same look, not rendered again
                yield Step(f"preset:{preset.name}", self.device, list(twins),
                           lambda ix, t=twins: [ctx.rendered[i, t[i]] for i in ix],  # type: ignore[misc]
                           lambda i, img, p=preset: self._keep(ctx, i, p, img))  # type: ignore[misc]

    @staticmethod
    def _keep(ctx: BatchContext, i: int, preset: Preset, image: Any) -> None:
        ctx.rendered[i, preset.name] = image
