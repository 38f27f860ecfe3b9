"""Retouch stages (docs/architecture.md, steps 4 to 6) as two fused passes, each with a CPU twin.

* pass (a), :meth:`correct`: white balance + Retinex local illumination + exposure/gamma +
  composite, one elementwise pass per image (:mod:`.correction`);
* pass (b), :meth:`render`: subject-aware crop + pad + antialiased resize + unsharp mask, one
  gather pass per preset (:mod:`.render`), batched over images on the GPU.

``CpuRetoucher`` (NumPy) and ``CupyRetoucher`` (CuPy RawKernels, imported lazily: importing
this package needs only NumPy) implement :class:`gpu_kernels.backends.Retoucher`.
Parameters are estimated on a strided sample with array-module-generic code, so both backends
use the same numbers. Options: ``lighting="off"`` skips every colour stage (composite only);
``"auto"`` runs white balance, exposure/gamma and, with ``RetinexConfig.strength > 0``, local
illumination. A white background without a mask (and without an alpha channel) keeps the image.
"""

from __future__ import annotations

from gpu_kernels.retouch.color import ExposureConfig, WhiteBalanceConfig
from gpu_kernels.retouch.config import RetouchConfig
from gpu_kernels.retouch.cpu import CpuRetoucher
from gpu_kernels.retouch.geometry import GeometryConfig
from gpu_kernels.retouch.gpu import CupyRetoucher
from gpu_kernels.retouch.illumination import RetinexConfig

__all__ = [
    "CpuRetoucher",
    "CupyRetoucher",
    "ExposureConfig",
    "GeometryConfig",
    "RetinexConfig",
    "RetouchConfig",
    "WhiteBalanceConfig",
]
