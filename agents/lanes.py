"""Live first: the backfill lane gets only the device's spare capacity. Pure (no asyncio, no Kafka).

A worker consumes two topics: the input topic (live) and the backfill topic. Two things keep the
backfill out of live traffic's way:

1. :class:`LaneBatcher` — what the runner drives instead of one :class:`~agents.batching.MicroBatcher`
   (same calls: ``add``, ``poll``, ``next_deadline``, ``flush``, ``record_service``, plus
   ``device_done``). It holds one micro-batcher per lane. Live batches leave as soon as they close,
   highest priority first. A closed backfill batch is held back and released only when no live
   item is waiting anywhere before the output lane (in the live batcher, or in a live batch not yet
   through the device) and no other backfill batch is before the output lane. So at most one
   backfill batch is ever ahead of a live batch: a backfill batch delays a live batch by at most
   one batch. With ``backfill_share`` below 1, a backfill batch that kept the decode and device
   lanes busy for ``d`` seconds is followed by a gap of ``d × (1 / share − 1)`` in which no backfill
   batch starts: the backfill takes at most that share of the device by itself, and a live batch
   arriving in a gap finds the device free.
2. :func:`pause_backfill` — the consumer-side rule (applied by :mod:`agents.backfill`): the
   backfill topic's partitions are paused while live work is queued in the worker or the live lag
   is above a threshold, so backfill records are not even fetched while live traffic needs the worker.
3. :class:`BackfillGate` — how many backfill inputs the worker may hold: few (``busy_cap``) while
   live work is about or was within the last ``idle_s``, the lane's whole window only once live
   traffic has been quiet that long. Backfill already in the worker then finishes behind live work
   (its prepare and output threads run at a lower CPU priority: :mod:`agents.runner`).

The driver reports each batch that leaves the device lane (or fails before it) with
``device_done(items)``; that is what frees the next backfill batch.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from typing import Generic, Literal, TypeVar

from agents.batching import Batch, MicroBatcher

__all__ = ["BACKFILL", "LIVE", "BackfillGate", "LaneBatcher", "pause_backfill"]

T = TypeVar("T")
Lane = Literal["live", "backfill"]
LIVE: Lane = "live"
BACKFILL: Lane = "backfill"


def pause_backfill(live_queued: int, live_lag: int, lag_threshold: int) -> bool:
    """Whether the backfill topic's partitions should be paused now: live work is queued in the
    worker (inputs handed and not yet through the device), or more than ``lag_threshold`` live
    records wait in the brokers."""
    return live_queued > 0 or live_lag > lag_threshold


class BackfillGate:
    """Admission of backfill inputs into a worker, from live activity (pure; ``clock`` injected).

    ``room(live_active, held, limit)``: how many more backfill inputs may be taken now, given
    whether live work is about (queued in the worker, or lagging in the brokers), how many backfill
    inputs the worker holds, and the lane's window ``limit``. While live work is about, and until it
    has been quiet for ``idle_s``, the worker holds at most ``busy_cap`` backfill inputs (0: none
    taken while live work is about, the old pause rule); after that, up to ``limit``."""

    def __init__(self, *, idle_s: float, busy_cap: int, clock: Callable[[], float]) -> None:
        if idle_s < 0 or busy_cap < 0:
            raise ValueError(f"BackfillGate: idle_s={idle_s} and busy_cap={busy_cap} must be >= 0")
        self.idle_s, self.busy_cap, self.clock = idle_s, busy_cap, clock
        self._last_live = float("-inf")  # when live work was last seen about

    def room(self, live_active: bool, held: int, limit: int) -> int:
        now = self.clock()
        if live_active:
            self._last_live = now
        cap = limit if not live_active and now - self._last_live >= self.idle_s else min(limit, self.busy_cap)
        return max(0, cap - held)


class LaneBatcher(Generic[T]):
    """See the module docstring. ``lane_of(item)`` is ``"live"`` or ``"backfill"``;
    ``priority_of(item)`` orders live buckets (higher first)."""

    def __init__(self, live: MicroBatcher[T], backfill: MicroBatcher[T], *, lane_of: Callable[[T], str],
                 priority_of: Callable[[T], int] | None = None, backfill_share: float = 1.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not 0 < backfill_share <= 1:
            raise ValueError(f"LaneBatcher: backfill_share={backfill_share}; expected 0 < share <= 1")
        self.live, self.backfill = live, backfill
        self.lane_of, self.priority_of = lane_of, priority_of or (lambda _item: 0)
        self.backfill_share, self.clock = backfill_share, clock
        self._service = 0.0  # the last record_service seconds (the batch device_done reports next)
        self._not_before = float("-inf")  # no backfill batch starts before (the gap after the last one)
        self._held: deque[Batch[T]] = deque()  # closed backfill batches waiting for spare capacity
        self._in_pipe: dict[str, int] = {LIVE: 0, BACKFILL: 0}  # batches released, not yet device_done
        self._items_in_pipe: dict[str, int] = {LIVE: 0, BACKFILL: 0}

    # -- what the driver reads ---------------------------------------------------------------
    @property
    def pending(self) -> int:
        """Items added and not yet returned in a batch (held backfill batches included)."""
        return self.live.pending + self.backfill.pending + sum(len(b) for b in self._held)

    @property
    def live_queued(self) -> int:
        """Live items before the output lane: in the live batcher or in a batch not yet through the device."""
        return self.live.pending + self._items_in_pipe[LIVE]

    @property
    def backfill_held(self) -> int:
        """Backfill items in closed batches waiting for spare capacity."""
        return sum(len(b) for b in self._held)

    def backfill_ready(self, now: float | None = None) -> bool:
        """Whether a backfill batch may go to the device (at ``now``; None: apart from the gap)."""
        if self._in_pipe[BACKFILL] or self._in_pipe[LIVE] or self.live.pending:
            return False
        return now is None or now >= self._not_before

    # -- MicroBatcher's interface --------------------------------------------------------------
    def add(self, item: T, shape_class: Hashable, now: float, nbytes: int = 0) -> list[Batch[T]]:
        if self._lane(item) == BACKFILL:
            self._held.extend(self.backfill.add(item, shape_class, now, nbytes))
            return self._release(self.live.poll(now), now)
        return self._release(self.live.add(item, shape_class, now, nbytes, priority=self.priority_of(item)), now)

    def poll(self, now: float) -> list[Batch[T]]:
        self._held.extend(self.backfill.poll(now))
        return self._release(self.live.poll(now), now)

    def next_deadline(self) -> float | None:
        """The live batcher's next deadline; the backfill's only while a backfill batch could go
        (a held batch: the end of the gap, ``-inf`` if none). A held batch is otherwise freed by
        ``device_done``."""
        live = self.live.next_deadline()
        if not self.backfill_ready():
            return live
        backfill = self._not_before if self._held else self.backfill.next_deadline()
        times = [t for t in (live, backfill) if t is not None]
        return min(times) if times else None

    def flush(self) -> list[Batch[T]]:
        """Everything, live first (shutdown: no spare capacity to wait for)."""
        out = [*self.live.flush(), *self._held, *self.backfill.flush()]
        self._held.clear()
        for batch in out:
            self._count(batch, +1)
        return out

    def record_service(self, batch_size: int, seconds: float) -> None:
        """The device's service time, whichever lane the batch came from: both lanes learn it (the
        next ``device_done`` is that batch's: a backfill batch's sets the gap after it)."""
        self._service = seconds
        self.live.record_service(batch_size, seconds)
        self.backfill.record_service(batch_size, seconds)

    def device_done(self, items: Sequence[T]) -> None:
        """A batch left the device lane (done or failed): the next backfill batch may go."""
        if items:
            lane = self._lane(items[0])
            self._in_pipe[lane] = max(0, self._in_pipe[lane] - 1)
            self._items_in_pipe[lane] = max(0, self._items_in_pipe[lane] - len(items))
            if lane == BACKFILL and self._service > 0 and self.backfill_share < 1:
                self._not_before = self.clock() + self._service * (1 / self.backfill_share - 1)
        self._service = 0.0  # a failed batch reports no service time: no gap

    # -- internals ------------------------------------------------------------------------------
    def _lane(self, item: T) -> str:
        lane = self.lane_of(item)
        if lane not in (LIVE, BACKFILL):
            raise ValueError(f"LaneBatcher: lane_of returned {lane!r}; expected 'live' or 'backfill'")
        return lane

    def _count(self, batch: Batch[T], sign: int) -> None:
        lane = self._lane(batch.items[0])
        self._in_pipe[lane] += sign
        self._items_in_pipe[lane] += sign * len(batch)

    def _release(self, live: list[Batch[T]], now: float) -> list[Batch[T]]:
        for batch in live:
            self._count(batch, +1)
        out = list(live)
        if self._held and self.backfill_ready(now):
            batch = self._held.popleft()
            self._count(batch, +1)
            out.append(batch)
        return out
