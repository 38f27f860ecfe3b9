"""Input checks shared by the segmenters."""

from __future__ import annotations

from typing import Any

import numpy as np

from schemas.errors import ProcessingFailed

__all__ = ["precut_alpha", "validate_image"]

Array = Any


def validate_image(i: int, img: Array) -> None:
    """Raise ProcessingFailed unless ``img`` is ``(H, W, 3|4)`` uint8 with H, W >= 1."""
    shape, dtype = getattr(img, "shape", None), getattr(img, "dtype", None)
    if shape is None or len(shape) != 3 or shape[2] not in (3, 4) or shape[0] < 1 or shape[1] < 1 or dtype != np.uint8:
        raise ProcessingFailed(
            f"image {i}: expected (H, W, 3|4) uint8, got shape {shape} dtype {dtype}",
            stage="segment",
        )


def precut_alpha(img: Array, xp: Any) -> Array | None:
    """The image's own alpha if it is RGBA with any transparency (already cut out), else None.
    The segmenters pass it through :func:`~gpu_kernels.segment.postprocess.clean_cutout`."""
    if img.shape[2] != 4:
        return None
    alpha = img[..., 3]
    return xp.ascontiguousarray(alpha) if bool((alpha < 255).any()) else None
