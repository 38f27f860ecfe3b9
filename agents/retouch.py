"""The retouch worker: a Faust agent on the input topic that feeds a :class:`BatchRunner`.

Thin glue. Everything that decides anything lives in pure modules: batching
(:mod:`agents.batching`), records in/out (:mod:`agents.process`), the pipeline
(:mod:`gpu_kernels.pipeline`).
"""

from __future__ import annotations

import asyncio
import logging

import faust

from agents.batching import BatchingConfig, MicroBatcher
from agents.process import BatchProcessor
from agents.runner import BatchRunner
from agents.wiring import build_processor
from streams.app import create_app, input_topic
from streams.settings import Settings
from streams.sink import KafkaSink

__all__ = ["build_worker"]

log = logging.getLogger(__name__)


def build_worker(settings: Settings, processor: BatchProcessor | None = None) -> faust.App:
    """The Faust app with the retouch agent registered; run it with ``lightbox worker``."""
    app = create_app(settings)
    device = settings.resolved_device()
    overrides = {"max_batch": settings.max_batch, "slo_s": settings.slo_ms and settings.slo_ms / 1000,
                 "max_wait_s": settings.max_wait_ms and settings.max_wait_ms / 1000,
                 "fixed_batch": settings.fixed_batch}
    config = BatchingConfig.for_device(device, **{k: v for k, v in overrides.items() if v is not None})
    # a running batch plus a filling one must fit, or batches never reach the allowed size
    max_in_flight = max(settings.max_in_flight, 2 * config.max_batch + 8)

    @app.agent(input_topic(app, settings), name="lightbox.retouch")
    async def retouch(stream: faust.StreamT[bytes]) -> None:
        manual = stream.noack()  # type: ignore[attr-defined]  # on Stream, not in StreamT
        runner = BatchRunner(processor or build_processor(settings, device), KafkaSink(settings),
                             MicroBatcher(config), max_in_flight=max_in_flight)
        await runner.start()
        try:
            async for event in manual.events():
                await runner.submit(event, manual.ack)
        finally:
            await asyncio.shield(_finish(runner))

    return app


async def _finish(runner: BatchRunner) -> None:
    await runner.drain()
    await runner.stop()
    s = runner.stats
    log.warning("lightbox worker stopped: %d processed, %d dead letters, %d batches (mean size %.1f)",
                s.processed, s.dead_letters, s.batches, s.batch_items / max(1, s.batches))
