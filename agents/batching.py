"""Adaptive micro-batching as a pure state machine with an injected clock.

No asyncio, no device, no Kafka: the driver (the Faust agent, a simulation, a test) passes
``now`` — seconds on one monotonic clock — into every call and acts on the batches returned.

- ``add(item, shape_class, now, nbytes, priority)`` puts an item in its shape class's bucket
  (buckets never mix) and returns every batch that closes at ``now``.
- ``next_deadline()`` is when the driver must call ``poll`` next (None: nothing pending).
- ``poll(now)`` closes buckets that are full or whose deadline has passed.
- ``flush()`` closes everything (shutdown, partition revoked).
- ``record_service(batch_size, seconds)`` reports how long a batch took on the device.

Priority: a bucket's priority is the highest ``priority`` of its items (the event's field); the
batches one call returns are ordered by priority, highest first, then by opening time — so when
several buckets close at once, the most urgent goes to the device first. Priority never mixes
shape classes and never delays a bucket.

A bucket closes ``"full"`` when it holds the allowed size or the next item would take it over
the memory budget, and ``"deadline"`` at::

    opened_at + min(max_wait_s, max(0, slo_s - predicted_service(len(bucket))))

i.e. its oldest item still leaves in time to finish within the SLO, and never waits more than
``max_wait_s``.

The allowed size (``allowed_size(now)``) has two regimes.

Light load (the default): ``for_rate`` (:mod:`agents.controller`), the smallest size whose
predicted device throughput carries the measured arrival rate at ``target_utilization``, capped
at the ``knee`` of the device model — 1 at light load, so an item leaves on arrival.

Saturation: a bucket that reached the allowed size (>= 2) within ``backlog_fraction`` of its
batch's time (the device model's, or the worker's measured time at saturation when longer) was
filled from a backlog, not by live arrivals. From then on a
:class:`~agents.controller.SaturationClimber` sets the size from the *measured* interval between
batches closed from the backlog — the whole worker's time per batch, per-batch costs outside the
device lane included, which the device model does not see: it doubles while a doubling pays, up
to the SLO cap (the largest size whose predicted service time fits
``slo_s - max_wait_s``), keeps to the smallest size whose measured time per item is within
``knee_tolerance`` of the best, and re-measures the neighbouring sizes now and then (never below
the light-load size). A deadline close, or a bucket that did not fill from
the backlog, halves the size; at 0 the light-load rule is back.

A batch of 1 closes on arrival, so it cannot show a backlog: after ``probe_after`` arrivals in a
row each within ``max_wait_s`` of the previous one, one bucket is allowed 2 items (a probe). Under
a backlog it fills at once and saturation begins; otherwise its deadline comes after
``backlog_fraction`` of the predicted service time of 2 — all a backlog would need to fill it — so
at light load a probe costs its one item next to nothing. Sparser arrivals are never probed.

The saturation signal needs the recommended driving loop (double buffering): pull events and
``add`` them only while no closed batch is waiting for the device; while one waits, events stay
in the consumer. The arrival rate the batcher sees is then capped by the worker's throughput at
the current size, so the rate alone would not grow batches past what the device model asks for.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any, Generic, TypeVar

from agents.controller import (
    ArrivalRate,
    SaturationClimber,
    ServiceModel,
    knee_size,
    plan_throughput,
    size_for_rate,
    slo_cap,
)

__all__ = ["Batch", "BatchingConfig", "CloseReason", "MicroBatcher"]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class BatchingConfig:
    """Micro-batching settings. Times in seconds, sizes in items, memory in bytes.

    ``memory_budget_bytes``: the most bytes (sum of ``add``'s ``nbytes``) one batch may hold;
    an item over it on its own forms a batch by itself.
    ``fixed_batch`` turns the controller off: the allowed size is that constant (benchmarks'
    fixed-size baselines); deadlines still apply. ``target_utilization`` (0..1] is the share of
    a batch size's throughput the arrival rate may use before a larger size is allowed.
    ``knee_tolerance`` [0..1): how far below the best predicted throughput the knee may sit.
    ``jump_ratio`` > 1: a service time this many times off its estimate rescales the model.
    ``rate_window_s``: time constant of the arrival-rate estimate.
    ``backlog_fraction`` [0..1): a batch that filled to the allowed size within this share of
    its batch's time was filled from a backlog (see the module docstring).
    ``climb_settle``, ``climb_dwell``, ``climb_refresh``: the saturation climber's batches let pass
    after a size change, intervals averaged per decision, and decisions a measurement stays
    recent (:class:`~agents.controller.SaturationClimber`). ``probe_after``: arrivals in a row
    within ``max_wait_s`` before a bucket of 2 probes for a backlog.
    """

    slo_s: float = 0.25
    max_batch: int = 64
    max_wait_s: float = 0.025
    memory_budget_bytes: int = 8 * 2**30
    fixed_batch: int | None = None
    target_utilization: float = 0.8
    knee_tolerance: float = 0.05
    ewma_alpha: float = 0.3
    jump_ratio: float = 2.0
    rate_window_s: float = 0.25
    backlog_fraction: float = 0.1
    climb_settle: int = 4
    climb_dwell: int = 4
    climb_refresh: int = 8
    probe_after: int = 8

    def __post_init__(self) -> None:
        checks = {
            "slo_s": self.slo_s > 0,
            "max_batch": self.max_batch >= 1,
            "max_wait_s": 0 <= self.max_wait_s < self.slo_s,
            "memory_budget_bytes": self.memory_budget_bytes > 0,
            "fixed_batch": self.fixed_batch is None or 1 <= self.fixed_batch <= self.max_batch,
            "target_utilization": 0 < self.target_utilization <= 1,
            "knee_tolerance": 0 <= self.knee_tolerance < 1,
            "ewma_alpha": 0 < self.ewma_alpha <= 1,
            "jump_ratio": self.jump_ratio > 1,
            "rate_window_s": self.rate_window_s > 0,
            "backlog_fraction": 0 <= self.backlog_fraction < 1,
            "climb_settle": self.climb_settle >= 0,
            "climb_dwell": self.climb_dwell >= 1,
            "climb_refresh": self.climb_refresh >= 1,
            "probe_after": self.probe_after >= 1,
        }
        bad = [name for name, ok in checks.items() if not ok]
        if bad:
            name = bad[0]
            raise ValueError(
                f"BatchingConfig.{name} is out of range: got {getattr(self, name)!r} "
                f"(slo_s={self.slo_s!r}, max_batch={self.max_batch!r})"
            )

    @property
    def service_budget_s(self) -> float:
        """Longest predicted service time a batch may have: the SLO less the longest wait."""
        return self.slo_s - self.max_wait_s

    @classmethod
    def for_device(cls, device: str, **overrides: Any) -> BatchingConfig:
        """Defaults for ``"gpu"`` (SLO 250 ms) or ``"cpu"`` (SLO 2 s), with ``overrides``."""
        if device == "gpu":
            base = cls()
        elif device == "cpu":
            # 8, not 16: on a CPU a larger batch gains nothing per image (worker CPU per input 62.6,
            # 66.7, 69.5 ms at 16 against 65.9, 61.7, 66.8 ms at 8: alternating rounds, a 120-input
            # backlog of bench/bench_faults.py's mixed stream, 2026-12-07, shared 2-vCPU host), and
            # the lanes' in-flight window is sized from it (agents/wiring.py: 136 inputs at 16, 72
            # at 8): a backlog drained after an outage peaked at 1.41x the steady RSS against
            # 1.44-1.53x at 16 (bench/bench_faults.py, broker and S3 blackholes)
            base = cls(
                slo_s=2.0,
                max_batch=8,
                max_wait_s=0.2,
                memory_budget_bytes=2**30,
                rate_window_s=4.0,
            )
        else:
            raise ValueError(
                f"BatchingConfig.for_device: device must be 'gpu' or 'cpu'; got {device!r}"
            )
        return replace(base, **overrides)


class CloseReason(StrEnum):
    FULL = "full"
    DEADLINE = "deadline"
    FLUSH = "flush"


@dataclass(frozen=True, slots=True)
class Batch(Generic[T]):
    """Items of one shape class in arrival order; ``opened_at`` is the oldest item's arrival."""

    items: tuple[T, ...]
    shape_class: Hashable
    opened_at: float
    reason: CloseReason
    nbytes: int = 0
    priority: int = 0

    def __len__(self) -> int:
        return len(self.items)


@dataclass(slots=True)
class _Bucket(Generic[T]):
    shape_class: Hashable
    opened_at: float
    last_at: float
    items: list[T] = field(default_factory=list)
    nbytes: int = 0
    priority: int | None = None
    probe: bool = False  # opened as a probe for a backlog (module docstring)

    def close(self, reason: CloseReason) -> Batch[T]:
        return Batch(tuple(self.items), self.shape_class, self.opened_at, reason, self.nbytes, self.priority or 0)


def _by_priority(batches: list[Batch[T]]) -> list[Batch[T]]:
    """Highest priority first; the same priority keeps its order (oldest first)."""
    return sorted(batches, key=lambda b: -b.priority)


class MicroBatcher(Generic[T]):
    """Buckets items by shape class and closes batches; see the module docstring."""

    def __init__(self, config: BatchingConfig | None = None) -> None:
        self.config = config or BatchingConfig()
        self._model = ServiceModel(alpha=self.config.ewma_alpha, jump_ratio=self.config.jump_ratio)
        self._arrivals = ArrivalRate(self.config.rate_window_s)
        self._buckets: dict[Hashable, _Bucket[T]] = {}  # insertion order = opening order
        self._now = -math.inf
        self._plan: list[float] = [1.0]
        self._knee = 1
        self._cap = self.config.max_batch  # the SLO's largest size
        cfg = self.config
        self._climb = SaturationClimber(tolerance=cfg.knee_tolerance, settle=cfg.climb_settle, dwell=cfg.climb_dwell,
                                        refresh=cfg.climb_refresh)
        self._last_add = -math.inf
        self._last_close = -math.inf
        self._short_gaps = 0  # arrivals in a row within max_wait_s of the previous one

    @property
    def pending(self) -> int:
        """Items added and not yet returned in a batch."""
        return sum(len(b.items) for b in self._buckets.values())

    def add(self, item: T, shape_class: Hashable, now: float, nbytes: int = 0, priority: int = 0) -> list[Batch[T]]:
        """Add ``item`` (``nbytes``: its memory estimate on the device; ``priority``: higher goes
        first); return the batches that close at ``now``, highest priority first, then oldest
        first — it is also a clock tick, like :meth:`poll`."""
        if nbytes < 0:
            raise ValueError(f"MicroBatcher.add: nbytes must be >= 0; got {nbytes!r}")
        now = self._tick(now)
        self._arrivals.observe(now)
        self._short_gaps = self._short_gaps + 1 if now - self._last_add <= self.config.max_wait_s else 0
        self._last_add = now
        closed: list[Batch[T]] = []
        bucket = self._buckets.get(shape_class)
        if bucket is not None and bucket.nbytes + nbytes > self.config.memory_budget_bytes:
            closed.append(self._close(shape_class, CloseReason.FULL, self.allowed_size(now)))
            bucket = None
        if bucket is None:
            bucket = self._buckets[shape_class] = _Bucket(shape_class, now, now,
                                                          probe=self.config.fixed_batch is None and self._sized(now)[1])
        bucket.items.append(item)
        bucket.nbytes += nbytes
        bucket.last_at = now
        bucket.priority = priority if bucket.priority is None else max(bucket.priority, priority)
        return _by_priority(closed + self.poll(now))

    def poll(self, now: float) -> list[Batch[T]]:
        """Close buckets that are full at the current allowed size or past their deadline."""
        now = self._tick(now)
        allowed = self.allowed_size(now)
        closed: list[Batch[T]] = []
        for key, bucket in list(self._buckets.items()):
            full = len(bucket.items) >= allowed
            if full or bucket.nbytes >= self.config.memory_budget_bytes:
                closed.append(self._close(key, CloseReason.FULL, allowed))
            elif self._deadline(bucket) <= now:
                closed.append(self._close(key, CloseReason.DEADLINE, allowed))
        return _by_priority(closed)

    def next_deadline(self) -> float | None:
        """Earliest deadline of a pending bucket, or None when nothing is pending."""
        return min((self._deadline(b) for b in self._buckets.values()), default=None)

    def flush(self) -> list[Batch[T]]:
        """Close every bucket now, highest priority first, then oldest first."""
        closed = [b.close(CloseReason.FLUSH) for b in self._buckets.values()]
        self._buckets.clear()
        if closed:
            self._last_close = -math.inf  # the next interval would not be a batch's time
        return _by_priority(closed)

    def record_service(self, batch_size: int, seconds: float) -> None:
        """Report that a batch of ``batch_size`` items took ``seconds`` on the device."""
        if batch_size < 1 or not (math.isfinite(seconds) and seconds >= 0):
            raise ValueError(
                "MicroBatcher.record_service: need batch_size >= 1 and finite seconds >= 0; "
                f"got batch_size={batch_size!r}, seconds={seconds!r}"
            )
        self._model.observe(batch_size, seconds)
        self._plan = plan_throughput(
            self._model, max_size=self.config.max_batch, budget_s=self.config.service_budget_s
        )
        self._knee = knee_size(self._plan, self.config.knee_tolerance)
        self._cap = slo_cap(self._model, max_size=self.config.max_batch, budget_s=self.config.service_budget_s)

    def device_done(self, items: Sequence[T]) -> None:
        """The driver's notice that a batch left the device lane; a single batcher needs none
        (:class:`agents.tiers.TierBatcher` does)."""

    def allowed_size(self, now: float) -> int:
        """Batch size a bucket closes at, given the arrival rate measured up to ``now``."""
        if self.config.fixed_batch is not None:
            return self.config.fixed_batch
        size, _ = self._sized(now)
        return size

    def _sized(self, now: float) -> tuple[int, bool]:
        """The allowed size (not fixed), and whether it is 2 only to probe for a backlog."""
        rate = self._arrivals.rate(max(now, self._now))
        size = size_for_rate(self._plan, self._knee, rate, self.config.target_utilization)
        if self._climb.size:
            return min(max(size, self._climb.size), self._cap), False
        if size == 1 and self._cap >= 2 and self._short_gaps >= self.config.probe_after:
            return 2, True
        return size, False

    @property
    def saturated_size(self) -> int:
        """The saturation climber's size (0: light load; see the module docstring)."""
        return self._climb.size

    def predicted_service_s(self, batch_size: int) -> float:
        """The model's service time in seconds for ``batch_size`` items (0.0 before data)."""
        return self._model.predict(batch_size)

    def _close(self, key: Hashable, reason: CloseReason, allowed: int) -> Batch[T]:
        """Close a bucket, and learn from how it filled whether a backlog is waiting."""
        bucket = self._buckets.pop(key)
        size = len(bucket.items)
        interval, self._last_close = self._now - self._last_close, self._now
        if size >= 2 or reason is CloseReason.DEADLINE:
            self._short_gaps = 0  # a probe, or a batch that needed none, is over
        if reason is CloseReason.FULL and size >= allowed:
            if size >= 2:
                measured = self._climb.per_item_s(size)
                batch_s = max(self._model.predict(size), 0.0 if measured is None else measured * size)
                backlog = bucket.last_at - bucket.opened_at <= self.config.backlog_fraction * batch_s
            elif self._climb.size == 1:  # walked down to 1: arrivals as fast as the worker works at 1 or 2
                ref = self._climb.per_item_s(1) or self._climb.per_item_s(2)
                backlog = ref is not None and interval <= 3 * ref
            else:  # light load; a probe of 2 tells a backlog
                return bucket.close(reason)
            if backlog:
                self._climb.backlog_close(size, interval, self._cap)
            elif self._climb.size:
                self._climb.relax()
        elif reason is CloseReason.DEADLINE and self._climb.size:
            self._climb.relax()
        return bucket.close(reason)

    def _deadline(self, bucket: _Bucket[T]) -> float:
        slack = self.config.slo_s - self._model.predict(len(bucket.items))
        wait = min(self.config.max_wait_s, max(slack, 0.0))
        if bucket.probe:  # a backlog fills it at once; waiting longer would only add latency
            wait = min(wait, self.config.backlog_fraction * self._model.predict(2))
        return bucket.opened_at + wait

    def _tick(self, now: float) -> float:
        """Advance the clock; an earlier ``now`` than already seen counts as the latest one."""
        if math.isnan(now):
            raise ValueError("MicroBatcher: now must be a number of seconds; got nan")
        self._now = max(self._now, now)
        return self._now
