"""Supervision of a :class:`~agents.runner.BatchRunner`: the watchdog and the fail-stop.

Never a silent stall. An exception that is not an item's own (a lane call raising, a lane
returning the wrong number of outputs) becomes ``PROCESSING_FAILED`` dead letters for that
batch's items, logged once per batch; the lanes go on (:meth:`agents.delivery.Delivery.batch_failed`).
When the runner cannot go on — a :class:`~schemas.errors.FatalError` (e.g. the output store
refusing the worker's credentials), a produce that fails for good, a send unanswered past
``delivery_timeout_s`` or a lane call running longer than ``stage_timeout_s`` while no dependency
is known to be down (the watchdog), a loop crashing — :meth:`Supervisor.fail` fail-stops it: one
log line, nothing more acknowledged, :attr:`BatchRunner.failed` set, the loops cancelled, and
``on_fatal`` called once, whose job is to make the worker leave its group and exit 70
(:mod:`agents.worker`). What was in flight stays
uncommitted and goes to the partitions' next owner (same event ids, same bytes).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import signal
import threading
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from agents.dependencies import Dependencies
from schemas.errors import FatalError

__all__ = ["RunnerFailed", "SignalRestore", "StopAtStart", "Supervisor"]

log = logging.getLogger("agents.runner")  # one logger for the runner and its helpers

R = TypeVar("R")


class RunnerFailed(RuntimeError):
    """The runner fail-stopped; ``__cause__`` says why."""


class Supervisor:
    """Watches the lane calls and the sends in progress; fail-stops once.

    ``busy``: lane calls running in threads (token -> lane, since, items); ``delivering``: sends
    waiting for the brokers (token -> since). Both on ``clock``."""

    def __init__(self, *, stage_timeout_s: float, delivery_timeout_s: float, interval_s: float,
                 clock: Callable[[], float], in_flight: Callable[[], int],
                 on_fatal: Callable[[BaseException], None] | None = None,
                 dependencies: Dependencies | None = None) -> None:
        self.stage_timeout_s, self.delivery_timeout_s, self.interval_s = stage_timeout_s, delivery_timeout_s, interval_s
        self.dependencies = dependencies or Dependencies(clock=clock)
        self.clock, self._in_flight, self._on_fatal = clock, in_flight, on_fatal
        self.busy: dict[object, tuple[str, float, int]] = {}
        self.delivering: dict[object, float] = {}
        self.failure: BaseException | None = None
        self.failed = asyncio.Event()
        self.loops: list[asyncio.Task[None]] = []  # cancelled on a fail-stop

    def timed(self, lane: str, size: int, fn: Callable[[], R]) -> Callable[[], R]:
        """``fn`` for a lane thread, visible to the watchdog while it runs (the clock starts when a
        thread picks the call up, not while it queues)."""

        def run() -> R:
            token = object()
            self.busy[token] = (lane, self.clock(), size)
            try:
                return fn()
            finally:
                self.busy.pop(token, None)

        return run

    def check(self) -> None:
        """Raise :class:`RunnerFailed` after a fail-stop."""
        if self.failure is not None:
            raise RunnerFailed("the runner fail-stopped") from self.failure

    def overdue(self, now: float) -> FatalError | None:
        """Why the runner must fail-stop now: a lane call or a send running past its timeout. While
        a dependency is down, calls and sends wait on it and none is overdue; once it is back, each
        gets its full timeout again from the heal."""
        deps = self.dependencies
        if deps.waiting:
            return None
        for lane, began, size in list(self.busy.values()):
            since = deps.running_since(began)
            if now - since > self.stage_timeout_s:
                return FatalError(f"{lane} lane stuck: one call on {size} items has run for {now - since:.0f} s "
                                  f"(stage_timeout_s={self.stage_timeout_s:g})")
        for began in list(self.delivering.values()):
            since = deps.running_since(began)
            if now - since > self.delivery_timeout_s:
                return FatalError(f"output delivery unacknowledged for {now - since:.0f} s "
                                  f"(delivery_timeout_s={self.delivery_timeout_s:g})")
        return None

    async def watchdog(self) -> None:
        """Every ``interval_s`` (real time): raise what :meth:`overdue` finds (the loop's end fail-stops)."""
        while True:
            await asyncio.sleep(self.interval_s)
            if (exc := self.overdue(self.clock())) is not None:
                raise exc

    def task_ended(self, task: asyncio.Task[None]) -> None:
        """Done-callback of a task the runner spawned: its exception fail-stops."""
        if not task.cancelled() and task.exception() is not None:
            self.fail(task.exception())  # type: ignore[arg-type]

    def loop_ended(self, name: str, task: asyncio.Task[None]) -> None:
        """Done-callback of one of the runner's loops: a loop never ends by itself."""
        if task.cancelled():
            return
        exc = task.exception()
        self.fail(exc if exc is not None else FatalError(f"the {name} lane ended"), lane=name)

    def fail(self, exc: BaseException, lane: str | None = None) -> None:
        """Fail-stop, once: log, cancel the loops, call ``on_fatal``."""
        if self.failure is not None:
            return
        self.failure = exc
        where = f" ({lane} lane crashed)" if lane and not isinstance(exc, FatalError) else ""
        log.critical("lightbox worker fail-stop%s: %s: %s; %d inputs in flight stay uncommitted for the "
                     "partitions' next owner", where, type(exc).__name__, exc, self._in_flight())
        self.failed.set()
        for task in self.loops:
            task.cancel()
        if self._on_fatal is not None:
            self._on_fatal(exc)

    def cancel_all(self, others: Iterable[asyncio.Task[None]]) -> list[asyncio.Task[None]]:
        """Cancel the loops and ``others``; what to gather."""
        tasks = [*self.loops, *others]
        for task in tasks:
            task.cancel()
        return tasks


class StopAtStart(BaseException):
    """SIGTERM while a worker process builds its pipeline (the model runtime gate can take minutes): the
    build is abandoned at the next Python instruction and the process exits 0, having held nothing.
    A BaseException, so that no ``except Exception`` on the way turns it into a failed start."""

    @classmethod
    def install(cls) -> SignalRestore:
        def stop(signum: int, frame: Any) -> None:
            raise cls(signal.Signals(signum).name)

        if threading.current_thread() is not threading.main_thread():  # only the main thread handles signals
            return SignalRestore(signal.SIGTERM, None)
        return SignalRestore(signal.SIGTERM, signal.signal(signal.SIGTERM, stop))


@dataclasses.dataclass
class SignalRestore:
    """The handler :meth:`StopAtStart.install` replaced; :meth:`restore` puts it back."""

    signum: int
    previous: Any  # None: nothing was installed

    def restore(self) -> None:
        if self.previous is not None:
            signal.signal(self.signum, self.previous)
