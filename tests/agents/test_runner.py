"""The runner (agents/runner.py) with a fake processor, a fake sink and an injected clock.

These tests are about ordering, supervision and fail-stop; real Kafka is in test_kafka_e2e.py.
The sink holds every record's broker acknowledgement until the test releases it, so the tests
choose the order outputs are acknowledged in.
"""

from __future__ import annotations

import asyncio
import random
import threading
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
from faust.transport.consumer import Consumer
from hypothesis import given, settings
from hypothesis import strategies as st

from agents.batching import BatchingConfig, MicroBatcher
from agents.dependencies import Backoff, Dependencies
from agents.intake import log_ids
from agents.process import InRecord, OutRecord
from agents.runner import BatchRunner, RunnerConfig, RunnerFailed
from schemas.errors import LightboxError, StoreUnavailable

TOPIC = "in"


class FakeClock:
    """Seconds that move only when told to (``advance``), or by ``step`` on every read."""

    def __init__(self, step: float = 0.0) -> None:
        self.t, self.step = 1000.0, step

    def __call__(self) -> float:
        self.t += self.step
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


@dataclass
class Job:
    record: InRecord
    event: dict[str, Any]
    shape_class: int = 0
    nbytes: int = 1


@dataclass
class State:
    items: list[Job]

    def __len__(self) -> int:
        return len(self.items)


class FakeProcessor:
    """Values steer it: b"bad" -> a dead letter from prepare, b"boom" -> prepare raises,
    b"decode-raise"/b"device-raise" -> that lane raises for the whole batch, b"fatal" -> the
    output lane raises StoreUnavailable, b"hang" -> the device blocks until ``release``, b"store-down"
    -> the output lane waits for a store that is down, as ``blobio.store`` does, through ``waiter``."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.device_threads: set[str] = set()
        self.waiter: Dependencies | None = None

    def prepare(self, rec: InRecord) -> Job | OutRecord:
        if rec.value == b"boom":
            raise ValueError("embedded null byte")
        if rec.value == b"bad":
            return self.dead_letter(rec, LightboxError("unreadable", stage="deserialize"))
        return Job(rec, {"event_id": f"e{rec.partition}-{rec.offset}"})

    def decode(self, batch: Sequence[Job]) -> State:
        if any(j.record.value == b"decode-raise" for j in batch):
            raise RuntimeError("decoder exploded")
        return State(list(batch))

    def device(self, state: State) -> State:
        self.device_threads.add(threading.current_thread().name)
        if any(j.record.value == b"device-raise" for j in state.items):
            raise RuntimeError("device exploded")
        if any(j.record.value == b"hang" for j in state.items):
            self.release.wait(30)
        return state

    def output(self, state: State, *, max_record_bytes: int | None = None) -> list[OutRecord]:
        if any(j.record.value == b"fatal" for j in state.items):
            raise StoreUnavailable("store unwritable past its retry budget")
        if any(j.record.value == b"store-down" for j in state.items):
            assert self.waiter is not None
            while self.waiter.sleep(self.waiter.failed("output store", "timeout")):
                pass
            raise StoreUnavailable("output store: stopped while waiting for it")
        return [OutRecord("processed", j.record.key, b"out:" + (j.record.value or b""), [], j.record)
                for j in state.items]

    def dead_letter(self, rec: InRecord, exc: LightboxError, event: dict[str, Any] | None = None) -> OutRecord:
        return OutRecord("dead_letter", rec.key, b"dl:" + str(exc.code).encode() + b":" + (rec.value or b""),
                         [("h", b"v")], rec, error_code=str(exc.code))

    def close(self) -> None:
        self.release.set()


class Transient(Exception):
    pass


@dataclass
class FakeSink:
    """Each sent record waits for the test to acknowledge it (``ack``/``ack_all``), unless
    ``auto``; ``errors`` are returned (in order) for the next attempts instead of waiting."""

    auto: bool = False
    limits: dict[str, int | None] = field(default_factory=lambda: {"processed": None, "dead_letter": None})
    errors: list[BaseException] = field(default_factory=list)
    pending: list[tuple[OutRecord, asyncio.Future[None]]] = field(default_factory=list)
    acknowledged: list[OutRecord] = field(default_factory=list)
    sends: int = 0
    stopped: bool = False
    answers: bool | None = True  # what the readiness probe finds (None: it raises)
    start_errors: list[BaseException] = field(default_factory=list)  # raised by the next starts, in order
    starts: int = 0

    async def start(self) -> None:
        self.starts += 1
        if self.start_errors:
            raise self.start_errors.pop(0)

    async def send_batch(self, records: Sequence[OutRecord]) -> list[BaseException | None]:
        self.sends += 1
        if self.errors:
            err = self.errors.pop(0)
            return [err for _ in records]
        loop = asyncio.get_running_loop()
        futs = []
        for out in records:
            fut: asyncio.Future[None] = loop.create_future()
            if self.auto:
                fut.set_result(None)
                self.acknowledged.append(out)
            else:
                self.pending.append((out, fut))
            futs.append(fut)
        await asyncio.gather(*futs)
        return [None for _ in records]

    def ack(self, i: int) -> OutRecord:
        out, fut = self.pending.pop(i)
        self.acknowledged.append(out)
        fut.set_result(None)
        return out

    def ack_offset(self, partition: int, offset: int) -> OutRecord:
        return self.ack(next(i for i, (o, _) in enumerate(self.pending)
                             if (o.source.partition, o.source.offset) == (partition, offset)))

    def ack_all(self) -> None:
        while self.pending:
            self.ack(0)

    def retriable(self, exc: BaseException) -> bool:
        return isinstance(exc, Transient)

    async def reachable(self, timeout_s: float) -> bool:
        if self.answers is None:
            raise RuntimeError("the probe itself broke")
        return self.answers


    async def stop(self) -> None:
        self.stopped = True


def rec(partition: int, offset: int, value: bytes = b"ok") -> InRecord:
    return InRecord(TOPIC, partition, offset, value, key=b"k", headers=[("traceparent", b"00-x")])


class Harness:
    def __init__(self, *, sink: FakeSink | None = None, clock: FakeClock | None = None,
                 batching: BatchingConfig | None = None, **config: Any) -> None:
        self.processor = FakeProcessor()
        self.sink = sink or FakeSink()
        self.clock = clock or FakeClock(step=0.001)
        self.acked: list[InRecord] = []
        self.fatal: list[BaseException] = []
        self.on_ack: Callable[[InRecord], None] = lambda r: None
        batching = batching or BatchingConfig(slo_s=1.0, max_batch=4, max_wait_s=0.005, fixed_batch=3)
        cfg = {"max_in_flight": 64, "watchdog_interval_s": 0.01, "retry_backoff_s": 0.001, "probe_interval_s": 0.01,
               **config}
        deps = Dependencies(Backoff(0.001, 0.005), clock=self.clock)  # a dependency that is down: quick retries
        self.runner = BatchRunner(self.processor, self.sink, MicroBatcher(batching), ack=self._ack,
                                  config=RunnerConfig(**cfg), clock=self.clock, on_fatal=self.fatal.append,
                                  dependencies=deps)

    async def _ack(self, event: InRecord) -> None:
        self.on_ack(event)
        self.acked.append(event)

    async def submit(self, *records: InRecord) -> None:
        for r in records:
            await self.runner.submit(r, r)


async def until(cond: Callable[[], bool], what: str, tries: int = 2000) -> None:
    """Let the loop (and the lane threads) run until ``cond``; fails if it never holds."""
    for _ in range(tries):
        if cond():
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"never happened: {what}")


def run(coro: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(coro())


# ------------------------------------------------------------------------------------------ acks
def test_inputs_are_acknowledged_only_after_the_sink_acknowledged_their_outputs() -> None:
    async def go() -> None:
        h = Harness()
        await h.runner.start()
        await h.submit(rec(0, 0), rec(0, 1), rec(0, 2, b"bad"), rec(0, 3))
        await until(lambda: len(h.sink.pending) == 4, "four outputs sent")
        assert h.acked == []
        for offset in (3, 1, 2):  # acknowledge the others first: nothing may be acked while offset 0 is out
            h.sink.ack_offset(0, offset)
        await asyncio.sleep(0.05)
        assert h.acked == []
        h.sink.ack_all()
        await until(lambda: len(h.acked) == 4, "all acked")
        assert [r.offset for r in h.acked] == [0, 1, 2, 3]
        assert h.runner.in_flight == 0 and h.runner.committable() == {(TOPIC, 0): 4}
        await h.runner.stop()
        assert h.sink.stopped

    run(go)


@dataclass(eq=False)
class Message:
    topic: str
    tp: tuple[str, int]
    offset: int
    acked: bool = False


@dataclass
class FaustConsumerState:
    """The attributes faust-streaming 0.15.3's ``Consumer.ack`` and ``_new_offset`` use, so the
    test can run Faust's own commit arithmetic on the acks the runner makes."""

    committed: int | None

    def __post_init__(self) -> None:
        from collections import defaultdict

        from intervaltree import IntervalTree

        self._acked: dict[Any, list[int]] = defaultdict(list)
        self._acked_index: dict[Any, set[int]] = defaultdict(set)
        self._gap: dict[Any, IntervalTree] = defaultdict(IntervalTree)
        self._committed_offset: dict[Any, int | None] = defaultdict(lambda: self.committed)
        self._unacked_messages: set[Any] = set()
        self._n_acked = 0
        self._waiting_for_ack = None
        self.app = SimpleNamespace(topics=SimpleNamespace(acks_enabled_for=lambda topic: True))

    def ack(self, r: InRecord) -> None:
        Consumer.ack(self, Message(r.topic, (r.topic, r.partition), r.offset))  # type: ignore[arg-type]

    def commit(self, tp: Any) -> None:
        new = Consumer._new_offset(self, tp)  # type: ignore[arg-type]
        if new is not None and Consumer._should_commit(self, tp, new):  # type: ignore[arg-type]
            self._committed_offset[tp] = new


@st.composite
def scenario(draw: st.DrawFn) -> tuple[list[InRecord], int, bool]:
    """Inputs over 1-2 partitions (rising offsets with gaps, interleaved), a seed for the order
    the sink acknowledges outputs in, and whether the group is fresh (no committed offset)."""
    values = st.sampled_from([b"ok", b"ok", b"ok", b"bad", b"boom", b"decode-raise", b"device-raise"])
    parts: dict[int, list[InRecord]] = {}
    for part in range(draw(st.integers(1, 2))):
        offset = draw(st.integers(0, 3))
        for _ in range(draw(st.integers(1, 9))):
            parts.setdefault(part, []).append(rec(part, offset, draw(values)))
            offset += draw(st.integers(1, 2))
    interleave = draw(st.permutations([p for p, rs in parts.items() for _ in rs]))
    handed = [parts[p].pop(0) for p in interleave]
    return handed, draw(st.integers(0, 2**32 - 1)), draw(st.booleans())


@settings(max_examples=40, deadline=None)
@given(scenario())
def test_acked_offset_never_passes_the_lowest_unacknowledged_input(case: tuple[list[InRecord], int, bool]) -> None:
    """For any completion order of outputs (dead letters from prepare and from failed batches
    mixed in), every ack names an input whose partition has no lower unacknowledged input, acks
    come in offset order, and Faust's own commit arithmetic on those acks (fresh group or a group
    committed at 0) never passes the lowest unacknowledged input."""
    handed, seed, fresh = case
    order = random.Random(seed)

    async def go() -> None:
        h = Harness()
        faust_state = FaustConsumerState(committed=None if fresh else 0)
        broker_acked: set[tuple[int, int]] = set()

        def check(r: InRecord) -> None:
            lower = [x for x in handed if x.partition == r.partition and x.offset <= r.offset]
            assert all((x.partition, x.offset) in broker_acked for x in lower), "acked before a lower input's output"
            prev = [a.offset for a in h.acked if a.partition == r.partition]
            assert not prev or prev[-1] < r.offset, "acks out of offset order"
            faust_state.ack(r)
            tp = (r.topic, r.partition)
            faust_state.commit(tp)
            done = {(a.partition, a.offset) for a in h.acked} | {(r.partition, r.offset)}
            low = min((x.offset for x in handed if x.partition == r.partition and (x.partition, x.offset) not in done),
                      default=None)
            committed = faust_state._committed_offset[tp]
            if committed is not None and low is not None:
                assert committed <= low, f"faust would commit {committed} past unacknowledged offset {low}"

        h.on_ack = check
        await h.runner.start()
        submitter = asyncio.create_task(h.submit(*handed))
        while len(broker_acked) < len(handed):
            await until(lambda: bool(h.sink.pending), "an output to acknowledge")
            out = h.sink.ack(order.randrange(len(h.sink.pending)))
            broker_acked.add((out.source.partition, out.source.offset))
            await asyncio.sleep(0)
        await submitter
        await until(lambda: len(h.acked) == len(handed), "every input acked")
        assert sorted((r.partition, r.offset) for r in h.acked) == sorted((r.partition, r.offset) for r in handed)
        for part in {r.partition for r in handed}:
            end = max(r.offset for r in handed if r.partition == part) + 1
            assert h.runner.committable()[(TOPIC, part)] == end
        outputs = [(o.source.partition, o.source.offset, o.kind) for o in h.sink.acknowledged]
        assert len({(p, o) for p, o, _ in outputs}) == len(outputs) == len(handed)  # one output per input
        bad = {(r.partition, r.offset) for r in handed if r.value != b"ok"}
        assert all(kind == "dead_letter" for p, o, kind in outputs if (p, o) in bad)
        await h.runner.stop()
        assert not h.fatal

    run(go)


# ----------------------------------------------------------------------------------- supervision
def test_a_batch_level_exception_becomes_dead_letters_and_the_lanes_go_on(caplog: pytest.LogCaptureFixture) -> None:
    async def go() -> None:
        h = Harness(sink=FakeSink(auto=True),
                    batching=BatchingConfig(slo_s=1.0, max_batch=4, max_wait_s=0.005, fixed_batch=2))
        await h.runner.start()
        await h.submit(rec(0, 0), rec(0, 1, b"device-raise"), rec(0, 2, b"boom"), rec(0, 3), rec(0, 4))
        await until(lambda: len(h.acked) == 5, "all five acked")
        by_offset = {o.source.offset: o for o in h.sink.acknowledged}
        assert by_offset[0].kind == by_offset[1].kind == "dead_letter"  # batch-mates of the failing batch
        assert by_offset[0].error_code == "PROCESSING_FAILED"
        assert by_offset[2].kind == "dead_letter"  # prepare raised: its own dead letter, its slot freed
        assert by_offset[3].kind == by_offset[4].kind == "processed"  # the lanes went on
        assert h.runner.stats.batch_failures == 1 and not h.fatal and h.runner.in_flight == 0
        assert h.processor.device_threads == {"lightbox-device_0"}  # one device thread, only device work
        await h.runner.stop()

    run(go)
    failed = [r for r in caplog.records if "a batch of 2 failed" in r.getMessage()]
    assert len(failed) == 1 and failed[0].inputs == f"{TOPIC}:0:0,{TOPIC}:0:1"  # type: ignore[attr-defined]


def test_error_logs_name_the_inputs_and_the_traces_they_continue() -> None:
    trace = "4bf92f3577b34da6a3ce929d0e0e4736"
    traced = InRecord(TOPIC, 1, 7, b"ok", headers=[("traceparent", f"00-{trace}-00f067aa0ba902b7-01".encode())])
    assert log_ids([traced, rec(0, 3)]) == {"inputs": f"{TOPIC}:1:7,{TOPIC}:0:3", "trace_ids": trace}
    assert log_ids([rec(0, 3)]) == {"inputs": f"{TOPIC}:0:3"}  # a malformed traceparent names no trace


def test_a_fatal_error_fail_stops_without_acknowledging() -> None:
    async def go() -> None:
        h = Harness(sink=FakeSink(auto=True))
        await h.runner.start()
        await h.submit(rec(0, 0, b"bad"), rec(0, 1, b"fatal"), rec(0, 2, b"bad"))
        await until(lambda: h.runner.failed.is_set(), "fail-stop")
        assert len(h.fatal) == 1 and isinstance(h.fatal[0], StoreUnavailable)
        await asyncio.sleep(0.05)
        assert [r.offset for r in h.acked] in ([], [0])  # never offset 1 or anything past it
        with pytest.raises(RunnerFailed):
            await h.runner.submit(rec(0, 3), rec(0, 3))
        assert not await h.runner.drain(1.0)
        await h.runner.stop()

    run(go)


@pytest.mark.parametrize("retriable", [True, False])
def test_brokers_that_keep_failing_are_waited_for_and_a_refusal_fail_stops(retriable: bool) -> None:
    """Retriable send errors that go on: the brokers are a dependency that is down — intake paused,
    no fail-stop however long (the watchdog does not count the wait) — until a send is acknowledged.
    A refusal (fenced) fail-stops at once."""
    async def go() -> None:
        clock = FakeClock()
        sink = FakeSink(auto=True, errors=[Transient("leader moved") if retriable else RuntimeError("fenced")] * 10_000)
        h = Harness(sink=sink, clock=clock, delivery_timeout_s=60.0)
        await h.runner.start()
        await h.submit(rec(0, 0, b"bad"))
        if not retriable:
            await until(lambda: h.runner.failed.is_set(), "fail-stop")
            assert h.acked == [] and len(h.fatal) == 1 and "fenced" in str(h.fatal[0])
            await h.runner.stop()
            return
        deps = h.runner.dependencies
        await until(lambda: deps.waiting, "the brokers counted as down")
        assert "Kafka brokers unreachable (Transient)" in deps.describe()
        paused = asyncio.create_task(h.submit(rec(0, 1, b"bad")))
        clock.advance(600.0)  # ten times delivery_timeout_s: waiting is not a stuck send
        await asyncio.sleep(0.1)
        assert not h.runner.failed.is_set() and not paused.done() and h.acked == []
        sink.errors.clear()  # the brokers answer again
        await until(lambda: len(h.acked) == 2, "both acknowledged after the heal")
        assert paused.done() and not deps.waiting and deps.healed_at > 1000.0 and not h.fatal
        assert [r.offset for r in h.acked] == [0, 1]
        await h.runner.stop()

    run(go)


@pytest.mark.parametrize("retriable", [True, False])
def test_brokers_unreachable_at_start_are_waited_for_and_a_refusal_raises(retriable: bool) -> None:
    """The sink cannot reach the brokers when the runner starts (a backfill process started during a
    broker outage): start waits, the brokers counted as down, and the runner works once they
    answer. What waiting cannot fix (not retriable) raises from start at once."""
    async def go() -> None:
        err = Transient("unreachable") if retriable else RuntimeError("password refused")
        sink = FakeSink(auto=True, start_errors=[err] * 40)
        h = Harness(sink=sink)
        deps = h.runner.dependencies
        if not retriable:
            with pytest.raises(RuntimeError, match="password refused"):
                await h.runner.start()
            assert sink.starts == 1
            return
        starting = asyncio.create_task(h.runner.start())
        await until(lambda: deps.waiting, "the brokers counted as down at start")
        assert "Kafka brokers unreachable (start: Transient)" in deps.describe()
        await starting
        assert sink.starts == 41 and not deps.waiting and deps.outages_seen == 1
        await h.submit(rec(0, 0))
        await until(lambda: len(h.acked) == 1, "an input processed once the brokers answered")
        await h.runner.stop()

    run(go)


def test_brokers_that_stop_answering_the_probe_pause_intake_until_they_answer() -> None:
    """Nothing to send, and the brokers stop answering: they count as down all the same (``/readyz``
    follows), the next input waits; once they answer, it goes through."""
    async def go() -> None:
        sink = FakeSink(auto=True)
        h = Harness(sink=sink)
        await h.runner.start()
        await h.submit(rec(0, 0, b"bad"))
        await until(lambda: len(h.acked) == 1, "acked")
        sink.answers = False
        deps = h.runner.dependencies
        await until(lambda: deps.waiting, "the brokers counted as down")
        assert "no answer" in deps.describe()
        paused = asyncio.create_task(h.submit(rec(0, 1, b"bad")))
        await asyncio.sleep(0.05)
        assert not paused.done() and sink.sends == 1
        sink.answers = True
        await until(lambda: len(h.acked) == 2, "the next input after the heal")
        assert not deps.waiting and not h.fatal
        sink.answers = None  # a probe that raises says "not ready"; it never ends the worker
        await until(lambda: deps.waiting, "a broken probe counted as no answer")
        assert "probe failed: RuntimeError" in deps.describe() and not h.runner.failed.is_set()
        await h.runner.stop()

    run(go)


def test_a_stop_while_the_store_is_down_is_no_fail_stop() -> None:
    """SIGTERM while an output waits for a store that is down: the drain times out, the stop ends the
    wait, and no fail-stop is recorded (the worker exits 0; what waited is redone by the next owner)."""
    async def go() -> None:
        clock = FakeClock(step=0.001)
        h = Harness(clock=clock, stage_timeout_s=1.0)
        h.processor.waiter = h.runner.dependencies
        await h.runner.start()
        await h.submit(rec(0, 0, b"store-down"))
        await until(lambda: h.runner.dependencies.waiting, "the store counted as down")
        clock.advance(100.0)  # a hundred stage timeouts: waiting is not a stuck lane
        await asyncio.sleep(0.05)
        assert not h.runner.failed.is_set()
        assert not await h.runner.drain(0.1)
        await h.runner.stop()
        await asyncio.sleep(0.05)
        assert h.fatal == [] and h.runner.failure is None and h.acked == []

    run(go)


def test_a_retriable_produce_error_is_retried_and_then_acknowledged_once() -> None:
    async def go() -> None:
        sink = FakeSink(auto=True, errors=[Transient("not enough replicas")] * 2)
        h = Harness(sink=sink)
        await h.runner.start()
        await h.submit(rec(0, 0, b"bad"))
        await until(lambda: len(h.acked) == 1, "acked")
        assert sink.sends == 3 and h.runner.stats.send_retries == 2 and not h.fatal
        await h.runner.stop()

    run(go)


def test_the_watchdog_fail_stops_a_stuck_device() -> None:
    async def go() -> None:
        clock = FakeClock()
        h = Harness(clock=clock, stage_timeout_s=100.0,
                    batching=BatchingConfig(slo_s=1.0, max_batch=4, max_wait_s=0.0))
        await h.runner.start()
        try:
            await h.submit(rec(0, 0, b"hang"), rec(0, 1))
            await until(lambda: any(lane == "device" for lane, _, _ in h.runner._sup.busy.values()), "device busy")
            await asyncio.sleep(0.05)
            assert not h.runner.failed.is_set()
            clock.advance(101.0)
            await until(lambda: h.runner.failed.is_set(), "watchdog fail-stop")
            assert "device lane stuck" in str(h.fatal[0]) and h.acked == []
        finally:
            h.processor.release.set()
            await h.runner.stop()

    run(go)


# ------------------------------------------------------------------------ back-pressure, revoke
def test_in_flight_is_bounded_until_inputs_are_acknowledged() -> None:
    async def go() -> None:
        h = Harness(max_in_flight=4)
        await h.runner.start()
        await h.submit(*(rec(0, i, b"bad") for i in range(4)))
        await until(lambda: len(h.sink.pending) == 4, "four sent")
        fifth = asyncio.create_task(h.submit(rec(0, 4, b"bad")))
        for _ in range(20):
            await asyncio.sleep(0.005)
        assert not fifth.done() and h.runner.in_flight == 4
        h.sink.ack_all()  # four released: the fifth gets a slot
        await asyncio.wait_for(fifth, 10)
        await until(lambda: len(h.sink.pending) == 1, "the fifth sent")
        h.sink.ack_all()
        await until(lambda: len(h.acked) == 5, "all acked")
        await h.runner.stop()

    run(go)


def test_acknowledged_inputs_are_freed_without_waiting_for_a_garbage_collection() -> None:
    """An input's item and its acknowledgement ticket refer to each other; a released item must let
    go of its ticket, or every released input (its record and decoded event) waits for a full
    collection, which after a backlog comes only hundreds of inputs later."""
    import gc

    from agents.intake import Item
    from agents.watermark import Ticket

    def alive() -> int:
        return sum(isinstance(o, Item | Ticket) for o in gc.get_objects())

    async def go() -> None:
        h = Harness(sink=FakeSink(auto=True))
        await h.runner.start()
        await h.submit(*(rec(p, i, b"bad" if i % 5 == 0 else b"ok") for p in range(2) for i in range(20)))
        await until(lambda: len(h.acked) == 40, "all acked")
        # the loops' locals may still hold their last batch: at most a few batches of items
        assert h.runner.in_flight == 0 and alive() <= 12, f"{alive()} items and tickets still alive"
        await h.runner.stop()

    gc.collect()
    gc.disable()  # only reference counting frees what the runner let go of
    try:
        run(go)
    finally:
        gc.enable()


class SizedProcessor(FakeProcessor):
    """Every prepared job decodes to ``nbytes``; counts the jobs decoded and not yet through their
    output call, and the most there ever were at once (in bytes)."""

    def __init__(self, nbytes: int) -> None:
        super().__init__()
        self.nbytes, self.decoded, self.peak = nbytes, 0, 0
        self._lock = threading.Lock()

    def prepare(self, rec: InRecord) -> Job | OutRecord:
        job = super().prepare(rec)
        if isinstance(job, Job):
            job.nbytes = self.nbytes
        return job

    def decode(self, batch: Sequence[Job]) -> State:
        with self._lock:
            self.decoded += len(batch)
            self.peak = max(self.peak, self.decoded * self.nbytes)
        return super().decode(batch)

    def output(self, state: State, *, max_record_bytes: int | None = None) -> list[OutRecord]:
        try:
            return super().output(state, max_record_bytes=max_record_bytes)
        finally:
            with self._lock:
                self.decoded -= len(state.items)


def _sized(nbytes: int, budget: int) -> Harness:
    h = Harness(sink=FakeSink(auto=True), max_in_flight=64, max_in_flight_bytes=budget,
                batching=BatchingConfig(slo_s=1.0, max_batch=3, max_wait_s=0.005, fixed_batch=3))
    h.processor = SizedProcessor(nbytes)
    h.runner.processor = h.processor
    return h


def test_decoded_bytes_in_flight_stay_within_their_budget_while_a_backlog_waits() -> None:
    """A backlog (12 inputs held: the count allows 64) behind a batch stuck on the device: with a
    budget of three images' decoded bytes, nothing more is decoded until that batch's output is
    done (the lanes' queues alone would take two more batches); then the rest goes through,
    never more than the budget decoded at once."""
    async def go() -> None:
        h = _sized(nbytes=10, budget=30)
        proc = h.processor
        assert isinstance(proc, SizedProcessor)
        await h.runner.start()
        await h.submit(rec(0, 0, b"hang"), rec(0, 1), rec(0, 2), *(rec(0, i) for i in range(3, 12)))
        await until(lambda: proc.device_threads != set(), "the first batch on the device")
        for _ in range(40):
            await asyncio.sleep(0.005)
        assert proc.decoded == 3 and h.runner.decoded_bytes == 30 and h.runner.in_flight == 12
        proc.release.set()
        await until(lambda: len(h.acked) == 12, "all acknowledged")
        assert proc.peak <= 30 and h.runner.decoded_bytes == 0
        await h.runner.stop()

    run(go)


def test_an_image_larger_than_the_budget_still_goes_alone() -> None:
    async def go() -> None:
        h = _sized(nbytes=100, budget=30)
        proc = h.processor
        assert isinstance(proc, SizedProcessor)
        await h.runner.start()
        await h.submit(*(rec(0, i) for i in range(4)))
        await until(lambda: len(h.acked) == 4, "all acknowledged")
        assert proc.peak == 100 and h.runner.decoded_bytes == 0  # one at a time
        await h.runner.stop()

    run(go)


def test_work_of_a_revoked_partition_acknowledges_nothing() -> None:
    async def go() -> None:
        h = Harness(max_in_flight=3)
        await h.runner.start()
        for n, r in enumerate([rec(0, 0, b"bad"), rec(0, 1, b"bad"), rec(1, 0, b"bad")], 1):
            await h.submit(r)  # one at a time: each in a send of its own
            await until(lambda n=n: len(h.sink.pending) == n, f"{n} sent")  # type: ignore[misc]
        h.sink.ack_offset(0, 1)
        h.runner.revoke([(TOPIC, 0)])
        assert h.runner.in_flight == 1
        await asyncio.wait_for(h.submit(rec(0, 0, b"bad")), 10)  # the slot of the dropped offset 1 was freed
        await until(lambda: len(h.sink.pending) == 3, "the new generation's offset 0 sent")
        h.sink.ack_all()
        await until(lambda: len(h.acked) == 2, "acks of the current generation")
        await asyncio.sleep(0.05)
        assert sorted((r.partition, r.offset) for r in h.acked) == [(0, 0), (1, 0)]
        assert h.runner.in_flight == 0
        await h.runner.stop()

    run(go)


def test_drain_finishes_in_flight_work_and_acknowledges_it() -> None:
    async def go() -> None:
        h = Harness(sink=FakeSink(auto=True),
                    batching=BatchingConfig(slo_s=100.0, max_batch=8, max_wait_s=50.0, fixed_batch=8))
        await h.runner.start()
        await h.submit(rec(0, 0), rec(0, 1), rec(1, 0))  # a batch of 8 that would wait 50 s
        assert await h.runner.drain(10.0)
        assert sorted((r.partition, r.offset) for r in h.acked) == [(0, 0), (0, 1), (1, 0)]
        await h.runner.stop()

    run(go)


def test_an_output_over_the_topic_limit_becomes_a_dead_letter_never_attempted() -> None:
    async def go() -> None:
        sink = FakeSink(auto=True, limits={"processed": 300, "dead_letter": 800})
        h = Harness(sink=sink)
        await h.runner.start()
        await h.submit(rec(0, 0, b"x" * 400), rec(0, 1, b"x" * 600))
        await h.runner.drain(10.0)
        assert len(h.acked) == 2
        sent = {o.source.offset: o for o in sink.acknowledged}
        assert sent[0].kind == "dead_letter" and b"x" * 400 in sent[0].value  # the original kept
        assert sent[1].kind == "dead_letter" and b"x" * 600 not in sent[1].value  # left out: over 800
        await h.runner.stop()

    run(go)


class RecordingObserver:
    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def received(self, rec: InRecord) -> None:
        self.calls.append(("received", rec.offset))

    def batch_done(self, lane: str, size: int, seconds: float) -> None:
        self.calls.append(("batch_done", lane))

    def sending(self, out: OutRecord) -> OutRecord:
        self.calls.append(("sending", out.source.offset))
        return out

    def output_acked(self, out: OutRecord) -> None:
        self.calls.append(("output_acked", out.source.offset))

    def lane_progress(self, lane: str, queued: int) -> None:
        self.calls.append(("lane_progress", lane))

    def in_flight(self, n: int) -> None:
        self.calls.append(("in_flight", n))


def test_the_observer_hears_every_input_batch_and_acknowledged_output() -> None:
    async def go() -> None:
        h = Harness(sink=FakeSink(auto=True))
        obs = RecordingObserver()
        h.runner.observer = obs
        await h.runner.start()
        await h.submit(rec(0, 0), rec(0, 1, b"bad"), rec(0, 2))
        await h.runner.drain(10.0)
        names = [name for name, _ in obs.calls]
        assert sorted(v for n, v in obs.calls if n == "received") == [0, 1, 2]
        assert sorted(v for n, v in obs.calls if n == "output_acked") == [0, 1, 2]
        assert sorted(v for n, v in obs.calls if n == "sending") == [0, 1, 2]  # each before its ack
        assert names.index("sending") < names.index("output_acked")
        assert {v for n, v in obs.calls if n == "batch_done"} == {"prepare", "decode", "device", "output"}
        assert {v for n, v in obs.calls if n == "lane_progress"} == {"prepare", "decode", "device", "output"}
        assert names.index("received") < names.index("output_acked")
        assert [v for n, v in obs.calls if n == "in_flight"][-1] == 0
        await h.runner.stop()

    run(go)


# ------------------------------------------------------------------------ per-event costs
def test_a_full_in_flight_window_closes_the_batch_without_waiting_for_its_deadline() -> None:
    """Nothing can join a batch while every in-flight slot is taken: the runner closes it then,
    instead of holding the worker idle until the batch's deadline (here: never, the clock stands)."""
    async def go() -> None:
        h = Harness(sink=FakeSink(auto=True), clock=FakeClock(step=0.0), max_in_flight=3,
                    batching=BatchingConfig(slo_s=100.0, max_batch=8, max_wait_s=50.0, fixed_batch=8))
        await h.runner.start()
        await h.submit(rec(0, 0), rec(0, 1))
        await asyncio.sleep(0.1)
        assert h.acked == []  # two of three slots: the batch waits for batch-mates
        await h.submit(rec(0, 2))
        await until(lambda: len(h.acked) == 3, "the full window's batch went out")
        assert h.runner.stats.batches == 1 and h.runner.stats.batch_items == 3
        await h.runner.stop()

    run(go)


def test_inputs_handed_together_are_prepared_in_one_thread_call() -> None:
    async def go() -> None:
        h = Harness(sink=FakeSink(auto=True))
        calls: list[int] = []
        prepare_all = h.runner._prepare_all

        def counted(records: list[InRecord]) -> list[Any]:
            calls.append(len(records))
            return prepare_all(records)

        h.runner._prepare_all = counted  # type: ignore[method-assign]
        await h.runner.start()
        await h.submit(*(rec(0, i) for i in range(10)), rec(0, 10, b"bad"), rec(0, 11, b"boom"))
        await until(lambda: len(h.acked) == 12, "all acked")
        assert sum(calls) == 12 and len(calls) == 1, calls
        kinds = [o.kind for o in sorted(h.sink.acknowledged, key=lambda o: o.source.offset)]
        assert kinds == ["processed"] * 10 + ["dead_letter"] * 2  # a raising prepare is still one item's dead letter
        assert [r.offset for r in h.acked] == list(range(12))
        await h.runner.stop()

    run(go)


def test_two_device_threads_run_two_batches_on_the_device_at_once_and_acknowledge_in_order() -> None:
    """With ``device_threads=2`` (a model that runs calls side by side) the next decoded batch goes
    onto the device while the previous one is still there; delivery order is untouched."""
    async def go() -> None:
        h = Harness(sink=FakeSink(auto=True), device_threads=2,
                    batching=BatchingConfig(slo_s=1.0, max_batch=2, max_wait_s=0.005, fixed_batch=2))
        meet = threading.Barrier(2, timeout=10)  # breaks (the batches become dead letters) unless both meet
        device = h.processor.device

        def together(state: State) -> State:
            meet.wait()
            return device(state)

        h.processor.device = together  # type: ignore[method-assign]
        await h.runner.start()
        await h.submit(*(rec(p, i) for i in range(2) for p in (0, 1)))  # two batches of two
        await until(lambda: len(h.acked) == 4, "all acked")
        assert sorted(o.kind for o in h.sink.acknowledged) == ["processed"] * 4
        assert len(h.processor.device_threads) == 2 and h.runner.stats.batches == 2
        assert [(r.partition, r.offset) for r in sorted(h.acked, key=lambda r: (r.partition, r.offset))] == [
            (0, 0), (0, 1), (1, 0), (1, 1)]
        for p in (0, 1):  # each partition's inputs acknowledged in offset order
            assert [r.offset for r in h.acked if r.partition == p] == [0, 1]
        await h.runner.stop()

    run(go)


def test_the_worker_gives_its_device_lane_as_many_threads_as_the_model_runs_side_by_side() -> None:
    from agents.worker import _runner_parts
    from streams.settings import Settings

    class Pipeline:
        side_by_side = 2  # OpenVINO's two streams on a CPU

        def __init__(self) -> None:
            self.callers: list[int] = []

        def device_callers(self, n: int) -> None:
            self.callers.append(n)

    proc = SimpleNamespace(pipeline=Pipeline())
    auto, _ = _runner_parts(Settings(device="cpu"), "cpu", proc)  # type: ignore[arg-type]
    assert auto.device_threads == 2 and proc.pipeline.callers == [2]  # the model is told it has two callers
    one, _ = _runner_parts(Settings(device="cpu", device_threads=1), "cpu", proc)  # type: ignore[arg-type]
    assert one.device_threads == 1 and proc.pipeline.callers[-1] == 1
    assert auto.max_in_flight > one.max_in_flight  # room for the second device thread's batch


def test_the_decoded_bytes_bound_defaults_by_device_and_follows_its_setting() -> None:
    from agents.worker import _runner_parts
    from streams.settings import Settings

    class Pipeline:
        side_by_side = 1

        def device_callers(self, n: int) -> None:
            pass

    proc = SimpleNamespace(pipeline=Pipeline())
    cpu, _ = _runner_parts(Settings(device="cpu"), "cpu", proc)  # type: ignore[arg-type]
    gpu, _ = _runner_parts(Settings(device="gpu"), "gpu", proc)  # type: ignore[arg-type]
    assert (cpu.max_in_flight_bytes, gpu.max_in_flight_bytes) == (256 * 2**20, 4 * 2**30)
    set_, _ = _runner_parts(Settings(device="cpu", max_in_flight_bytes=5 << 20), "cpu", proc)  # type: ignore[arg-type]
    assert set_.max_in_flight_bytes == 5 << 20


def test_a_cpu_worker_holds_at_most_72_inputs_unless_told_otherwise() -> None:
    """The in-flight window is sized from the largest batch (every lane slot full, plus one filling
    batch): a CPU's largest batch of 8 gives 72, what a backlog drained after an outage may hold
    at once; a larger LIGHTBOX_MAX_BATCH or LIGHTBOX_MAX_IN_FLIGHT widens it."""
    from agents.worker import _runner_parts
    from streams.settings import Settings

    class Pipeline:
        side_by_side = 1

        def device_callers(self, n: int) -> None:
            pass

    proc = SimpleNamespace(pipeline=Pipeline())
    cpu, batcher = _runner_parts(Settings(device="cpu"), "cpu", proc)  # type: ignore[arg-type]
    assert cpu.max_in_flight <= 72
    assert batcher.live.config.max_batch == 8
    wide, _ = _runner_parts(Settings(device="cpu", max_batch=16), "cpu", proc)  # type: ignore[arg-type]
    told, _ = _runner_parts(Settings(device="cpu", max_in_flight=200), "cpu", proc)  # type: ignore[arg-type]
    assert wide.max_in_flight > 72 and told.max_in_flight == 200
