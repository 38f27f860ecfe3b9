"""Builds the worker's stages from settings, once, at start-up (never per event)."""

from __future__ import annotations

from dataclasses import replace

from agents.batching import BatchingConfig, MicroBatcher
from agents.process import BatchProcessor
from agents.runner import Pair, RunnerConfig
from agents.tiers import TierBatcher
from blobio.fetch import Fetcher, FetchPolicy
from blobio.store import make_store
from gpu_kernels.backends import Retoucher, Segmenter
from gpu_kernels.codec import make_decoder, make_encoder
from gpu_kernels.pipeline import RetouchPipeline
from gpu_kernels.presets import load_presets
from gpu_kernels.retouch import CpuRetoucher, CupyRetoucher
from schemas.codec import FileSchemaStore
from schemas.errors import ProcessingFailed
from schemas.events import EventCodecs
from streams.settings import PIPELINE_VERSION, Settings

__all__ = ["backfill_batching", "batching_config", "build_fetcher", "build_pipeline", "build_processor",
           "runner_config"]


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
    from gpu_kernels.segment.model import resolve_model

    if settings.segmenter == "triton":  # the model runs on a shared Triton server; masks made here
        from gpu_kernels.segment.model import KNOWN_SPECS, load_model_config
        from gpu_kernels.segment.triton_runner import TritonSegmenter

        if settings.model_config_file is not None:
            spec = load_model_config(settings.model_config_file)[1]
        elif settings.model_spec in KNOWN_SPECS:
            spec = KNOWN_SPECS[settings.model_spec]
        else:
            raise ProcessingFailed(f"unknown model spec {settings.model_spec!r}; known: {sorted(KNOWN_SPECS)}",
                                   stage="segment")
        remote = TritonSegmenter(settings.triton_url, settings.triton_model, spec,
                                 max_batch=settings.max_batch or 16, timeout_s=settings.triton_timeout_s)
        return remote, classical, remote.version

    path, spec = resolve_model(settings.model_path, settings.model_spec, settings.model_config_file)
    model, choice = make_model_segmenter(path or ensure_u2netp().batched, spec, device=device,
                                         runtime=settings.segment_runtime, threads=settings.segment_threads,
                                         cuda_graphs=settings.cuda_graphs,
                                         max_batch=settings.max_batch if device == "gpu" else None)  # CPU: 1
    runtime = "" if choice.runtime == "fp32" else f"+{choice.runtime}"  # events name the runtime when not fp32
    return model, classical, f"{getattr(model, 'version', 'model')}{runtime}"


def build_pipeline(settings: Settings, device: str) -> tuple[RetouchPipeline, str]:
    """The pipeline and its model version string."""
    decoder = make_decoder(device, max_pixels=settings.max_pixels, max_bytes=settings.max_image_bytes,
                           max_frames=settings.max_frames, max_scans=settings.max_scans,
                           time_budget_s=settings.decode_time_budget_s)
    model, classical, model_version = _segmenters(settings, device)
    return RetouchPipeline(decoder, _retoucher(device), make_encoder(device), model, classical), model_version


def build_processor(settings: Settings, device: str | None = None) -> BatchProcessor:
    device = device or settings.resolved_device()
    pipeline, model_version = build_pipeline(settings, device)
    return BatchProcessor(
        pipeline, load_presets(settings.presets_file), EventCodecs.create(FileSchemaStore(settings.schema_store)),
        worker_id=settings.worker_id, pipeline_version=PIPELINE_VERSION, model_version=model_version,
        max_image_bytes=settings.max_image_bytes, max_pixels=settings.max_pixels,
        max_frames=settings.max_frames, max_scans=settings.max_scans,
        file_roots=settings.file_roots, fetcher=build_fetcher(settings),
        store=make_store(settings.output_store_url(), settings), inline_max_bytes=settings.inline_max_bytes)


def build_fetcher(settings: Settings) -> Fetcher:
    return Fetcher(FetchPolicy(
        max_bytes=settings.max_image_bytes, file_roots=tuple(settings.file_roots), allow=tuple(settings.fetch_allow),
        timeout_s=settings.fetch_timeout_s, connect_timeout_s=settings.fetch_connect_timeout_s,
        retries=settings.fetch_retries, s3_endpoint=settings.s3_endpoint, ca_file=settings.fetch_ca_file))


def batching_config(settings: Settings, device: str) -> BatchingConfig:
    """The micro-batcher's settings for ``device``, with the ones set in ``settings``."""
    overrides = {"max_batch": settings.max_batch, "slo_s": settings.slo_ms and settings.slo_ms / 1000,
                 "max_wait_s": settings.max_wait_ms and settings.max_wait_ms / 1000,
                 "fixed_batch": settings.fixed_batch}
    return BatchingConfig.for_device(device, **{k: v for k, v in overrides.items() if v is not None})


def backfill_batching(settings: Settings, live: BatchingConfig) -> BatchingConfig:
    """The backfill tier's batching: the live tier's, capped at ``backfill_max_batch`` (the most a
    live batch can wait behind)."""
    size = min(settings.backfill_max_batch or live.max_batch, live.max_batch)
    fixed = None if live.fixed_batch is None else min(live.fixed_batch, size)
    return replace(live, max_batch=size, fixed_batch=fixed)


def runner_config(settings: Settings, batching: BatchingConfig) -> RunnerConfig:
    """Lane sizes and timeouts. Every batch slot of the lanes (decode and device: one running,
    ``queue_depth`` waiting; output: ``output_threads`` running, ``queue_depth`` waiting) plus a
    filling batch must fit in flight at the largest batch size: with fewer inputs in flight the
    lanes hold small batches, and every batch costs thread hops and a produce request (with a
    backlog of 64×64 images and 64 in flight, batches averaged 2 items; bench/bench_overhead.py)."""
    depth = RunnerConfig().queue_depth
    slots = 2 * (1 + depth) + settings.output_threads + depth + 1
    backfill = backfill_batching(settings, batching)
    return RunnerConfig(max_in_flight=max(settings.max_in_flight, slots * batching.max_batch + 8),
                        backfill_in_flight=max(settings.backfill_in_flight, backfill.max_batch),
                        prepare_threads=settings.prepare_threads, output_threads=settings.output_threads,
                        backfill_threads=settings.backfill_threads, backfill_nice=settings.backfill_nice,
                        delivery_timeout_s=settings.delivery_timeout_s, stage_timeout_s=settings.stage_timeout_s)


def tier_batcher(settings: Settings, batching: BatchingConfig) -> TierBatcher[Pair]:
    """The runner's batcher: live and backfill tiers (agents/tiers.py), live buckets by the event's priority."""
    return TierBatcher(MicroBatcher(batching), MicroBatcher(backfill_batching(settings, batching)),
                       tier_of=lambda pair: pair[0].tier, priority_of=_priority,
                       backfill_share=settings.backfill_device_share, wait_for_live=settings.backfill_wait_for_live,
                       pipelined=settings.backfill_pipelined,
                       fill_to=min(settings.backfill_fill_to, batching.max_batch),
                       nbytes_of=lambda pair: pair[1].nbytes, memory_budget_bytes=batching.memory_budget_bytes)


def _priority(pair: Pair) -> int:
    event = getattr(pair[1], "event", None)
    return int(event.get("priority", 0) or 0) if isinstance(event, dict) else 0
