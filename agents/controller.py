"""What the micro-batcher learns online: service time per batch size and the arrival rate.

Pure and clock-free: every method takes the values it needs (``now`` in seconds from any
monotonic clock). :class:`agents.batching.MicroBatcher` owns one of each and asks
:func:`plan_throughput`, :func:`knee_size` and :func:`size_for_rate` which batch size to allow.

How the allowed size is chosen (model-based, with doubling exploration):

1. ``ServiceModel`` keeps an EWMA of the service time of each batch size it has seen and fits
   ``t(b) = a + c*b`` through them for sizes it has not (one size seen: ``t(b) = t(b0)``,
   an optimistic guess that makes the next, larger batch worth trying).
2. A sample ``jump_ratio`` times above (or below) the EWMA of its size is a regime change
   (throttled or shared device, other content): every size's estimate is rescaled by that ratio
   at once instead of decaying towards it over several batches.
3. ``plan_throughput`` lists the predicted throughput ``b / t(b)`` for ``b = 1, 2, ...`` up to
   the smallest of ``max_size`` and twice the largest size ever seen (the model is never trusted
   further than one doubling beyond its data), stopping before the first ``b > 1`` whose predicted
   service time breaks the SLO budget.
4. ``knee_size``: the smallest size whose throughput is within ``tolerance`` of the best listed
   one — past it per-item time no longer improves enough to pay the extra latency.
5. ``size_for_rate``: the smallest size up to the knee whose throughput carries the measured
   arrival rate at ``target_utilization``; the knee when none does (saturation).

So at light load the allowed size is 1 (no waiting for batch-mates); as the arrival rate rises it
grows, at most doubling beyond the data per step, while the model says per-item time improves;
it shrinks as soon as the predicted service time of the allowed size would break the SLO budget
(e.g. after a jump in service time).

Under a backlog the device model is not enough: per-batch costs outside the device lane (thread
hops, Avro, produce, acks) can cap the worker while the device idles, and the model, seeing a
fast device, would keep batches of 1. :class:`SaturationClimber` then picks the size from the
worker's *measured* time per item at each size (the interval between batches closed from the
backlog), and :class:`~agents.batching.MicroBatcher` uses the larger of the two, within
:func:`slo_cap`.
"""

from __future__ import annotations

import math

__all__ = ["ArrivalRate", "SaturationClimber", "ServiceModel", "knee_size", "plan_throughput", "size_for_rate",
           "slo_cap"]

_TINY_S = 1e-9  # service times are clamped to [_TINY_S, _HUGE_S], so ratios stay finite
_HUGE_S = 1e9


class ServiceModel:
    """Online estimate of the service time ``t(b)`` (seconds) of a batch of ``b >= 1`` items."""

    def __init__(self, *, alpha: float = 0.3, jump_ratio: float = 2.0) -> None:
        self._alpha = alpha
        self._jump_ratio = jump_ratio
        self._ewma: dict[int, float] = {}
        self._seen: dict[int, int] = {}  # observations per size
        self._a = 0.0  # fitted intercept, seconds
        self._c = 0.0  # fitted slope, seconds per item

    @property
    def largest_seen(self) -> int:
        """The largest batch size observed so far; 0 before the first observation."""
        return max(self._ewma, default=0)

    @property
    def fit(self) -> tuple[float, float]:
        """``(a, c)`` of the fitted ``t(b) = a + c*b``, both >= 0; ``(0, 0)`` with no data."""
        return self._a, self._c

    def observe(self, size: int, seconds: float) -> bool:
        """Fold in one batch's service time (clamped to [1 ns, 1e9 s]). Returns True when it
        was a jump, i.e. the whole model was rescaled.

        The first batch of a new size often pays one-time costs (allocations, kernels compiled
        for the shape): its time is capped at ``jump_ratio`` times what the other sizes predict,
        and a later jump off a size seen only once replaces that one estimate instead of
        rescaling every size by a warm-up's ratio."""
        seconds = _clamp(seconds)
        old = self._ewma.get(size)
        jumped = old is not None and not 1 / self._jump_ratio <= seconds / old <= self._jump_ratio
        if old is None:
            if self._ewma:
                seconds = min(seconds, self._jump_ratio * self.predict(size))
            self._ewma[size] = seconds
        elif jumped and self._seen.get(size, 0) < 2:
            self._ewma[size] = seconds
            jumped = False
        elif jumped:
            self._ewma = {b: _clamp(t * seconds / old) for b, t in self._ewma.items()}
            self._ewma[size] = seconds
        else:
            self._ewma[size] = old + self._alpha * (seconds - old)
        self._seen[size] = self._seen.get(size, 0) + 1
        self._refit()
        return jumped

    def predict(self, size: int) -> float:
        """Predicted service time in seconds of a batch of ``size``: 0.0 before any data."""
        seen = self._ewma.get(size)
        if seen is not None:
            return seen
        if not self._ewma:
            return 0.0
        return max(self._a + self._c * size, _TINY_S)

    def _refit(self) -> None:
        """Least-squares line through the per-size EWMAs, clamped to a, c >= 0."""
        sizes, times = list(self._ewma), list(self._ewma.values())
        if len(sizes) == 1:
            self._a, self._c = times[0], 0.0
            return
        n = len(sizes)
        mean_b, mean_t = sum(sizes) / n, sum(times) / n
        var_b = sum((b - mean_b) ** 2 for b in sizes)
        c = sum((b - mean_b) * (t - mean_t) for b, t in zip(sizes, times, strict=True)) / var_b
        a = mean_t - c * mean_b
        if c < 0:  # bigger batches measured faster: noise; treat time as flat
            a, c = mean_t, 0.0
        elif a < 0:  # super-linear: refit through the origin
            a, c = 0.0, sum(b * t for b, t in zip(sizes, times, strict=True)) / sum(
                b * b for b in sizes
            )
        self._a, self._c = a, c


class ArrivalRate:
    """Arrival rate (items per second): an exponentially decayed count with time constant
    ``window_s``, divided by the decayed time it covers.

    The first arrival only starts the clock, so the estimate is unbiased from the second one on
    (no slow warm-up at start-up). For a steady stream of rate ``r`` it converges to ``r``; once
    arrivals stop it relaxes towards 0 with time constant ``window_s``.
    """

    def __init__(self, window_s: float) -> None:
        self._window_s = window_s
        self._count = 0.0
        self._start: float | None = None
        self._last = 0.0

    def observe(self, now: float) -> None:
        """Count one arrival at ``now`` (seconds, never earlier than the previous call)."""
        if self._start is None:
            self._start = now
        else:
            self._count = self._decayed(now) + 1.0
        self._last = now

    def rate(self, now: float) -> float:
        """Estimated arrivals per second at ``now``; 0.0 before two arrivals."""
        if self._start is None or now <= self._start:
            return 0.0
        covered = self._window_s * -math.expm1(-(now - self._start) / self._window_s)
        return self._decayed(now) / covered

    def _decayed(self, now: float) -> float:
        return self._count * math.exp(-max(now - self._last, 0.0) / self._window_s)


def _clamp(seconds: float) -> float:
    return min(max(seconds, _TINY_S), _HUGE_S)


def plan_throughput(model: ServiceModel, *, max_size: int, budget_s: float) -> list[float]:
    """Predicted items/s of batch sizes ``1..n`` (index ``b - 1``): ``n`` is the largest size
    within ``max_size``, twice the largest size seen, and the SLO service budget ``budget_s``.
    Always holds size 1."""
    upper = min(max_size, max(1, 2 * model.largest_seen))
    plan: list[float] = []
    for size in range(1, upper + 1):
        seconds = model.predict(size)
        if size > 1 and seconds > budget_s:
            break
        plan.append(size / max(seconds, _TINY_S))  # 0.0 before any data
    return plan


def knee_size(plan: list[float], tolerance: float) -> int:
    """Smallest batch size whose throughput is within ``tolerance`` (0..1) of the plan's best."""
    floor = (1.0 - tolerance) * max(plan)
    return next(i + 1 for i, items_per_s in enumerate(plan) if items_per_s >= floor)


def size_for_rate(plan: list[float], knee: int, rate: float, utilization: float) -> int:
    """Smallest size ``<= knee`` whose throughput covers ``rate / utilization``; else ``knee``."""
    needed = rate / utilization
    return next((i + 1 for i in range(knee) if plan[i] >= needed), knee)


class SaturationClimber:
    """The batch size at saturation, found on the measured throughput of the whole worker.

    Under a backlog, what limits throughput is often not the device lane the
    :class:`ServiceModel` sees but per-batch costs elsewhere (thread hops, Avro, produce, acks):
    with tiny images a batch of 1 can be cheap on the device and still cap the worker at a few
    hundred events/s. The driver then feeds the batcher only as fast as the slowest lane takes
    batches, so the interval between two batches that closed from a backlog is that lane's time
    per batch: ``interval / size`` is the whole worker's time per item at that size, whatever the
    bottleneck is.

    The climber holds the current size (``size``; 0 when not saturated) and, per size, the
    measured time per item and when it was measured (a count of decisions). At each size it lets
    ``settle`` batches pass (the lanes still hold batches of the previous size), averages the next
    ``dwell`` intervals but the slowest (a new shape's warm-up, a GC pause, another tenant; half as
    many intervals while twice the size was never measured: the first climb is quick), and decides:

    - while the size just measured is the best so far, it doubles (within ``cap``, the SLO's limit)
      if twice the size was not measured recently;
    - otherwise it goes to the ``target``: the smallest size measured in the last ``refresh``
      decisions whose time per item is within ``tolerance`` of the best one so measured (past it,
      larger batches only add latency);
    - at the target, it explores one neighbour not measured recently — twice the size first,
      else half — so an early, noisy or outdated figure never locks a size in.

    So it climbs by doubling while a doubling pays at all, settles within ``tolerance`` of the
    best size it measured (not ``tolerance`` per doubling), and re-measures the neighbours every
    ``refresh`` decisions. Sizes are powers of two, plus ``cap`` itself.
    """

    def __init__(self, *, tolerance: float = 0.05, settle: int = 4, dwell: int = 4, refresh: int = 8) -> None:
        self.size = 0
        self._tolerance, self._settle, self._dwell, self._refresh = tolerance, settle, dwell, refresh
        self._per_item: dict[int, tuple[float, int]] = {}  # size -> (seconds per item, decision stamp)
        self._decisions = 0
        self._closes = 0
        self._intervals: list[float] = []

    def per_item_s(self, size: int) -> float | None:
        """The measured seconds per item at ``size``, recent or not; None if never measured."""
        seen = self._per_item.get(size)
        return None if seen is None else seen[0]

    def backlog_close(self, size: int, interval_s: float, cap: int) -> None:
        """A batch of ``size`` closed from a backlog ``interval_s`` after the previous batch
        closed (``inf`` when there was none); ``cap`` is the largest size allowed now."""
        if self.size == 0:
            self._move(max(1, min(size, cap)))
            return
        self._closes += 1
        climbing = self.size < cap and min(2 * self.size, cap) not in self._per_item
        dwell = max(1, self._dwell // 2) if climbing else self._dwell  # class docstring
        if self._closes > self._settle and math.isfinite(interval_s) and size == self.size:
            self._intervals.append(interval_s)
        if len(self._intervals) >= dwell:
            self._decide(cap)
        elif self.size > cap:
            self._move(_grid_floor(cap))

    def relax(self) -> None:
        """A batch did not fill from a backlog: halve the size, or leave saturation (0) from 2
        or 1 (a batch of 1 cannot show a backlog); the measurements are kept."""
        self._move(self.size // 2 if self.size > 2 else 0)

    def _decide(self, cap: int) -> None:
        kept = sorted(self._intervals)[:max(1, len(self._intervals) - 1)]  # the slowest left out
        measured = sum(kept) / (len(kept) * self.size)
        old = self._per_item.get(self.size)
        if old is not None and self._decisions - old[1] <= self._refresh:
            measured = (old[0] + measured) / 2
        self._decisions += 1
        self._per_item[self.size] = (measured, self._decisions)
        fresh = {b: s for b, (s, stamp) in self._per_item.items()
                 if b <= cap and self._decisions - stamp <= self._refresh}
        if not fresh:  # the cap fell below every size measured recently
            self._move(_grid_floor(cap))
            return
        best = min(fresh.values())
        target = min(b for b, s in fresh.items() if s <= best * (1 + self._tolerance))
        up = min(2 * self.size, cap) if self.size < cap else None
        if fresh[self.size] == best and up is not None and up not in fresh:
            self._move(up)  # still improving: look further up before settling on the target
            return
        if target != self.size:
            self._move(target)
            return
        down = _grid_floor(self.size - 1) if self.size > 1 else None
        explore = next((b for b in (up, down) if b is not None and b not in fresh), None)
        self._move(self.size if explore is None else explore)

    def _move(self, size: int) -> None:
        self.size = size
        self._closes = 0
        self._intervals = []


def _grid_floor(size: int) -> int:
    """The largest power of two <= ``size`` (``size`` >= 1)."""
    return 1 << (max(size, 1).bit_length() - 1)


def slo_cap(model: ServiceModel, *, max_size: int, budget_s: float) -> int:
    """The largest size ``<= max_size`` whose predicted service time is within ``budget_s``
    (at least 1; every size before any data)."""
    return next((b for b in range(max_size, 1, -1) if model.predict(b) <= budget_s), 1)
