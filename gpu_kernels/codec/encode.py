"""Encode finished images to the preset's format (docs/architecture.md, step 7).

``CpuEncoder``: JPEG with libjpeg-turbo (simplejpeg), PNG and WebP with OpenCV (libpng,
libwebp). ``NvJpegEncoder``: JPEG with nvJPEG through nvImageCodec for images of at least
``gpu_min_pixels`` (where the GPU wins; see bench/gpu/checks.py codec), a preset's images in
one batched call, the CPU encoder for smaller JPEGs and for PNG/WebP (the pipeline runs those in
its output lane, not in the device lane).

Input: ``(H, W, 3)`` RGB or ``(H, W, 4)`` RGBA uint8 (``(H, W)`` gray also accepted). JPEG
has no alpha: an RGBA image is flattened over white (the marketplace background) first.
PNG and WebP keep alpha. Outputs are deterministic: the same pixels and preset give the same
bytes, which idempotent outputs rely on (docs/architecture.md, "Delivery: the argument").
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
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

    The pipeline calls the two halves apart (:class:`~gpu_kernels.stages.encode.EncodeStage`):
    :meth:`encode_device`, one nvImageCodec call for a preset's images that :meth:`on_device`
    takes, in the device lane; :meth:`encode_host` for the others (PNG, WebP, JPEGs under
    ``gpu_min_pixels`` or with alpha), in the output lane, so a CPU encode never holds up the
    device thread. :meth:`encode` is both, one image at a time.

    Takes CuPy (or NumPy) ``(H, W, 3|4)`` uint8 images. nvImageCodec is imported lazily; where it
    is not installed (a stock PyTorch image) every image goes through the CPU encoder after its
    device→host copy (``version`` "host-encode-1" says so). ``cpu_threads``: nvImageCodec's
    ``max_num_cpu_threads`` (the host half of nvJPEG's hybrid encoder); None: as many as the
    GPU decoder's (:func:`~gpu_kernels.codec.chain.decode_threads`).
    """

    version = "nvjpeg-encode-1"

    def __init__(
        self,
        device: str = "gpu",
        *,
        device_id: int = 0,
        gpu_min_pixels: int = 500_000,
        settings: EncodeSettings | None = None,
        cpu_threads: int | None = None,
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
        from gpu_kernels.codec.chain import decode_threads

        self._nvimgcodec = nvimgcodec
        self._encoder = nvimgcodec.Encoder(device_id=device_id,
                                           max_num_cpu_threads=cpu_threads or decode_threads("gpu"),
                                           backends=gpu_encode_backends(nvimgcodec))
        self._subsampling = {
            "444": nvimgcodec.ChromaSubsampling.CSS_444,
            "422": nvimgcodec.ChromaSubsampling.CSS_422,
            "420": nvimgcodec.ChromaSubsampling.CSS_420,
        }[self.settings.jpeg_subsampling]

    @staticmethod
    def _checked(image: Array, preset: Preset) -> Array:
        if str(getattr(image, "dtype", "")) != "uint8" or getattr(image, "ndim", 0) not in (2, 3):
            raise ProcessingFailed(
                f"preset {preset.name!r}: expected a uint8 (H, W[, C]) image, got "
                f"{type(image).__name__} {getattr(image, 'dtype', '')} "
                f"{getattr(image, 'shape', '')}",
                stage=STAGE,
            )
        return image

    def on_device(self, image: Array, preset: Preset) -> bool:
        """Whether ``image`` is encoded by nvJPEG for ``preset``: a JPEG preset, an RGB uint8
        image of at least ``gpu_min_pixels`` pixels, nvImageCodec installed."""
        return (
            self._encoder is not None
            and preset.format == "jpeg"
            and str(getattr(image, "dtype", "")) == "uint8"
            and getattr(image, "ndim", 0) == 3
            and image.shape[2] == 3
            and image.shape[0] * image.shape[1] >= self.gpu_min_pixels
        )

    def encode(self, image: Array, preset: Preset) -> bytes:
        self._checked(image, preset)
        if not self.on_device(image, preset):
            return self.encode_host(image, preset)
        (out,) = self.encode_device([image], preset)
        if isinstance(out, ProcessingFailed):
            raise out
        return out

    def encode_host(self, image: Array, preset: Preset) -> bytes:
        """The CPU encoder's bytes for ``image`` (copied to the host first: on the caller's
        current stream, which must have waited for the image's producer)."""
        host = np.asarray(image.get() if hasattr(image, "get") else image)
        self._checked(host, preset)
        if preset.format == "jpeg" and host.ndim == 3 and host.shape[2] == 4:
            host = flatten_alpha(host)
        return self._cpu.encode(host, preset)

    def encode_device(self, images: Sequence[Array], preset: Preset) -> list[bytes | ProcessingFailed]:
        """nvJPEG encodes of ``images`` (``(H, W, 3)`` uint8 RGB, each :meth:`on_device`) at the
        preset's quality: one nvImageCodec call for the list, on the current CUDA stream. An image
        nvImageCodec could not encode gets its ``ProcessingFailed`` in its place."""
        for image in images:
            if not self.on_device(self._checked(image, preset), preset):
                raise ProcessingFailed(f"preset {preset.name!r}: a {getattr(image, 'shape', '')} image is not "
                                       "one nvJPEG encodes here", stage=STAGE)
        if not images:
            return []
        nv = self._nvimgcodec
        params = nv.EncodeParams(
            quality_type=nv.QualityType.QUALITY,
            quality_value=float(preset.quality),
            chroma_subsampling=self._subsampling,
        )
        inputs, stream = _device_inputs(images)
        try:
            code_streams = self._encoder.encode(inputs, "jpeg", params=params, cuda_stream=stream)
        except (RuntimeError, ValueError) as err:
            raise ProcessingFailed(
                f"preset {preset.name!r}: nvJPEG encode of {len(inputs)} image(s) failed: {err}",
                stage=STAGE,
            ) from err
        if code_streams is None or len(code_streams) != len(inputs):
            raise ProcessingFailed(f"preset {preset.name!r}: nvJPEG returned no list for {len(inputs)} image(s)",
                                   stage=STAGE)
        out: list[bytes | ProcessingFailed] = []
        for img, code_stream in zip(inputs, code_streams, strict=True):
            if code_stream is None:
                out.append(ProcessingFailed(
                    f"preset {preset.name!r}: nvJPEG encode of a {tuple(img.shape)} image failed", stage=STAGE))
            else:  # the buffer may be larger than the stream (capacity >= size)
                out.append(bytes(memoryview(code_stream)[: code_stream.size]))
        return out

    def close(self) -> None:
        self._encoder = None


def _device_inputs(images: Sequence[Array]) -> tuple[list[Any], int]:
    """Contiguous inputs for nvImageCodec and the stream it orders its reads on: CuPy arrays on
    the current stream; NumPy arrays (nvImageCodec reads host memory too) on none."""
    if all(isinstance(im, np.ndarray) for im in images):
        return [np.ascontiguousarray(im) for im in images], 0
    import cupy as cp

    return [cp.ascontiguousarray(cp.asarray(im)) for im in images], int(cp.cuda.get_current_stream().ptr)
