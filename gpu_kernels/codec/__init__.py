"""Decode and encode stages (docs/architecture.md, steps 2 and 7).

- :mod:`.sniff` — header guards: format, size, pixels, bit depth, frames, JPEG scans, EXIF
  orientation, ICC presence; no pixel decoded.
- :mod:`.dali_decode` — :class:`DaliDecoder`, batched DALI decode on CPU or GPU (``mixed``),
  with a per-item time budget for what runs on the CPU pool.
- :mod:`.pillow_decode` — the Pillow (+ pillow-heif) path: TIFF, BMP, GIF, HEIF, AVIF, alpha,
  animated (first frame), 16-bit, ICC profiles converted to sRGB.
- :mod:`.opencv_decode` — OpenCV's ``imdecode``, the last decoder of the fallback chain
  (DALI → Pillow → OpenCV) for files the others refuse.
- :mod:`.encode` — :class:`CpuEncoder` (libjpeg-turbo / libpng / libwebp) and
  :class:`NvJpegEncoder` (nvJPEG for large JPEGs, CPU otherwise).

Pick an implementation once with :func:`make_decoder` / :func:`make_encoder`.
CuPy and nvImageCodec are imported only inside the GPU classes.
"""

from __future__ import annotations

from typing import Any

from gpu_kernels.codec.dali_decode import DaliDecoder, ReduceMode, reduced_size
from gpu_kernels.codec.encode import CpuEncoder, EncodeSettings, NvJpegEncoder, flatten_alpha
from gpu_kernels.codec.orient import orient
from gpu_kernels.codec.sniff import (
    DEFAULT_MAX_BYTES,
    DEFAULT_MAX_FRAMES,
    DEFAULT_MAX_MARKERS,
    DEFAULT_MAX_PIXELS,
    DEFAULT_MAX_SCANS,
    ImageFormat,
    ImageInfo,
    exif_orientation,
    fingerprint,
    sniff,
)

__all__ = [
    "DEFAULT_MAX_BYTES",
    "DEFAULT_MAX_FRAMES",
    "DEFAULT_MAX_MARKERS",
    "DEFAULT_MAX_PIXELS",
    "DEFAULT_MAX_SCANS",
    "CpuEncoder",
    "DaliDecoder",
    "EncodeSettings",
    "ImageFormat",
    "ImageInfo",
    "NvJpegEncoder",
    "ReduceMode",
    "exif_orientation",
    "fingerprint",
    "flatten_alpha",
    "make_decoder",
    "make_encoder",
    "orient",
    "reduced_size",
    "sniff",
]


def make_decoder(device: str = "cpu", **options: Any) -> DaliDecoder:
    """A :class:`DaliDecoder` for ``device`` ("cpu" or "gpu"); ``options`` are its keyword
    arguments (``max_pixels``, ``max_bytes``, ``max_frames``, ``max_scans``, ``max_markers``,
    ``batch_size``, ``num_threads``, ``hw_decoder_load``, ``device_id``, ``reduce``,
    ``time_budget_s``, ``dali``). On "cpu" it decodes without DALI unless ``dali=True``:
    libjpeg-turbo and Pillow, so a CPU install carries no CUDA libraries (DALI is in the
    ``gpu`` extra; on CPU its decode was within a few per cent of this path, see docs)."""
    if device == "cpu":
        options.setdefault("dali", False)
    return DaliDecoder(device, **options)


def make_encoder(device: str = "cpu", **options: Any) -> CpuEncoder | NvJpegEncoder:
    """:class:`CpuEncoder` for "cpu", :class:`NvJpegEncoder` for "gpu" (``device_id``,
    ``gpu_min_pixels``, ``settings``)."""
    if device == "gpu":
        return NvJpegEncoder(device, **options)
    return CpuEncoder(device, **options)
