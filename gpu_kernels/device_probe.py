"""Quick probes of what the GPU path needs, each answering in a second or two with one line.

- :func:`cupy_jit` compiles and runs a new CuPy elementwise kernel: CuPy builds its kernels at
  run time with NVRTC, which needs the CUDA headers (CuPy 13.6 and later ship none: they come
  from ``cupy-cuda13x[ctk]`` or the CUDA toolkit's cudart/cccl headers). Without them every new
  kernel fails on the first image; this finds it at start.
- :func:`driver_floor` checks the NVIDIA driver against the CUDA major the wheels are built for
  (CUDA 13: driver 580 or newer).

``lightbox doctor`` and the GPU validation run's preflight call them. None raises.
"""

from __future__ import annotations

import time
from typing import Any

__all__ = ["CUDA_MAJOR", "DRIVER_FLOOR", "cupy_jit", "driver_floor"]

CUDA_MAJOR = 13  # what the gpu extra's wheels (CuPy, ONNX Runtime, DALI) are built for
DRIVER_FLOOR = "580"  # the first driver branch that runs CUDA 13 code


def cupy_jit(cupy: Any = None) -> str | None:
    """None when a freshly generated CuPy kernel compiles and gives the right answer; else why."""
    try:
        cp = cupy or __import__("cupy")
        # A new source each call: CuPy's on-disk kernel cache cannot hide a missing header.
        stamp = time.time_ns() % 1_000_003
        kernel = cp.ElementwiseKernel("float32 x", "float32 y", f"y = x * 2.0f + {stamp}.0f",
                                      f"lightbox_probe_{stamp}")
        got = float(kernel(cp.arange(4, dtype=cp.float32)).get()[3])
    except Exception as exc:  # no CuPy, no device, NVRTC cannot find a header
        text = " ".join(str(exc).split())[:240]
        hint = " (CUDA headers missing: pip install 'cupy-cuda13x[ctk]')" if ".h" in text or "nvrtc" in text.lower() \
            else ""
        return f"a CuPy kernel did not compile: {type(exc).__name__}: {text}{hint}"
    if got != 6.0 + stamp:
        return f"a CuPy kernel gave {got}, expected {6.0 + stamp}"
    return None


def driver_floor(cupy: Any = None) -> str | None:
    """None when the driver runs CUDA ``CUDA_MAJOR`` code; else one line with the versions."""
    try:
        cp = cupy or __import__("cupy")
        version = int(cp.cuda.runtime.driverGetVersion())  # e.g. 13000 for CUDA 13.0
    except Exception as exc:
        return f"cannot read the NVIDIA driver's CUDA version: {type(exc).__name__}: {exc}"[:300]
    if version // 1000 < CUDA_MAJOR:
        return (f"the NVIDIA driver supports CUDA {version // 1000}.{version % 1000 // 10}; the GPU wheels need "
                f"CUDA {CUDA_MAJOR} (driver {DRIVER_FLOOR} or newer)")
    return None
