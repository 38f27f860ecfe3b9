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
from agents.lanes import BACKFILL, LIVE, LaneBatcher, pause_backfill
from agents.process import BatchProcessor
from agents.runner import BatchRunner, Pair, RunnerFailed, RunnerObserver
from agents.wiring import backfill_batching, batching_config, build_processor, runner_config
from streams.app import backfill_topic, create_app, input_topic
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
        self.lane_pauses = 0  # times the backfill partitions were paused

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
    """The worker; run ``worker.app`` with ``lightbox worker``. Builds the processor now.

    Two agents feed one runner: ``lightbox.retouch`` on the input topic (live) and
    ``lightbox.backfill`` on the backfill topic, which gets only spare capacity
    (:mod:`agents.lanes`): a :class:`LaneBatcher` lets a backfill batch go only when no live item
    waits, and :func:`_lane_control` pauses the backfill partitions while live work is queued or
    the live lag is over ``backfill_max_live_lag``."""
    app = create_app(settings)
    worker = RetouchWorker(app)
    device = settings.resolved_device()
    batching = batching_config(settings, device)
    config = runner_config(settings, batching)
    proc = processor or build_processor(settings, device)
    lanes: LaneBatcher[Pair] = LaneBatcher(MicroBatcher(batching), MicroBatcher(backfill_batching(settings, batching)),
                                           lane_of=lambda pair: pair[0].lane, priority_of=_priority)
    worker.lanes = lanes
    shared = _SharedRunner(worker, settings)

    async def ack(event: Any) -> None:
        lane = BACKFILL if event.message.topic == settings.backfill_topic else LIVE
        await shared.streams[lane].ack(event)

    def make_runner() -> BatchRunner:
        return BatchRunner(proc, KafkaSink(settings), lanes, ack=ack, config=config, observer=observer,
                           on_fatal=worker.fail)

    shared.make_runner = make_runner

    @app.agent(input_topic(app, settings), name="lightbox.retouch")
    async def retouch(stream: faust.StreamT[bytes]) -> None:
        await shared.consume(stream, LIVE)

    if settings.backfill_enabled:
        @app.agent(backfill_topic(app, settings), name="lightbox.backfill")
        async def backfill(stream: faust.StreamT[bytes]) -> None:
            await shared.consume(stream, BACKFILL)

    @app.on_partitions_revoked.connect  # type: ignore[arg-type]  # after Faust waited for the acks it handed out
    def on_revoked(sender: Any, *args: Any, signal: Any = None, **kwargs: Any) -> None:
        revoked: set[Any] = args[0] if args else kwargs.get("revoked", set())
        if worker.runner is not None:
            worker.runner.revoke((tp.topic, tp.partition) for tp in revoked)
        for tp in revoked:
            shared.last_live.pop(tp, None)

    return worker


def _priority(pair: Pair) -> int:
    event = getattr(pair[1], "event", None)
    return int(event.get("priority", 0) or 0) if isinstance(event, dict) else 0


class _SharedRunner:
    """One runner for both agents: the first to start builds and starts it (and the lane
    control); the last to stop drains and stops it."""

    def __init__(self, worker: RetouchWorker, settings: Settings) -> None:
        self.worker, self.settings = worker, settings
        self.streams: dict[str, Any] = {}
        self.make_runner: Any = None
        self.last_live: dict[Any, int] = {}  # live partition -> the last offset handed to the runner
        self.backfill_open = asyncio.Event()  # cleared: the backfill agent stops pulling (its partitions pause)
        self.backfill_open.set()
        self._users = 0
        self._lock = asyncio.Lock()
        self._control: asyncio.Task[None] | None = None

    async def consume(self, stream: Any, lane: str) -> None:
        manual = stream.noack()
        self.streams[lane] = manual
        runner: BatchRunner | None = None
        try:
            runner = await self._acquire()
            last, gate = self.last_live, self.backfill_open
            events = manual.events().__aiter__()
            while True:
                if lane == BACKFILL:
                    await gate.wait()  # paused: stop pulling (see _lane_control)
                try:
                    event = await events.__anext__()
                except StopAsyncIteration:
                    break
                if lane == LIVE:
                    last[event.message.tp] = event.message.offset
                await runner.submit(event, lane=lane)
        except RunnerFailed:
            pass  # logged by the runner; worker.fail is under way
        except Exception as exc:  # start-up included: never an agent that died while the worker stays up
            self.worker.fail(exc)
        finally:
            if runner is not None:
                await asyncio.shield(self._release(runner))

    async def _acquire(self) -> BatchRunner:
        async with self._lock:
            self._users += 1
            if self.worker.runner is None:
                runner = self.worker.runner = self.make_runner()
                await runner.start()
                if self.settings.backfill_enabled and self.worker.lanes is not None:
                    self._control = asyncio.create_task(_lane_control(self.worker, self, self.settings),
                                                        name="lightbox-lane-control")
            return self.worker.runner

    async def _release(self, runner: BatchRunner) -> None:
        async with self._lock:
            self._users -= 1
            if self._users > 0:
                return
            if self._control is not None:
                self._control.cancel()
            await _finish(self.worker, runner, self.settings)


async def _lane_control(worker: RetouchWorker, shared: _SharedRunner, settings: Settings) -> None:
    """Every ``backfill_check_ms``: pause the backfill topic's partitions while live work is queued
    or the live lag (records in the brokers past the last one handed over) is over the threshold;
    resume them otherwise. A live lane over the threshold also holds backfill batches back.

    Pausing is done by the backfill agent no longer pulling from its stream: Faust's own flow
    control then stops fetching the partitions once their buffer is full, and resumes when it
    drains. Faust's ``consumer.pause_partitions`` is not used: called while a fetched batch is
    being handed out, it drops that batch's records of the paused partitions from the stream
    (faust-streaming 0.15.3 filters them against the live set of active partitions after the
    fetch advanced the position; seen here as a backfill that stopped for good). During a
    rebalance held backfill batches go regardless of live work, so the revoke's wait for
    acknowledgements ends."""
    consumer = worker.app.consumer
    lanes, gate, paused = worker.lanes, shared.backfill_open, False
    assert lanes is not None
    while True:
        await asyncio.sleep(settings.backfill_check_ms / 1000)
        runner = worker.runner
        if runner is None:
            continue
        lanes.rebalancing = bool(getattr(worker.app, "rebalancing", False))
        try:
            assigned = consumer.assignment()
        except Exception:  # not assigned yet (consumer starting, rebalancing)
            continue
        lag = 0
        for tp in assigned:
            if tp.topic == settings.input_topic:
                try:
                    high = consumer.highwater(tp)
                except Exception:  # AssertionError: not assigned any more (a rebalance under way)
                    continue
                if high is not None:
                    lag += max(0, high - shared.last_live.get(tp, -1) - 1)
        queued = runner.preparing(LIVE) + lanes.live_queued
        lanes.live_behind = lag > settings.backfill_max_live_lag
        pause = pause_backfill(queued, lag, settings.backfill_max_live_lag) and not lanes.rebalancing
        if pause:
            gate.clear()
        else:
            gate.set()
        if pause != paused:
            worker.lane_pauses += pause
            log.debug("backfill partitions %s (live queued %d, live lag %d)", "paused" if pause else "resumed",
                      queued, lag)
        paused = pause


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
