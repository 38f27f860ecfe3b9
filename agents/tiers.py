"""Live first: the backfill tier gets only the device's spare capacity. Pure (no asyncio, no Kafka).

A worker consumes two topics: the input topic (live) and the backfill topic. Two things keep the
backfill out of live traffic's way:

1. :class:`TierBatcher` — what the runner drives instead of one :class:`~agents.batching.MicroBatcher`
   (same calls: ``add``, ``poll``, ``next_deadline``, ``flush``, ``record_service``, plus
   ``device_started`` and ``device_done``). It holds one micro-batcher per tier. Live batches
   leave as soon as they close, highest priority first. A closed backfill batch is held back and
   released only when no other backfill batch is waiting for the device, no live batch is
   waiting for it and no live item is waiting in the live batcher for batch-mates. The runner's
   device queue serves live batches before backfill ones. So a live batch finds at most one
   backfill batch ahead of it, the one already on the device: a backfill batch delays a live
   batch by at most one batch (``LIGHTBOX_BACKFILL_MAX_BATCH`` bounds that). Meanwhile the next
   backfill batch is decoded while one is on the device, so with no live work about the device
   goes from one backfill batch to the next without waiting for a decode. (``pipelined=False`` is
   the first rule, kept for comparison: a backfill batch waits until every released batch, live or
   backfill, has left the device; the device then idles while each backfill batch decodes.)
   With ``backfill_share`` below 1, a backfill batch that kept the decode and device
   lanes busy for ``d`` seconds is followed by a gap of ``d × (1 / share − 1)`` in which no backfill
   batch starts: the backfill takes at most that share of the device by itself, and a live batch
   arriving in a gap finds the device free. ``wait_for_live=False`` drops the live conditions: a
   held backfill batch then waits only for the previous backfill batch to reach the device (a live
   batch still finds at most one backfill batch on the device ahead of it, but meets one more
   often, and live and backfill batches alternate in a live burst).

   **Empty seats** (``fill_to`` > 0): a live batch that closes with fewer than ``fill_to`` items
   while no other live work waits (in the live batcher, or a live batch waiting for the device)
   takes held backfill items of its shape class into its empty seats, oldest first, within
   the memory budget. On a GPU a batch of 4 costs about what a batch of 1 does; on a CPU it costs
   the riders' own time (so ``fill_to`` bounds that delay). The batch counts as live (live output
   threads); its riders count as backfill work (``live_queued`` leaves them out) and are
   acknowledged to the backfill consumer as usual.
2. :func:`pause_backfill` — the consumer-side rule (applied by :mod:`agents.backfill`): the
   backfill topic's partitions are paused while live work is queued in the worker or the live lag
   is above a threshold, so backfill records are not even fetched while live traffic needs the worker.
3. :class:`BackfillGate` — how many backfill inputs the worker may hold: few (``busy_cap``) while
   live work is about or was within the last ``idle_s``, the tier's whole window only once live
   traffic has been quiet that long. Backfill already in the worker then finishes behind live work
   (its prepare and output threads run at a lower CPU priority: :mod:`agents.runner`).

The driver reports each batch that goes onto the device with ``device_started(items)`` and each
that leaves the device lane (or fails before it) with ``device_done(items)``; that is what frees
the next backfill batch.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from dataclasses import replace
from typing import Generic, Literal, TypeVar

from agents.batching import Batch, MicroBatcher

__all__ = ["BACKFILL", "LIVE", "BackfillGate", "TierBatcher", "pause_backfill"]

T = TypeVar("T")
Tier = Literal["live", "backfill"]
LIVE: Tier = "live"
BACKFILL: Tier = "backfill"


def pause_backfill(live_queued: int, live_lag: int, lag_threshold: int) -> bool:
    """Whether the backfill topic's partitions should be paused now: live work is queued in the
    worker (inputs handed and not yet through the device), or more than ``lag_threshold`` live
    records wait in the brokers."""
    return live_queued > 0 or live_lag > lag_threshold


class BackfillGate:
    """Admission of backfill inputs into a worker, from live activity (pure; ``clock`` injected).

    ``room(live_active, held, limit)``: how many more backfill inputs may be taken now, given
    whether live work is about (queued in the worker, or lagging in the brokers), how many backfill
    inputs the worker holds, and the tier's window ``limit``. While live work is about, and until it
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


class TierBatcher(Generic[T]):
    """See the module docstring. ``tier_of(item)`` is ``"live"`` or ``"backfill"``;
    ``priority_of(item)`` orders live buckets (higher first)."""

    def __init__(self, live: MicroBatcher[T], backfill: MicroBatcher[T], *, tier_of: Callable[[T], str],
                 priority_of: Callable[[T], int] | None = None, backfill_share: float = 1.0,
                 wait_for_live: bool = True, pipelined: bool = True, fill_to: int = 0,
                 nbytes_of: Callable[[T], int] | None = None, memory_budget_bytes: int | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not 0 < backfill_share <= 1:
            raise ValueError(f"TierBatcher: backfill_share={backfill_share}; expected 0 < share <= 1")
        self.live, self.backfill = live, backfill
        self.tier_of, self.priority_of = tier_of, priority_of or (lambda _item: 0)
        if fill_to < 0:
            raise ValueError(f"TierBatcher: fill_to={fill_to}; expected >= 0 (0: live batches are never filled)")
        self.backfill_share, self.wait_for_live, self.clock = backfill_share, wait_for_live, clock
        self.pipelined, self.fill_to, self.nbytes_of = pipelined, fill_to, nbytes_of or (lambda _item: 0)
        self.memory_budget_bytes = memory_budget_bytes
        self.filled = 0  # backfill items that rode in live batches
        self._service = 0.0  # the last record_service seconds (the batch device_done reports next)
        self._not_before = float("-inf")  # no backfill batch starts before (the gap after the last one)
        self._held: deque[Batch[T]] = deque()  # closed backfill batches waiting for spare capacity
        self._in_pipe: dict[str, int] = {LIVE: 0, BACKFILL: 0}  # batches released, not yet device_done
        self._items_in_pipe: dict[str, int] = {LIVE: 0, BACKFILL: 0}
        self._waiting: dict[str, int] = {LIVE: 0, BACKFILL: 0}  # batches released, not yet on the device
        self._started: set[int] = set()  # batches on the device (id of their first item)

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
        """Whether a backfill batch may be released (at ``now``; None: apart from the gap): no
        backfill batch is waiting for the device (the one on it may still be working), and, with
        ``wait_for_live``, no live batch is waiting for the device and no live item for batch-mates."""
        if not self.pipelined:  # the first rule: every batch through the device, none waiting for batch-mates
            if self._in_pipe[BACKFILL] or (self.wait_for_live and (self._in_pipe[LIVE] or self.live.pending)):
                return False
        elif self._waiting[BACKFILL] or (self.wait_for_live and (self._waiting[LIVE] or self.live.pending)):
            return False
        return now is None or now >= self._not_before

    # -- MicroBatcher's interface --------------------------------------------------------------
    def add(self, item: T, shape_class: Hashable, now: float, nbytes: int = 0) -> list[Batch[T]]:
        if self._tier(item) == BACKFILL:
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
        """The device's service time, whichever tier the batch came from: both tiers learn it (the
        next ``device_done`` is that batch's: a backfill batch's sets the gap after it)."""
        self._service = seconds
        self.live.record_service(batch_size, seconds)
        self.backfill.record_service(batch_size, seconds)

    def device_started(self, items: Sequence[T]) -> None:
        """A released batch went onto the device: the next backfill batch may be decoded meanwhile."""
        if items:
            tier = self._tier(items[0])
            self._waiting[tier] = max(0, self._waiting[tier] - 1)
            self._started.add(id(items[0]))

    def device_done(self, items: Sequence[T]) -> None:
        """A batch left the device lane (done, or failed on it or before it)."""
        if items:
            tier = self._tier(items[0])  # a filled live batch is a live batch
            if id(items[0]) in self._started:
                self._started.discard(id(items[0]))
            else:  # failed before the device
                self._waiting[tier] = max(0, self._waiting[tier] - 1)
            self._in_pipe[tier] = max(0, self._in_pipe[tier] - 1)
            for item in items:
                of = self._tier(item)
                self._items_in_pipe[of] = max(0, self._items_in_pipe[of] - 1)
            if tier == BACKFILL and self._service > 0 and self.backfill_share < 1:
                self._not_before = self.clock() + self._service * (1 / self.backfill_share - 1)
        self._service = 0.0  # a failed batch reports no service time: no gap

    # -- internals ------------------------------------------------------------------------------
    def _tier(self, item: T) -> str:
        tier = self.tier_of(item)
        if tier not in (LIVE, BACKFILL):
            raise ValueError(f"TierBatcher: tier_of returned {tier!r}; expected 'live' or 'backfill'")
        return tier

    def _count(self, batch: Batch[T], sign: int) -> None:
        tier = self._tier(batch.items[0])  # a filled live batch is a live batch
        self._in_pipe[tier] += sign
        self._waiting[tier] += sign
        for item in batch.items:
            self._items_in_pipe[self._tier(item)] += sign

    def _fill(self, batch: Batch[T]) -> Batch[T]:
        """``batch`` (live) with held backfill items of its shape class in its empty seats, up to
        ``fill_to`` items and the memory budget, oldest first."""
        room = self.fill_to - len(batch)
        if room <= 0 or not self._held:
            return batch
        nbytes, budget = batch.nbytes, self.memory_budget_bytes
        taken: list[T] = []
        kept: deque[Batch[T]] = deque()
        for held in self._held:
            rest: list[T] = []
            for item in held.items:
                size = self.nbytes_of(item)
                if (len(taken) < room and held.shape_class == batch.shape_class
                        and (budget is None or nbytes + size <= budget)):
                    taken.append(item)
                    nbytes += size
                else:
                    rest.append(item)
            if len(rest) == len(held):
                kept.append(held)
            elif rest:
                kept.append(replace(held, items=tuple(rest), nbytes=sum(self.nbytes_of(i) for i in rest)))
        if not taken:
            return batch
        self._held = kept
        self.filled += len(taken)
        return replace(batch, items=(*batch.items, *taken), nbytes=nbytes)

    def _release(self, live: list[Batch[T]], now: float) -> list[Batch[T]]:
        out = []
        for i, batch in enumerate(live):
            # nothing live waits behind this batch: its empty seats are spare capacity
            if self.fill_to and i == len(live) - 1 and not self._waiting[LIVE] and not self.live.pending:
                batch = self._fill(batch)
            self._count(batch, +1)
            out.append(batch)
        if self._held and self.backfill_ready(now):
            batch = self._held.popleft()
            self._count(batch, +1)
            out.append(batch)
        return out
