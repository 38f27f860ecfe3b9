"""Drives a :class:`~agents.interfaces.Processor` (:class:`~agents.process.BatchProcessor`) from an
asyncio loop: inputs in, batches through decode, device and output, outputs to the brokers,
acknowledgements back in order. The loops live here; the runner's helpers each hold one concern:
:mod:`agents.intake` (per tier: inputs held, waiting, staged), :mod:`agents.delivery` (coalesced
sends, retries, ordered acknowledgements, record-size fitting), :mod:`agents.supervision`
(watchdog, fail-stop).

Lanes, joined by bounded queues so that a slow lane holds back the ones before it and, in the
end, the consumer (back-pressure), and so that the device never waits on I/O::

    submit ─► prepare (CPU pool) ─► batcher ─► decode (1 thread) ─► device (1 thread*) ─► output (CPU pool) ─► send
                 └── dead letters ────────────────────────────────────────────────────────────────────────────┘

The device thread runs ``processor.device`` and nothing else; Avro, store writes and produce run
in the output lane. (*) ``device_threads`` > 1 only for a model that runs calls side by side
(OpenVINO's two streams on a CPU, ``agents.wiring.runner_config``): each device thread then takes
the next decoded batch as soon as its own call is done, so one batch's mask refinement and model
run beside the next one's instead of the cores waiting between them.

At most ``max_in_flight`` inputs are held (handed and not yet committable); past that ``submit``
waits, the agent stops pulling, and Faust pauses the partitions' fetch. Of those, the images from
the batcher to the end of their output call — decoded, on the device, being encoded — hold at
most ``max_in_flight_bytes`` of decoded pixels (each image's estimate from its header,
``Prepared.nbytes``); the others wait prepared, still encoded, until some finish (one image always
goes, however large). Without it, a backlog drained after an outage would decode every held image
at once.

Delivery (at-least-once, never a lost input)
    An input is acknowledged only after its processed event or dead letter was acknowledged by
    the brokers (acks=all, idempotent producer) *and* every lower offset of its partition that
    this worker was handed is too (:class:`~agents.delivery.Delivery`):
    :class:`~agents.watermark.Watermarks` keeps one queue per
    partition in hand-over order and releases only the contiguous done prefix, whatever order
    batches and dead letters finish in.

    Why acknowledge through Faust and not commit ourselves: Faust's consumer owns the group
    generation (aiokafka runs in its own thread) and its rebalance handler waits (``wait_empty``)
    for every message it handed out to be acknowledged before it commits and gives the partitions
    up; committing around it would race that machinery. So the runner calls Faust's ack only for
    released inputs, in offset order, one at a time under one lock. Faust then commits
    ``Consumer._new_offset(tp)`` (faust-streaming 0.15.3): one past the end of the first run of
    consecutive numbers in the sorted acked offsets, to which it adds the gap intervals it
    recorded between consecutive fetched records (``[previous + 1, next]``) that start below the
    highest acked offset. Every acked offset ``a`` has all handed offsets ``<= a`` done; a gap
    interval that starts below ``max(acked)`` ends at a record that was handed before (or at)
    ``max(acked)``, so it is done too. Hence the committed offset is at most ``max(acked) + 1``,
    which never passes the lowest unacknowledged input. Faust's own gap check — which lets gaps
    through on a fresh group, as measured on faust-streaming 0.15.3 — is never relied on: we never hand it a gap.

    Rebalances: Faust's revoke handler waits for the acks of everything handed out, commits,
    then sends ``on_partitions_revoked``; :meth:`BatchRunner.revoke` then drops those partitions'
    queues. A ticket of a dropped queue is stale: its completion releases nothing, so in-flight
    work of a revoked partition never acknowledges into a later assignment generation.

Supervision (never a silent stall): a batch-level exception becomes dead letters for that batch;
what the runner cannot go on from fail-stops it (:mod:`agents.supervision` says which and how).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Callable, Coroutine, Iterable, Sequence
from typing import Any, TypeVar

from agents.batching import Batch, MicroBatcher
from agents.delivery import Delivery
from agents.dependencies import Dependencies
from agents.intake import (
    BACKFILL,
    LIVE,
    RUNNER_LANES,
    Intake,
    Item,
    Pair,
    Sent,
    log_ids,
    make_intake,
    prepare_each,
    record_of,
    tier_of,
)
from agents.interfaces import (
    Ack,
    Batcher,
    NullObserver,
    OutputSink,
    Processor,
    RunnerConfig,
    RunnerObserver,
    RunnerStats,
)
from agents.records import InRecord, OutRecord, value_limit
from agents.supervision import RunnerFailed, Supervisor
from agents.watermark import OffsetRewound, Watermarks
from schemas.errors import FatalError, ProcessingFailed

__all__ = ["BatchRunner", "Pair", "RunnerConfig", "RunnerFailed", "RunnerObserver", "RunnerStats"]

log = logging.getLogger(__name__)

R = TypeVar("R")

PAUSED_POLL_S = 0.2  # how often a paused intake looks whether the dependency it waits for is back


class BatchRunner:
    """See the module docstring. ``ack(event)`` acknowledges one input to the consumer;
    ``on_fatal(exc)`` is called once when the runner fail-stops."""

    def __init__(self, processor: Processor, sink: OutputSink, batcher: Batcher[Pair] | MicroBatcher[Pair], *,
                 ack: Ack, config: RunnerConfig | None = None, clock: Callable[[], float] = time.monotonic,
                 observer: RunnerObserver | None = None,
                 on_fatal: Callable[[BaseException], None] | None = None,
                 dependencies: Dependencies | None = None) -> None:
        self.processor, self.sink, self.batcher, self.clock = processor, sink, batcher, clock
        self.config = cfg = config or RunnerConfig()
        self.stats = RunnerStats()
        self._wm: Watermarks[Item] = Watermarks()
        self._intake, self._pools = make_intake(cfg)
        self._live = self._intake[LIVE]
        self._sup = Supervisor(stage_timeout_s=cfg.stage_timeout_s, delivery_timeout_s=cfg.delivery_timeout_s,
                               interval_s=cfg.watchdog_interval_s, clock=clock, in_flight=lambda: self._wm.pending,
                               on_fatal=on_fatal, dependencies=dependencies)
        self.dependencies = self._sup.dependencies
        self._tasks: set[asyncio.Task[None]] = set()  # prepare, output and delivery tasks
        self._delivery = Delivery(sink, processor, ack=ack, config=cfg, watermarks=self._wm, intake=self._intake,
                                  supervisor=self._sup, stats=self.stats, clock=clock,
                                  observer=observer or NullObserver(), spawn=self._spawn)
        self._decode_q: asyncio.Queue[Batch[Pair]] = asyncio.Queue(cfg.queue_depth)
        # live batches before backfill ones (then first come, first served): a decoded backfill
        # batch waiting for the device never holds up a live batch; one place more than ``depth``
        # so that a live batch's decode never waits for a backfill batch to leave the queue
        self._device_q: asyncio.PriorityQueue[tuple[int, int, tuple[list[Pair], Any, float]]] = (
            asyncio.PriorityQueue(cfg.queue_depth + 1))
        self._device_seq = 0
        # a tier batcher is told when a batch goes onto the device (a plain MicroBatcher is not)
        self._device_started: Callable[[Sequence[Pair]], None] | None = getattr(batcher, "device_started", None)
        self._output_q: asyncio.Queue[tuple[list[Pair], Any]] = asyncio.Queue(cfg.queue_depth)
        self._wake = asyncio.Event()
        self._calls: dict[str, int] = dict.fromkeys(RUNNER_LANES, 0)  # lane calls handed to threads, not yet back
        self.decoded_bytes = 0  # decoded bytes from the batcher to the end of the output call (max_in_flight_bytes)

    # -- public ------------------------------------------------------------------------------
    @property
    def observer(self) -> RunnerObserver:
        return self._delivery.observer

    @observer.setter
    def observer(self, observer: RunnerObserver) -> None:
        self._delivery.observer = observer

    @property
    def failure(self) -> BaseException | None:
        """Why the runner fail-stopped (None while it runs)."""
        return self._sup.failure

    @property
    def failed(self) -> asyncio.Event:
        """Set when the runner fail-stops."""
        return self._sup.failed

    @property
    def in_flight(self) -> int:
        """Inputs handed and not yet released (acknowledged) or revoked."""
        return self._wm.pending

    def wake(self) -> None:
        """Make the batch timer look at the batcher now (its release conditions changed)."""
        self._wake.set()

    def free_slots(self, tier: str = LIVE) -> int:
        """How many more inputs of ``tier`` :meth:`submit` takes without waiting."""
        return self._intake[tier].free()

    def preparing(self, tier: str = LIVE) -> int:
        """Inputs of ``tier`` not yet in the batcher: in the prepare lane (fetch), or staged."""
        return self._intake[tier].waiting()

    def committable(self) -> dict[Any, int]:
        """Per (topic, partition): the offset the acknowledged prefix allows committing."""
        return self._wm.committable()

    async def start(self) -> None:
        """Start the sink (reads the topics' size limits) and the loops. Brokers that cannot be
        reached at start are waited for, as a send they do not acknowledge is: capped backoff,
        ``/readyz`` false, until they answer; what waiting cannot fix (a refused password, a topic
        that does not exist) still raises."""
        await self._start_sink()
        loops: dict[str, Callable[[], Coroutine[Any, Any, None]]] = {
                 "prepare": functools.partial(self._prepare_loop, LIVE),
                 "backfill-prepare": functools.partial(self._prepare_loop, BACKFILL),
                 "batch-timer": self._timer_loop, "decode": self._decode_loop,
                 "output": self._output_loop, "send": self._delivery.loop, "watchdog": self._sup.watchdog,
                 "broker-probe": self._delivery.probe}
        for k in range(self.config.device_threads):  # each takes the next decoded batch when its call is done
            loops["device" if k == 0 else f"device-{k}"] = self._device_loop
        for name, loop in loops.items():
            task = asyncio.create_task(loop(), name=f"lightbox-{name}")
            task.add_done_callback(functools.partial(self._sup.loop_ended, name))
            self._sup.loops.append(task)

    async def _start_sink(self) -> None:
        deps = self.dependencies
        while True:
            try:
                await self.sink.start()
            except Exception as exc:
                if not self.sink.retriable(exc):
                    raise
                await asyncio.sleep(deps.failed(Delivery.BROKERS, f"start: {type(exc).__name__}"))
            else:
                deps.reached(Delivery.BROKERS)
                return

    async def submit(self, event: Any, record: InRecord | None = None, *, tier: str = LIVE) -> None:
        """Take one consumed input; returns once it is on its way (waits while its tier is full:
        ``max_in_flight`` live, ``backfill_in_flight`` backfill inputs, and while a dependency is
        down: :mod:`agents.dependencies`). Raises :class:`RunnerFailed` after a fail-stop."""
        self._sup.check()
        while self.dependencies.waiting:  # the consumer stops pulling; its fetch pauses
            await asyncio.sleep(PAUSED_POLL_S)
            self._sup.check()
        intake = self._intake[tier]
        await intake.take()
        self._sup.check()
        rec = record or record_of(event)
        item = Item(event, rec, tier=tier)
        key = (rec.topic, rec.partition)
        try:
            item.ticket = self._wm.submit(key, rec.offset, item)
        except OffsetRewound:  # the consumer went back (a seek): a new generation for the partition
            log.warning("partition %s:%d rewound to offset %d; earlier in-flight inputs will not be acknowledged",
                        rec.topic, rec.partition, rec.offset)
            self._delivery.release_dropped(self._wm.revoke([key]))
            item.ticket = self._wm.submit(key, rec.offset, item)
        self.observer.received(rec)
        self.observer.in_flight(self._wm.pending)
        intake.hand(item)
        if self._live.slots.locked():
            self._wake.set()  # the window is full: the batcher may stop waiting for batch-mates

    def revoke(self, partitions: Iterable[tuple[str, int]]) -> None:
        """Partitions went away: forget their queues; their in-flight work will ack nothing."""
        self._delivery.release_dropped(self._wm.revoke(list(partitions)))
        self.observer.in_flight(self._wm.pending)

    async def drain(self, timeout_s: float) -> bool:
        """Graceful stop: finish everything handed so far and acknowledge it. True when nothing
        is left unacknowledged; False on timeout or fail-stop (the rest is redelivered)."""
        try:
            async with asyncio.timeout(timeout_s):
                while self._wm.pending and self.failure is None:
                    for batch in self._stage_into_batcher(all_of_them=True) + self.batcher.flush():
                        await self._decode_q.put(batch)  # no waiting for batch-mates now
                    await asyncio.sleep(0.02)
        except TimeoutError:
            log.warning("drain timed out after %.0f s with %d inputs unacknowledged; they will be redelivered",
                        timeout_s, self._wm.pending)
        return self._wm.pending == 0 and self.failure is None

    async def stop(self) -> None:
        """Stop the loops and the sink; threads still busy are abandoned (the process is ending),
        and a store write waiting for its store gives up (what waited is redone by the next owner):
        after its task is cancelled, so that giving up is no fail-stop."""
        await asyncio.gather(*self._sup.cancel_all(self._tasks), return_exceptions=True)
        self.dependencies.stop()
        try:  # after a fail-stop, unsent outputs do not matter (they are redone): no long flush
            await asyncio.wait_for(self.sink.stop(), None if self.failure is None else 2.0)
        finally:
            for pool in self._pools.values():
                pool.shutdown(wait=False, cancel_futures=True)
            self.processor.close()

    # -- loops -------------------------------------------------------------------------------
    async def _prepare_loop(self, tier: str) -> None:
        """Hands submitted inputs to the prepare threads in groups: one thread hop per group, not
        per input (a hop costs the event loop a GIL hand-over, ~0.1 ms on a busy 2-vCPU host).
        The consumer hands inputs over one at a time, so a group shorter than
        ``max_prepare_batch`` lingers ``prepare_linger_s`` for more. Each call takes what is
        queued, up to ``max_prepare_batch``; a larger backlog goes to the other prepare threads
        (fetches wait on the network in parallel). One loop per tier: a live input never queues
        behind backfill inputs, and backfill fetches run in the backfill tier's own threads if it has
        them (``backfill_threads``; else it shares the prepare threads)."""
        cfg = self.config
        intake = self._intake[tier]
        inbox, ready, slots = intake.inbox, intake.ready, intake.prepare_slots
        while True:
            await ready.wait()
            ready.clear()
            if len(inbox) < cfg.max_prepare_batch and cfg.prepare_linger_s > 0:
                await asyncio.sleep(cfg.prepare_linger_s)
            while inbox:
                await slots.acquire()
                n = min(len(inbox), cfg.max_prepare_batch)
                self._spawn(self._prepare(tier, [inbox.popleft() for _ in range(n)]))

    async def _prepare(self, tier: str, items: list[Item]) -> None:
        intake = self._intake[tier]
        self.observer.lane_progress("prepare", sum(len(i.inbox) for i in self._intake.values()))
        t0 = self.clock()
        try:
            results = await self._call("prepare", len(items), self._prepare_all, [i.record for i in items],
                                       pool=intake.prepare_pool)
        finally:
            self.observer.batch_done("prepare", len(items), self.clock() - t0)
            intake.prepare_slots.release()
            intake.preparing -= len(items)
        dead: list[Sent] = []
        for item, res in zip(items, results, strict=True):
            if isinstance(res, Exception):  # prepare never raises by contract; this is the last line of defence
                log.error("prepare lane: %s for %s:%d:%d; it goes to the dead-letter topic", type(res).__name__,
                          item.record.topic, item.record.partition, item.record.offset,
                          extra=log_ids([item.record]))
                dead.append((item, self._delivery.dead_letter(item, ProcessingFailed(f"{type(res).__name__}: {res}",
                                                                            stage="prepare"))))
            elif isinstance(res, OutRecord):
                dead.append((item, res))
            else:
                item.parsed = res.event
                intake.staged.append((item, res))
        if dead:
            self._delivery.put(dead)
        self._wake.set()  # staged jobs to feed, or (window full) nothing more to wait for

    def _prepare_all(self, records: list[InRecord]) -> list[Any]:
        return prepare_each(self.processor, records)

    def _stage_into_batcher(self, *, all_of_them: bool = False) -> list[Batch[Pair]]:
        """Prepared jobs enter the batcher only while a closed batch can go straight to decode:
        while one waits, they stay staged, and then arrive together — the backlog signal that
        lets the batcher grow batches under load (agents/batching.py)."""
        closed: list[Batch[Pair]] = []
        for intake in self._intake.values():  # live first
            staged = intake.staged
            while staged and (all_of_them or (not closed and not self._decode_q.full())):
                if not self._admits(staged[0][1].nbytes):
                    return closed  # the byte budget is spent: the rest waits for outputs to finish
                pair = staged.popleft()
                pair[0].charged = pair[1].nbytes
                self.decoded_bytes += pair[0].charged
                closed += self.batcher.add(pair, pair[1].shape_class, self.clock(), nbytes=pair[1].nbytes)
        return closed

    def _admits(self, nbytes: int) -> bool:
        """Whether an image of ``nbytes`` decoded may enter the batcher now (``max_in_flight_bytes``)."""
        limit = self.config.max_in_flight_bytes
        return limit is None or self.decoded_bytes == 0 or self.decoded_bytes + nbytes <= limit

    def _can_stage(self) -> bool:
        """A staged job could enter the batcher now (the budget admits the first one waiting)."""
        return any(t.staged and self._admits(t.staged[0][1].nbytes) for t in self._intake.values())

    def _uncharge(self, pairs: Sequence[Pair]) -> None:
        """These inputs' decoded pixels are gone (their output call ended, or their batch failed)."""
        for item, _ in pairs:
            self.decoded_bytes -= item.charged
            item.charged = 0
        self._wake.set()  # room in the budget: staged jobs may enter the batcher

    def _window_full(self) -> bool:
        """Every live in-flight slot is taken, every taken input reached the batcher (or left
        it), decode is idle and a device thread is: no batch-mate can arrive before something
        completes, and waiting for the deadline would only leave the device idle. (While they are busy, the
        bucket keeps filling as slots free up: under a backlog batches still grow.)"""
        tiers = self._intake.values()
        return (self._live.slots.locked() and not any(t.inbox or t.preparing or t.staged for t in tiers)
                and self._decode_q.empty() and self._device_q.empty()
                and not self._calls["decode"] and self._calls["device"] < self.config.device_threads)

    async def _timer_loop(self) -> None:
        """Feeds the batcher and closes batches at their deadlines, or at once when the
        in-flight window is full and the device idle (a deadline would then only add latency)."""
        while True:
            closed = self._stage_into_batcher() + self.batcher.poll(self.clock())
            if not closed and self._window_full() and not self._decode_q.full():
                closed = self.batcher.flush()
            for batch in closed:
                await self._decode_q.put(batch)
            if self._can_stage() and not self._decode_q.full():
                continue
            deadline = self.batcher.next_deadline()
            timeout = None if deadline is None else max(0.0, deadline - self.clock())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout)
            self._wake.clear()

    async def _decode_loop(self) -> None:
        while True:
            batch = await self._decode_q.get()
            self._wake.set()  # room for the next batch: staged jobs may enter the batcher
            self.observer.lane_progress("decode", self._decode_q.qsize())
            pairs = list(batch.items)
            t0 = self.clock()
            try:
                state = await self._call("decode", len(pairs), self.processor.decode, [p for _, p in pairs])
            except FatalError:
                raise
            except Exception as exc:
                self._left_device(pairs)
                self.observer.batch_done("decode", len(pairs), self.clock() - t0)
                self._batch_failed("decode", pairs, exc)
                continue
            seconds = self.clock() - t0
            self.observer.batch_done("decode", len(pairs), seconds)
            self._device_seq += 1
            rank = 0 if tier_of(pairs) == LIVE else 1
            await self._device_q.put((rank, self._device_seq, (pairs, state, seconds)))

    async def _device_loop(self) -> None:
        while True:
            _, _, (pairs, state, decode_s) = await self._device_q.get()
            self.observer.lane_progress("device", self._device_q.qsize())
            if self._device_started is not None:
                self._device_started(pairs)  # the tier batcher may let the next backfill batch decode meanwhile
                self._wake.set()
            t0 = self.clock()
            try:
                state = await self._call("device", len(pairs), self.processor.device, state)
            except FatalError:
                raise
            except Exception as exc:
                self._left_device(pairs)
                self.observer.batch_done("device", len(pairs), self.clock() - t0)
                self._batch_failed("device", pairs, exc)
                continue
            seconds = self.clock() - t0
            self.observer.batch_done("device", len(pairs), seconds)
            # the batch's service time: its decode plus its device work (they overlap other batches)
            self.batcher.record_service(len(pairs), decode_s + seconds)
            self._left_device(pairs)  # wakes the timer: a new service estimate can move deadlines
            self.stats.batches += 1
            self.stats.batch_items += len(pairs)
            await self._output_q.put((pairs, state))

    async def _output_loop(self) -> None:
        """A live batch waits here for a live output slot (back-pressure on the device lane); a
        backfill batch with threads of its own waits for one of those in its own task, so it never
        holds up the live batches behind it."""
        live = self._live.output_slots
        while True:
            await live.acquire()
            pairs, state = await self._output_q.get()
            self.observer.lane_progress("output", self._output_q.qsize())
            intake = self._intake[tier_of(pairs)]
            if intake.output_slots is live:
                self._spawn(self._output(intake, pairs, state))
            else:
                live.release()
                self._spawn(self._output(intake, pairs, state, wait=True))

    async def _output(self, intake: Intake, pairs: list[Pair], state: Any, *, wait: bool = False) -> None:
        if wait:
            await intake.output_slots.acquire()
        try:
            budget = value_limit(self.sink.limits.get("processed"))  # the size policy: agents/records.py
            t0 = self.clock()
            try:
                outs = await self._call("output", len(pairs),
                                        functools.partial(self.processor.output, max_record_bytes=budget), state,
                                        pool=intake.output_pool)
                if len(outs) != len(pairs):
                    raise ProcessingFailed(f"output lane returned {len(outs)} records for {len(pairs)} items",
                                           stage="output")
            except FatalError:
                raise
            except Exception as exc:
                self.observer.batch_done("output", len(pairs), self.clock() - t0)
                self._batch_failed("output", pairs, exc)
                return
            self.observer.batch_done("output", len(pairs), self.clock() - t0)
            self._delivery.put([(item, out) for (item, _), out in zip(pairs, outs, strict=True)])
        finally:
            self._uncharge(pairs)
            intake.output_slots.release()

    # -- helpers -----------------------------------------------------------------------------
    async def _call(self, lane: str, size: int, fn: Callable[..., R], *args: Any, pool: str | None = None) -> R:
        """``fn(*args)`` in the lane's threads (or ``pool``'s), visible to the watchdog while it runs."""
        self._calls[lane] += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(
                self._pools[pool or lane], self._sup.timed(lane, size, functools.partial(fn, *args)))
        finally:
            self._calls[lane] -= 1

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        task.add_done_callback(self._sup.task_ended)

    def _left_device(self, pairs: Sequence[Pair]) -> None:
        """A batch left the device lane (done, or failed before or in it): the batcher may let the
        next backfill batch go."""
        self.batcher.device_done(pairs)
        self._wake.set()

    def _batch_failed(self, lane: str, pairs: list[Pair], exc: Exception) -> None:
        self._uncharge(pairs)
        self._delivery.batch_failed(lane, pairs, exc)
