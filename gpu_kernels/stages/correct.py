"""Colour + composite (docs/architecture.md, steps 4-5): one fused pass per image, one step per set of options.

The mask is known here (segment runs first), so each item's subject box, and with it every
preset's crop, is known before colour correction: when the retoucher offers
``correction_window`` (both backends; ``RetouchConfig.crop_to_presets``), only the part of the
image that the item's presets will read is coloured. The window is kept in
``ctx.memo[WINDOW, item]`` and the render stage crops the mask alike.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

from gpu_kernels.backends import Array, Retoucher, RetouchOptions
from gpu_kernels.stages.base import BatchContext, Lane, Stage, Step

__all__ = ["WINDOW", "CorrectStage", "window_of"]

WINDOW = "correct:window"  # memo key: (WINDOW, item) -> (x0, y0, x1, y1) of ctx.corrected[item]


def window_of(ctx: BatchContext, i: int) -> tuple[int, int, int, int] | None:
    """The part of item ``i``'s image that ``ctx.corrected[i]`` holds (None: all of it)."""
    win: tuple[int, int, int, int] | None = ctx.memo.get((WINDOW, i))
    return win


def crop_mask(mask: Array | None, window: tuple[int, int, int, int] | None) -> Array | None:
    """``mask`` cut to ``window`` (the mask that goes with a windowed corrected image)."""
    if mask is None or window is None:
        return mask
    x0, y0, x1, y1 = window
    return mask[y0:y1, x0:x1]


class CorrectStage(Stage):
    name = "correct"

    def __init__(self, retoucher: Retoucher, lane: Lane | None = None) -> None:
        self.retoucher, self.device = retoucher, retoucher.device
        # on a GPU in the device lane, where the image already is; the CPU twin in the output
        # lane beside render: the device lane is one thread, and on a CPU it then holds only the
        # model and its mask refinement, while the output lane's threads colour other batches
        self.lane: Lane = lane or ("device" if self.device == "gpu" else "output")

    def steps(self, ctx: BatchContext) -> Iterable[Step]:
        groups: dict[RetouchOptions, list[int]] = defaultdict(list)
        for i in ctx.alive():
            groups[ctx.jobs[i].options].append(i)
        for opts, idx in groups.items():
            yield Step(self.name, self.device, idx,
                       lambda ix, o=opts: self._correct(ctx, ix, o),  # type: ignore[misc]
                       lambda i, c: self._keep(ctx, i, c))

    def _correct(self, ctx: BatchContext, idx: list[int], options: RetouchOptions) -> Sequence[object]:
        images = [ctx.images[i] for i in idx]
        masks = [ctx.masks.get(i) for i in idx]
        window = getattr(self.retoucher, "correction_window", None)
        if window is None:
            return self.retoucher.correct(images, masks, options)
        wins = []
        for i, image, mask in zip(idx, images, masks, strict=True):
            try:
                win = window(image, mask, ctx.jobs[i].presets)
            except Exception:  # a bad image: correct() reports it for this item alone
                win = None
            wins.append(win)
            if win is not None:
                ctx.memo[WINDOW, i] = win
        corrected: Sequence[object] = self.retoucher.correct(images, masks, options,
                                                             windows=wins)  # type: ignore[call-arg]
        return corrected

    @staticmethod
    def _keep(ctx: BatchContext, i: int, corrected: Any) -> None:
        ctx.corrected[i] = corrected
