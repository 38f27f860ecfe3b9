"""The last decoder of the fallback chain: OpenCV's ``imdecode`` (libpng, libjpeg-turbo, libtiff,
libwebp and its own BMP/GIF readers), for a file that DALI and Pillow both refused.

:func:`decode_opencv` returns the same ``(H, W, 3|4)`` uint8 array as the other paths: first
frame/page, EXIF orientation applied (``IMREAD_UNCHANGED`` does not), 16-bit samples reduced to
their high byte, grey to RGB, BGR(A) to RGB(A), an all-opaque alpha dropped. The decoded size must
not exceed the size the header guard passed (as on the Pillow path); before that, OpenCV's own
limit (``OPENCV_IO_MAX_IMAGE_PIXELS``, read once per process at its first decode) is set to the
decoder's pixel limit unless the environment sets it, so a header OpenCV reads differently from
the guard cannot make it allocate more. Errors come back as ``DecodeFailed`` whose ``reason`` is
OpenCV's message without payload bytes.
"""

from __future__ import annotations

import os

import numpy as np

from gpu_kernels.codec.orient import orient
from gpu_kernels.codec.pillow_decode import refusal, safe_reason
from gpu_kernels.codec.sniff import ImageInfo, fingerprint
from schemas.errors import DecodeFailed

__all__ = ["OPENCV_FORMATS", "decode_opencv"]

STAGE = "decode"
OPENCV_FORMATS = frozenset({"jpeg", "png", "webp", "tiff", "bmp", "gif"})


def _failed(info: ImageInfo, blob: bytes, reason: str, *, final: bool = False) -> DecodeFailed:
    if not final:  # a refusal: the chain may try the next decoder (see dali_decode)
        return refusal("OpenCV", info, blob, reason)
    return DecodeFailed(f"OpenCV could not decode the {info.format} image ({info.width}x{info.height}, "
                        f"{fingerprint(blob)}): {reason}", stage=STAGE)


def decode_opencv(blob: bytes, info: ImageInfo, max_pixels: int) -> np.ndarray:
    """Decode ``blob`` (a format in :data:`OPENCV_FORMATS`) to ``(H, W, 3|4)`` uint8."""
    os.environ.setdefault("OPENCV_IO_MAX_IMAGE_PIXELS", str(max_pixels))  # before OpenCV's first decode
    import cv2  # lazily: the package imports NumPy only

    if info.format not in OPENCV_FORMATS:
        raise _failed(info, blob, f"OpenCV does not read {info.format}")
    try:
        img = cv2.imdecode(np.frombuffer(blob, np.uint8), cv2.IMREAD_UNCHANGED)
    except cv2.error as err:
        raise _failed(info, blob, safe_reason(err)) from None
    if img is None or img.size == 0:
        raise _failed(info, blob, "imdecode read nothing")
    h, w = img.shape[:2]
    if w * h > min(max_pixels, info.pixels):
        raise _failed(info, blob, f"the decoder sees {w}x{h}, the header guard passed {info.width}x{info.height}",
                      final=True)
    if img.dtype == np.uint16:
        img = np.right_shift(img, 8).astype(np.uint8)
    elif img.dtype != np.uint8:
        if img.dtype.kind == "f":
            top = 255.0 if float(np.nanmax(img, initial=0.0)) <= 1.0 else 1.0
            img = np.clip(np.nan_to_num(img) * top, 0, 255).round().astype(np.uint8)
        else:
            img = np.clip(img, 0, 255).astype(np.uint8)
    if img.ndim == 2:
        img = img[..., None]
    channels = img.shape[2]
    if channels == 1:
        rgb = np.repeat(img, 3, axis=2)
    elif channels == 2:  # grey + alpha
        rgb = np.concatenate([np.repeat(img[..., :1], 3, axis=2), img[..., 1:]], axis=2)
    elif channels == 3:
        rgb = img[..., ::-1]
    else:
        rgb = img[..., [2, 1, 0, 3]]
    if rgb.shape[2] == 4 and bool((rgb[..., 3] == 255).all()):
        rgb = rgb[..., :3]
    return orient(np.ascontiguousarray(rgb), info.orientation)
