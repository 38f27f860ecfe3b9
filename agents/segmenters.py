"""The pipeline's segmenters from settings: the model (with its runtime chosen) and the classical
fallback. Apart from the rest of the wiring (``agents.wiring``) so that a command can make the
model, and start its compilation, before it imports the rest of the pipeline."""

from __future__ import annotations

from typing import TypeAlias

from gpu_kernels.backends import Segmenter
from schemas.errors import ProcessingFailed
from streams.settings import Settings

__all__ = ["Segmenters", "make_segmenters"]

Segmenters: TypeAlias = tuple[Segmenter | None, Segmenter | None, str]  # model, classical fallback, model version


def make_segmenters(settings: Settings, device: str) -> Segmenters:
    """(model, classical fallback, model version) as configured."""
    seg = settings.segment
    if seg.segmenter == "none":
        return None, None, "none"
    from gpu_kernels.segment import ensure_u2netp, make_segmenter

    classical = make_segmenter("classical", device)
    if seg.segmenter == "classical":
        return None, classical, classical.version
    from gpu_kernels.segment import make_model_segmenter
    from gpu_kernels.segment.model import resolve_model

    if seg.segmenter == "triton":  # the model runs on a shared Triton server; masks made here
        from gpu_kernels.segment.model import KNOWN_SPECS, load_model_config
        from gpu_kernels.segment.triton_runner import TritonSegmenter

        if seg.model_config_file is not None:
            spec = load_model_config(seg.model_config_file)[1]
        elif seg.model_spec in KNOWN_SPECS:
            spec = KNOWN_SPECS[seg.model_spec]
        else:
            raise ProcessingFailed(f"unknown model spec {seg.model_spec!r}; known: {sorted(KNOWN_SPECS)}",
                                   stage="segment")
        remote = TritonSegmenter(settings.triton.url, settings.triton.model, spec,
                                 max_batch=settings.batching.max_batch or 16, timeout_s=settings.triton.timeout_s)
        return remote, classical, remote.version

    path, spec = resolve_model(seg.model_path, seg.model_spec, seg.model_config_file)
    model, choice = make_model_segmenter(path or ensure_u2netp().batched, spec, device=device,
                                         runtime=seg.runtime, threads=seg.threads,
                                         cuda_graphs=seg.cuda_graphs,
                                         max_batch=settings.batching.max_batch if device == "gpu" else None)  # CPU: 1
    runtime = "" if choice.runtime == "fp32" else f"+{choice.runtime}"  # events name the runtime when not fp32
    return model, classical, f"{model.version}{runtime}"
