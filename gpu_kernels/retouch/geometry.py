"""Per-preset geometry: subject box, placement (crop + pad), and the resampling taps.

Placement. The subject box ``[x0, x1) × [y0, y1)`` (pixels whose alpha >= ``mask_threshold``,
by default 1: every pixel that shows on the canvas, the feathered rim and thin parts included, so
nothing visible is left outside the box and cropped by the canvas' edge; the whole image without
an alpha or when nothing passes) is scaled by
``k = fill * min(W / bw, H / bh)`` so that ``max(bw * k / W, bh * k / H) == fill``, and its
centre lands on the canvas centre. Output pixel ``X`` then covers the source interval
``[ox + X / k, ox + (X + 1) / k)`` with ``ox = cx - (W / 2) / k`` (likewise rows). Source pixels
outside the image are background (transparent black, premultiplied), which is how the crop and
the pad happen: the canvas simply extends past the image where it must.

Resampling (both backends, float32, same formulas and order):

* shrinking (``1/k > 1``): area filter, the overlap of the output footprint with each source
  pixel, ``T = ceil(1/k) + 1`` taps per axis, weights ``overlap * k`` (as ``overlap / inv_k``);
* enlarging: Keys cubic convolution (``cubic_a``, -0.5 = Catmull-Rom; OpenCV uses -0.75),
  4 taps at ``s = ox + (X + 0.5) / k - 0.5``.

:func:`axis_taps` tabulates the taps for one axis (indices clipped into the image, weights of
outside taps zeroed, which reads the zero background); the GPU kernel computes the same numbers
on the fly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpu_kernels.array import Array

__all__ = ["VISIBLE_ALPHA", "GeometryConfig", "axis_taps", "keys_weights", "placement", "read_window", "subject_box"]


# Alpha at or above which a mask pixel shows on a canvas (composited, it is no longer pure white or
# fully transparent): the subject box and the compliance checks use this one definition.
VISIBLE_ALPHA = 1


@dataclass(frozen=True, slots=True)
class GeometryConfig:
    """``mask_threshold``: alpha at or above which a pixel belongs to the subject box (default
    :data:`VISIBLE_ALPHA`: every pixel that will show; a higher value leaves faint edges and thin
    parts outside the box, where a tight fill can crop them at the canvas' edge);
    ``cubic_a``: the Keys cubic parameter used when enlarging."""

    mask_threshold: int = VISIBLE_ALPHA
    cubic_a: float = -0.5

    def __post_init__(self) -> None:
        if not 1 <= self.mask_threshold <= 255:
            raise ValueError(f"mask_threshold must be within [1, 255]; got {self.mask_threshold}")
        if not -1.0 <= self.cubic_a <= 0.0:
            raise ValueError(f"cubic_a must be within [-1, 0]; got {self.cubic_a}")

    def cubic_coefficients(self) -> np.ndarray:
        """``(6,)`` float32 ``[a + 2, a + 3, a, 5a, 8a, 4a]`` for :func:`keys_weights`."""
        a = np.float32(self.cubic_a)
        return np.array([a + 2, a + 3, a, 5 * a, 8 * a, 4 * a], np.float32)


def subject_box(xp: Any, alpha: Array | None, height: int, width: int, threshold: float) -> Array:
    """``(4,)`` int64 ``[x0, y0, x1, y1]`` (half-open) of alpha >= threshold, on alpha's device."""
    full = xp.asarray([0, 0, width, height], dtype=xp.int64)
    if alpha is None:
        return full
    m = alpha >= threshold
    rows = m.any(axis=1).astype(xp.int8)
    cols = m.any(axis=0).astype(xp.int8)
    box = xp.stack([
        xp.argmax(cols), xp.argmax(rows),
        width - xp.argmax(cols[::-1]), height - xp.argmax(rows[::-1]),
    ]).astype(xp.int64)
    return xp.where(xp.max(rows) > 0, box, full)


def placement(xp: Any, box: Array, out_w: int, out_h: int, fill: float) -> Array:
    """``(3,)`` float32 ``[inv_k, ox, oy]``: source pixels per output pixel and the source
    coordinates of the canvas' top-left corner (see the module docstring)."""
    b = box.astype(xp.float64)
    bw, bh = b[2] - b[0], b[3] - b[1]
    inv_k = 1.0 / (fill * xp.minimum(out_w / bw, out_h / bh))
    ox = (b[0] + b[2]) * 0.5 - (out_w * 0.5) * inv_k
    oy = (b[1] + b[3]) * 0.5 - (out_h * 0.5) * inv_k
    return xp.stack([inv_k, ox, oy]).astype(xp.float32)


def keys_weights(d: np.ndarray, coeffs: np.ndarray) -> np.ndarray:
    """Keys cubic kernel at distances ``d >= 0`` (float32), coefficients from
    :meth:`GeometryConfig.cubic_coefficients`; Horner forms as in the GPU kernel."""
    c0, c1, c2, c3, c4, c5 = (np.float32(c) for c in coeffs)
    near = ((c0 * d - c1) * d) * d + np.float32(1)
    far = ((c2 * d - c3) * d + c4) * d - c5
    return np.where(d <= 1, near, np.where(d < 2, far, np.float32(0))).astype(np.float32)


_TAPS: dict[tuple[float, float, int, int, bytes], tuple[np.ndarray, np.ndarray]] = {}
_TAPS_MAX = 512


def axis_taps(
    inv_k: float, origin: float, n_out: int, n_src: int, coeffs: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Taps of one axis: ``(idx (n_out, T) int32, weight (n_out, T) float32)``, read-only.

    ``inv_k`` and ``origin`` are taken as float32. Indices are clipped into ``[0, n_src)``;
    taps that fall outside the image get weight 0 (they read the zero background). Tables are
    kept per process (up to 512): photos of one size with one preset, the common case of a
    backlog, share them instead of tabulating them per image.
    """
    inv = np.float32(inv_k)
    org = np.float32(origin)
    key = (float(inv), float(org), n_out, n_src, np.asarray(coeffs, np.float32).tobytes())
    hit = _TAPS.get(key)
    if hit is not None:
        return hit
    taps = _axis_taps(inv, org, n_out, n_src, coeffs)
    for a in taps:
        a.flags.writeable = False
    if len(_TAPS) >= _TAPS_MAX:
        _TAPS.clear()
    _TAPS[key] = taps
    return taps


def _axis_taps(inv: np.float32, org: np.float32, n_out: int, n_src: int,
               coeffs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    x = np.arange(n_out, dtype=np.float32)
    if inv > 1:
        taps = int(np.ceil(inv)) + 1
        a = org + x * inv
        b = a + inv
        fi = np.floor(a)[:, None] + np.arange(taps, dtype=np.float32)[None, :]
        lo = np.maximum(a[:, None], fi)
        hi = np.minimum(b[:, None], fi + np.float32(1))
        w = np.maximum(hi - lo, np.float32(0)) / inv
    else:
        s = org + (x + np.float32(0.5)) * inv - np.float32(0.5)
        f0 = np.floor(s)
        f = s - f0
        fi = f0[:, None] + np.arange(-1, 3, dtype=np.float32)[None, :]
        one, two = np.float32(1), np.float32(2)
        w = keys_weights(np.stack([one + f, f, one - f, two - f], axis=1), coeffs)
    idx = fi.astype(np.int64)
    inside = (idx >= 0) & (idx < n_src)
    return (np.clip(idx, 0, n_src - 1).astype(np.int32),
            np.where(inside, w, np.float32(0)).astype(np.float32))


def read_window(box: np.ndarray, sizes: Sequence[tuple[int, int, float]], height: int, width: int,
                coeffs: np.ndarray, margin: int = 2) -> tuple[int, int, int, int]:
    """``(x0, y0, x1, y1)`` (half-open, inside the image): every source pixel that a render of the
    subject ``box`` (host ``[x0, y0, x1, y1]``) onto canvases of ``sizes`` = ``[(width, height,
    fill)]`` reads with a non-zero weight, and the box itself, grown by ``margin`` pixels.

    Colouring only this window and rendering from it (with the mask cropped alike, so the subject
    box and the placement shift with it) reads the same pixels as rendering from the whole image;
    the margin covers the float32 rounding of the shifted origin.
    """
    b = np.asarray(box, np.int64)
    lo = [int(b[0]), int(b[1])]
    hi = [int(b[2]), int(b[3])]
    for out_w, out_h, fill in sizes:
        inv_k, ox, oy = (float(v) for v in placement(np, b, out_w, out_h, fill))
        for axis, (origin, n_out, n_src) in enumerate(((ox, out_w, width), (oy, out_h, height))):
            idx, weight = axis_taps(inv_k, origin, n_out, n_src, coeffs)
            used = idx[weight != 0]
            if used.size:
                lo[axis] = min(lo[axis], int(used.min()))
                hi[axis] = max(hi[axis], int(used.max()) + 1)
    return (max(0, lo[0] - margin), max(0, lo[1] - margin),
            min(width, hi[0] + margin), min(height, hi[1] + margin))
