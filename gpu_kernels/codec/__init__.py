"""Decode and encode stages (docs/architecture.md, steps 2 and 7).

- :mod:`.sniff` — header guards: format, size, pixels, bit depth, frames, JPEG scans, EXIF
  orientation, ICC presence; no pixel decoded.
- :mod:`.chain` — :class:`DecoderChain`, the decoder chain: batched DALI decode on CPU or GPU (``mixed``),
  with a per-item time budget for what runs on the CPU pool.
- :mod:`.pillow_decode` — the Pillow (+ pillow-heif) path: TIFF, BMP, GIF, HEIF, AVIF, alpha,
  animated (first frame), 16-bit, ICC profiles converted to sRGB.
- :mod:`.opencv_decode` — OpenCV's ``imdecode``, the last decoder of the fallback chain
  (DALI → Pillow → OpenCV) for files the others refuse.
- :mod:`.torch_decode` — :class:`TorchvisionDecoder`, GPU JPEG decode with torchvision's nvJPEG
  binding where DALI is not installed (a stock PyTorch GPU image).
- :mod:`.encode` — :class:`CpuEncoder` (libjpeg-turbo / libpng / libwebp) and
  :class:`NvJpegEncoder` (nvJPEG for large JPEGs, CPU otherwise).

Pick an implementation once with :func:`make_decoder` / :func:`make_encoder`.
CuPy and nvImageCodec are imported only inside the GPU classes.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from gpu_kernels.codec.chain import DecoderChain, ReduceMode, decode_threads, reduced_size
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
from gpu_kernels.codec.torch_decode import TorchvisionDecoder

__all__ = [
    "DEFAULT_MAX_BYTES",
    "DEFAULT_MAX_FRAMES",
    "DEFAULT_MAX_MARKERS",
    "DEFAULT_MAX_PIXELS",
    "DEFAULT_MAX_SCANS",
    "CpuEncoder",
    "DecoderChain",
    "EncodeSettings",
    "ImageFormat",
    "ImageInfo",
    "NvJpegEncoder",
    "ReduceMode",
    "TorchvisionDecoder",
    "decode_threads",
    "exif_orientation",
    "fingerprint",
    "flatten_alpha",
    "gpu_decoder_choice",
    "make_decoder",
    "make_encoder",
    "orient",
    "reduced_size",
    "sniff",
]


def _dali_installed() -> bool:
    try:
        return importlib.util.find_spec("nvidia.dali") is not None
    except (ImportError, ValueError):  # no "nvidia" namespace at all
        return False


def gpu_decoder_choice() -> tuple[str | None, str]:
    """The GPU decoder this machine has: ("dali", ""), ("torchvision", ""), or (None, one line
    saying what to install)."""
    if _dali_installed():
        return "dali", ""
    from gpu_kernels.codec.torch_decode import torchvision_gpu_decode_available

    why = torchvision_gpu_decode_available()
    if why is None:
        return "torchvision", ""
    return None, ("device 'gpu' needs a GPU JPEG decoder: install DALI (pip install 'lightbox[gpu]', "
                  f"nvidia-dali-cuda130) or torchvision with CUDA; here DALI is missing and {why}")


def make_decoder(device: str = "cpu", **options: Any) -> DecoderChain | TorchvisionDecoder:
    """The decoder for ``device``. "cpu": a :class:`DecoderChain` that decodes without DALI unless
    ``dali=True`` (libjpeg-turbo and Pillow, so a CPU install carries no CUDA libraries; on CPU
    DALI's decode was within a few per cent of this path, see docs). "gpu": DALI's ``mixed``
    decode where DALI is installed, else torchvision's nvJPEG (:class:`TorchvisionDecoder`), else
    :class:`ValueError` at once, with what to install (never a failure at the first image).
    ``options``: the decoder's keyword arguments (``max_pixels``, ``max_bytes``, ``max_frames``,
    ``max_scans``, ``max_markers``, ``batch_size``, ``num_threads``, ``hw_decoder_load``,
    ``device_id``, ``reduce``, ``time_budget_s``, ``dali``); ``num_threads`` unset or None:
    :func:`decode_threads` (on a GPU one per usable core, at most 8; on a CPU 2)."""
    if device == "cpu":
        options.setdefault("dali", False)
        return DecoderChain(device, **options)
    if device == "gpu" and options.get("dali", True):
        choice, why = gpu_decoder_choice()
        if choice is None:
            raise ValueError(why)
        if choice == "torchvision":
            return TorchvisionDecoder(device, **options)
    return DecoderChain(device, **options)


def make_encoder(device: str = "cpu", **options: Any) -> CpuEncoder | NvJpegEncoder:
    """:class:`CpuEncoder` for "cpu", :class:`NvJpegEncoder` for "gpu" (``device_id``,
    ``gpu_min_pixels``, ``settings``)."""
    if device == "gpu":
        return NvJpegEncoder(device, **options)
    return CpuEncoder(device, **options)
