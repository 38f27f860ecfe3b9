"""Encode (docs/architecture.md, step 7): per preset (span ``encode:<name>``).

The stage's lane follows the encoder. A GPU encoder that splits its work
(:class:`DeviceEncoder`, e.g. :class:`~gpu_kernels.codec.encode.NvJpegEncoder`) gets two
stages: ``EncodeStage(encoder, "device")`` in the device lane, next to the render it reads
from, encodes what the GPU takes (nvJPEG: large RGB JPEGs), a preset's images in one call;
``EncodeStage(encoder, "host")`` in the output lane encodes the rest on the CPU (PNG, WebP,
small JPEGs: libpng, libwebp, libjpeg-turbo after a device→host copy), so the device thread
never waits for a CPU encode. A CPU encoder runs whole in the output lane (``"all"``); so does
a GPU encoder without the split, in the device lane. A preset with the same
:attr:`~gpu_kernels.presets.Preset.encoding` as one before it in the batch takes that one's
bytes (in the host half when the stage is split).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Literal, Protocol, runtime_checkable

from gpu_kernels.backends import Array, Encoder
from gpu_kernels.presets import Preset
from gpu_kernels.stages.base import BatchContext, Lane, Stage, Step
from schemas.errors import ProcessingFailed, per_item

__all__ = ["DeviceEncoder", "EncodePart", "EncodeStage", "encode_stages"]

EncodePart = Literal["all", "device", "host"]


@runtime_checkable
class DeviceEncoder(Protocol):
    """An encoder whose device half and host half the pipeline runs in different lanes."""

    device: str
    version: str

    def on_device(self, image: Array, preset: Preset) -> bool:
        """Whether the device half encodes ``image`` for ``preset``."""
        ...

    def encode_device(self, images: Sequence[Array], preset: Preset) -> Sequence[bytes | ProcessingFailed]:
        """The device half: one call for a preset's images (each ``on_device``)."""
        ...

    def encode(self, image: Array, preset: Preset) -> bytes: ...

    def close(self) -> None: ...


def encode_stages(encoder: Encoder) -> list[EncodeStage]:
    """The encode stage(s) for ``encoder``: a device half and a host half for a GPU
    :class:`DeviceEncoder`, else one stage."""
    if encoder.device == "gpu" and isinstance(encoder, DeviceEncoder):
        return [EncodeStage(encoder, "device"), EncodeStage(encoder, "host")]
    return [EncodeStage(encoder)]


class EncodeStage(Stage):
    """``part``: ``"device"`` (the images :meth:`DeviceEncoder.on_device` takes, batched per
    preset, device lane), ``"host"`` (every image not encoded yet, on the CPU, output lane) or
    ``"all"`` (``encoder.encode`` for every image: output lane for a CPU encoder, device lane for
    a GPU one)."""

    name = "encode"

    def __init__(self, encoder: Encoder, part: EncodePart = "all") -> None:
        if part != "all" and not isinstance(encoder, DeviceEncoder):
            raise ValueError(f"EncodeStage: part {part!r} needs an encoder with a device and a host half "
                             f"(on_device, encode_device); {type(encoder).__name__} has not")
        self.encoder, self.part = encoder, part
        if part == "all":
            self.device = encoder.device
            self.lane: Lane = "device" if encoder.device == "gpu" else "output"
        else:
            self.device = encoder.device if part == "device" else "cpu"
            self.lane = "device" if part == "device" else "output"

    def steps(self, ctx: BatchContext) -> Iterable[Step]:
        order = ctx.presets()
        for preset in order:
            own, twins = ctx.twins(order, preset, lambda p: p.encoding)
            items = [i for i in own if self._takes(ctx, i, preset)]
            if items:
                yield Step(f"encode:{preset.name}", self.device, items,
                           lambda ix, p=preset: self._encode(ctx, ix, p),  # type: ignore[misc]
                           lambda i, data, p=preset: ctx.encoded.__setitem__((i, p.name), data))  # type: ignore[misc]
            if twins and self.part != "device":  # the bytes of an earlier preset with the same encoding
                yield Step(f"encode:{preset.name}", self.device, list(twins),
                           lambda ix, t=twins: [ctx.encoded[i, t[i]] for i in ix],  # type: ignore[misc]
                           lambda i, data, p=preset: ctx.encoded.__setitem__((i, p.name), data))  # type: ignore[misc]

    def _takes(self, ctx: BatchContext, i: int, preset: Preset) -> bool:
        key = (i, preset.name)
        if self.part == "all":
            return True
        if self.part == "host":
            return key not in ctx.encoded
        return key in ctx.rendered and key not in ctx.encoded and bool(
            self.encoder.on_device(ctx.rendered[key], preset))  # type: ignore[attr-defined]

    def _encode(self, ctx: BatchContext, idx: list[int], preset: Preset) -> Sequence[object]:
        if self.part == "device":
            return self.encoder.encode_device(  # type: ignore[attr-defined,no-any-return]
                [ctx.rendered[i, preset.name] for i in idx], preset)
        # "host": what the device half left (the CPU formats; encode routes as on_device says)
        return per_item(lambda i: self.encoder.encode(ctx.rendered[i, preset.name], preset), idx)
