"""GPU JPEG decode with torchvision's nvJPEG binding, for machines without DALI.

A stock PyTorch GPU image (torch, torchvision, CuPy, OpenCV) has nvJPEG through
``torchvision.io.decode_jpeg(..., device="cuda")`` and no DALI. :class:`TorchvisionDecoder`
decodes a batch's plain JPEGs there in one call and hands out CuPy arrays (zero copy through
DLPack); everything else takes the CPU decoder's path (:class:`~.chain.DecoderChain` with
``dali=False``: the same header guards, Pillow for alpha, ICC profiles, GIF, HEIF and the rest,
OpenCV last) and is uploaded. :func:`~gpu_kernels.codec.make_decoder` picks it for "gpu" when
DALI is not installed.

A plain JPEG here: 1 or 3 components (CMYK/YCCK go to Pillow), sRGB or untagged. Output as the
other decoders: ``(H, W, 3)`` uint8 RGB (gray converted), EXIF orientation applied, full size
(``max_side`` is a permission to reduce, not an obligation). torchvision fails a whole list
when one image fails; the batch is then decoded one by one, and what nvJPEG refuses goes
through the CPU chain with nvJPEG's refusal named.

``torch_device="cpu"`` runs the same code with torchvision's CPU decoder (NumPy out): that is
how the routing and conversion are tested on machines without a GPU.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from gpu_kernels.array import Array
from gpu_kernels.codec.chain import DecoderChain, _Job, decode_threads
from gpu_kernels.codec.sniff import sniff
from schemas.errors import DecodeFailed, LightboxError

__all__ = ["TorchvisionDecoder", "torchvision_gpu_decode_available"]

STAGE = "decode"


def torchvision_gpu_decode_available() -> str | None:
    """None when torchvision can decode JPEGs on a CUDA device here, else why not (one line)."""
    try:
        torch: Any = importlib.import_module("torch")
        io: Any = importlib.import_module("torchvision.io")
    except ImportError as exc:
        return f"torchvision is not installed ({exc.name})"
    if not hasattr(io, "decode_jpeg"):
        return "this torchvision has no decode_jpeg"
    if not torch.cuda.is_available():
        return "torch sees no CUDA device (a CPU build of torch, or no driver)"
    return None


class TorchvisionDecoder:
    """:class:`~gpu_kernels.backends.Decoder` on torchvision's nvJPEG; see the module doc.

    ``options``: the CPU decoder's keyword arguments (``max_pixels``, ``max_bytes``,
    ``max_frames``, ``max_scans``, ``max_markers``, ``num_threads``, ``time_budget_s``); the CPU
    decoder's pool gets the GPU decoder's thread count (:func:`~.chain.decode_threads`) unless
    ``num_threads`` is given."""

    version = "torchvision-nvjpeg-1"

    def __init__(self, device: str = "gpu", *, device_id: int = 0, torch_device: str | None = None,
                 **options: Any) -> None:
        if device != "gpu":
            raise ValueError(f"TorchvisionDecoder: device must be 'gpu', got {device!r}")
        self.device = device
        self._torch: Any = importlib.import_module("torch")
        self._io: Any = importlib.import_module("torchvision.io")
        self._target = torch_device or f"cuda:{device_id}"
        self._on_cuda = self._target.startswith("cuda")
        for name in ("batch_size", "hw_decoder_load", "reduce", "dali", "device_id"):
            options.pop(name, None)  # DALI's knobs: nothing to set here
        if options.get("num_threads") is None:
            options["num_threads"] = decode_threads("gpu")
        self._cpu = DecoderChain("cpu", dali=False, reduce="off", **options)

    def decode_batch(self, blobs: Sequence[bytes], *, max_side: int | None = None) -> list[Array | LightboxError]:
        """Decode each blob; per-item errors are returned in place, never raised."""
        out: list[Array | LightboxError] = [DecodeFailed("not decoded", stage=STAGE) for _ in blobs]
        cpu = self._cpu
        jpegs: list[int] = []
        rest: list[int] = []
        for i, blob in enumerate(blobs):
            try:
                info = sniff(blob, max_bytes=cpu.max_bytes, max_pixels=cpu.max_pixels, max_frames=cpu.max_frames,
                             max_scans=cpu.max_scans, max_markers=cpu.max_markers)
            except LightboxError as err:
                out[i] = err
                continue
            plain = (info.format == "jpeg" and info.components in (1, 3) and not info.pillow_path
                     and not DecoderChain._needs_colour_management(_Job(i, bytes(blob), info, None)))
            (jpegs if plain else rest).append(i)
        refused = self._nvjpeg([bytes(blobs[i]) for i in jpegs], jpegs, out)
        rest += refused
        if rest:
            for i, item in zip(rest, cpu.decode_batch([blobs[i] for i in rest], max_side=max_side), strict=True):
                out[i] = item if isinstance(item, LightboxError) else self._upload(item)
        return out

    def _nvjpeg(self, data: list[bytes], index: list[int], out: list[Array | LightboxError]) -> list[int]:
        """Decode ``data`` into ``out`` at ``index``; the indices nvJPEG refused."""
        if not data:
            return []
        try:
            images = self._decode(data)
        except (RuntimeError, TypeError, ValueError):  # one bad image fails the list: one by one
            images = []
            for blob in data:
                try:
                    images.extend(self._decode([blob]))
                except (RuntimeError, TypeError, ValueError):
                    images.append(None)
        refused = []
        for i, image in zip(index, images, strict=True):
            if image is None:
                refused.append(i)
            else:
                out[i] = image
        return refused

    def _decode(self, data: list[bytes]) -> list[Any]:
        torch, io = self._torch, self._io
        inputs = [torch.frombuffer(bytearray(b), dtype=torch.uint8) for b in data]
        tensors = io.decode_jpeg(inputs, mode=io.ImageReadMode.RGB, device=self._target, apply_exif_orientation=True)
        return [self._hwc(t) for t in tensors]

    def _hwc(self, chw: Any) -> Array:
        hwc = chw.permute(1, 2, 0).contiguous()
        if self._on_cuda:
            import cupy

            return cupy.from_dlpack(hwc)
        return np.ascontiguousarray(hwc.numpy())

    def _upload(self, image: np.ndarray) -> Array:
        if not self._on_cuda:
            return image
        import cupy

        return cupy.asarray(image)

    def close(self) -> None:
        self._cpu.close()

    def __enter__(self) -> TorchvisionDecoder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
