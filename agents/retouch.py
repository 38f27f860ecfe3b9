"""The retouch worker: a Faust agent on the input topic that feeds a :class:`BatchRunner`.

Thin glue. Everything that decides anything lives in pure modules: batching
(:mod:`agents.batching`), acknowledgement order (:mod:`agents.watermark`), records in/out
(:mod:`agents.process`), the pipeline (:mod:`gpu_kernels.pipeline`).

Process life cycle:

- The processor (model, presets, schemas) is built before the worker joins the group: an error
  there ends the process at once (exit 70) without ever holding partitions.
- Fail-stop (:meth:`RetouchWorker.fail`, from the runner or an agent error, start-up included):
  one log line, then the worker stops the way SIGTERM stops it — the consumer leaves the group,
  so the partitions move at once — and the process exits 70. If that has not happened within
  ``FAIL_STOP_GRACE_S``, the process exits 70 anyway.
- SIGTERM: intake stops, in-flight work finishes and is acknowledged (up to
  ``shutdown_timeout_s``), offsets are committed, exit 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import threading
from typing import Any

import faust

from agents.batching import MicroBatcher
from agents.process import BatchProcessor
from agents.runner import BatchRunner, RunnerFailed, RunnerObserver
from agents.wiring import batching_config, build_processor, runner_config
from streams.app import create_app, input_topic
from streams.settings import Settings
from streams.sink import KafkaSink

__all__ = ["EXIT_FAIL_STOP", "FAIL_STOP_GRACE_S", "RetouchWorker", "build_worker"]

log = logging.getLogger(__name__)

EXIT_FAIL_STOP = 70  # EX_SOFTWARE: the worker cannot go on; an orchestrator restarts it
FAIL_STOP_GRACE_S = 10.0  # longest a fail-stop waits for a clean group leave before exiting anyway


class RetouchWorker:
    """The Faust app with the retouch agent, and how its process ends."""

    def __init__(self, app: faust.App) -> None:
        self.app = app
        self.failure: BaseException | None = None
        self.runner: BatchRunner | None = None

    @property
    def exit_code(self) -> int:
        return 0 if self.failure is None else EXIT_FAIL_STOP

    def fail(self, exc: BaseException) -> None:
        """Fail-stop: leave the group and exit non-zero, quickly (see the module docstring)."""
        if self.failure is not None:
            return
        self.failure = exc
        if self.runner is None or self.runner.failure is None:  # the runner logs its own
            log.critical("lightbox worker fail-stop: %s: %s", type(exc).__name__, exc)
        timer = threading.Timer(FAIL_STOP_GRACE_S, os._exit, (EXIT_FAIL_STOP,))
        timer.daemon = True
        timer.start()
        os.kill(os.getpid(), signal.SIGTERM)  # Faust's own stop: agents, consumer (leave group), producer


def build_worker(settings: Settings, processor: BatchProcessor | None = None,
                 observer: RunnerObserver | None = None) -> RetouchWorker:
    """The worker; run ``worker.app`` with ``lightbox worker``. Builds the processor now."""
    app = create_app(settings)
    worker = RetouchWorker(app)
    device = settings.resolved_device()
    batching = batching_config(settings, device)
    config = runner_config(settings, batching)
    proc = processor or build_processor(settings, device)

    @app.agent(input_topic(app, settings), name="lightbox.retouch")
    async def retouch(stream: faust.StreamT[bytes]) -> None:
        manual = stream.noack()  # type: ignore[attr-defined]  # on Stream, not in StreamT
        runner = worker.runner = BatchRunner(proc, KafkaSink(settings), MicroBatcher(batching), ack=manual.ack,
                                             config=config, observer=observer, on_fatal=worker.fail)
        try:
            await runner.start()
            async for event in manual.events():
                await runner.submit(event)
        except RunnerFailed:
            pass  # logged by the runner; worker.fail is under way
        except Exception as exc:  # start-up included: never an agent that died while the worker stays up
            worker.fail(exc)
        finally:
            await asyncio.shield(_finish(worker, runner, settings))

    @app.on_partitions_revoked.connect  # type: ignore[arg-type]  # after Faust waited for the acks it handed out
    def on_revoked(sender: Any, *args: Any, signal: Any = None, **kwargs: Any) -> None:
        revoked: set[Any] = args[0] if args else kwargs.get("revoked", set())
        if worker.runner is not None:
            worker.runner.revoke((tp.topic, tp.partition) for tp in revoked)

    return worker


async def _finish(worker: RetouchWorker, runner: BatchRunner, settings: Settings) -> None:
    if worker.failure is None:
        drained = await runner.drain(settings.shutdown_timeout_s)
        with contextlib.suppress(Exception):  # commit now, while the consumer still holds its partitions
            await worker.app.consumer.commit()
        log.warning("lightbox worker stopping: %s", "in-flight work finished and committed" if drained
                    else f"{runner.in_flight} inputs left for redelivery")
    with contextlib.suppress(Exception):
        await runner.stop()
    s = runner.stats
    log.warning("lightbox worker stopped: %d processed, %d dead letters, %d batches (mean size %.1f)",
                s.processed, s.dead_letters, s.batches, s.batch_items / max(1, s.batches))
