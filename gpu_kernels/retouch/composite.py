"""Composite: subject over pure white, alpha kept for transparent output, or the image kept.

``y``: ``(H, W, 3)`` float32 levels (the colour-corrected subject); ``alpha``: ``(H, W)`` uint8
or None. With a = alpha / 255 (float32):

* ``"white"``: ``round(y * a + 255 * (1 - a))`` → RGB; exactly 255 wherever alpha is 0 (and the
  plain ``round(y)`` wherever it is 255). Without an alpha there is nothing to composite: the
  image is kept (documented behaviour; a mask-less white request cannot invent a cut-out).
* ``"transparent"``: ``round(y)`` plus alpha as a 4th channel (255 without an alpha) → RGBA,
  not premultiplied.
* ``"keep"``: ``round(y)`` → RGB.

Rounding is ``floor(v + 0.5)`` clipped to [0, 255], as in the GPU kernels.
"""

from __future__ import annotations

from typing import Any, Literal

from gpu_kernels.array import Array

__all__ = ["Background", "composite", "round_levels"]

Background = Literal["white", "transparent", "keep"]


def round_levels(xp: Any, v: Array) -> Array:
    """float32 levels → uint8, ``floor(v + 0.5)`` clipped to [0, 255]."""
    return xp.clip(xp.floor(v + xp.float32(0.5)), 0, 255).astype(xp.uint8)


def composite(xp: Any, y: Array, alpha: Array | None, background: Background) -> Array:
    """``(H, W, 3)`` float32 + ``(H, W)`` uint8 alpha → uint8 ``(H, W, 3)`` or ``(H, W, 4)``."""
    if background == "transparent":
        out = xp.empty((*y.shape[:2], 4), xp.uint8)
        out[..., :3] = round_levels(xp, y)
        out[..., 3] = 255 if alpha is None else alpha
        return out
    if background == "white" and alpha is not None:
        a = (alpha.astype(xp.float32) / xp.float32(255))[..., None]
        return round_levels(xp, y * a + xp.float32(255) * (xp.float32(1) - a))
    return round_levels(xp, y)
