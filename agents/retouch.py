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
  ``shutdown_timeout_s``), offsets are committed, exit 0 (at the latest ``FAIL_STOP_GRACE_S``
  after ``shutdown_timeout_s``, even if Faust's own stop hangs).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import signal
import threading
from collections.abc import Callable
from typing import Any

import faust

from agents.backfill import BackfillConsumer, BackfillEvent
from agents.lanes import LaneBatcher
from agents.process import BatchProcessor
from agents.runner import BatchRunner, Pair, RunnerFailed, RunnerObserver
from agents.wiring import batching_config, build_processor, lane_batcher, runner_config
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
        self.lanes: LaneBatcher[Pair] | None = None
        self.backfill: BackfillConsumer | None = None
        #: ``(queued, lag)``: live inputs queued in the worker, live records waiting in the brokers
        self.live_work: Callable[[], tuple[int, int]] = lambda: (0, 0)

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
        self.app.conf.stream_wait_empty = False  # Faust must not wait for acks that will never come
        _exit_after(FAIL_STOP_GRACE_S, lambda: EXIT_FAIL_STOP)
        os.kill(os.getpid(), signal.SIGTERM)  # Faust's own stop: agents, consumer (leave group), producer


def _exit_after(seconds: float, code: Callable[[], int]) -> None:
    """A last resort: end the process after ``seconds`` if it has not ended by itself."""
    timer = threading.Timer(seconds, lambda: os._exit(code()))
    timer.daemon = True
    timer.start()


def build_worker(settings: Settings, processor: BatchProcessor | None = None,
                 observer: RunnerObserver | None = None) -> RetouchWorker:
    """The worker; run ``worker.app`` with ``lightbox worker``. Builds the processor now.

    One runner, two lanes: the Faust agent ``lightbox.retouch`` on the input topic (live), and a
    :class:`~agents.backfill.BackfillConsumer` on the backfill topic that gets only spare capacity
    (:mod:`agents.lanes`: a backfill batch is released only while no live batch waits for the
    device, and the device serves live batches first; the backfill partitions are paused while
    live work is queued or the live lag is over ``backfill_max_live_lag``)."""
    app = create_app(settings)
    worker = RetouchWorker(app)
    device = settings.resolved_device()
    batching = batching_config(settings, device)
    config = runner_config(settings, batching)
    proc = processor or build_processor(settings, device)
    lanes = worker.lanes = lane_batcher(settings, batching)
    last_live: dict[Any, int] = {}  # live partition -> the last offset handed to the runner
    worker.live_work = functools.partial(_live_work, worker, settings, last_live)
    backfill = BackfillConsumer(settings, lambda: worker.runner, worker.live_work)
    worker.backfill = backfill

    @app.agent(input_topic(app, settings), name="lightbox.retouch")
    async def retouch(stream: faust.StreamT[bytes]) -> None:
        manual = stream.noack()  # type: ignore[attr-defined]  # on Stream, not in StreamT

        async def ack(event: Any) -> None:
            if isinstance(event, BackfillEvent):
                backfill.ack(event)
            else:
                await manual.ack(event)

        runner = worker.runner = BatchRunner(proc, KafkaSink(settings), lanes, ack=ack, config=config,
                                             observer=observer, on_fatal=worker.fail)
        pulling: asyncio.Task[None] | None = None
        try:
            await runner.start()
            if settings.backfill_enabled:
                pulling = asyncio.create_task(backfill.run(), name="lightbox-backfill")
                pulling.add_done_callback(functools.partial(_backfill_ended, worker))
            async for event in manual.events():
                last_live[event.message.tp] = event.message.offset
                await runner.submit(event)
        except RunnerFailed:
            pass  # logged by the runner; worker.fail is under way
        except Exception as exc:  # start-up included: never an agent that died while the worker stays up
            worker.fail(exc)
        finally:
            if pulling is not None:
                pulling.cancel()
            await asyncio.shield(_finish(worker, runner, settings))
            await asyncio.shield(backfill.close())

    @app.on_partitions_revoked.connect  # type: ignore[arg-type]  # after Faust waited for the acks it handed out
    def on_revoked(sender: Any, *args: Any, signal: Any = None, **kwargs: Any) -> None:
        revoked: set[Any] = args[0] if args else kwargs.get("revoked", set())
        if worker.runner is not None:
            worker.runner.revoke((tp.topic, tp.partition) for tp in revoked)
        for tp in revoked:
            last_live.pop(tp, None)

    return worker


def _live_work(worker: RetouchWorker, settings: Settings, last_live: dict[Any, int]) -> tuple[int, int]:
    """Live inputs queued in the worker (in the prepare lane, the batcher, or a batch not yet through
    the device) and live records waiting in the brokers: what pauses the backfill lane."""
    runner, lanes = worker.runner, worker.lanes
    queued = 0 if runner is None or lanes is None else runner.preparing("live") + lanes.live_queued
    return queued, _live_lag(worker.app, settings, last_live)


def _live_lag(app: faust.App, settings: Settings, last_live: dict[Any, int]) -> int:
    """Live records in the brokers past the last one handed to the runner (from the last fetch's high water)."""
    consumer = app.consumer
    try:
        assigned = consumer.assignment()
    except Exception:  # not started or rebalancing: nothing known
        return 0
    lag = 0
    for tp in assigned:
        if tp.topic != settings.input_topic:
            continue
        try:
            high = consumer.highwater(tp)
        except Exception:  # AssertionError: not assigned any more
            continue
        if high is not None:
            lag += max(0, high - last_live.get(tp, -1) - 1)
    return lag


def _backfill_ended(worker: RetouchWorker, task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        worker.fail(task.exception())  # type: ignore[arg-type]


async def _finish(worker: RetouchWorker, runner: BatchRunner, settings: Settings) -> None:
    if worker.failure is None:
        _exit_after(settings.shutdown_timeout_s + FAIL_STOP_GRACE_S, lambda: worker.exit_code)
        drained = await runner.drain(settings.shutdown_timeout_s)
        if not drained:
            worker.app.conf.stream_wait_empty = False  # what is left is redelivered; do not wait for it
        with contextlib.suppress(Exception):  # commit now, while the consumer still holds its partitions
            await worker.app.consumer.commit()
        log.warning("lightbox worker stopping: %s", "in-flight work finished and committed" if drained
                    else f"{runner.in_flight} inputs left for redelivery")
    with contextlib.suppress(Exception):
        await runner.stop()
    s = runner.stats
    log.warning("lightbox worker stopped: %d processed, %d dead letters, %d batches (mean size %.1f)",
                s.processed, s.dead_letters, s.batches, s.batch_items / max(1, s.batches))
