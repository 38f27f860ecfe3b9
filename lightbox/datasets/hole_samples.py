"""Composites whose true mask has holes and thin parts, for mask post-processing tests.

Like :mod:`gpu_kernels.segment.samples` (real photo content cut along a known shape, pasted on a
plain, gradient or textured background), with shapes that a product can have and a mask
cleanup can get wrong: ``mug`` (a body and a handle whose opening shows the background), ``ring``
(a disc with a large central hole), ``lamp`` (a shade on a thin pole and a base). The paste mask
is the ground truth. Deterministic; needs scikit-image (imported lazily).
"""

from __future__ import annotations

import cv2
import numpy as np

from gpu_kernels.segment.samples import Composite, _photo, make_background

__all__ = ["HOLED_SHAPES", "holed_composite", "holed_shape"]

HOLED_SHAPES = ("mug", "ring", "lamp")


def holed_shape(shape: str, h: int, w: int) -> np.ndarray:
    """``(h, w)`` bool mask of ``shape`` in an ``h`` x ``w`` box."""
    m = np.zeros((h, w), np.uint8)
    if shape == "mug":
        bw = int(w * 0.68)
        cv2.rectangle(m, (0, int(h * 0.05)), (bw, h - 1), 1, -1)
        centre, axes = (bw, h // 2), (int(w * 0.3), int(h * 0.28))
        cv2.ellipse(m, centre, axes, 0, 0, 360, 1, -1)
        cv2.ellipse(m, centre, (axes[0] - int(w * 0.1), axes[1] - int(h * 0.1)), 0, 0, 360, 0, -1)
        cv2.rectangle(m, (0, int(h * 0.05)), (bw, h - 1), 1, -1)
    elif shape == "ring":
        cv2.ellipse(m, (w // 2, h // 2), (w // 2 - 1, h // 2 - 1), 0, 0, 360, 1, -1)
        cv2.ellipse(m, (w // 2, h // 2), (w // 4, h // 4), 0, 0, 360, 0, -1)
    elif shape == "lamp":
        shade = np.array([[w * 0.2, 0], [w * 0.8, 0], [w, h * 0.35], [0, h * 0.35]], np.int32)
        cv2.fillPoly(m, [shade], 1)
        pole = max(3, w // 40)
        cv2.rectangle(m, (w // 2 - pole // 2, int(h * 0.35)), (w // 2 + pole // 2, int(h * 0.9)), 1, -1)
        cv2.ellipse(m, (w // 2, int(h * 0.93)), (int(w * 0.3), int(h * 0.06)), 0, 0, 360, 1, -1)
    else:
        raise ValueError(f"unknown shape {shape!r}; known: {HOLED_SHAPES}")
    return m.astype(bool)


def holed_composite(obj: str, shape: str, background: str, *, size: tuple[int, int] = (900, 1200),
                    frac: float = 0.7) -> Composite:
    """Photo ``obj`` cut along ``shape`` (a box of ``frac`` x the frame height), centred."""
    h, w = size
    bh, bw = int(h * frac), int(h * frac * (1.2 if shape == "mug" else 0.8))
    crop = cv2.resize(_photo(obj), (bw, bh), interpolation=cv2.INTER_AREA)
    cut = holed_shape(shape, bh, bw)
    image = make_background(background, h, w)
    y0, x0 = (h - bh) // 2, (w - bw) // 2
    region = image[y0:y0 + bh, x0:x0 + bw]
    region[cut] = crop[cut]
    mask = np.zeros((h, w), bool)
    mask[y0:y0 + bh, x0:x0 + bw] = cut
    return Composite(f"{obj}-{shape}-{background}", image, mask, background)
