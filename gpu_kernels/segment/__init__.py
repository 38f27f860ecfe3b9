"""Segment stage (docs/architecture.md, step 3): a foreground alpha mask per image.

Two implementations of :class:`gpu_kernels.backends.Segmenter`, each on CPU (NumPy) and GPU
(CuPy, imported lazily):

- :class:`OnnxSegmenter`: an ONNX model through ONNX Runtime. The default model is the
  pretrained U²-Net-p, fetched and verified by :func:`ensure_u2netp`; others plug in through
  a :class:`ModelSpec` (``load_model_config``).
- :class:`ClassicalSegmenter`: border-colour model + morphology, for near-uniform backgrounds;
  the fallback when no model is configured.

Pick one with :func:`make_segmenter`, once, at worker start-up. The model's runtime (one of the
table :mod:`schemas.segment_runtimes`) is chosen behind a fidelity gate (``segment.runtime``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from gpu_kernels.backends import Segmenter
from gpu_kernels.segment.classical import ClassicalConfig, ClassicalSegmenter
from gpu_kernels.segment.fetch_model import ModelFiles, ensure_u2netp, model_cache_dir
from gpu_kernels.segment.model import (
    BIREFNET,
    ISNET,
    KNOWN_SPECS,
    U2NETP,
    ModelSpec,
    load_model_config,
)
from gpu_kernels.segment.onnx_runner import OnnxSegmenter, batch_buckets
from gpu_kernels.segment.postprocess import MaskPostprocess, alpha_from_probability
from gpu_kernels.segment.runtime import RuntimeChoice, make_model_segmenter
from schemas.errors import ProcessingFailed

__all__ = [
    "BIREFNET",
    "ISNET",
    "KNOWN_SPECS",
    "U2NETP",
    "ClassicalConfig",
    "ClassicalSegmenter",
    "MaskPostprocess",
    "ModelFiles",
    "ModelSpec",
    "OnnxSegmenter",
    "RuntimeChoice",
    "alpha_from_probability",
    "batch_buckets",
    "ensure_u2netp",
    "load_model_config",
    "make_model_segmenter",
    "make_segmenter",
    "model_cache_dir",
]


def make_segmenter(
    kind: Literal["model", "classical"],
    device: str = "cpu",
    model_path: Path | str | None = None,
    spec: ModelSpec | None = None,
    runtime: str = "fp32",
    **options: Any,
) -> Segmenter:
    """A segmenter for ``device`` ("cpu" or "gpu").

    ``kind="model"``: ``model_path`` (with ``spec``, default U2NETP), or, when None, the
    cached u2netp with a symbolic batch (fetched on first use; may raise FetchFailed).
    ``kind="classical"``: the border-colour segmenter; ``model_path``/``spec`` must be None.
    ``runtime``: the model's runtime (a name of :mod:`schemas.segment_runtimes`); anything but
    fp32 goes through :func:`make_model_segmenter`.
    ``options`` go to the constructor (``max_batch``, ``threads``, ``post``, ``config``, ...).
    """
    if kind == "classical":
        if model_path is not None or spec is not None:
            raise ProcessingFailed("classical segmenter takes no model_path or spec", stage="segment")
        return ClassicalSegmenter(device=device, **options)
    if kind == "model":
        if model_path is None:
            model_path = ensure_u2netp().batched
        if runtime == "fp32" and not options.get("cuda_graphs"):
            return OnnxSegmenter(model_path, spec or U2NETP, device=device, **options)
        seg, _ = make_model_segmenter(Path(model_path), spec or U2NETP, device=device, runtime=runtime, **options)
        return seg
    raise ProcessingFailed(f"unknown segmenter kind {kind!r}; use 'model' or 'classical'", stage="segment")
