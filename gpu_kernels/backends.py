"""The small interfaces every stage implementation satisfies (CPU twin and GPU alike).

The pipeline (``gpu_kernels.pipeline``) only talks to these. A backend is chosen once, from
settings, by :func:`agents.wiring.build_pipeline`; never deep in a call path.

Per-item failures are returned, not raised: a batch method returns, for each input, either
its result or the :class:`~schemas.errors.LightboxError` that item failed with, so one bad
image never fails its batch-mates.

Every backend carries ``device`` ("cpu" or "gpu"), ``version`` (a short string that changes
when its output may change; it goes into logs and the model version of output events) and
``close()`` (release what it holds; the pipeline calls it once, at shutdown).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol, runtime_checkable

from gpu_kernels.array import Array
from gpu_kernels.presets import Preset
from schemas.errors import LightboxError

if TYPE_CHECKING:
    from gpu_kernels.segment.bucketed import Unrefined

__all__ = [
    "Array",
    "Decoder",
    "Encoder",
    "ModelSegmenter",
    "RetouchOptions",
    "Retoucher",
    "Segmenter",
]


@dataclass(frozen=True, slots=True)
class RetouchOptions:
    background: Literal["white", "transparent", "keep"] = "white"
    lighting: Literal["auto", "off"] = "auto"
    segmentation: Literal["auto", "model", "classical"] = "auto"  # auto: the model when configured


@runtime_checkable
class Decoder(Protocol):
    device: str
    version: str

    def decode_batch(
        self, blobs: Sequence[bytes], *, max_side: int | None = None
    ) -> list[Array | LightboxError]:
        """Decode each blob to ``(H, W, 3|4)`` uint8 RGB(A), EXIF orientation applied.

        ``max_side`` is the largest output side any requested preset needs; a decoder may
        decode at reduced size as long as the result's longer side stays >= ``max_side``
        (or is the full image). Guards (byte size, header pixel count) run before decoding.
        """
        ...

    def close(self) -> None: ...


@runtime_checkable
class Segmenter(Protocol):
    device: str
    version: str

    def segment_batch(self, images: Sequence[Array]) -> list[Array | LightboxError]:
        """Foreground alpha ``(H, W)`` uint8 per image, same H and W as the image; an image that
        cannot be segmented (bad shape or dtype) gets its :class:`LightboxError` in its place."""
        ...

    def close(self) -> None: ...


@runtime_checkable
class ModelSegmenter(Segmenter, Protocol):
    """A segmenter that runs a model (every runtime's, ``gpu_kernels.segment.bucketed.BucketedSegmenter``):
    what the pipeline and the runtime gate use beyond :class:`Segmenter`."""

    model_s: float  # wall seconds spent inside the model so far (the model alone)
    streams: int  # images one call runs side by side (1: one at a time)

    def infer_batch(self, images: Sequence[Array]) -> list[Array | Unrefined | LightboxError]:
        """:meth:`segment_batch` up to the model's probabilities: the mask refinement of each
        :class:`Unrefined` is left to run later, on any thread."""
        ...

    def set_callers(self, n: int, *, lone_latency: bool) -> None:
        """``n`` threads call the model at once; ``lone_latency``: a lone call still takes every thread."""
        ...

    def prepare(self) -> None:
        """Compile what those callers will run on, now (a model that cannot load fails here)."""
        ...


@runtime_checkable
class Retoucher(Protocol):
    device: str
    version: str

    def correct(
        self, images: Sequence[Array], masks: Sequence[Array | None], options: RetouchOptions
    ) -> list[Array | LightboxError]:
        """Colour stages + composite (docs/architecture.md, steps 4 and 5) as one fused pass per image.

        Returns RGB for a white/keep background, RGBA when ``options.background`` is
        "transparent". Where the mask is 0 and the background is white, pixels are exactly 255.
        """
        ...

    def render(self, image: Array, mask: Array | None, preset: Preset) -> Array:
        """Subject-aware crop + resize + pad + sharpen for one preset (step 6), ready to encode."""
        ...

    def render_batch(self, images: Sequence[Array], masks: Sequence[Array | None],
                     preset: Preset) -> list[Array | LightboxError]:
        """:meth:`render` for many images (one launch per preset on the GPU); an item's error
        takes its place."""
        ...

    def close(self) -> None: ...


@runtime_checkable
class Encoder(Protocol):
    device: str
    version: str

    def encode(self, image: Array, preset: Preset) -> bytes:
        """Encode to the preset's format and quality (PNG/WebP keep alpha)."""
        ...

    def close(self) -> None: ...
