"""EXIF orientation: the one transform every decoder applies after decoding."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

__all__ = ["orient"]

_ORIENT_OPS: dict[int, Callable[[np.ndarray], np.ndarray]] = {
    1: lambda a: a,
    2: lambda a: a[:, ::-1],
    3: lambda a: a[::-1, ::-1],
    4: lambda a: a[::-1],
    5: lambda a: a.transpose(1, 0, 2),
    6: lambda a: np.rot90(a, -1),
    7: lambda a: a[::-1, ::-1].transpose(1, 0, 2),
    8: lambda a: np.rot90(a, 1),
}


def orient(image: np.ndarray, orientation: int) -> np.ndarray:
    """Apply EXIF ``orientation`` (1..8) to an ``(H, W, C)`` image; returns a contiguous array.

    Same convention as Pillow's ``ImageOps.exif_transpose``: 6 = rotate 90° clockwise,
    8 = 90° counter-clockwise, 3 = 180°, 2/4 = mirror, 5/7 = transpose/transverse.
    """
    return np.ascontiguousarray(_ORIENT_OPS.get(orientation, _ORIENT_OPS[1])(image))
