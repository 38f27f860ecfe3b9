"""The micro-batching state machine, driven by a fake clock (no sleeps, no asyncio, no device)."""

from __future__ import annotations

import inspect
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import agents.batching as batching
import agents.controller as controller
from agents.batching import Batch, BatchingConfig, CloseReason, MicroBatcher
from agents.controller import ArrivalRate, ServiceModel

GPU = BatchingConfig.for_device("gpu")


def linear(a: float, c: float) -> Callable[[int], float]:
    return lambda b: a + c * b


def burst(
    batcher: MicroBatcher[int],
    service: Callable[[int], float],
    *,
    start: float,
    count: int,
    gap_s: float,
) -> list[Batch[int]]:
    """Add ``count`` items ``gap_s`` apart; report each closed batch's service time at once."""
    out: list[Batch[int]] = []
    for i in range(count):
        now = start + i * gap_s
        for batch in batcher.add(i, "800", now):
            batcher.record_service(len(batch), service(len(batch)))
            out.append(batch)
    return out


# --- configuration -----------------------------------------------------------------------


def test_device_defaults_follow_the_issue() -> None:
    assert BatchingConfig.for_device("gpu").slo_s == 0.25
    assert BatchingConfig.for_device("cpu").slo_s == 2.0
    assert BatchingConfig.for_device("cpu", max_batch=4).max_batch == 4


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"slo_s": 0.0}, "slo_s"),
        ({"max_wait_s": 0.3}, "max_wait_s"),
        ({"fixed_batch": 65}, "fixed_batch"),
        ({"jump_ratio": 1.0}, "jump_ratio"),
    ],
)
def test_bad_settings_name_the_field(overrides: dict[str, float], field: str) -> None:
    with pytest.raises(ValueError, match=f"BatchingConfig.{field} "):
        BatchingConfig(**overrides)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="'tpu'"):
        BatchingConfig.for_device("tpu")


def test_public_exports_are_complete() -> None:
    for module in (batching, controller):
        public = {
            name
            for name, value in vars(module).items()
            if not name.startswith("_")
            and (inspect.isclass(value) or inspect.isfunction(value))
            and value.__module__ == module.__name__
        }
        assert public <= set(module.__all__), module.__name__


# --- the controller's pieces -------------------------------------------------------------


def test_service_model_fits_a_line_and_rescales_on_a_jump() -> None:
    model = ServiceModel(alpha=0.5, jump_ratio=2.0)
    assert model.predict(8) == 0.0
    model.observe(1, 0.012)
    assert model.predict(2) == pytest.approx(0.012)  # one size seen: flat, optimistic
    model.observe(4, 0.018)
    assert model.fit == pytest.approx((0.010, 0.002))
    assert model.predict(16) == pytest.approx(0.042)
    model.observe(4, 0.018)
    assert model.observe(4, 0.072) is True  # 4x a confirmed estimate: every size scales with it
    assert model.predict(1) == pytest.approx(0.048)
    assert model.observe(4, 0.080) is False
    assert model.predict(4) == pytest.approx(0.076)


def test_service_model_does_not_learn_a_warm_up_as_a_regime() -> None:
    """The first batch of a new size pays a one-time cost (1.5 s instead of 20 ms): its estimate
    is capped, and the next batch of that size replaces it without rescaling the other sizes."""
    model = ServiceModel(alpha=0.5, jump_ratio=2.0)
    for _ in range(3):
        model.observe(1, 0.012)
        model.observe(2, 0.014)
    assert model.observe(8, 1.5) is False
    assert model.predict(8) == pytest.approx(2.0 * (0.010 + 0.002 * 8))  # capped at 2x the fit
    assert model.observe(8, 0.026) is False  # a jump off a size seen once: only its own estimate
    assert model.predict(8) == pytest.approx(0.026)
    assert model.predict(1) == pytest.approx(0.012)


def test_arrival_rate_converges_and_decays() -> None:
    rate = ArrivalRate(window_s=1.0)
    assert rate.rate(0.0) == 0.0
    for i in range(2000):
        rate.observe(i / 100)
        if i == 10:  # no warm-up bias
            assert rate.rate(0.1) == pytest.approx(100, rel=0.01)
    assert rate.rate(19.99) == pytest.approx(100, rel=0.01)
    assert rate.rate(19.99 + 5) < 1.0


# --- state-machine behaviour ----------------------------------------------------------------


def test_a_deadline_closes_a_partial_batch() -> None:
    batcher: MicroBatcher[str] = MicroBatcher(BatchingConfig(fixed_batch=8, max_wait_s=0.02))
    assert batcher.add("a", "800", 10.0) == []
    assert batcher.add("b", "800", 10.005) == []
    assert batcher.next_deadline() == pytest.approx(10.02)
    assert batcher.poll(10.019) == []
    [batch] = batcher.poll(10.02)
    assert batch.items == ("a", "b")
    assert batch.reason is CloseReason.DEADLINE
    assert batch.opened_at == 10.0
    assert batcher.pending == 0
    assert batcher.next_deadline() is None


def test_the_deadline_leaves_room_for_the_predicted_service_time() -> None:
    config = BatchingConfig(slo_s=0.25, max_wait_s=0.2, fixed_batch=8)
    batcher: MicroBatcher[int] = MicroBatcher(config)
    batcher.record_service(1, 0.01)
    for _ in range(2):  # the first batch of a size may be a warm-up: seen twice, it is believed
        batcher.record_service(2, 0.2)
    batcher.add(1, "800", 0.0)
    assert batcher.next_deadline() == pytest.approx(0.2)  # bounded by max_wait
    batcher.add(2, "800", 0.01)
    assert batcher.next_deadline() == pytest.approx(0.05)  # 0.25 SLO - 0.2 predicted for 2
    batcher.record_service(3, 0.5)
    [batch] = batcher.add(3, "800", 0.02)  # 3 items would take longer than the SLO: leave now
    assert (len(batch), batch.reason) == (3, "deadline")


def test_a_lone_item_at_low_rate_leaves_at_once() -> None:
    batcher: MicroBatcher[int] = MicroBatcher(GPU)
    service = linear(0.02, 0.002)
    for i in range(50):  # one item every 2 s: 1 % of batch-1 capacity
        [batch] = batcher.add(i, "800", 2.0 * i)
        assert (batch.items, batch.reason) == ((i,), "full")
        batcher.record_service(1, service(1))
    assert batcher.next_deadline() is None


def test_a_lone_item_after_a_burst_waits_at_most_max_wait() -> None:
    batcher: MicroBatcher[int] = MicroBatcher(GPU)
    burst(batcher, linear(0.02, 0.002), start=0.0, count=3000, gap_s=0.001)
    batcher.flush()
    assert batcher.allowed_size(3.0) > 1
    closed = batcher.add(-1, "800", 3.0)  # rate estimate still high: the item may wait...
    if not closed:
        deadline = batcher.next_deadline()
        assert deadline is not None and deadline <= 3.0 + GPU.max_wait_s  # ...but not long
        closed = batcher.poll(deadline)
    assert [b.items for b in closed] == [(-1,)]
    assert batcher.allowed_size(3.0 + 10 * GPU.rate_window_s) == 1  # and the rate decays


def test_a_burst_grows_batches() -> None:
    batcher: MicroBatcher[int] = MicroBatcher(GPU)
    batches = burst(batcher, linear(0.02, 0.002), start=0.0, count=4000, gap_s=0.001)
    sizes = [len(b) for b in batches]
    assert sizes[0] == 1
    assert max(sizes[-20:]) >= 16
    assert batcher.allowed_size(4.0) >= 16
    assert sum(sizes) + batcher.pending == 4000


def test_a_jump_in_service_time_shrinks_the_allowed_size() -> None:
    batcher: MicroBatcher[int] = MicroBatcher(GPU)
    fast, slow = linear(0.02, 0.002), linear(0.08, 0.008)  # then the device gets 4x slower
    burst(batcher, fast, start=0.0, count=4000, gap_s=0.001)
    before = batcher.allowed_size(4.0)
    assert batcher.predicted_service_s(before) <= GPU.service_budget_s < slow(before)
    later = burst(batcher, slow, start=4.0, count=2000, gap_s=0.001)
    after = batcher.allowed_size(6.0)
    assert after < before
    assert slow(after) <= GPU.service_budget_s
    assert len(later[0]) > after  # closed before the first slow report...
    assert all(slow(len(b)) <= GPU.service_budget_s for b in later[1:])  # ...and none past the SLO after it


def test_buckets_never_mix_and_close_on_their_own_clocks() -> None:
    batcher: MicroBatcher[tuple[str, int]] = MicroBatcher(
        BatchingConfig(fixed_batch=3, max_wait_s=0.02)
    )
    closed: list[Batch[tuple[str, int]]] = []
    for i in range(7):
        for cls in ("800", "2000"):
            closed += batcher.add((cls, i), cls, i * 0.001)
    closed += batcher.poll(0.006 + 0.02)
    assert [(b.shape_class, len(b), b.reason) for b in closed] == [
        ("800", 3, "full"), ("2000", 3, "full"), ("800", 3, "full"), ("2000", 3, "full"),
        ("800", 1, "deadline"), ("2000", 1, "deadline"),
    ]
    for batch in closed:
        assert {cls for cls, _ in batch.items} == {batch.shape_class}


def test_priority_orders_buckets_that_close_together() -> None:
    """Three buckets reach their deadline at the same tick: the most urgent leaves first, then by age."""
    batcher: MicroBatcher[str] = MicroBatcher(BatchingConfig(fixed_batch=8, max_wait_s=0.02))
    batcher.add("bulk", "800", 0.000, priority=0)
    batcher.add("urgent", "2000", 0.001, priority=9)
    batcher.add("normal", "400", 0.002, priority=0)
    closed = batcher.poll(1.0)
    assert [b.items for b in closed] == [("urgent",), ("bulk",), ("normal",)]
    assert [b.priority for b in closed] == [9, 0, 0]


def test_a_bucket_takes_its_most_urgent_items_priority() -> None:
    batcher: MicroBatcher[str] = MicroBatcher(BatchingConfig(fixed_batch=3, max_wait_s=0.02))
    batcher.add("a", "800", 0.0, priority=1)
    batcher.add("x", "2000", 0.0, priority=2)
    batcher.add("b", "800", 0.0, priority=5)  # lifts the 800 bucket above the 2000 one
    batcher.add("c", "800", 0.0, priority=-3)  # a lower one never lowers it; the bucket is full now...
    assert [b.priority for b in batcher.flush()] == [2]  # ...and left; the 2000 bucket remains
    batcher.add("d", "800", 1.0, priority=-1)
    batcher.add("e", "2000", 1.0, priority=-2)
    batcher.add("f", "400", 1.0, priority=7)
    assert [(b.items, b.priority) for b in batcher.flush()] == [(("f",), 7), (("d",), -1), (("e",), -2)]


def test_a_full_bucket_and_a_deadline_close_order_by_priority() -> None:
    batcher: MicroBatcher[int] = MicroBatcher(BatchingConfig(fixed_batch=2, max_wait_s=0.02))
    batcher.add(1, "low", 0.0, priority=0)
    closed = batcher.add(2, "high", 0.05, priority=3)  # "low" is past its deadline at this tick
    assert [b.items for b in closed] == [(1,)]
    closed = batcher.add(3, "high", 0.05, priority=3)
    assert [(b.items, b.reason) for b in closed] == [((2, 3), "full")]
    batcher.add(4, "low", 1.0)
    batcher.add(5, "high", 1.0, priority=1)
    closed = batcher.add(6, "low", 1.5)  # "low" fills at the tick "high" reaches its deadline
    assert [(b.items, b.reason) for b in closed] == [((5,), "deadline"), ((4, 6), "full")]


def test_the_memory_budget_caps_a_batch() -> None:
    batcher: MicroBatcher[int] = MicroBatcher(
        BatchingConfig(fixed_batch=8, memory_budget_bytes=1000)
    )
    closed = [b for i in range(5) for b in batcher.add(i, "800", 0.0, nbytes=300)]
    closed += batcher.add(5, "800", 0.0, nbytes=5000)  # alone over budget: a batch of its own
    assert [(b.items, b.nbytes) for b in closed] == [((0, 1, 2), 900), ((3, 4), 600), ((5,), 5000)]


def test_flush_returns_everything_and_bad_values_are_refused() -> None:
    batcher: MicroBatcher[int] = MicroBatcher(BatchingConfig(fixed_batch=4))
    for i in range(3):
        batcher.add(i, i % 2, 0.0)
    assert [(b.items, b.reason) for b in batcher.flush()] == [((0, 2), "flush"), ((1,), "flush")]
    assert batcher.flush() == []
    with pytest.raises(ValueError, match="batch_size=0"):
        batcher.record_service(0, 0.1)
    with pytest.raises(ValueError, match="seconds=nan"):
        batcher.record_service(1, float("nan"))
    with pytest.raises(ValueError, match="nbytes"):
        batcher.add(9, 0, 0.0, nbytes=-1)


# --- nothing dropped or duplicated, whatever the driver does ---------------------------------

_op = st.one_of(
    st.tuples(st.just("add"), st.sampled_from(["a", "b", "c"]), st.integers(0, 400)),
    st.tuples(st.just("wait"), st.floats(0, 0.2)),
    st.tuples(st.just("poll"), st.floats(0, 0.01)),
    st.tuples(st.just("service"), st.integers(1, 40), st.floats(0, 0.5)),
    st.tuples(st.just("flush")),
)


@settings(max_examples=200, deadline=None)
@given(
    ops=st.lists(st.tuples(_op, st.floats(0, 0.05)), max_size=120),
    fixed=st.sampled_from([None, 1, 5]),
    backwards=st.booleans(),
)
@example(  # once found: a zero and a subnormal service time made the model rescale by inf
    ops=[(("service", 1, 0.0), 0.0), (("service", 2, 1e-313), 0.0), (("service", 2, 0.5), 0.0),
         (("add", "a", 0), 0.0)],
    fixed=None,
    backwards=False,
)
def test_no_item_is_dropped_duplicated_or_late(
    ops: list[tuple[tuple[object, ...], float]], fixed: int | None, backwards: bool
) -> None:
    config = BatchingConfig(max_batch=8, fixed_batch=fixed, memory_budget_bytes=1000)
    batcher: MicroBatcher[int] = MicroBatcher(config)
    out: list[tuple[float, Batch[int]]] = []
    classes: dict[int, str] = {}
    now, added = 0.0, 0

    def advance(to: float) -> None:
        """Move the clock to ``to``, polling at every deadline on the way (a good driver)."""
        nonlocal now
        while (deadline := batcher.next_deadline()) is not None and deadline <= to:
            now = max(now, deadline)
            out.extend((now, b) for b in batcher.poll(now))
        now = max(now, to)

    for op, dt in ops:
        advance(now + dt)
        match op:
            case ("add", str(cls), int(nbytes)):
                classes[added] = cls
                t = now - 1.0 if backwards else now  # a stale clock reading must be harmless
                out.extend((now, b) for b in batcher.add(added, cls, t, nbytes=nbytes))
                added += 1
            case ("wait", float(seconds)):
                advance(now + seconds)
            case ("poll", float(seconds)):  # a poll between deadlines
                advance(now + seconds)
                out.extend((now, b) for b in batcher.poll(now))
            case ("service", int(size), float(seconds)):
                batcher.record_service(size, seconds)
            case ("flush",):
                out.extend((now, b) for b in batcher.flush())
        assert batcher.pending == added - sum(len(b) for _, b in out)
    out.extend((now, b) for b in batcher.flush())

    emitted = [item for _, batch in out for item in batch.items]
    assert sorted(emitted) == list(range(added))  # each item exactly once
    for closed_at, batch in out:
        assert 1 <= len(batch) <= config.max_batch
        assert list(batch.items) == sorted(batch.items)  # arrival order
        assert {classes[i] for i in batch.items} == {batch.shape_class}
        assert batch.nbytes <= config.memory_budget_bytes or len(batch) == 1
        if batch.reason is not CloseReason.FLUSH:  # polled at its deadline: never late
            assert closed_at - batch.opened_at <= config.max_wait_s + 1e-9 or backwards
    assert batcher.pending == 0 and batcher.next_deadline() is None


# --- simulation: an open-loop Poisson load on a server with t(b) = a + c*b ---------------


@dataclass
class Outcome:
    throughput: float  # items/s completed after warm-up
    latencies: list[float]  # seconds, arrival → completion, in arrival order
    sizes: list[int]

    def quantile(self, q: float) -> float:
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def simulate(
    config: BatchingConfig,
    service: Callable[[int], float],
    load: list[tuple[float, float]],
    measure_from_s: float = 0.0,
    seed: int = 7,
) -> Outcome:
    """Poisson arrivals at ``load`` = [(items/s, seconds), ...] phases on one device with
    double buffering: the driver pulls arrived items into the batcher only while no closed
    batch waits for the device (the backlog stays in the "broker"). Throughput counts the
    completions from ``measure_from_s`` to the end of the load."""
    rng = random.Random(seed)
    arrivals: list[float] = []
    t = start = 0.0
    for rate, seconds in load:
        start += seconds
        while (t := t + rng.expovariate(rate)) < start:
            arrivals.append(t)
        t = start
    batcher: MicroBatcher[int] = MicroBatcher(config)
    backlog: deque[int] = deque()
    staged: deque[Batch[int]] = deque()
    running: tuple[float, Batch[int], float] | None = None  # (ends at, batch, seconds)
    done_at = [0.0] * len(arrivals)
    sizes: list[int] = []
    nxt, now = 0, 0.0
    while True:
        if running and running[0] <= now:
            end, batch, seconds = running
            for item in batch.items:
                done_at[item] = end
            batcher.record_service(len(batch), seconds)
            running = None
        while nxt < len(arrivals) and arrivals[nxt] <= now:
            backlog.append(nxt)
            nxt += 1
        while not staged and backlog:
            staged.extend(batcher.add(backlog.popleft(), "800", now))
        if not staged:
            staged.extend(batcher.poll(now))
        if running is None and staged:
            batch = staged.popleft()
            sizes.append(len(batch))
            seconds = service(len(batch)) * rng.uniform(0.95, 1.05)
            running = (now + seconds, batch, seconds)
        events = [
            arrivals[nxt] if nxt < len(arrivals) else None,
            running[0] if running else None,
            batcher.next_deadline() if not staged else None,
        ]
        if all(e is None for e in events):
            break
        now = max(now, min(e for e in events if e is not None))
    finished = [d for d in done_at if measure_from_s <= d <= start]
    return Outcome(
        throughput=len(finished) / (start - measure_from_s),
        latencies=[d - a for d, a in zip(done_at, arrivals, strict=True)],
        sizes=sizes,
    )


SCENARIOS = {
    # GPU-like: batching pays (per-item time 22 ms at b=1, ~2.3 ms at b=64)
    "gpu": (GPU, linear(0.020, 0.002)),
    # CPU-like (u2netp on 2 cores): batching does not pay at all
    "cpu": (BatchingConfig.for_device("cpu"), linear(0.0, 0.316)),
}


@pytest.mark.parametrize("name", SCENARIOS)
def test_adaptive_throughput_at_saturation_matches_the_best_fixed_size(name: str) -> None:
    config, service = SCENARIOS[name]
    light = 0.25 / service(1)
    best_capacity = max(b / service(b) for b in range(1, config.max_batch + 1))
    quiet, busy = (10.0, 6.0) if name == "gpu" else (100.0, 200.0)
    load = [(light, quiet), (1.2 * best_capacity, busy)]  # a quiet spell, then overload
    measure_from = quiet + busy / 6
    fixed = {
        b: simulate(replace(config, fixed_batch=b), service, load, measure_from).throughput
        for b in {1, 4, 16, config.max_batch} if b <= config.max_batch
    }
    adaptive = simulate(config, service, load, measure_from)
    assert adaptive.throughput >= 0.9 * max(fixed.values()), (adaptive.throughput, fixed)


def test_a_backlog_doubles_batches_within_a_few_served_batches() -> None:
    service = linear(0.020, 0.002)
    load = [(0.25 / service(1), 10.0), (10 / service(1), 3.0)]  # quiet, then a flood
    sizes = simulate(GPU, service, load).sizes
    growth = next(i for i, size in enumerate(sizes) if size > 1)
    top = next(i for i in range(growth, len(sizes)) if sizes[i] >= 45)  # the knee of this curve is 47
    climb = sizes[growth:top + 1]
    assert climb[0] == 2 and climb == sorted(climb)  # a probe of 2, then only up...
    assert all(climb.count(size) <= 7 for size in climb)  # ...each size served a few times
    assert len(climb) <= 30


@pytest.mark.parametrize("name", SCENARIOS)
def test_adaptive_latency_at_light_load_is_batch_one_latency(name: str) -> None:
    config, service = SCENARIOS[name]
    load = [(0.25 / service(1), 120.0 if name == "gpu" else 1200.0)]  # 25 % of batch-1 capacity
    one = simulate(replace(config, fixed_batch=1), service, load)
    adaptive = simulate(config, service, load)
    assert adaptive.quantile(0.5) <= 1.1 * one.quantile(0.5)
    assert adaptive.quantile(0.99) <= 1.25 * one.quantile(0.99)
