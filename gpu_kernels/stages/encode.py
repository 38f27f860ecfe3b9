"""Encode (docs/architecture.md, step 7): per preset (span ``encode:<name>``).

The stage's lane follows the encoder: a GPU encoder (nvJPEG) runs in the device lane, next to
the render it reads from; the CPU encoder runs in the output lane, so the device never waits
for libjpeg/libpng/libwebp.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from gpu_kernels.backends import Encoder
from gpu_kernels.presets import Preset
from gpu_kernels.stages.base import BatchContext, Lane, Stage, Step
from schemas.errors import per_item

__all__ = ["EncodeStage"]


class EncodeStage(Stage):
    name = "encode"

    def __init__(self, encoder: Encoder) -> None:
        self.encoder, self.device = encoder, encoder.device
        self.lane: Lane = "device" if encoder.device == "gpu" else "output"

    def steps(self, ctx: BatchContext) -> Iterable[Step]:
        for preset in ctx.presets():
            yield Step(f"encode:{preset.name}", self.device, ctx.asking(preset),
                       lambda ix, p=preset: self._encode(ctx, ix, p),  # type: ignore[misc]
                       lambda i, data, p=preset: ctx.encoded.__setitem__((i, p.name), data))  # type: ignore[misc]

    def _encode(self, ctx: BatchContext, idx: list[int], preset: Preset) -> Sequence[object]:
        return per_item(lambda i: self.encoder.encode(ctx.rendered[i, preset.name], preset), idx)
