"""Input checks shared by both backends: shapes and dtypes, named in the error.

Works on anything with ``shape``/``dtype``/``ndim`` (NumPy or CuPy arrays) and never copies.
Accepted images: ``(H, W)`` or ``(H, W, 1)`` gray, ``(H, W, 3)`` RGB, ``(H, W, 4)`` RGBA, all
uint8 with H, W >= 1. Masks: ``(H, W)`` or ``(H, W, 1)`` uint8 (or bool, read as 0/255) with the
image's H and W. Anything else raises :class:`~schemas.errors.ProcessingFailed` naming the shape.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gpu_kernels.array import Array
from schemas.errors import ProcessingFailed

__all__ = ["alpha_source", "as_pixels"]


def _describe(a: Array) -> str:
    return f"shape {tuple(a.shape)} dtype {a.dtype}"


def _is(dtype: Any, scalar: type) -> bool:
    """``dtype`` (a NumPy dtype, as NumPy and CuPy arrays carry, or anything) is ``scalar``'s:
    a comparison of types, where ``str(dtype)`` builds the name every call (~5 us, a few times
    per image)."""
    return getattr(dtype, "type", None) is scalar


def as_pixels(image: Array, *, stage: str) -> Array:
    """``image`` as an ``(H, W, C)`` view with C in {1, 3, 4}; raises ``ProcessingFailed``."""
    shape = tuple(getattr(image, "shape", ()))
    if not _is(getattr(image, "dtype", None), np.uint8):
        what = _describe(image) if hasattr(image, "dtype") else f"a {type(image).__name__}"
        raise ProcessingFailed(f"expected a uint8 image; got {what}", stage=stage)
    if len(shape) == 2:
        image = image.reshape(shape[0], shape[1], 1)
    elif len(shape) != 3 or shape[2] not in (1, 3, 4):
        raise ProcessingFailed(
            "expected an image of shape (H, W), (H, W, 1), (H, W, 3) or (H, W, 4); "
            f"got {_describe(image)}",
            stage=stage,
        )
    if image.shape[0] < 1 or image.shape[1] < 1:
        raise ProcessingFailed(f"empty image: {_describe(image)}", stage=stage)
    return image


def alpha_source(mask: Array | None, pixels: Array, *, stage: str) -> tuple[Array | None, bool]:
    """The alpha that drives estimation and compositing, and whether it is the image's own.

    ``mask`` wins when given (returned as an ``(H, W)`` uint8 array; bool masks become 0/255);
    otherwise an RGBA image's alpha channel (a strided view, second item True); else None.
    """
    h, w = pixels.shape[:2]
    if mask is None:
        if pixels.shape[2] == 4:
            return pixels[:, :, 3], True
        return None, False
    shape = tuple(getattr(mask, "shape", ()))
    if len(shape) == 3 and shape[2] == 1:
        mask = mask.reshape(shape[0], shape[1])
        shape = shape[:2]
    if shape != (h, w):
        raise ProcessingFailed(
            f"mask shape {shape} does not match image shape {tuple(pixels.shape)}", stage=stage)
    dtype = getattr(mask, "dtype", None)
    if _is(dtype, np.bool_):
        return mask.astype(pixels.dtype) * pixels.dtype.type(255), False
    if not _is(dtype, np.uint8):
        raise ProcessingFailed(f"expected a uint8 or bool mask; got {_describe(mask)}", stage=stage)
    return mask, False
