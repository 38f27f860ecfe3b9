"""Live first (agents.tiers): the backfill tier gets only spare capacity. Pure: no asyncio, no Kafka."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from agents.batching import Batch, BatchingConfig, MicroBatcher
from agents.tiers import BackfillGate, TierBatcher, pause_backfill
from tests.agents.test_runner import FakeClock  # seconds that move only when told to

Item = tuple[str, int, int]  # (lane, id, priority)


def tiers(live_batch: int = 2, backfill_batch: int = 2, **kw: Any) -> TierBatcher[Item]:
    cfg = BatchingConfig(max_wait_s=0.02)
    return TierBatcher(MicroBatcher(BatchingConfig(fixed_batch=live_batch, max_wait_s=cfg.max_wait_s)),
                       MicroBatcher(BatchingConfig(fixed_batch=backfill_batch, max_wait_s=cfg.max_wait_s)),
                       tier_of=lambda it: it[0], priority_of=lambda it: it[2], **kw)


def ids(batches: list[Batch[Item]]) -> list[tuple[int, ...]]:
    return [tuple(i for _, i, _ in b.items) for b in batches]


def test_backfill_flows_when_the_live_tier_is_idle_one_batch_at_a_time() -> None:
    lb = tiers()
    out = [b for i in range(6) for b in lb.add(("backfill", i, 0), "s", 0.0)]
    assert ids(out) == [(0, 1)]  # the first closed backfill batch goes; the next wait for it
    assert lb.backfill_held == 4 and lb.next_deadline() is None
    lb.device_done(out[0].items)
    assert lb.next_deadline() == float("-inf")  # a held batch may go now
    assert ids(lb.poll(0.0)) == [(2, 3)]


def test_a_live_batch_is_never_behind_more_than_one_backfill_batch() -> None:
    lb = tiers()
    first = [b for i in range(4) for b in lb.add(("backfill", i, 0), "s", 0.0)]
    assert ids(first) == [(0, 1)]
    live = lb.add(("live", 100, 0), "s", 0.001) + lb.add(("live", 101, 0), "s", 0.002)
    assert ids(live) == [(100, 101)]  # leaves at once: behind only the backfill batch already out
    lb.device_done(first[0].items)
    assert lb.poll(0.003) == []  # a live batch is before the output lane: no backfill yet
    assert lb.live_queued == 2
    lb.device_done(live[0].items)
    assert ids(lb.poll(0.004)) == [(2, 3)] and lb.live_queued == 0


def test_live_items_waiting_for_batch_mates_hold_the_backfill() -> None:
    lb = tiers()
    lb.add(("live", 1, 0), "s", 0.0)  # waits up to max_wait for a mate
    assert [b for i in range(2) for b in lb.add(("backfill", i, 0), "s", 0.0)] == []
    assert lb.live_queued == 1 and lb.backfill_held == 2
    [live] = lb.poll(0.02)  # its deadline: the live batch leaves, the backfill still waits
    assert ids([live]) == [(1,)]
    lb.device_done(live.items)
    assert ids(lb.poll(0.021)) == [(0, 1)]


def test_priority_orders_live_buckets_and_flush_puts_live_first() -> None:
    lb = tiers(live_batch=4)
    lb.add(("backfill", 0, 99), "s", 0.0)
    lb.add(("live", 1, 0), "a", 0.0)
    lb.add(("live", 2, 5), "b", 0.0)
    lb.add(("live", 3, 1), "c", 0.0)
    assert ids(lb.poll(1.0)) == [(2,), (3,), (1,)]  # the backfill bucket closed too, but waits
    assert ids(lb.flush()) == [(0,)]


def test_service_times_teach_both_lanes() -> None:
    lb = tiers()
    lb.record_service(2, 0.5)
    assert lb.live.predicted_service_s(2) == lb.backfill.predicted_service_s(2) > 0


def test_unknown_lane_is_refused() -> None:
    lb = tiers()
    with pytest.raises(ValueError, match="tier_of returned 'bulk'"):
        lb.add(("bulk", 1, 0), "s", 0.0)


def test_random_driving_never_puts_two_backfill_batches_before_output_nor_loses_items() -> None:
    """A device simulation: released batches wait for one device that takes live batches first
    (the runner's device queue); some fail in decode, before the device. At most one backfill
    batch ever waits, none is released while a live batch waits, so a live batch finds at most
    the one on the device ahead of it; filled batches seat live items first; every item comes
    out once."""
    rng = random.Random(3)
    for _ in range(50):
        live_batch, fill_to = rng.choice([1, 2, 3]), rng.choice([0, 0, 2, 4])
        lb = tiers(live_batch=live_batch, backfill_batch=rng.choice([1, 2, 4]), fill_to=fill_to)
        waiting: list[Batch[Item]] = []
        on_device: Batch[Item] | None = None
        seen: list[int] = []
        now, n = 0.0, 0
        for _step in range(300):
            now += rng.uniform(0, 0.01)
            r = rng.random()
            out: list[Batch[Item]] = []
            if r < 0.3:
                out = lb.add(("live", n, rng.randrange(3)), rng.choice("ab"), now)
                n += 1
            elif r < 0.55:
                out = lb.add(("backfill", n, 0), "s", now)
                n += 1
            elif r < 0.7 and on_device is None and waiting:
                on_device = next((b for b in waiting if b.items[0][0] == "live"), waiting[0])
                waiting.remove(on_device)
                lb.device_started(on_device.items)
                out = lb.poll(now)
            elif r < 0.75 and waiting:  # a decode failure: out before the device
                failed = waiting.pop(rng.randrange(len(waiting)))
                seen.extend(i for _, i, _ in failed.items)
                lb.device_done(failed.items)
                out = lb.poll(now)
            elif r < 0.9 and on_device is not None:
                seen.extend(i for _, i, _ in on_device.items)
                lb.device_done(on_device.items)
                on_device = None
                out = lb.poll(now)
            else:
                out = lb.poll(now)
            live_waiting = any(b.items[0][0] == "live" for b in waiting)
            for batch in out:
                if batch.items[0][0] == "live":
                    riders = [it for it in batch.items if it[0] == "backfill"]
                    assert len(batch) <= max(live_batch, fill_to) and (not riders or len(batch) <= fill_to)
                    assert all(it[0] == "live" for it in batch.items[:len(batch) - len(riders)])  # live seats first
                else:
                    assert not live_waiting
                waiting.append(batch)
            assert sum(1 for b in waiting if b.items[0][0] == "backfill") <= 1
        rest = waiting + ([on_device] if on_device else []) + lb.flush()
        for batch in rest:
            seen.extend(i for _, i, _ in batch.items)
        assert sorted(seen) == list(range(n))


@pytest.mark.parametrize("queued,lag,threshold,paused", [
    (0, 0, 0, False), (1, 0, 0, True), (0, 1, 0, True), (0, 5, 10, False), (0, 11, 10, True)])
def test_pause_rule(queued: int, lag: int, threshold: int, paused: bool) -> None:
    assert pause_backfill(queued, lag, threshold) is paused


def test_the_runner_puts_a_live_input_right_behind_the_backfill_batch_on_the_device() -> None:
    """The runner driving a TierBatcher: backfill 0 is on the device, backfill 1 decoded and waiting
    for it, 2-3 held; a live input arriving then goes next, before backfill 1, and the backfill
    resumes after it."""
    import asyncio

    from agents.process import InRecord
    from agents.runner import BatchRunner, RunnerConfig
    from tests.agents.test_runner import FakeClock, FakeProcessor, FakeSink, until

    class Recording(FakeProcessor):
        def __init__(self) -> None:
            super().__init__()
            self.order: list[tuple[str, int]] = []

        def device(self, state: Any) -> Any:
            self.order.extend((j.record.topic, j.record.offset) for j in state.items)
            return super().device(state)

    async def go() -> list[tuple[str, int]]:
        one = BatchingConfig(slo_s=1.0, max_batch=4, max_wait_s=0.005, fixed_batch=1)
        lb: TierBatcher[Any] = TierBatcher(MicroBatcher(one), MicroBatcher(one), tier_of=lambda p: p[0].tier)
        proc, acked = Recording(), []

        async def ack(ev: InRecord) -> None:
            acked.append(ev)

        runner = BatchRunner(proc, FakeSink(auto=True), lb, ack=ack, clock=FakeClock(step=0.001),
                             config=RunnerConfig(watchdog_interval_s=0.01, backfill_in_flight=8))
        await runner.start()
        try:
            for i in range(4):
                r = InRecord("bf", 0, i, b"hang" if i == 0 else b"ok")
                await runner.submit(r, r, tier="backfill")
            await until(lambda: proc.order == [("bf", 0)] and lb.backfill_held == 2
                        and runner._device_q.qsize() == 1,
                        "backfill 0 on the device, backfill 1 waiting for it")
            live = InRecord("in", 0, 0, b"ok")
            await runner.submit(live, live)
            await until(lambda: runner._device_q.qsize() == 2, "the live batch waiting for the device too")
            assert runner.free_slots("backfill") == 4 and runner.free_slots() == 63
            proc.release.set()
            await until(lambda: len(acked) == 5, "everything acknowledged")
        finally:
            await runner.stop()
        return proc.order

    assert asyncio.run(go()) == [("bf", 0), ("in", 0), ("bf", 1), ("bf", 2), ("bf", 3)]


def test_gate_fills_the_window_only_after_live_work_has_been_quiet_for_idle_s() -> None:
    clock = FakeClock()
    gate = BackfillGate(idle_s=0.5, busy_cap=2, clock=clock)  # binary-exact times
    assert gate.room(False, held=0, limit=16) == 16  # no live work ever seen: the whole window
    assert gate.room(False, held=10, limit=16) == 6
    assert gate.room(True, held=0, limit=16) == 2  # live work about: at most busy_cap held
    assert gate.room(True, held=1, limit=16) == 1
    assert gate.room(True, held=5, limit=16) == 0  # more than busy_cap already in: none taken (none dropped)
    clock.t += 0.25
    assert gate.room(False, held=1, limit=16) == 1  # quiet, but not long enough yet
    clock.t += 0.25
    assert gate.room(False, held=1, limit=16) == 15  # quiet for idle_s: the window again
    assert gate.room(True, held=1, limit=16) == 1  # live again: back to busy_cap at once


def test_gate_with_no_busy_cap_and_no_idle_time_is_the_plain_pause_rule() -> None:
    clock = FakeClock()
    gate = BackfillGate(idle_s=0.0, busy_cap=0, clock=clock)
    assert gate.room(True, held=0, limit=16) == 0
    assert gate.room(False, held=3, limit=16) == 13  # same instant, live gone: no wait
    assert gate.room(False, held=16, limit=16) == 0
    assert BackfillGate(idle_s=1.0, busy_cap=8, clock=clock).room(True, held=0, limit=4) == 4  # never past limit


def test_gate_refuses_negative_settings() -> None:
    with pytest.raises(ValueError, match="idle_s"):
        BackfillGate(idle_s=-1.0, busy_cap=0, clock=FakeClock())
    with pytest.raises(ValueError, match="busy_cap"):
        BackfillGate(idle_s=0.0, busy_cap=-1, clock=FakeClock())


@pytest.mark.skipif(not hasattr(os, "setpriority"), reason="no per-thread niceness here")
def test_lower_thread_priority_lowers_only_the_calling_thread() -> None:
    import threading

    from agents.intake import lower_thread_priority

    seen: dict[str, int] = {}

    def body() -> None:
        tid = threading.get_native_id()
        seen["before"] = os.getpriority(os.PRIO_PROCESS, tid)
        lower_thread_priority(3)
        seen["after"] = os.getpriority(os.PRIO_PROCESS, tid)

    here = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    t = threading.Thread(target=body)
    t.start()
    t.join()
    assert seen["after"] == min(19, seen["before"] + 3)
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == here


def test_backfill_prepare_and_output_run_in_their_own_threads_and_never_hold_up_live() -> None:
    """With ``backfill_threads``, a backfill output that is stuck (a slow encode, a slow store) does
    not hold up a live input behind it, even with one live output thread; and backfill prepare and
    output calls run in the backfill tier's own threads. (With shared threads the live input would
    wait for the stuck output: one output thread.)"""
    import asyncio
    import threading

    from agents.process import InRecord
    from agents.runner import BatchRunner, RunnerConfig
    from tests.agents.test_runner import FakeClock, FakeProcessor, FakeSink, until

    class Recording(FakeProcessor):
        def __init__(self) -> None:
            super().__init__()
            self.threads: dict[tuple[str, str], set[str]] = {}
            self.out_started: list[str] = []

        def _note(self, call: str, topic: str) -> None:
            self.threads.setdefault((call, topic), set()).add(threading.current_thread().name.rsplit("_", 1)[0])

        def prepare(self, rec: InRecord) -> Any:
            self._note("prepare", rec.topic)
            return super().prepare(rec)

        def output(self, state: Any, *, max_record_bytes: int | None = None) -> Any:
            topic = state.items[0].record.topic
            self._note("output", topic)
            self.out_started.append(topic)
            if topic == "bf":
                self.release.wait(30)
            return super().output(state, max_record_bytes=max_record_bytes)

    async def go() -> tuple[Recording, list[str]]:
        one = BatchingConfig(slo_s=1.0, max_batch=4, max_wait_s=0.005, fixed_batch=1)
        lb: TierBatcher[Any] = TierBatcher(MicroBatcher(one), MicroBatcher(one), tier_of=lambda p: p[0].tier)
        proc, acked = Recording(), []

        async def ack(ev: InRecord) -> None:
            acked.append(ev.topic)

        runner = BatchRunner(proc, FakeSink(auto=True), lb, ack=ack, clock=FakeClock(step=0.001),
                             config=RunnerConfig(watchdog_interval_s=0.01, backfill_in_flight=4, output_threads=1,
                                                 backfill_threads=1, backfill_nice=1))
        await runner.start()
        try:
            bf = InRecord("bf", 0, 0, b"ok")
            await runner.submit(bf, bf, tier="backfill")
            await until(lambda: proc.out_started == ["bf"], "the backfill output stuck")
            live = InRecord("in", 0, 0, b"ok")
            await runner.submit(live, live)
            await until(lambda: acked == ["in"], "the live input acknowledged past the stuck backfill output")
            proc.release.set()
            await until(lambda: sorted(acked) == ["bf", "in"], "everything acknowledged")
        finally:
            await runner.stop()
        return proc, acked

    proc, _ = asyncio.run(go())
    assert proc.threads == {("prepare", "bf"): {"lightbox-backfill-prepare"}, ("prepare", "in"): {"lightbox-prepare"},
                            ("output", "bf"): {"lightbox-backfill-output"}, ("output", "in"): {"lightbox-output"}}


def test_backfill_share_leaves_a_gap_after_each_backfill_batch_that_live_batches_use() -> None:
    """share 0.5: a backfill batch that took 0.25 s is followed by 0.25 s in which no backfill batch
    starts; a live batch arriving then goes at once; a failed batch (no service time) leaves no gap."""
    clock = FakeClock()
    one = BatchingConfig(fixed_batch=1, max_wait_s=0.02)
    lb: TierBatcher[Item] = TierBatcher(MicroBatcher(one), MicroBatcher(one), tier_of=lambda it: it[0],
                                        backfill_share=0.5, clock=clock)
    first = lb.add(("backfill", 0, 0), "s", clock.t)
    assert ids(first) == [(0,)]
    assert lb.add(("backfill", 1, 0), "s", clock.t) == [] and lb.add(("backfill", 2, 0), "s", clock.t) == []
    clock.t += 0.25
    lb.record_service(1, 0.25)
    lb.device_done(first[0].items)
    assert lb.poll(clock.t) == [] and lb.next_deadline() == clock.t + 0.25  # the gap
    clock.t += 0.125
    live = lb.add(("live", 9, 0), "s", clock.t)
    assert ids(live) == [(9,)]  # the device is free for it
    lb.device_done(live[0].items)
    assert lb.poll(clock.t) == []  # still in the gap
    clock.t += 0.125
    second = lb.poll(clock.t)
    assert ids(second) == [(1,)]
    lb.device_done(second[0].items)  # failed before the device: no service time, no gap
    assert ids(lb.poll(clock.t)) == [(2,)]


def test_backfill_share_must_be_a_share() -> None:
    for share in (0.0, -0.5, 1.5):
        with pytest.raises(ValueError, match="backfill_share"):
            TierBatcher(MicroBatcher(BatchingConfig()), MicroBatcher(BatchingConfig()), tier_of=lambda it: "live",
                        backfill_share=share)


def test_a_live_batch_alone_before_the_device_takes_held_backfill_into_its_empty_seats() -> None:
    """fill_to 3: a live batch of 1 that closes with nothing else live about leaves with two held
    backfill items of its shape class (oldest first); they count as backfill, not live, work."""
    lb = tiers(live_batch=1, backfill_batch=1, fill_to=3)
    first = [b for i in range(4) for b in lb.add(("backfill", i, 0), "s", 0.0)]
    lb.add(("backfill", 9, 0), "other", 0.0)  # another shape class: never mixed in
    assert ids(first) == [(0,)] and lb.backfill_held == 4
    [live] = lb.add(("live", 100, 0), "s", 0.001)
    assert ids([live]) == [(100, 1, 2)] and live.shape_class == "s"
    assert lb.filled == 2 and lb.backfill_held == 2 and lb.live_queued == 1
    lb.device_done(first[0].items)
    assert lb.poll(0.002) == []  # the live batch (with its riders) is before the output lane
    lb.device_done(live.items)
    assert lb.live_queued == 0
    assert ids(lb.poll(0.003)) == [(3,)]


def test_no_filling_while_other_live_work_waits_nor_past_the_memory_budget() -> None:
    lb = tiers(live_batch=1, backfill_batch=1, fill_to=2)
    first = [b for i in range(3) for b in lb.add(("backfill", i, 0), "s", 0.0)]
    [live1] = lb.add(("live", 100, 0), "s", 0.001)
    assert ids([live1]) == [(100, 1)]  # filled: nothing else live about
    [live2] = lb.add(("live", 101, 0), "s", 0.002)
    assert ids([live2]) == [(101,)]  # live1 is still before the device: its seat is not spare
    assert lb.filled == 1 and lb.backfill_held == 1
    lb.device_done(first[0].items)
    lb.device_done(live1.items)
    lb.device_done(live2.items)
    budget = TierBatcher(MicroBatcher(BatchingConfig(fixed_batch=1)), MicroBatcher(BatchingConfig(fixed_batch=1)),
                         tier_of=lambda it: it[0], fill_to=4, nbytes_of=lambda it: it[1], memory_budget_bytes=100)
    head = budget.add(("backfill", 10, 0), "s", 0.0)  # on the device: the next ones are held
    for size in (70, 20, 5):
        budget.add(("backfill", size, 0), "s", 0.0)
    [live] = budget.add(("live", 50, 0), "s", 0.001, nbytes=50)
    assert [i for _, i, _ in live.items] == [50, 20, 5] and live.nbytes == 75  # 70 would not fit
    assert budget.backfill_held == 1
    budget.device_done(head[0].items)


def test_fill_to_must_not_be_negative() -> None:
    with pytest.raises(ValueError, match="fill_to"):
        tiers(fill_to=-1)


def test_without_wait_for_live_a_backfill_batch_waits_only_for_the_previous_one() -> None:
    lb = tiers(live_batch=2, backfill_batch=1, wait_for_live=False)
    lb.add(("live", 100, 0), "s", 0.0)  # waits for a batch mate
    first = [b for i in range(2) for b in lb.add(("backfill", i, 0), "s", 0.0)]
    assert ids(first) == [(0,)]  # goes although a live item waits: it waits for at most this one batch
    assert lb.add(("live", 101, 0), "s", 0.001) and lb.poll(0.002) == []  # backfill 0 not through yet
    lb.device_done(first[0].items)
    assert ids(lb.poll(0.003)) == [(1,)]  # the live batch is still before the device: one batch ahead


def test_the_runner_carries_backfill_riders_in_a_live_batch_and_acknowledges_every_input() -> None:
    """fill_to 3: backfill 0 is on the device, 1 waits for it, 2-3 are held; a live input arriving
    leaves with 2 and 3 in its empty seats and goes before 1, its output runs in the live output
    threads, and every input of both lanes is acknowledged once with every slot given back."""
    import asyncio
    import threading

    from agents.process import InRecord
    from agents.runner import BatchRunner, RunnerConfig
    from tests.agents.test_runner import FakeClock, FakeProcessor, FakeSink, until

    class Recording(FakeProcessor):
        def __init__(self) -> None:
            super().__init__()
            self.batches: list[tuple[tuple[str, int], ...]] = []
            self.output_threads: dict[tuple[tuple[str, int], ...], str] = {}

        def device(self, state: Any) -> Any:
            self.batches.append(tuple((j.record.topic, j.record.offset) for j in state.items))
            return super().device(state)

        def output(self, state: Any, *, max_record_bytes: int | None = None) -> Any:
            key = tuple((j.record.topic, j.record.offset) for j in state.items)
            self.output_threads[key] = threading.current_thread().name.rsplit("_", 1)[0]
            return super().output(state, max_record_bytes=max_record_bytes)

    async def go() -> tuple[Recording, list[tuple[str, int]], BatchRunner]:
        one = BatchingConfig(slo_s=1.0, max_batch=4, max_wait_s=0.005, fixed_batch=1)
        lb: TierBatcher[Any] = TierBatcher(MicroBatcher(one), MicroBatcher(one), tier_of=lambda p: p[0].tier,
                                           fill_to=3)
        proc, acked = Recording(), []

        async def ack(ev: InRecord) -> None:
            acked.append((ev.topic, ev.offset))

        runner = BatchRunner(proc, FakeSink(auto=True), lb, ack=ack, clock=FakeClock(step=0.001),
                             config=RunnerConfig(watchdog_interval_s=0.01, backfill_in_flight=8, backfill_threads=1))
        await runner.start()
        try:
            for i in range(4):
                r = InRecord("bf", 0, i, b"hang" if i == 0 else b"ok")
                await runner.submit(r, r, tier="backfill")
            await until(lambda: proc.batches == [(("bf", 0),)] and lb.backfill_held == 2
                        and runner._device_q.qsize() == 1,
                        "backfill 0 on the device, backfill 1 waiting for it")
            live = InRecord("in", 0, 0, b"ok")
            await runner.submit(live, live)
            await until(lambda: lb.filled == 2, "the live batch filled")
            proc.release.set()
            await until(lambda: len(acked) == 5, "everything acknowledged")
            assert runner.free_slots("backfill") == 8 and runner.free_slots() == 64
            assert lb.live_queued == 0 and lb.pending == 0
        finally:
            await runner.stop()
        return proc, acked, runner

    proc, acked, runner = asyncio.run(go())
    assert proc.batches == [(("bf", 0),), (("in", 0), ("bf", 2), ("bf", 3)), (("bf", 1),)]
    assert proc.output_threads[(("in", 0), ("bf", 2), ("bf", 3))] == "lightbox-output"
    assert sorted(acked) == [("bf", 0), ("bf", 1), ("bf", 2), ("bf", 3), ("in", 0)]
    assert runner.stats.processed == 5


@pytest.mark.skipif(not hasattr(os, "fork"), reason="POSIX: the child inherits the descriptor")
def test_the_live_signal_reaches_the_backfill_process_as_the_worker_writes_it() -> None:
    """The worker's live work crosses to its backfill process through the shared memory: a child
    started the way ``spawn`` starts one (the descriptor passed, its number in the environment)
    reads each value the parent writes after it started."""
    from agents.backfill_process import LIVE_FD_ENV, LiveSignal

    live = LiveSignal.create()
    assert live.read() == (0, 0)
    script = (
        "import os, sys, time\n"
        "from agents.backfill_process import LIVE_FD_ENV, LiveSignal\n"
        "signal = LiveSignal(int(os.environ[LIVE_FD_ENV]))\n"
        "print('ready', signal.read(), flush=True)\n"
        "for want in [(3, 0), (0, 41), (0, 0)]:\n"
        "    deadline = time.monotonic() + 30\n"
        "    while signal.read() != want and time.monotonic() < deadline:\n"
        "        time.sleep(0.005)\n"
        "    print('saw', signal.read(), flush=True)\n"
        "    sys.stdin.readline()\n"
    )
    env = {**os.environ, LIVE_FD_ENV: str(live.fd), "PYTHONPATH": str(Path(__file__).parents[2])}
    child = subprocess.Popen([sys.executable, "-c", script], env=env, pass_fds=(live.fd,), text=True,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert child.stdin is not None and child.stdout is not None
    try:
        assert child.stdout.readline().split() == ["ready", "(0,", "0)"]
        for queued, lag in [(3, 0), (0, 41), (0, 0)]:
            live.write(queued, lag)
            assert child.stdout.readline().strip() == f"saw ({queued}, {lag})"
            child.stdin.write("\n")
            child.stdin.flush()
        assert child.wait(30) == 0
    finally:
        child.kill()
        live.close()


def test_the_backfill_process_is_the_cpu_default_on_linux_and_its_metrics_sit_on_the_next_port(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``LIGHTBOX_BACKFILL_PROCESS=auto`` (the default): a process of its own on a CPU worker on
    Linux, never on a GPU worker; true/false force it. Its metrics: the worker's port + 1, off with
    the worker's, or its own setting."""
    from streams.settings import Settings

    linux = sys.platform.startswith("linux")
    monkeypatch.delenv("LIGHTBOX_BACKFILL_PROCESS", raising=False)
    s = Settings(metrics_port=9464)
    assert s.backfill.process == "auto"
    assert (s.resolved_backfill_process("cpu"), s.resolved_backfill_process("gpu")) == (linux, False)
    for forced, want in (("true", True), ("false", False)):
        monkeypatch.setenv("LIGHTBOX_BACKFILL_PROCESS", forced)
        assert {Settings().resolved_backfill_process(d) for d in ("cpu", "gpu")} == {want}
    monkeypatch.setenv("LIGHTBOX_BACKFILL_PROCESS", "sometimes")
    with pytest.raises(ValueError, match="backfill_process"):
        Settings()
    monkeypatch.delenv("LIGHTBOX_BACKFILL_PROCESS")
    assert s.resolved_backfill_metrics_port() == 9465
    assert Settings(metrics_port=0).resolved_backfill_metrics_port() == 0
    assert Settings(metrics_port=9464, backfill_metrics_port=9500).resolved_backfill_metrics_port() == 9500
    assert Settings(metrics_port=9464, backfill_metrics_port=0).resolved_backfill_metrics_port() == 0


def test_the_worker_runs_the_pipelined_release_rules_whatever_the_environment(monkeypatch: pytest.MonkeyPatch,
                                                                              tmp_path: Path) -> None:
    """The release rules are no settings: the environment cannot turn them off."""
    from agents.wiring import batching_config, tier_batcher
    from streams.settings import Settings

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LIGHTBOX_BACKFILL_PIPELINED", "false")  # no such setting: ignored
    monkeypatch.setenv("LIGHTBOX_BACKFILL_WAIT_FOR_LIVE", "false")
    s = Settings(device="cpu")
    batcher = tier_batcher(s, batching_config(s, "cpu"))
    assert (batcher.pipelined, batcher.wait_for_live) == (True, True)
