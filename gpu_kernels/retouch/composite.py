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

A transparent preset needs the subject's alpha on its canvas, also when pass (a) composited the
subject over white (the default): :func:`cutout_source` turns such an RGB image and its alpha back
into RGBA, the colour un-composited from white (``c = (v - 255 (1 - a)) / a``), so that the
render's premultiplied resampling sees ``c * a = v - 255 (1 - a)``: the subject's own colour,
no white fringe, and alpha 0 wherever the mask is 0.
"""

from __future__ import annotations

from typing import Any, Literal

from gpu_kernels.array import Array

__all__ = ["Background", "composite", "cutout_source", "round_levels"]

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


def cutout_source(xp: Any, pixels: Array, alpha: Array | None) -> Array:
    """The source a transparent canvas is rendered from: ``pixels`` itself when it has its own
    alpha (4 channels) or there is no ``alpha``; else ``(H, W, 4)`` uint8 with ``alpha`` and the
    colour un-composited from white (0 where alpha is 0). ``pixels``: ``(H, W, 1|3|4)`` uint8."""
    if alpha is None or pixels.shape[2] == 4:
        return pixels
    a = alpha.astype(xp.float32) * xp.float32(1 / 255)
    v = pixels.astype(xp.float32)
    if v.shape[2] == 1:
        v = xp.repeat(v, 3, axis=2)
    colour = (v - xp.float32(255) * (xp.float32(1) - a)[..., None]) / xp.maximum(a, xp.float32(1 / 255))[..., None]
    out = xp.empty((*pixels.shape[:2], 4), xp.uint8)
    out[..., :3] = xp.where((alpha > 0)[..., None], round_levels(xp, colour), xp.uint8(0))
    out[..., 3] = alpha
    return out
