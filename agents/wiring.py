"""Builds the worker's stages from settings, once, at start-up (never per event)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from agents.batching import BatchingConfig, MicroBatcher
from agents.process import BatchProcessor
from agents.runner import Pair, RunnerConfig
from agents.segmenters import Segmenters, make_segmenters
from agents.tiers import TierBatcher
from blobio.fetch import Fetcher, FetchPolicy
from blobio.store import Waiter, make_store
from gpu_kernels.backends import Retoucher
from gpu_kernels.codec import make_decoder, make_encoder
from gpu_kernels.pipeline import ImagePipeline
from gpu_kernels.presets import load_presets
from gpu_kernels.retouch import CpuRetoucher, CupyRetoucher
from streams.registry import event_codecs
from streams.settings import PIPELINE_VERSION, FetchSettings, Settings

if TYPE_CHECKING:
    from agents.backfill import BackfillConsumer
    from streams.sink import KafkaSink

__all__ = ["backfill_batching", "batching_config", "build_fetcher", "build_pipeline", "build_processor",
           "runner_config"]


def _retoucher(device: str) -> Retoucher:
    return CupyRetoucher() if device == "gpu" else CpuRetoucher()


def build_pipeline(settings: Settings, device: str, segmenters: Segmenters | None = None
                   ) -> tuple[ImagePipeline, str]:
    """The pipeline and its model version string; ``segmenters``: made before
    (:func:`agents.segmenters.make_segmenters`), else made here."""
    decoder = make_decoder(device, max_pixels=settings.limits.max_pixels, max_bytes=settings.limits.max_image_bytes,
                           max_frames=settings.limits.max_frames, max_scans=settings.limits.max_scans,
                           time_budget_s=settings.limits.decode_time_budget_s)
    model, classical, model_version = segmenters or make_segmenters(settings, device)
    return ImagePipeline(decoder, _retoucher(device), make_encoder(device), model, classical), model_version


def build_processor(settings: Settings, device: str | None = None, *,
                    segmenters: Segmenters | None = None, waiter: Waiter | None = None) -> BatchProcessor:
    """The processor; ``waiter``: an object store or a schema registry that is down is waited for
    through it (else the store fail-stops the worker once its retries are spent)."""
    device = device or settings.resolved_device()
    pipeline, model_version = build_pipeline(settings, device, segmenters)
    return BatchProcessor(
        pipeline, load_presets(settings.worker.presets_file),
        event_codecs(settings, patience_s=None, waiter=waiter),  # a registry away: inputs wait, never dead letters
        worker_id=settings.worker.worker_id, pipeline_version=PIPELINE_VERSION, model_version=model_version,
        max_image_bytes=settings.limits.max_image_bytes, max_pixels=settings.limits.max_pixels,
        max_frames=settings.limits.max_frames, max_scans=settings.limits.max_scans,
        file_roots=settings.fetch.file_roots, fetcher=build_fetcher(settings.fetch, settings.limits.max_image_bytes),
        store=make_store(settings.store.resolved_url(), settings.store, waiter),
        inline_max_bytes=settings.store.inline_max_bytes)


def build_fetcher(fetch: FetchSettings, max_bytes: int) -> Fetcher:
    """The worker's fetcher: the fetch section's allow-lists and timeouts, inputs up to ``max_bytes``."""
    return Fetcher(FetchPolicy(
        max_bytes=max_bytes, file_roots=tuple(fetch.file_roots), allow=tuple(fetch.allow),
        timeout_s=fetch.timeout_s, connect_timeout_s=fetch.connect_timeout_s,
        retries=fetch.retries, s3_endpoint=fetch.s3_endpoint, ca_file=fetch.ca_file))


def batching_config(settings: Settings, device: str) -> BatchingConfig:
    """The micro-batcher's settings for ``device``, with the ones set in ``settings``."""
    b = settings.batching
    overrides = {"max_batch": b.max_batch, "slo_s": b.slo_ms and b.slo_ms / 1000,
                 "max_wait_s": b.max_wait_ms and b.max_wait_ms / 1000, "fixed_batch": b.fixed_batch}
    return BatchingConfig.for_device(device, **{k: v for k, v in overrides.items() if v is not None})


def backfill_batching(settings: Settings, live: BatchingConfig) -> BatchingConfig:
    """The backfill tier's batching: the live tier's, capped at ``backfill_max_batch`` (the most a
    live batch can wait behind)."""
    size = min(settings.backfill.max_batch or live.max_batch, live.max_batch)
    fixed = None if live.fixed_batch is None else min(live.fixed_batch, size)
    return replace(live, max_batch=size, fixed_batch=fixed)


#: decoded bytes in flight when ``max_in_flight_bytes`` is unset, by device: a GPU's batches of large
#: photos need room (its batch memory budget is 8 GiB); a CPU gains little from more than a few images
IN_FLIGHT_BYTES = {"cpu": 256 * 2**20, "gpu": 4 * 2**30}


def runner_config(settings: Settings, batching: BatchingConfig, side_by_side: int = 1,
                  device: str = "cpu") -> RunnerConfig:
    """Lane sizes and timeouts. Every batch slot of the lanes (decode: one running, device:
    ``device_threads`` running, each ``queue_depth`` waiting; output: ``output_threads`` running,
    ``queue_depth`` waiting) plus a filling batch must fit in flight at the largest batch size:
    with fewer inputs in flight the lanes hold small batches, and every batch costs thread hops and
    a produce request (docs/performance.md, the 64×64 backlog). ``device_threads`` is the setting,
    else ``side_by_side`` (the pipeline's: how many calls its model runs at once to good effect)."""
    depth = RunnerConfig().queue_depth
    device_threads = settings.runner.device_threads or side_by_side
    slots = (1 + depth) + (device_threads + depth) + (settings.runner.output_threads + depth) + 1
    backfill = backfill_batching(settings, batching)
    return RunnerConfig(max_in_flight=max(settings.batching.max_in_flight, slots * batching.max_batch + 8),
                        max_in_flight_bytes=settings.batching.max_in_flight_bytes or IN_FLIGHT_BYTES[device],
                        backfill_in_flight=max(settings.backfill.in_flight, backfill.max_batch),
                        prepare_threads=settings.runner.prepare_threads, output_threads=settings.runner.output_threads,
                        device_threads=device_threads,
                        backfill_threads=settings.backfill.threads, backfill_nice=settings.backfill.nice,
                        delivery_timeout_s=settings.runner.delivery_timeout_s,
                        stage_timeout_s=settings.runner.stage_timeout_s)


def tier_batcher(settings: Settings, batching: BatchingConfig) -> TierBatcher[Pair]:
    """The runner's batcher: live and backfill tiers (agents/tiers.py), live buckets by the event's priority."""
    return TierBatcher(MicroBatcher(batching), MicroBatcher(backfill_batching(settings, batching)),
                       tier_of=lambda pair: pair[0].tier, priority_of=_priority,
                       backfill_share=settings.backfill.device_share,
                       fill_to=min(settings.backfill.fill_to, batching.max_batch),
                       nbytes_of=lambda pair: pair[1].nbytes, memory_budget_bytes=batching.memory_budget_bytes)


def _priority(pair: Pair) -> int:
    event = getattr(pair[1], "event", None)
    return int(event.get("priority", 0) or 0) if isinstance(event, dict) else 0


def kafka_sink(settings: Settings) -> KafkaSink:
    """The output producer: the Kafka and topic sections, the delivery timeout and this worker's client id."""
    from streams.sink import KafkaSink

    return KafkaSink(settings.kafka, settings.topics, delivery_timeout_s=settings.runner.delivery_timeout_s,
                     client_id=f"lightbox-{settings.worker.worker_id}")


def backfill_consumer(settings: Settings, runner: Callable[[], Any],
                      live_work: Callable[[], tuple[int, int]]) -> BackfillConsumer:
    """The backfill topic's consumer: the Kafka and backfill sections, the backfill topic."""
    from agents.backfill import BackfillConsumer

    return BackfillConsumer(settings.kafka, settings.backfill, topic=settings.topics.backfill,
                            client_id=f"lightbox-{settings.worker.worker_id}-backfill", runner=runner,
                            live_work=live_work)
