"""The saturation climber (agents/controller.py) alone, and the micro-batcher driven through a
simulated two-lane worker where per-batch costs outside the device lane are the bottleneck.

Simulated time only (an injected clock, seeded jitter): no sleeps, no wall-clock bounds.
"""

from __future__ import annotations

import math
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import pytest

from agents.batching import Batch, BatchingConfig, MicroBatcher
from agents.controller import SaturationClimber

Cost = Callable[[int], float]  # seconds for a batch of b items


# --- the climber alone --------------------------------------------------------------------------


def climb(per_batch: Cost, *, batches: int, cap: int = 64, climber: SaturationClimber | None = None,
          noise: Callable[[int, int], float] = lambda _i, _b: 1.0) -> tuple[SaturationClimber, list[int]]:
    """Feed a climber ``batches`` backlog closes whose interval is ``per_batch(size)`` (times
    ``noise(i, size)``); returns it and the size of every batch."""
    climber = climber or SaturationClimber()
    climber.backlog_close(2, math.inf, cap)  # the probe that found the backlog
    sizes = []
    for i in range(batches):
        size = climber.size
        sizes.append(size)
        climber.backlog_close(size, per_batch(size) * noise(i, size), cap)
    return climber, sizes


def throughput(per_batch: Cost, size: int) -> float:
    return size / per_batch(size)


def test_climbs_while_doubling_pays_and_stops_within_tolerance() -> None:
    per_batch = lambda b: 0.002 + 0.0003 * b  # noqa: E731 - per item: 2 ms / b + 0.3 ms
    climber, sizes = climb(per_batch, batches=200)
    best = max(throughput(per_batch, b) for b in range(1, 65))
    assert throughput(per_batch, climber.size) >= 0.9 * best
    assert sizes[:30] == sorted(sizes[:30]) and max(sizes[:40]) >= 32  # climbs by doubling, a few batches a size


def test_finds_an_interior_optimum_and_keeps_to_it() -> None:
    per_batch = lambda b: 0.002 + 0.0003 * b + 0.000004 * b * b  # noqa: E731 - per item is least near b = 22
    _, sizes = climb(per_batch, batches=300)
    best = max(throughput(per_batch, b) for b in range(1, 65))
    later = sizes[100:]
    assert sum(throughput(per_batch, b) for b in later) / len(later) >= 0.9 * best
    assert later.count(64) <= len(later) // 6  # 64 (17 % slower) is only re-measured now and then


def test_an_early_outlier_does_not_lock_the_size() -> None:
    """The first measurement at 64 (the best size) is 3x slow (a warm-up, another tenant): a
    per-size estimate that is never re-measured would refuse 64 for good; the climber leaves it,
    re-measures it later and goes back."""
    per_batch = lambda b: 0.002 + 0.0003 * b  # noqa: E731 - per item at 64 is 8.6 % less than at 32
    outlier = lambda i, b: 3.0 if b == 64 and i < 60 else 1.0  # noqa: E731
    climber, sizes = climb(per_batch, batches=300, noise=outlier)
    assert 64 in sizes[:40] and sizes[40:90].count(64) < 10  # it reached 64, then the outlier drove it off...
    assert climber.size == 64 and sizes[-50:].count(64) >= 40  # ...but not for good


def test_follows_a_regime_change_in_both_directions() -> None:
    fast_small = lambda b: 0.002 + 0.0003 * b + 0.00004 * b * b  # noqa: E731 - best near b = 7
    climber, _ = climb(fast_small, batches=150)
    assert climber.size <= 16
    overhead_heavy = lambda b: 0.02 + 0.0003 * b  # noqa: E731 - per-batch cost x10: large batches pay
    climber, _ = climb(overhead_heavy, batches=150, climber=climber)
    assert climber.size >= 32


def test_respects_the_cap_and_relaxes_to_zero() -> None:
    climber, sizes = climb(lambda b: 0.002 + 0.0003 * b, batches=100, cap=12)
    assert max(sizes) <= 12 and climber.size >= 8
    for _ in range(8):
        climber.relax()
    assert climber.size == 0


# --- the micro-batcher in a simulated worker ------------------------------------------------------


@dataclass
class Worker:
    """Two lanes in series with one batch slot before each (the runner's bounded queues): the
    device lane, whose time the batcher is told (``record_service``), then a framework lane
    (produce, acks, thread hops) that it is not told about. The driver adds arrived items to
    the batcher only while no closed batch waits for the device (double buffering)."""

    batcher: MicroBatcher[int]
    device: Cost
    framework: Cost
    rng: random.Random
    now: float = 0.0
    waiting: deque[Batch[int]] = field(default_factory=deque)  # closed, waiting for the device
    on_device: tuple[float, Batch[int], float] | None = None
    device_out: Batch[int] | None = None  # done on the device, waiting for the framework slot
    framework_q: Batch[int] | None = None
    on_framework: tuple[float, Batch[int]] | None = None
    done: dict[int, float] = field(default_factory=dict)
    sizes: list[tuple[float, int]] = field(default_factory=list)  # (closed at, size)

    def jitter(self, seconds: float) -> float:
        return seconds * self.rng.uniform(0.9, 1.1)

    def run(self, arrivals: list[float], until: float) -> None:
        backlog: deque[int] = deque()
        nxt = 0
        while True:
            changed = True
            while changed:
                changed = False
                if self.on_framework and self.on_framework[0] <= self.now:
                    for item in self.on_framework[1].items:
                        self.done[item] = self.on_framework[0]
                    self.on_framework, changed = None, True
                if self.on_framework is None and self.framework_q is not None:
                    b = self.framework_q
                    self.on_framework, self.framework_q, changed = (self.now + self.jitter(self.framework(len(b))),
                                                                    b), None, True
                if self.on_device and self.on_device[0] <= self.now and self.device_out is None:
                    _, b, seconds = self.on_device
                    self.batcher.record_service(len(b), seconds)
                    self.device_out, self.on_device, changed = b, None, True
                if self.device_out is not None and self.framework_q is None:
                    self.framework_q, self.device_out, changed = self.device_out, None, True
                if self.on_device is None and self.device_out is None and self.waiting:
                    b = self.waiting.popleft()
                    seconds = self.jitter(self.device(len(b)))
                    self.on_device, changed = (self.now + seconds, b, seconds), True
                while nxt < len(arrivals) and arrivals[nxt] <= self.now:
                    backlog.append(nxt)
                    nxt += 1
                while not self.waiting and backlog:
                    self._closed(self.batcher.add(backlog.popleft(), "64", self.now))
                    changed = True
                if not self.waiting:
                    self._closed(self.batcher.poll(self.now))
                    changed = changed or bool(self.waiting)
            events = [arrivals[nxt] if nxt < len(arrivals) else None,
                      self.on_device[0] if self.on_device else None,
                      self.on_framework[0] if self.on_framework else None,
                      self.batcher.next_deadline() if not self.waiting else None]
            upcoming = [e for e in events if e is not None and e > self.now]
            if not upcoming or min(upcoming) > until:
                return
            self.now = min(upcoming)

    def _closed(self, batches: list[Batch[int]]) -> None:
        self.waiting.extend(batches)
        self.sizes += [(self.now, len(b)) for b in batches]


def poisson(rate: float, start: float, end: float, rng: random.Random) -> list[float]:
    out, t = [], start
    while (t := t + rng.expovariate(rate)) < end:
        out.append(t)
    return out


DEVICE = lambda b: 0.0002 + 0.00002 * b  # noqa: E731 - a fast device: 0.22 ms at b = 1
FRAMEWORK_CURVES = {
    # per-batch costs dominate; every doubling pays (best fixed: 64)
    "linear": lambda b: 0.002 + 0.0003 * b,
    # per-item time least near b = 22 (best fixed: 16), 64 is 17 % slower
    "interior": lambda b: 0.002 + 0.0003 * b + 0.000004 * b * b,
}
CONFIG = BatchingConfig.for_device("gpu")  # SLO 250 ms, max batch 64, max wait 25 ms


def saturated_throughput(config: BatchingConfig, framework: Cost, *, seconds: float = 8.0) -> tuple[float, Worker]:
    """Items/s completed from ``seconds / 4`` to ``seconds`` under an arrival rate far above capacity."""
    rng = random.Random(11)
    worker = Worker(MicroBatcher(config), DEVICE, framework, rng)
    capacity = max(b / framework(b) for b in range(1, 65))
    worker.run(poisson(3 * capacity, 0.0, seconds, rng), until=seconds)
    finished = sum(1 for t in worker.done.values() if seconds / 4 <= t <= seconds)
    return finished / (0.75 * seconds), worker


@pytest.mark.parametrize("curve", FRAMEWORK_CURVES)
def test_at_saturation_adaptive_is_within_10_percent_of_the_best_fixed_size(curve: str) -> None:
    """The device lane alone would carry the load at batch 1 (0.22 ms), so a controller that
    only models the device keeps batches of 1 under this backlog — capped near 450 items/s by
    the framework lane's 2 ms per batch."""
    framework = FRAMEWORK_CURVES[curve]
    fixed = {b: saturated_throughput(replace(CONFIG, fixed_batch=b), framework)[0] for b in (1, 4, 16, 64)}
    adaptive, _ = saturated_throughput(CONFIG, framework)
    assert adaptive >= 0.9 * max(fixed.values()), (adaptive, fixed)
    assert adaptive >= 3 * fixed[1]


def test_after_the_backlog_light_load_gets_batches_of_one_again() -> None:
    framework = FRAMEWORK_CURVES["linear"]
    rng = random.Random(5)
    worker = Worker(MicroBatcher(CONFIG), DEVICE, framework, rng)
    flood = poisson(6000.0, 0.0, 3.0, rng)  # ~2x capacity for 3 s
    light = poisson(20.0, 6.0, 66.0, rng)  # then 20 items/s (~4 % of batch-1 capacity) for a minute
    arrivals = flood + light
    worker.run(arrivals, until=70.0)
    assert len(worker.done) == len(arrivals)
    during = [size for t, size in worker.sizes if 1.0 <= t <= 3.0]
    assert sum(during) / len(during) >= 16  # it did climb under the backlog
    late = [size for t, size in worker.sizes if t >= 16.0]  # 10 s into the light load
    assert len(late) >= 500 and sum(late) / len(late) <= 1.05
    assert worker.batcher.saturated_size == 0
    latencies = sorted(worker.done[i] - arrivals[i] for i in range(len(flood), len(arrivals))
                       if arrivals[i] >= 16.0)
    assert latencies[len(latencies) // 2] <= 1.2 * (DEVICE(1) + framework(1))  # leaves on arrival


@pytest.mark.parametrize("load", [0.3, 0.6])
def test_a_steady_load_below_capacity_keeps_batch_one_latency(load: float) -> None:
    """Arrivals close together (so probes for a backlog happen) at 30 % and 60 % of batch-1
    capacity: batches stay at 1, and latency stays that of a fixed batch of 1."""
    framework = FRAMEWORK_CURVES["linear"]
    runs = {}
    for name, config in (("adaptive", CONFIG), ("one", replace(CONFIG, fixed_batch=1))):
        rng = random.Random(9)
        worker = Worker(MicroBatcher(config), DEVICE, framework, rng)
        arrivals = poisson(load / (DEVICE(1) + framework(1)), 0.0, 30.0, rng)
        worker.run(arrivals, until=31.0)
        assert len(worker.done) == len(arrivals)
        runs[name] = (sorted(worker.done[i] - t for i, t in enumerate(arrivals)), [s for _, s in worker.sizes])
    (adaptive, sizes), (one, _) = runs["adaptive"], runs["one"]
    assert sum(sizes) / len(sizes) <= 1.05 and max(sizes) <= 2
    assert adaptive[len(adaptive) // 2] <= 1.1 * one[len(one) // 2]
    assert adaptive[int(0.99 * len(adaptive))] <= 1.25 * one[int(0.99 * len(one))]
