"""Derived copies of a segmentation model: FP16 (GPU) and INT8 (CPU), built once and cached.

- :func:`make_fp16`: weights and activations in float16 (``onnxconverter-common``), inputs and
  outputs kept float32 so the runner and the pre/post-processing do not change.
- :func:`make_int8`: ONNX Runtime static quantization in QDQ format, int8 per-channel weights
  and uint8 activations with ranges calibrated (min-max) on sample images; the last layers
  (``keep_float_tail`` convolutions, the fused output and the side outputs) stay in float.
  Opset 11 models are converted to opset 13 first (per-channel QDQ needs it).

Neither is used unless it passes the fidelity gate (``gpu_kernels.segment.runtime``).
:func:`derived_path` names a variant's cache file after the source's sha256, so a changed
model never meets a stale copy.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from gpu_kernels.segment.fetch_model import make_batch_static, sha256_file
from gpu_kernels.segment.model import ModelSpec, preprocess
from gpu_kernels.segment.ops import CpuOps
from schemas.errors import ProcessingFailed

__all__ = ["batch_copy", "derived_path", "make_fp16", "make_int8"]

STAGE = "segment.variants"


def derived_path(src: Path, kind: str, folder: Path | None = None) -> Path:
    """``<folder>/<stem>.<sha12>.<kind>.onnx`` (folder: the source's own)."""
    return (folder or src.parent) / f"{src.stem}.{sha256_file(src)[:12]}.{kind}.onnx"


def batch_copy(src: Path, batch: int, folder: Path) -> Path:
    """``src`` with dim 0 of its inputs and outputs fixed at ``batch``
    (``<folder>/<stem>.<sha12>.b<batch>.onnx``, written on first use by ``make_batch_static``).
    Raises OSError when ``folder`` cannot be written, FetchFailed without the ``onnx`` package."""
    dst = derived_path(src, f"b{batch}", folder)
    if not dst.is_file():
        dst.parent.mkdir(parents=True, exist_ok=True)
        make_batch_static(src, dst, batch)
    return dst


def _save_atomic(model: Any, dst: Path) -> None:
    import onnx

    dst.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=dst.parent, prefix=f".{dst.name}.", suffix=".tmp")
    os.close(fd)
    try:
        onnx.save(model, tmp)
        os.replace(tmp, dst)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def make_fp16(src: Path, dst: Path) -> Path:
    """A float16 copy of ``src`` with float32 inputs and outputs; returns ``dst``."""
    try:
        import onnx
        from onnxconverter_common import float16
    except ImportError as exc:
        raise ProcessingFailed("the FP16 model needs 'onnx' and 'onnxconverter-common'", stage=STAGE) from exc
    model = float16.convert_float_to_float16(onnx.load(str(src)), keep_io_types=True)
    _save_atomic(model, dst)
    return dst


class _Calibration:
    """ONNX Runtime's CalibrationDataReader over prepared sample images (one per call)."""

    def __init__(self, input_name: str, batches: Iterable[np.ndarray]) -> None:
        self._it: Iterator[np.ndarray] = iter(batches)
        self.input_name = input_name

    def get_next(self) -> dict[str, np.ndarray] | None:
        x = next(self._it, None)
        return None if x is None else {self.input_name: x}


def make_int8(src: Path, dst: Path, spec: ModelSpec, images: Iterable[np.ndarray], *,
              keep_float_tail: int = 7) -> Path:
    """A static QDQ INT8 copy of ``src`` calibrated on ``images`` (``(H, W, 3)`` uint8 RGB)."""
    try:
        import onnx
        from onnx import version_converter
        from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static
    except ImportError as exc:
        raise ProcessingFailed("the INT8 model needs 'onnx' and onnxruntime's quantization tools",
                               stage=STAGE) from exc
    model = onnx.load(str(src))
    opset = max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=13)
    if opset < 13:
        model = version_converter.convert_version(model, 13)
    convs = [n.name for n in model.graph.node if n.op_type == "Conv"]
    initializers = {t.name for t in model.graph.initializer}
    input_name = spec.input_name or next(i.name for i in model.graph.input if i.name not in initializers)
    ops = CpuOps()
    with tempfile.TemporaryDirectory(prefix="lightbox-int8-") as tmp:
        staged = Path(tmp) / "model.onnx"
        onnx.save(model, str(staged))
        reader = _Calibration(input_name, (preprocess([img], spec, 1, ops) for img in images))
        out = Path(tmp) / "int8.onnx"
        quantize_static(str(staged), str(out), reader, quant_format=QuantFormat.QDQ, per_channel=True,
                        activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                        calibrate_method=CalibrationMethod.MinMax,
                        nodes_to_exclude=convs[-keep_float_tail:] if keep_float_tail else [])
        _save_atomic(onnx.load(str(out)), dst)
    return dst
