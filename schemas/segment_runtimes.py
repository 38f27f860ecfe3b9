"""The segment model's runtimes, in one table: every name ``LIGHTBOX_SEGMENT_RUNTIME`` takes.

Two kinds of row:

- :class:`SegmentRuntime`: one engine at one precision (``openvino-bf16``: OpenVINO, bf16).
  Asked for by name it is used as asked, not gated.
- :class:`RuntimeFamily`: a name that chooses on one device (``auto``, ``openvino``, ``torch``, and
  ``fp16`` on the GPU): its candidates go through the fidelity gate against fp32 masks (verdicts
  cached per machine) and its rule picks one (``fastest``: the quickest that passed and is
  ``min_speedup`` faster than fp32; ``first``: the first in order that passed); when none does,
  the first available of its ``fallback`` names.

The settings (which names are valid), ``gpu_kernels.segment.runtime`` (what each row builds and
how a family chooses), ``lightbox doctor`` and ``lightbox process --help`` read this table; the
names are spelled nowhere else. Adding a runtime: one row here, its runner, its gate test
(docs/model-runtimes.md, "Adding a runtime").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["FAMILIES", "NAMES", "RUNTIMES", "Engine", "RuntimeFamily", "SegmentRuntime", "family", "names_for",
           "runtime", "summary"]

Engine = Literal["onnxruntime", "openvino", "torch"]
Device = Literal["cpu", "gpu"]


@dataclass(frozen=True, slots=True)
class SegmentRuntime:
    """One engine at one precision. ``precision``: what the engine's runner is asked for.
    ``auto``: a candidate of ``auto`` on the CPU. ``recheck``: OpenVINO bf16 that runs an unsure
    image again at f32."""

    name: str
    engine: Engine
    precision: str
    devices: tuple[Device, ...]
    summary: str
    auto: bool = False
    recheck: bool = False


@dataclass(frozen=True, slots=True)
class RuntimeFamily:
    """A name that chooses among ``candidates`` on ``device`` (see the module docstring)."""

    name: str
    device: Device
    candidates: tuple[str, ...]
    rule: Literal["fastest", "first"]
    fallback: tuple[str, ...]
    summary: str
    min_speedup: float = 0.0


RUNTIMES: tuple[SegmentRuntime, ...] = (
    SegmentRuntime("fp32", "onnxruntime", "fp32", ("cpu", "gpu"), "ONNX Runtime, float32: the reference"),
    SegmentRuntime("openvino-bf16", "openvino", "bf16", ("cpu",), "OpenVINO bf16 (CPUs with AVX512-BF16 or AMX)",
                   auto=True),
    SegmentRuntime("openvino-checked", "openvino", "bf16", ("cpu",), "OpenVINO bf16 that runs an unsure image "
                   "again at f32", auto=True, recheck=True),
    SegmentRuntime("openvino-f32", "openvino", "f32", ("cpu",), "OpenVINO f32", auto=True),
    SegmentRuntime("int8", "onnxruntime", "int8", ("cpu",), "ONNX Runtime on a static INT8 copy (calibrated once)",
                   auto=True),
    SegmentRuntime("fp16", "onnxruntime", "fp16", ("gpu",), "ONNX Runtime on a float16 copy (CUDA/TensorRT)"),
    SegmentRuntime("torch-bf16", "torch", "bf16", ("cpu", "gpu"), "PyTorch bf16 autocast ([torch] extra)",
                   auto=True),
    SegmentRuntime("torch-fp16", "torch", "fp16", ("cpu", "gpu"), "PyTorch fp16 autocast ([torch] extra)",
                   auto=True),
    SegmentRuntime("torch-fp32", "torch", "fp32", ("cpu", "gpu"), "PyTorch float32 ([torch] extra)", auto=True),
)

FAMILIES: tuple[RuntimeFamily, ...] = (
    RuntimeFamily("auto", "cpu", tuple(r.name for r in RUNTIMES if r.auto), "fastest", ("fp32",),
                  "the fastest runtime that passes the gate and is 1.1x fp32, else fp32", min_speedup=1.10),
    RuntimeFamily("auto", "gpu", (), "first", ("fp32", "torch"),
                  "fp32 (ONNX Runtime with CUDA), else torch"),
    RuntimeFamily("openvino", "cpu", ("openvino-bf16", "openvino-checked", "openvino-f32"), "first",
                  ("openvino-f32",), "OpenVINO: bf16 when it passes the gate, else the checked bf16, else f32"),
    RuntimeFamily("torch", "cpu", ("torch-bf16", "torch-fp16"), "fastest", ("torch-fp32",),
                  "PyTorch: the faster of bf16/fp16 that passes the gate, else fp32"),
    RuntimeFamily("torch", "gpu", ("torch-fp16",), "first", ("torch-fp32",),
                  "PyTorch: fp16 when it passes the gate, else fp32"),
    RuntimeFamily("fp16", "gpu", ("fp16",), "first", ("fp32",), "the float16 copy when it passes the gate, else fp32"),
)

NAMES: tuple[str, ...] = tuple(dict.fromkeys([*(f.name for f in FAMILIES), *(r.name for r in RUNTIMES)]))


def runtime(name: str) -> SegmentRuntime | None:
    return next((r for r in RUNTIMES if r.name == name), None)


def family(name: str, device: str) -> RuntimeFamily | None:
    return next((f for f in FAMILIES if f.name == name and f.device == device), None)


def names_for(device: str) -> list[str]:
    """Every name that means something on ``device`` ("cpu" or "gpu")."""
    return [n for n in NAMES if family(n, device) is not None or device in getattr(runtime(n), "devices", ())]


def summary(device: str | None = None) -> str:
    """One line per name (on ``device``, or every device): the help texts' list."""
    lines = []
    for n in NAMES:
        fams = [f for f in FAMILIES if f.name == n and device in (None, f.device)]
        row = runtime(n)
        for f in fams:
            lines.append(f"{n} ({f.device}): {f.summary}")
        if row is not None and not fams and (device is None or device in row.devices):
            lines.append(f"{n} ({'/'.join(row.devices)}): {row.summary}")
    return "; ".join(lines)
