"""Live first (agents.lanes): the backfill lane gets only spare capacity. Pure: no asyncio, no Kafka."""

from __future__ import annotations

import random
from typing import Any

import pytest

from agents.batching import Batch, BatchingConfig, MicroBatcher
from agents.lanes import LaneBatcher, pause_backfill

Item = tuple[str, int, int]  # (lane, id, priority)


def lanes(live_batch: int = 2, backfill_batch: int = 2) -> LaneBatcher[Item]:
    cfg = BatchingConfig(max_wait_s=0.02)
    return LaneBatcher(MicroBatcher(BatchingConfig(fixed_batch=live_batch, max_wait_s=cfg.max_wait_s)),
                       MicroBatcher(BatchingConfig(fixed_batch=backfill_batch, max_wait_s=cfg.max_wait_s)),
                       lane_of=lambda it: it[0], priority_of=lambda it: it[2])


def ids(batches: list[Batch[Item]]) -> list[tuple[int, ...]]:
    return [tuple(i for _, i, _ in b.items) for b in batches]


def test_backfill_flows_when_the_live_lane_is_idle_one_batch_at_a_time() -> None:
    lb = lanes()
    out = [b for i in range(6) for b in lb.add(("backfill", i, 0), "s", 0.0)]
    assert ids(out) == [(0, 1)]  # the first closed backfill batch goes; the next wait for it
    assert lb.backfill_held == 4 and lb.next_deadline() is None
    lb.device_done(out[0].items)
    assert lb.next_deadline() == float("-inf")  # a held batch may go now
    assert ids(lb.poll(0.0)) == [(2, 3)]


def test_a_live_batch_is_never_behind_more_than_one_backfill_batch() -> None:
    lb = lanes()
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
    lb = lanes()
    lb.add(("live", 1, 0), "s", 0.0)  # waits up to max_wait for a mate
    assert [b for i in range(2) for b in lb.add(("backfill", i, 0), "s", 0.0)] == []
    assert lb.live_queued == 1 and lb.backfill_held == 2
    [live] = lb.poll(0.02)  # its deadline: the live batch leaves, the backfill still waits
    assert ids([live]) == [(1,)]
    lb.device_done(live.items)
    assert ids(lb.poll(0.021)) == [(0, 1)]


def test_priority_orders_live_buckets_and_flush_puts_live_first() -> None:
    lb = lanes(live_batch=4)
    lb.add(("backfill", 0, 99), "s", 0.0)
    lb.add(("live", 1, 0), "a", 0.0)
    lb.add(("live", 2, 5), "b", 0.0)
    lb.add(("live", 3, 1), "c", 0.0)
    assert ids(lb.poll(1.0)) == [(2,), (3,), (1,)]  # the backfill bucket closed too, but waits
    assert ids(lb.flush()) == [(0,)]


def test_service_times_teach_both_lanes() -> None:
    lb = lanes()
    lb.record_service(2, 0.5)
    assert lb.live.predicted_service_s(2) == lb.backfill.predicted_service_s(2) > 0


def test_unknown_lane_is_refused() -> None:
    lb = lanes()
    with pytest.raises(ValueError, match="lane_of returned 'bulk'"):
        lb.add(("bulk", 1, 0), "s", 0.0)


def test_random_driving_never_puts_two_backfill_batches_before_output_nor_loses_items() -> None:
    """A device simulation: batches go to a FIFO before the device; every live batch finds at most
    one backfill batch ahead of it; every item comes out once."""
    rng = random.Random(3)
    for _ in range(50):
        lb = lanes(live_batch=rng.choice([1, 2, 3]), backfill_batch=rng.choice([1, 2, 4]))
        fifo: list[Batch[Item]] = []
        seen: list[int] = []
        now, n = 0.0, 0
        for _step in range(300):
            now += rng.uniform(0, 0.01)
            r = rng.random()
            out: list[Batch[Item]] = []
            if r < 0.3:
                out = lb.add(("live", n, rng.randrange(3)), rng.choice("ab"), now)
                n += 1
            elif r < 0.6:
                out = lb.add(("backfill", n, 0), "s", now)
                n += 1
            elif r < 0.85 and fifo:
                done = fifo.pop(0)
                seen.extend(i for _, i, _ in done.items)
                lb.device_done(done.items)
                out = lb.poll(now)
            else:
                out = lb.poll(now)
            for batch in out:
                if batch.items[0][0] == "live":
                    assert sum(1 for b in fifo if b.items[0][0] == "backfill") <= 1
                fifo.append(batch)
            assert sum(1 for b in fifo if b.items[0][0] == "backfill") <= 1
        for batch in fifo + lb.flush():
            seen.extend(i for _, i, _ in batch.items)
        assert sorted(seen) == list(range(n))


@pytest.mark.parametrize("queued,lag,threshold,paused", [
    (0, 0, 0, False), (1, 0, 0, True), (0, 1, 0, True), (0, 5, 10, False), (0, 11, 10, True)])
def test_pause_rule(queued: int, lag: int, threshold: int, paused: bool) -> None:
    assert pause_backfill(queued, lag, threshold) is paused


def test_the_runner_puts_a_live_input_right_behind_the_backfill_batch_on_the_device() -> None:
    """The runner driving a LaneBatcher: backfill 0 is on the device, backfill 1-3 wait; a live input
    arriving then goes next, and the backfill resumes after it."""
    import asyncio

    from agents.process import InRecord
    from agents.runner import BatchRunner, RunnerConfig
    from tests.test_runner import FakeClock, FakeProcessor, FakeSink, until

    class Recording(FakeProcessor):
        def __init__(self) -> None:
            super().__init__()
            self.order: list[tuple[str, int]] = []

        def device(self, state: Any) -> Any:
            self.order.extend((j.record.topic, j.record.offset) for j in state.items)
            return super().device(state)

    async def go() -> list[tuple[str, int]]:
        one = BatchingConfig(slo_s=1.0, max_batch=4, max_wait_s=0.005, fixed_batch=1)
        lb: LaneBatcher[Any] = LaneBatcher(MicroBatcher(one), MicroBatcher(one), lane_of=lambda p: p[0].lane)
        proc, acked = Recording(), []

        async def ack(ev: InRecord) -> None:
            acked.append(ev)

        runner = BatchRunner(proc, FakeSink(auto=True), lb, ack=ack, clock=FakeClock(step=0.001),
                             config=RunnerConfig(watchdog_interval_s=0.01, backfill_in_flight=8))
        await runner.start()
        try:
            for i in range(4):
                r = InRecord("bf", 0, i, b"hang" if i == 0 else b"ok")
                await runner.submit(r, r, lane="backfill")
            await until(lambda: proc.order == [("bf", 0)] and lb.backfill_held == 3, "backfill 0 on the device")
            live = InRecord("in", 0, 0, b"ok")
            await runner.submit(live, live)
            await until(lambda: lb.live_queued == 1 and runner.preparing() == 0, "the live batch waiting")
            assert runner.free_slots("backfill") == 4 and runner.free_slots() == 63
            proc.release.set()
            await until(lambda: len(acked) == 5, "everything acknowledged")
        finally:
            await runner.stop()
        return proc.order

    assert asyncio.run(go()) == [("bf", 0), ("in", 0), ("bf", 1), ("bf", 2), ("bf", 3)]
