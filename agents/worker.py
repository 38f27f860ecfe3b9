"""One lightbox worker process, assembled in one place.

Two kinds of process run this module:

- ``lightbox worker`` (:func:`run_worker`): a Faust app whose agent ``lightbox.live`` feeds the
  live tier of a :class:`~agents.runner.BatchRunner`. The backfill tier runs either in the same
  runner (a :class:`~agents.backfill.BackfillConsumer` beside the agent) or, on a CPU worker on Linux
  by default (``LIGHTBOX_BACKFILL_PROCESS``), in a child process that this one starts, watches and
  stops (:mod:`agents.backfill_process` explains why and holds the child's helpers).
- The backfill child (:func:`run_backfill_worker`), started as
  ``python -m agents.worker backfill-worker``: a runner whose live tier stays empty, no Faust.

Everything that decides anything lives in pure modules: batching (:mod:`agents.batching`),
acknowledgement order (:mod:`agents.watermark`), the records out and their sizes
(:mod:`agents.records`), the pipeline (:mod:`gpu_kernels.pipeline`). This module only assembles
them and ends the process.

Process life cycle (both kinds):

- The processor (model, presets, schemas) is built before the worker joins the group: an error
  there ends the process at once (exit 70, :data:`EXIT_FAIL_STOP`) without ever holding partitions.
- Fail-stop (:meth:`LightboxWorker.fail`, from the runner or an agent error, start-up included):
  one log line, then the worker stops the way SIGTERM stops it — the consumer leaves the group,
  so the partitions move at once — and the process exits 70. If that has not happened within
  ``FAIL_STOP_GRACE_S``, the process exits 70 anyway.
- SIGTERM: intake stops, in-flight work finishes and is acknowledged (up to
  ``shutdown_timeout_s``), offsets are committed, exit 0 (at the latest ``FAIL_STOP_GRACE_S``
  after ``shutdown_timeout_s``, even if Faust's own stop hangs). A SIGTERM while the worker is
  still building its pipeline (the segment runtime gate can take minutes on a fresh machine)
  abandons the build and exits 0 at once: nothing was joined yet.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import functools
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import faust

from agents import backfill_process
from agents.backfill import BackfillConsumer, BackfillEvent
from agents.dependencies import Dependencies
from agents.dependencies import dependencies as make_dependencies
from agents.memory import cap_malloc_arenas, fix_mmap_threshold
from agents.observe import REFRESH_S, Observability, version
from agents.process import BatchProcessor
from agents.runner import BatchRunner, Pair, RunnerConfig, RunnerFailed, RunnerObserver
from agents.supervision import StopAtStart
from agents.tiers import TierBatcher
from agents.wiring import backfill_consumer, batching_config, build_processor, kafka_sink, runner_config, tier_batcher
from streams.app import create_app, input_topic, live_lag
from streams.settings import Settings

__all__ = ["EXIT_FAIL_STOP", "FAIL_STOP_GRACE_S", "LightboxWorker", "build_worker", "main", "run_backfill",
           "run_backfill_worker", "run_worker"]

log = logging.getLogger(__name__)

EXIT_FAIL_STOP = 70  # EX_SOFTWARE: the worker cannot go on; an orchestrator restarts it
FAIL_STOP_GRACE_S = 10.0  # longest a fail-stop waits for a clean group leave before exiting anyway
BACKFILL_COMMAND = "backfill-worker"  # python -m agents.worker backfill-worker: the backfill child


class LightboxWorker:
    """The Faust app with the live tier's agent, and how its process ends."""

    def __init__(self, app: faust.App) -> None:
        self.app = app
        self.failure: BaseException | None = None
        self.runner: BatchRunner | None = None
        self.tiers: TierBatcher[Pair] | None = None
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
                 observer: RunnerObserver | None = None,
                 dependencies: Dependencies | None = None) -> LightboxWorker:
    """The worker; run ``worker.app`` with ``lightbox worker``. Builds the processor now.

    One runner, two tiers: the Faust agent ``lightbox.live`` on the input topic (live), and a
    :class:`~agents.backfill.BackfillConsumer` on the backfill topic that gets only spare capacity
    (:mod:`agents.tiers`: a backfill batch is released only while no live batch waits for the
    device, and the device serves live batches first; the backfill partitions are paused while
    live work is queued or the live lag is over ``backfill_max_live_lag``)."""
    app = create_app(settings)
    worker = LightboxWorker(app)
    device = settings.resolved_device()
    deps = dependencies or make_dependencies(settings.runner)
    proc = processor or build_processor(settings, device, waiter=deps)
    config, tiers = _runner_parts(settings, device, proc)
    worker.tiers = tiers
    last_live: dict[Any, int] = {}  # live partition -> the last offset handed to the runner
    worker.live_work = functools.partial(_live_work, worker, settings, last_live)
    backfill = backfill_consumer(settings, lambda: worker.runner, worker.live_work)
    worker.backfill = backfill

    @app.agent(input_topic(app, settings), name="lightbox.live")
    async def live(stream: faust.StreamT[bytes]) -> None:
        manual = stream.noack()  # type: ignore[attr-defined]  # on Stream, not in StreamT

        async def ack(event: Any) -> None:
            if isinstance(event, BackfillEvent):
                backfill.ack(event)
            else:
                await manual.ack(event)

        runner = worker.runner = BatchRunner(proc, kafka_sink(settings), tiers, ack=ack, config=config,
                                             observer=observer, on_fatal=worker.fail, dependencies=deps)
        pulling: asyncio.Task[None] | None = None
        try:
            await runner.start()
            if settings.backfill.enabled:
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


def _runner_parts(settings: Settings, device: str,
                  processor: BatchProcessor) -> tuple[RunnerConfig, TierBatcher[Pair]]:
    """The runner's configuration and its tiers' batcher, as every worker process builds them; the
    processor's model is told how many device threads will call it."""
    batching = batching_config(settings, device)
    config = runner_config(settings, batching, processor.pipeline.side_by_side, device)
    processor.pipeline.device_callers(config.device_threads)
    return config, tier_batcher(settings, batching)


def _live_work(worker: LightboxWorker, settings: Settings, last_live: dict[Any, int]) -> tuple[int, int]:
    """Live inputs queued in the worker (in the prepare lane, the batcher, or a batch not yet through
    the device) and live records waiting in the brokers: what pauses the backfill tier."""
    runner, tiers = worker.runner, worker.tiers
    queued = 0 if runner is None or tiers is None else runner.preparing("live") + tiers.live_queued
    return queued, live_lag(worker.app, settings.topics.input, last_live)


def _backfill_ended(worker: LightboxWorker, task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        worker.fail(task.exception())  # type: ignore[arg-type]


async def _finish(worker: LightboxWorker, runner: BatchRunner, settings: Settings) -> None:
    if worker.failure is None:
        _exit_after(settings.runner.shutdown_timeout_s + FAIL_STOP_GRACE_S, lambda: worker.exit_code)
        drained = await runner.drain(settings.runner.shutdown_timeout_s)
        if not drained:
            worker.app.conf.stream_wait_empty = False  # what is left is redelivered; do not wait for it
        with contextlib.suppress(Exception):  # commit now, while the consumer still holds its partitions
            await worker.app.consumer.commit()
        _stopping(runner, "lightbox worker", drained)
    await _stop(runner, "lightbox worker")


async def _stop(runner: BatchRunner, who: str) -> None:
    """Stop the runner's loops and log what it did (the last line of both kinds of worker)."""
    with contextlib.suppress(Exception):
        await runner.stop()
    s = runner.stats
    log.warning("%s stopped: %d processed, %d dead letters, %d batches (mean size %.1f)",
                who, s.processed, s.dead_letters, s.batches, s.batch_items / max(1, s.batches))


def _stopping(runner: BatchRunner, who: str, drained: bool) -> None:
    log.warning("%s stopping: %s", who, "in-flight work finished and committed" if drained
                else f"{runner.in_flight} inputs left for redelivery")


# ------------------------------------------------------------------------ lightbox worker
def run_worker(settings: Settings, overrides: Mapping[str, Any], loglevel: str) -> int:
    """``lightbox worker``: build everything before joining the group, start the backfill child if
    the backfill tier runs in one, run the Faust worker until it stops; the exit code.
    ``overrides``: the command line's settings, passed on to the child's environment.
    A :class:`~streams.security.KafkaSecurityError` propagates (a configuration error: exit 2)."""
    import logging.config

    from faust import Worker

    from agents.logs import logging_config
    from streams.app import ensure_topics
    from streams.security import KafkaSecurityError

    cap_malloc_arenas(settings.worker.malloc_arenas)  # before the lanes' threads
    fix_mmap_threshold(settings.worker.malloc_mmap_threshold)
    logs = logging_config(settings.observe.log_format, loglevel)
    logging.config.dictConfig(logs)  # Faust's Worker applies the same again when it starts
    logging.captureWarnings(True)
    say = _say(settings)
    obs = None
    asked = StopAtStart.install()  # the gate may run for minutes; as PID 1 SIGTERM would be ignored
    try:  # before joining the group: a worker that cannot start never holds partitions
        created = asyncio.run(ensure_topics(settings))
        obs = Observability(settings)
        device = settings.resolved_device()
        split = settings.backfill.enabled and settings.resolved_backfill_process(device)  # in a child process
        port = settings.resolved_backfill_metrics_port() if split else 0
        if split:
            backfill_process.check_port(port)
        processor = build_processor(settings, device, waiter=obs.dependencies)
        live = settings.model_copy(update={"backfill_enabled": False}) if split else settings
        retouch = build_worker(live, processor=processor, observer=obs.telemetry, dependencies=obs.dependencies)
        obs.attach(retouch.app, device=device, model=processor.model_version, version=version(),
                   backfill=retouch.backfill)
    except StopAtStart as stop:
        say(f"lightbox worker stopped while starting ({stop}): it never joined the group")
        if obs is not None:
            obs.close()
        return 0
    except KafkaSecurityError:
        if obs is not None:
            obs.close()
        raise
    except Exception as exc:
        say(f"lightbox worker could not start: {type(exc).__name__}: {exc}")
        if obs is not None:
            obs.close()
        return EXIT_FAIL_STOP
    finally:
        asked.restore()
    if created:
        say(f"created topics: {', '.join(created)}")
    say(f"lightbox worker {settings.worker.worker_id}: {settings.topics.input} → {settings.topics.output} "
        f"on {settings.kafka.bootstrap}, device {device}"
        + (f", metrics on :{obs.server.port}" if obs.server is not None else ""))
    from streams.registry import describe

    if (ids := describe(processor.codecs)) is not None:
        say(ids)
    child = _start_backfill_child(retouch, settings, overrides, loglevel, port, say) if split else None
    code: Any = 0
    try:
        runner = Worker(retouch.app, loglevel=loglevel.upper(), quiet=True, logging_config=logs)
        if not runner.stdout.isatty():
            runner.spinner = None  # it writes cursor codes even into files
        runner.execute_from_commandline()
    except SystemExit as exc:
        code = exc.code
    finally:
        if child is not None:
            backfill_process.stop(child, settings.runner.shutdown_timeout_s + 5)
        obs.close()
    return retouch.exit_code or (code if isinstance(code, int) else 1)


def _say(settings: Settings) -> Callable[[str], None]:
    """Start-up lines: a log record with JSON logs, else a plain line on stderr."""
    if settings.observe.log_format == "json":
        return logging.getLogger("lightbox.worker").warning
    return functools.partial(print, file=sys.stderr, flush=True)


def _start_backfill_child(retouch: LightboxWorker, settings: Settings, overrides: Mapping[str, Any], loglevel: str,
                          port: int, say: Callable[[str], None]) -> Any:
    """Start the backfill child, fail-stop when it ends by itself, share the live work with it."""
    backfill_process.one_opencv_thread()
    live_work = backfill_process.LiveSignal.create()
    child = backfill_process.spawn(overrides, loglevel, live_work, port)
    say(f"backfill tier: process {child.pid} ({settings.topics.backfill}), {settings.describe_backfill_process()}")

    @retouch.app.timer(interval=1.0)  # type: ignore[untyped-decorator]
    async def watch_backfill() -> None:
        if (exc := backfill_process.watch(child)) is not None:
            retouch.fail(exc)

    @retouch.app.timer(interval=settings.backfill.check_ms / 1000)  # type: ignore[untyped-decorator]
    async def share_live_work() -> None:
        live_work.write(*retouch.live_work())

    return child


# ---------------------------------------------------------------------- the backfill child
def run_backfill_worker(settings: Settings, loglevel: str) -> int:
    """The backfill tier alone, at the lower CPU priority, until SIGTERM/SIGINT (0) or a fail-stop (70)."""
    backfill_process.lower_priority(settings.backfill.nice, settings.backfill.sched_idle)  # before any thread
    cap_malloc_arenas(settings.worker.malloc_arenas)
    fix_mmap_threshold(settings.worker.malloc_mmap_threshold)
    import logging.config

    from agents.logs import logging_config

    logging.config.dictConfig(logging_config(settings.observe.log_format, loglevel))
    obs = None
    asked = StopAtStart.install()  # as the worker's: a stop while building exits 0 at once
    try:
        obs = Observability(settings)
        device = settings.resolved_device()
        processor = build_processor(settings, device, waiter=obs.dependencies)
        parts = _runner_parts(settings, device, processor)  # the model compiles here
    except StopAtStart as stop:
        print(f"lightbox backfill worker stopped while starting ({stop})", file=sys.stderr)
        if obs is not None:
            obs.close()
        return 0
    except Exception as exc:
        print(f"lightbox backfill worker could not start: {type(exc).__name__}: {exc}", file=sys.stderr)
        if obs is not None:
            obs.close()
        return EXIT_FAIL_STOP
    finally:
        asked.restore()
    try:
        return asyncio.run(run_backfill(settings, processor, parts, obs))
    finally:
        obs.close()


async def run_backfill(settings: Settings, processor: BatchProcessor, parts: tuple[RunnerConfig, TierBatcher[Pair]],
                       obs: Observability | None = None) -> int:
    """The backfill tier alone, until SIGTERM/SIGINT (0) or a fail-stop (70); see :mod:`agents.backfill_process`.
    ``parts``: the processor's :func:`_runner_parts`, made at start-up (where a model that cannot load is
    reported). ``obs``: its metrics and health (on its own port), the backfill lag refreshed every ``REFRESH_S``."""
    device = processor.pipeline.device  # resolved once, at start-up
    config, tiers = parts
    # the whole process runs at the lower priority: the backfill uses the lanes' own threads
    config = dataclasses.replace(config, backfill_threads=0)
    stopping = asyncio.Event()

    async def ack(event: Any) -> None:
        assert isinstance(event, BackfillEvent)
        backfill.ack(event)

    runner = BatchRunner(processor, kafka_sink(settings), tiers, ack=ack, config=config,
                         observer=None if obs is None else obs.telemetry, on_fatal=lambda _exc: stopping.set(),
                         dependencies=None if obs is None else obs.dependencies)
    fd = os.environ.get(backfill_process.LIVE_FD_ENV, "")
    live = backfill_process.LiveSignal(int(fd)) if fd.isdigit() else None  # started by hand: no live work to see
    backfill = backfill_consumer(settings, lambda: runner, live.read if live is not None else lambda: (0, 0))
    if obs is not None:
        obs.describe(device=device, model=processor.model_version, version=version(), backfill=backfill)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    code = 0
    await runner.start()
    pulling = asyncio.create_task(backfill.run(), name="lightbox-backfill")
    waiting = asyncio.create_task(stopping.wait())
    tasks = {pulling, waiting}
    if obs is not None:
        tasks.add(asyncio.create_task(_refresh(obs), name="lightbox-backfill-metrics"))
    try:
        await asyncio.wait({pulling, waiting}, return_when=asyncio.FIRST_COMPLETED)
        if pulling.done() and not pulling.cancelled() and pulling.exception() is not None:
            code = EXIT_FAIL_STOP  # logged by the loop
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    if runner.failure is not None:
        code = EXIT_FAIL_STOP
    elif code == 0:
        drained = await runner.drain(settings.runner.shutdown_timeout_s)
        _stopping(runner, "lightbox backfill worker", drained)
    await backfill.close()  # commits what the runner acknowledged, leaves the group
    await _stop(runner, "lightbox backfill worker")
    return code


async def _refresh(obs: Observability) -> None:
    """The backfill lag in the metrics, and readiness while the consumer holds partitions."""
    while True:
        with contextlib.suppress(Exception):  # a broker away: the next round
            obs.health.assigned = await obs.refresh_backfill() > 0
        await asyncio.sleep(REFRESH_S)



def main(argv: Sequence[str] | None = None) -> int:
    """``python -m agents.worker backfill-worker [--loglevel L]``: how a worker starts its backfill child."""
    parser = argparse.ArgumentParser(prog="python -m agents.worker", description="the backfill child of a worker")
    parser.add_argument("command", choices=[BACKFILL_COMMAND])
    parser.add_argument("--loglevel", "-l", default=None, help="default: LIGHTBOX_LOG_LEVEL")
    args = parser.parse_args(argv)
    logging.getLogger("aiokafka").setLevel(logging.ERROR)
    from streams.security import KafkaSecurityError

    try:
        settings = Settings()
        return run_backfill_worker(settings, args.loglevel or settings.observe.log_level)
    except KafkaSecurityError as exc:
        print(f"kafka security: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
