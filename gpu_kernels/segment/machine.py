"""What this machine and installation can run the model on: the probes the runtime table
(:mod:`schemas.segment_runtimes`) is read against. Each looks without loading a model, and the
costly ones once per process.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.metadata
import importlib.util
import os
import platform
from pathlib import Path
from typing import Any

__all__ = ["INSTALL", "available", "cpu_flags_line", "machine_key", "openvino_available", "openvino_bf16",
           "ort_available", "ort_has_cuda", "torch_available", "torch_cpu_supports", "torch_cuda_available",
           "usable_cores"]

# what to install for an engine, in the errors that name a missing one
INSTALL = {"onnxruntime": "pip install 'lightbox[cpu]' (or 'lightbox[gpu]' on an NVIDIA host)",
           "openvino": "pip install openvino", "torch": "pip install 'lightbox[torch]'"}


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


@functools.cache
def cpu_flags_line() -> str:
    """The ``flags`` line of ``/proc/cpuinfo`` (the CPU's instruction sets), "" where there is none;
    read once per process."""
    with contextlib.suppress(OSError):
        return next((ln for ln in Path("/proc/cpuinfo").read_text().splitlines() if ln.startswith("flags")), "")
    return ""


def ort_available() -> bool:
    """Whether an ONNX Runtime is installed (found without importing it)."""
    try:
        return importlib.util.find_spec("onnxruntime") is not None
    except (ImportError, ValueError):
        return False


@functools.cache
def ort_has_cuda() -> bool:
    """Whether ONNX Runtime has its CUDA provider here."""
    if not ort_available():
        return False
    import onnxruntime as ort

    if hasattr(ort, "preload_dlls"):
        with contextlib.suppress(OSError, RuntimeError):
            ort.preload_dlls()
    return "CUDAExecutionProvider" in ort.get_available_providers()


def openvino_available() -> bool:
    """Whether OpenVINO is installed (found without importing it: a start whose model runs on ONNX
    Runtime, ``auto`` where OpenVINO is not 1.1x faster, never needs its ~30 ms import; a broken
    install says so when an OpenVINO runtime is built)."""
    try:
        return importlib.util.find_spec("openvino") is not None
    except (ImportError, ValueError):
        return False


@functools.cache
def openvino_bf16() -> bool:
    """Whether OpenVINO's CPU plugin can run bf16 natively: on Linux from the CPU's flags
    (AVX512-BF16 or AMX-BF16, the instructions the plugin needs), else its reported optimisation
    capabilities (asking the plugin costs ~50 ms at every start)."""
    flags = cpu_flags_line()
    if flags:
        return bool({"avx512_bf16", "amx_bf16"} & set(flags.split()))
    from gpu_kernels.segment.openvino_runner import shared_core

    try:
        caps = shared_core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")
    except (ImportError, RuntimeError):
        return False
    return "BF16" in [str(c).upper() for c in caps]


def torch_available() -> bool:
    """Whether ``torch`` is installed (found without importing it)."""
    return importlib.util.find_spec("torch") is not None


def torch_cuda_available() -> bool:
    if not torch_available():
        return False
    from gpu_kernels.segment.onnx_torch import import_torch

    try:
        return bool(import_torch().cuda.is_available())
    except Exception:  # a broken CUDA install reports itself here, not on the first image
        return False


def torch_cpu_supports(precision: str) -> bool:
    """Whether PyTorch's oneDNN has native ``precision`` convolutions on this CPU (fp32: always).

    Without native support autocast still runs, through slow emulation, so the runtime choice
    does not offer that precision on this CPU."""
    if not torch_available():
        return False
    if precision == "fp32":
        return True
    from gpu_kernels.segment.onnx_torch import import_torch

    try:
        torch = import_torch()
        check = {"bf16": "_is_mkldnn_bf16_supported", "fp16": "_is_mkldnn_fp16_supported"}[precision]
        return bool(torch.backends.mkldnn.is_available() and getattr(torch.ops.mkldnn, check)())
    except (KeyError, AttributeError, RuntimeError):
        return False


def available(row: Any, device: str) -> bool:
    """Whether runtime ``row`` (a :class:`schemas.segment_runtimes.SegmentRuntime`) runs on
    ``device`` here."""
    if device not in row.devices:
        return False
    if row.engine == "onnxruntime":
        return ort_has_cuda() if device == "gpu" else ort_available()
    if row.engine == "openvino":
        return openvino_available() and (row.precision != "bf16" or openvino_bf16())
    if row.engine == "torch":
        return torch_cuda_available() if device == "gpu" else torch_cpu_supports(row.precision)
    return False


@functools.cache
def machine_key(torch: bool) -> tuple[list[str], str]:
    """The runtime versions and the CPU (its flags) a gate verdict holds for; once per process."""
    versions = []
    for package in ("onnxruntime", "onnxruntime-gpu", "openvino", *(("torch",) if torch else ())):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):  # not imported: ~0.3 s at start
            versions.append(importlib.metadata.version(package))
    return versions, cpu_flags_line() or platform.processor() or platform.machine()
