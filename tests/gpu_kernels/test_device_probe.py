"""The start-up probes of the GPU path answer with one line and never raise. CuPy itself needs
a GPU; here a stand-in module takes its place at the import boundary, and the probes' own
logic (fresh kernel source, answer check, driver floor) runs."""

from __future__ import annotations

import re
import types
from typing import Any

import numpy as np

from gpu_kernels.device_probe import cupy_jit, driver_floor


class _Array(np.ndarray):
    def get(self) -> np.ndarray:
        return np.asarray(self)


def _cupy(*, headers: bool = True, driver: int = 13000, wrong: bool = False) -> Any:
    sources: list[str] = []

    def kernel(in_params: str, out_params: str, body: str, name: str) -> Any:
        sources.append(body)
        if not headers:
            raise RuntimeError("NVRTC_ERROR_COMPILATION: catastrophic error: cannot open source file \"cuda_fp16.h\"")
        offset = float(re.search(r"\+ (\d+)\.0f", body).group(1))  # type: ignore[union-attr]
        return lambda x: (np.asarray(x) * 2.0 + offset + (1.0 if wrong else 0.0)).view(_Array)

    runtime = types.SimpleNamespace(driverGetVersion=lambda: driver)
    return types.SimpleNamespace(ElementwiseKernel=kernel, arange=np.arange, float32=np.float32,
                                 cuda=types.SimpleNamespace(runtime=runtime), sources=sources)


def test_cupy_jit_passes_compiles_a_new_source_each_time_and_names_missing_headers() -> None:
    cp = _cupy()
    assert cupy_jit(cp) is None and cupy_jit(cp) is None
    assert len(set(cp.sources)) == 2  # a fresh source each time: the kernel cache cannot answer for the compiler
    why = cupy_jit(_cupy(headers=False))
    assert why is not None and "\n" not in why and "cupy-cuda13x[ctk]" in why
    assert "expected" in (cupy_jit(_cupy(wrong=True)) or "")


def test_driver_floor_names_the_driver_cuda13_needs() -> None:
    assert driver_floor(_cupy(driver=13000)) is None
    why = driver_floor(_cupy(driver=12080))
    assert why is not None and "12.8" in why and "580" in why
