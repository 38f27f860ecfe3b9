"""Encode finished images to the preset's format (docs/architecture.md, step 7).

``CpuEncoder``: JPEG with libjpeg-turbo (simplejpeg), PNG and WebP with OpenCV (libpng,
libwebp). ``NvJpegEncoder``: JPEG with nvJPEG through nvImageCodec for images of at least
``gpu_min_pixels`` (where the GPU wins; see bench/gpu/checks.py codec), the CPU encoder for
smaller JPEGs and for PNG/WebP.

Input: ``(H, W, 3)`` RGB or ``(H, W, 4)`` RGBA uint8 (``(H, W)`` gray also accepted). JPEG
has no alpha: an RGBA image is flattened over white (the marketplace background) first.
PNG and WebP keep alpha. Outputs are deterministic: the same pixels and preset give the same
bytes, which idempotent outputs rely on (docs/architecture.md, "Delivery: the argument").
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Literal

import cv2
import numpy as np

from gpu_kernels.array import Array
from gpu_kernels.presets import Preset
from schemas.errors import ProcessingFailed

__all__ = ["CpuEncoder", "EncodeSettings", "NvJpegEncoder", "flatten_alpha", "gpu_encode_backends"]

STAGE = "encode"
Subsampling = Literal["444", "422", "420"]


@dataclass(frozen=True, slots=True)
class EncodeSettings:
    """Codec knobs not in the preset.

    ``jpeg_subsampling``: chroma subsampling for JPEG ("420" is what marketplaces serve).
    ``png_compression``: zlib level 0..9 (3 is ~3x faster than 6 for ~5 % more bytes).
    ``webp_lossless_alpha``: encode RGBA WebP losslessly so the cut-out edge stays exact.
    """

    jpeg_subsampling: Subsampling = "420"
    png_compression: int = 3
    webp_lossless_alpha: bool = False


def flatten_alpha(image: np.ndarray, background: int = 255) -> np.ndarray:
    """``(H, W, 4)`` RGBA uint8 → ``(H, W, 3)`` RGB composited over a flat ``background``."""
    rgb = image[..., :3].astype(np.uint16)
    a = image[..., 3:4].astype(np.uint16)
    out = (rgb * a + background * (255 - a) + 127) // 255
    return out.astype(np.uint8)


def _check(image: Any, preset: Preset) -> np.ndarray:
    if not isinstance(image, np.ndarray) or image.dtype != np.uint8:
        raise ProcessingFailed(
            f"preset {preset.name!r}: expected a uint8 numpy image, got "
            f"{type(image).__name__} {getattr(image, 'dtype', '')}",
            stage=STAGE,
        )
    if (image.ndim == 3 and image.shape[2] in (3, 4)) or image.ndim == 2:
        return np.ascontiguousarray(image)
    raise ProcessingFailed(
        f"preset {preset.name!r}: expected (H, W), (H, W, 3) or (H, W, 4), got {image.shape}",
        stage=STAGE,
    )


class CpuEncoder:
    """:class:`~gpu_kernels.backends.Encoder` on the CPU (libjpeg-turbo, libpng, libwebp)."""

    version = "cpu-encode-1"

    def __init__(self, device: str = "cpu", settings: EncodeSettings | None = None) -> None:
        if device != "cpu":
            raise ValueError(f"CpuEncoder: device must be 'cpu', got {device!r}")
        self.device = device
        self.settings = settings or EncodeSettings()

    def encode(self, image: Array, preset: Preset) -> bytes:
        img = _check(image, preset)
        try:
            if preset.format == "jpeg":
                return self._jpeg(img, preset.quality)
            if preset.format == "png":
                return self._cv2(
                    img, ".png", [cv2.IMWRITE_PNG_COMPRESSION, self.settings.png_compression]
                )
            quality = preset.quality
            if img.ndim == 3 and img.shape[2] == 4 and self.settings.webp_lossless_alpha:
                quality = 101  # OpenCV: > 100 selects lossless WebP
            return self._cv2(img, ".webp", [cv2.IMWRITE_WEBP_QUALITY, quality])
        except (cv2.error, ValueError) as err:
            raise ProcessingFailed(
                f"preset {preset.name!r}: {preset.format} encode of a {img.shape} image "
                f"failed: {err}",
                stage=STAGE,
            ) from err

    def _jpeg(self, img: np.ndarray, quality: int) -> bytes:
        import simplejpeg  # imported here so the GPU box needs only OpenCV for PNG/WebP

        if img.ndim == 2:
            gray = img[..., None]
            return bytes(
                simplejpeg.encode_jpeg(gray, quality, colorspace="GRAY", colorsubsampling="Gray")
            )
        if img.shape[2] == 4:
            img = flatten_alpha(img)
        return bytes(
            simplejpeg.encode_jpeg(
                img, quality, colorspace="RGB", colorsubsampling=self.settings.jpeg_subsampling
            )
        )

    @staticmethod
    def _cv2(img: np.ndarray, ext: str, params: list[int]) -> bytes:
        if img.ndim == 3:
            code = cv2.COLOR_RGBA2BGRA if img.shape[2] == 4 else cv2.COLOR_RGB2BGR
            img = cv2.cvtColor(img, code)
        ok, buf = cv2.imencode(ext, img, params)
        if not ok:
            raise ValueError(f"cv2.imencode({ext!r}) returned False")
        return buf.tobytes()

    def close(self) -> None:
        """Nothing to release."""


def gpu_encode_backends(nvimgcodec: Any) -> list[Any]:
    """The nvImageCodec backends a GPU encode may use: ``GPU_ONLY`` and ``HYBRID_CPU_GPU``.

    nvJPEG's CUDA encoder registers as ``HYBRID_CPU_GPU`` (Huffman coding on the host, the rest on
    the device); with ``GPU_ONLY`` alone no JPEG encoder matches and every encode returns None.
    nvImageCodec's own encode tests pass exactly these two kinds as their "GPU" backends. The
    CPU-only kind is left out: a host encode goes through :class:`CpuEncoder` instead."""
    return [nvimgcodec.Backend(nvimgcodec.GPU_ONLY), nvimgcodec.Backend(nvimgcodec.HYBRID_CPU_GPU)]


class NvJpegEncoder:
    """:class:`~gpu_kernels.backends.Encoder` on the GPU: nvJPEG (via nvImageCodec) for JPEGs
    of >= ``gpu_min_pixels`` pixels, :class:`CpuEncoder` otherwise (after a device→host copy).

    Takes CuPy (or NumPy) ``(H, W, 3|4)`` uint8 images. nvImageCodec is imported lazily; where it
    is not installed (a stock PyTorch image) every image goes through the CPU encoder after its
    device→host copy (``version`` "host-encode-1" says so).
    """

    version = "nvjpeg-encode-1"

    def __init__(
        self,
        device: str = "gpu",
        *,
        device_id: int = 0,
        gpu_min_pixels: int = 500_000,
        settings: EncodeSettings | None = None,
    ) -> None:
        if device != "gpu":
            raise ValueError(f"NvJpegEncoder: device must be 'gpu', got {device!r}")
        self.device = device
        self.gpu_min_pixels = gpu_min_pixels
        self.settings = settings or EncodeSettings()
        self._cpu = CpuEncoder("cpu", self.settings)
        try:
            nvimgcodec: Any = importlib.import_module("nvidia.nvimgcodec")
        except ImportError:  # a stock PyTorch image: no nvImageCodec; every format on the CPU encoder
            self.version = "host-encode-1"
            self._encoder: Any = None
            return
        self._nvimgcodec = nvimgcodec
        self._encoder = nvimgcodec.Encoder(device_id=device_id, backends=gpu_encode_backends(nvimgcodec))
        self._subsampling = {
            "444": nvimgcodec.ChromaSubsampling.CSS_444,
            "422": nvimgcodec.ChromaSubsampling.CSS_422,
            "420": nvimgcodec.ChromaSubsampling.CSS_420,
        }[self.settings.jpeg_subsampling]

    def encode(self, image: Array, preset: Preset) -> bytes:
        if str(getattr(image, "dtype", "")) != "uint8" or image.ndim not in (2, 3):
            raise ProcessingFailed(
                f"preset {preset.name!r}: expected a uint8 (H, W[, C]) image, got "
                f"{type(image).__name__} {getattr(image, 'dtype', '')} "
                f"{getattr(image, 'shape', '')}",
                stage=STAGE,
            )
        h, w = image.shape[:2]
        on_gpu = (
            self._encoder is not None
            and preset.format == "jpeg"
            and image.ndim == 3
            and image.shape[2] == 3
            and h * w >= self.gpu_min_pixels
        )
        if not on_gpu:
            host = image.get() if hasattr(image, "get") else np.asarray(image)
            if preset.format == "jpeg" and host.ndim == 3 and host.shape[2] == 4:
                host = flatten_alpha(host)
            return self._cpu.encode(host, preset)
        return self.encode_jpeg_gpu(image, preset.quality, preset.name)

    def encode_jpeg_gpu(self, image: Array, quality: int, name: str = "") -> bytes:
        """nvJPEG encode of one ``(H, W, 3)`` uint8 RGB device array."""
        import cupy as cp

        nv = self._nvimgcodec
        params = nv.EncodeParams(
            quality_type=nv.QualityType.QUALITY,
            quality_value=float(quality),
            chroma_subsampling=self._subsampling,
        )
        img = cp.ascontiguousarray(cp.asarray(image))
        stream = cp.cuda.get_current_stream()
        try:
            code_stream = self._encoder.encode(img, "jpeg", params=params, cuda_stream=stream.ptr)
        except (RuntimeError, ValueError) as err:
            raise ProcessingFailed(
                f"preset {name!r}: nvJPEG encode of a {tuple(img.shape)} image failed: {err}",
                stage=STAGE,
            ) from err
        if code_stream is None:
            raise ProcessingFailed(
                f"preset {name!r}: nvJPEG encode of a {tuple(img.shape)} image failed",
                stage=STAGE,
            )
        # The buffer may be larger than the stream (capacity >= size).
        return bytes(memoryview(code_stream)[: code_stream.size])

    def close(self) -> None:
        self._encoder = None
