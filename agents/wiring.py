"""Builds the worker's stages from settings, once, at start-up (never per event)."""

from __future__ import annotations

from agents.process import BatchProcessor
from gpu_kernels.backends import Retoucher, Segmenter
from gpu_kernels.codec import make_decoder, make_encoder
from gpu_kernels.pipeline import RetouchPipeline
from gpu_kernels.presets import load_presets
from gpu_kernels.retouch import CpuRetoucher, CupyRetoucher
from schemas.codec import FileSchemaStore
from schemas.events import EventCodecs
from streams.settings import PIPELINE_VERSION, Settings

__all__ = ["build_pipeline", "build_processor"]


def _retoucher(device: str) -> Retoucher:
    return CupyRetoucher() if device == "gpu" else CpuRetoucher()


def _segmenters(settings: Settings, device: str) -> tuple[Segmenter | None, Segmenter | None, str]:
    """(model, classical fallback, model version) as configured."""
    if settings.segmenter == "none":
        return None, None, "none"
    from gpu_kernels.segment import ensure_u2netp, make_segmenter

    classical = make_segmenter("classical", device)
    if settings.segmenter == "classical":
        return None, classical, str(getattr(classical, "version", "classical"))
    from gpu_kernels.segment import make_model_segmenter

    model, choice = make_model_segmenter(settings.model_path or ensure_u2netp().batched, device=device,
                                         runtime=settings.segment_runtime, threads=settings.segment_threads,
                                         cuda_graphs=settings.cuda_graphs,
                                         max_batch=settings.max_batch if device == "gpu" else None)  # CPU: 1
    runtime = "" if choice.runtime == "fp32" else f"+{choice.runtime}"  # events name the runtime when not fp32
    return model, classical, f"{getattr(model, 'version', 'model')}{runtime}"


def build_pipeline(settings: Settings, device: str) -> tuple[RetouchPipeline, str]:
    """The pipeline and its model version string."""
    decoder = make_decoder(device, max_pixels=settings.max_pixels, max_bytes=settings.max_image_bytes)
    model, classical, model_version = _segmenters(settings, device)
    return RetouchPipeline(decoder, _retoucher(device), make_encoder(device), model, classical), model_version


def build_processor(settings: Settings, device: str | None = None) -> BatchProcessor:
    device = device or settings.resolved_device()
    pipeline, model_version = build_pipeline(settings, device)
    return BatchProcessor(
        pipeline, load_presets(settings.presets_file), EventCodecs.create(FileSchemaStore(settings.schema_store)),
        worker_id=settings.worker_id, pipeline_version=PIPELINE_VERSION, model_version=model_version,
        max_image_bytes=settings.max_image_bytes, max_pixels=settings.max_pixels,
        file_roots=settings.file_roots, output_dir=settings.output_dir)
