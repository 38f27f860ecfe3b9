"""The servers a worker cannot do without — the brokers, the output store and the schema registry
(when ``LIGHTBOX_SCHEMA_REGISTRY_URL`` is set: ``streams.registry`` reports to it) — and whether each
is reachable now. A dependency that is down is waited for, never turned into dead letters and never
a reason to exit:

- whoever finds it unreachable (a store write past the store client's own retries, a send the
  brokers did not acknowledge, a lookup of an input's schema id the registry did not answer) calls
  :meth:`Dependencies.failed`, sleeps the backoff it returns (capped exponential, with jitter, so a
  recovering server is not hammered) and tries again, without end;
- while any dependency is down, the runner takes no new inputs (the consumer's fetch pauses),
  ``/readyz`` says which one is down and since when, ``/healthz`` stays live (a restart would not
  bring the server back), and the watchdog does not count the wait as a stuck lane or send;
- the first success calls :meth:`Dependencies.reached`: intake resumes, and calls that waited
  get their full timeouts again from that moment (:attr:`Dependencies.healed_at`).

What waiting cannot fix — credentials refused, a bucket that does not exist — is not waited for:
it stays a :class:`~schemas.errors.FatalError` whose message says what to change.

Thread-safe: store writes run in the output lane's threads, sends on the event loop.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from streams.settings import RunnerSettings

__all__ = ["Backoff", "Dependencies", "Outage", "dependencies"]

log = logging.getLogger("agents.runner")


@dataclass(frozen=True, slots=True)
class Backoff:
    """Capped exponential backoff with full jitter on the upper half: attempt ``n`` (from 1) waits
    between half and all of ``min(cap_s, first_s * 2 ** (n - 1))``."""

    first_s: float = 0.5
    cap_s: float = 5.0

    def delay(self, attempt: int, rand: Callable[[], float] = random.random) -> float:
        top = min(self.cap_s, self.first_s * 2.0 ** max(0, min(attempt - 1, 30)))
        return top * (0.5 + 0.5 * rand())


@dataclass(slots=True)
class Outage:
    """One dependency that is down: since when (on the clock), why, how many attempts failed."""

    since: float
    reason: str
    attempts: int = 1


class Dependencies:
    """Which dependencies are down now (see the module docstring)."""

    def __init__(self, backoff: Backoff | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.backoff = backoff or Backoff()
        self.clock = clock
        self.healed_at = float("-inf")  # when the last dependency that was down came back
        self.outages_seen = 0
        self._down: dict[str, Outage] = {}
        self._lock = threading.Lock()
        self._stopping = threading.Event()

    def failed(self, name: str, reason: str) -> float:
        """``name`` could not be reached (``reason``: a short kind — timeout, unreachable, server
        error — never a server's text). Returns how long to wait before the next attempt."""
        with self._lock:
            out = self._down.get(name)
            if out is None:
                out = self._down[name] = Outage(self.clock(), reason)
                self.outages_seen += 1
                first = True
            else:
                out.attempts += 1
                out.reason = reason
                first = False
            attempts = out.attempts
        delay = self.backoff.delay(attempts)
        if first:
            log.warning("%s unreachable (%s): waiting for it; no new inputs are taken until it answers "
                        "(retrying with backoff up to %g s)", name, reason, self.backoff.cap_s)
        return delay

    def reached(self, name: str) -> None:
        """``name`` answered: it is up again (a no-op when it was not down)."""
        with self._lock:
            out = self._down.pop(name, None)
            if out is None:
                return
            now = self.clock()
            if not self._down:
                self.healed_at = now
        log.warning("%s reachable again after %.1f s (%d failed attempts)", name, now - out.since, out.attempts)

    def sleep(self, seconds: float) -> bool:
        """Wait ``seconds`` in a thread; False at once when the worker is stopping (give up the wait)."""
        return not self._stopping.wait(seconds)

    def stop(self) -> None:
        """The worker is stopping: waits end (what waited stays uncommitted and is redone)."""
        self._stopping.set()

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def down(self) -> dict[str, Outage]:
        """The dependencies down now (a copy)."""
        with self._lock:
            return {k: Outage(v.since, v.reason, v.attempts) for k, v in self._down.items()}

    @property
    def waiting(self) -> bool:
        """Whether any dependency is down."""
        return bool(self._down)

    def describe(self) -> str:
        """``output store unreachable (timeout) for 12 s, …`` — for ``/readyz`` and logs."""
        now = self.clock()
        return ", ".join(f"{name} unreachable ({o.reason}) for {now - o.since:.0f} s"
                         for name, o in sorted(self.down().items()))

    def running_since(self, since: float) -> float:
        """The start a watchdog should count a call from: a call that began before the last outage
        ended gets its full timeout again from the heal."""
        return max(since, self.healed_at)


def dependencies(runner: RunnerSettings) -> Dependencies:
    """The worker's :class:`Dependencies`, with the runner section's backoff (``wait_*_backoff_s``)."""
    return Dependencies(Backoff(runner.wait_backoff_s, runner.wait_max_backoff_s))
