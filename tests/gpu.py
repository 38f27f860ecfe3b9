"""Shared by the GPU test modules: CuPy with a CUDA device, or a clean module-level skip."""

from __future__ import annotations

from typing import Any

import pytest


def cupy_or_skip() -> Any:
    """The ``cupy`` module; skips the calling test module without CuPy or without a CUDA device."""
    cp = pytest.importorskip("cupy")
    try:
        devices = cp.cuda.runtime.getDeviceCount()
    except Exception:  # no driver / no device: CuPy raises CUDARuntimeError
        devices = 0
    if devices == 0:
        pytest.skip("no CUDA device", allow_module_level=True)
    return cp
