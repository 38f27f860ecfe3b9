"""Drives the :class:`~agents.process.BatchProcessor` lanes from an asyncio loop: inputs in,
batches through decode, device and output, outputs to the brokers, acknowledgements back in order.

Lanes, joined by bounded queues so that a slow lane holds back the ones before it and, in the
end, the consumer (back-pressure), and so that the device never waits on I/O::

    submit ─► prepare (CPU pool) ─► batcher ─► decode (1 thread) ─► device (1 thread) ─► output (CPU pool) ─► send
                 └── dead letters ───────────────────────────────────────────────────────────────────────────┘

The device thread runs ``processor.device`` and nothing else; Avro, store writes and produce run
in the output lane. At most ``max_in_flight`` inputs are held (handed and not yet committable);
past that ``submit`` waits, the agent stops pulling, and Faust pauses the partitions' fetch.

Delivery (at-least-once, never a lost input)
    An input is acknowledged only after its processed event or dead letter was acknowledged by
    the brokers (acks=all, idempotent producer) *and* every lower offset of its partition that
    this worker was handed is too: :class:`~agents.watermark.Watermarks` keeps one queue per
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
    through on a fresh group (FACTS.md) — is never relied on: we never hand it a gap.

    Rebalances: Faust's revoke handler waits for the acks of everything handed out, commits,
    then sends ``on_partitions_revoked``; :meth:`BatchRunner.revoke` then drops those partitions'
    queues. A ticket of a dropped queue is stale: its completion releases nothing, so in-flight
    work of a revoked partition never acknowledges into a later assignment generation.

Supervision (never a silent stall)
    An exception that is not an item's own (a lane call raising, a lane returning the wrong
    number of outputs) becomes ``PROCESSING_FAILED`` dead letters for that batch's items, logged
    once per batch; the lanes go on. When the runner cannot go on — a :class:`FatalError` (e.g.
    the output store unreachable past its retry budget), a produce that fails for good or keeps
    failing past ``delivery_timeout_s``, a lane call running longer than ``stage_timeout_s``
    (watchdog), a lane task crashing — it fail-stops: logs one line, acknowledges nothing more,
    sets :attr:`BatchRunner.failed` and calls ``on_fatal``, whose job is to make the worker
    leave its group and exit non-zero. What was in flight stays uncommitted and goes to the
    partitions' next owner (same event ids, same bytes).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine, Hashable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from agents.batching import Batch, MicroBatcher
from agents.process import InRecord, OutRecord
from agents.watermark import OffsetRewound, Ticket, Watermarks
from schemas.errors import FatalError, LightboxError, OutputTooLarge, ProcessingFailed, SchemaInvalid
from streams.records import RECORD_OVERHEAD, record_size

__all__ = ["BatchRunner", "Lanes", "NullObserver", "OutputSink", "RunnerConfig", "RunnerFailed",
           "RunnerObserver", "RunnerStats", "lower_thread_priority", "record_of"]

log = logging.getLogger(__name__)

R = TypeVar("R")
T_contra = TypeVar("T_contra", contravariant=True)
Ack = Callable[[Any], Awaitable[Any]]


class OutputSink(Protocol):
    """Where outputs go (:class:`streams.sink.KafkaSink`; a fake in unit tests)."""

    #: the largest record each kind's topic accepts (None: unknown); valid after ``start``
    limits: Mapping[str, int | None]

    async def start(self) -> None: ...
    async def send_batch(self, records: Sequence[OutRecord]) -> Sequence[BaseException | None]: ...
    def retriable(self, exc: BaseException) -> bool: ...
    async def stop(self) -> None: ...


class Lanes(Protocol):
    """The processor's lanes (INTERFACES.md); :class:`agents.process.BatchProcessor` is one."""

    def prepare(self, rec: InRecord) -> Any: ...  # Prepared | OutRecord
    def decode(self, batch: Sequence[Any]) -> Any: ...
    def device(self, state: Any) -> Any: ...
    def output(self, state: Any, *, max_record_bytes: int | None = None) -> list[OutRecord]: ...
    def dead_letter(self, rec: InRecord, exc: LightboxError, event: dict[str, Any] | None = None) -> OutRecord: ...
    def close(self) -> None: ...


class RunnerObserver(Protocol):
    """Hooks for metrics and tracing; called on the event loop, must be quick and never raise."""

    def received(self, rec: InRecord) -> None: ...
    def batch_done(self, lane: str, size: int, seconds: float) -> None: ...  # failed batches too
    def sending(self, out: OutRecord) -> OutRecord: ...  # just before the send; may return it re-headered
    def output_acked(self, out: OutRecord) -> None: ...  # after the brokers acknowledged it
    def lane_progress(self, lane: str, queued: int) -> None: ...  # a lane took a batch; ``queued`` wait behind
    def in_flight(self, n: int) -> None: ...


class NullObserver:
    """The default :class:`RunnerObserver`: does nothing."""

    def received(self, rec: InRecord) -> None:
        pass

    def batch_done(self, lane: str, size: int, seconds: float) -> None:
        pass

    def sending(self, out: OutRecord) -> OutRecord:
        return out

    def output_acked(self, out: OutRecord) -> None:
        pass

    def lane_progress(self, lane: str, queued: int) -> None:
        pass

    def in_flight(self, n: int) -> None:
        pass


def lower_thread_priority(nice: int) -> None:
    """Thread initializer: lower the calling thread's CPU priority by ``nice`` (Linux, where niceness
    is per thread; elsewhere, or if the OS refuses, nothing happens)."""
    if nice <= 0 or not hasattr(os, "setpriority"):
        return
    tid = threading.get_native_id()
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + nice))


class RunnerFailed(RuntimeError):
    """The runner fail-stopped (see the module docstring); ``__cause__`` says why."""


@dataclass(frozen=True, slots=True)
class RunnerConfig:
    """Lane sizes and timeouts. Seconds are on the runner's clock (``delivery_timeout_s``,
    ``stage_timeout_s``) or real time (``watchdog_interval_s``, ``retry_backoff_s``)."""

    max_in_flight: int = 64
    prepare_threads: int = 4
    output_threads: int = 2
    queue_depth: int = 1  # closed batches waiting in front of each of decode, device, output
    delivery_timeout_s: float = 120.0
    stage_timeout_s: float = 300.0
    watchdog_interval_s: float = 1.0
    retry_backoff_s: float = 0.5
    max_send_batch: int = 256
    backfill_in_flight: int = 16  # backfill-lane inputs held at once, apart from the live lane's max_in_flight
    max_prepare_batch: int = 64  # inputs one prepare call takes
    prepare_linger_s: float = 0.002  # how long a short group waits for more inputs before it goes
    backfill_threads: int = 0  # prepare and output threads of the backfill lane's own (0: it shares the live lane's)
    backfill_nice: int = 0  # how much lower those threads' CPU priority is (Linux niceness, per thread)


@dataclass
class RunnerStats:
    processed: int = 0
    dead_letters: int = 0
    batches: int = 0
    batch_items: int = 0
    batch_failures: int = 0
    send_retries: int = 0


def record_of(event: Any) -> InRecord:
    """The :class:`InRecord` of a Faust event (topic, partition, offset, headers, bytes)."""
    msg = event.message
    headers = msg.headers or []
    if isinstance(headers, dict):
        headers = list(headers.items())
    return InRecord(topic=msg.topic, partition=msg.partition, offset=msg.offset,
                    value=msg.value, key=msg.key,
                    headers=[(str(k), None if v is None else bytes(v)) for k, v in headers],
                    timestamp_ms=int(msg.timestamp * 1000) if msg.timestamp else None)


def _log_ids(records: Sequence[InRecord]) -> dict[str, str]:
    """Log fields that find these inputs again: ``inputs`` (topic:partition:offset) and the trace
    ids their ``traceparent`` headers carry, which their spans continue (agents/tracing.py)."""
    traces = []
    for rec in records:
        parent = next((v for k, v in rec.headers or [] if k == "traceparent" and v), None)
        parts = parent.split(b"-") if parent else []
        if len(parts) == 4 and len(parts[1]) == 32:
            traces.append(parts[1].decode("ascii", "replace"))
    out = {"inputs": ",".join(f"{r.topic}:{r.partition}:{r.offset}" for r in records)}
    if traces:
        out["trace_ids"] = ",".join(traces)
    return out


@dataclass(eq=False, slots=True)
class _Item:
    """One handed input on its way through the lanes."""

    event: Any
    record: InRecord
    ticket: Ticket[_Item] | None = None
    lane: str = "live"  # or "backfill" (agents.lanes)
    parsed: dict[str, Any] | None = None  # the decoded input event, once prepare read it


Pair = tuple[_Item, Any]  # an input and its Prepared job
Sent = tuple[_Item, OutRecord]


def _lane_of(pairs: Sequence[Pair]) -> str:
    """A batch's input lane: its first item's (a live batch with backfill riders is live)."""
    return pairs[0][0].lane if pairs else "live"


class Batcher(Protocol[T_contra]):
    """What the runner drives: :class:`~agents.batching.MicroBatcher`, or :class:`~agents.lanes.LaneBatcher`
    for live and backfill lanes. ``device_done(items)``: a batch left the device lane (done or failed);
    a batcher with a ``device_started(items)`` method is also told when a batch goes onto the device."""

    def add(self, item: Any, shape_class: Hashable, now: float, nbytes: int = 0) -> list[Batch[Any]]: ...
    def poll(self, now: float) -> list[Batch[Any]]: ...
    def next_deadline(self) -> float | None: ...
    def flush(self) -> list[Batch[Any]]: ...
    def record_service(self, batch_size: int, seconds: float) -> None: ...
    def device_done(self, items: Sequence[T_contra]) -> None: ...


class BatchRunner:
    """See the module docstring. ``ack(event)`` acknowledges one input to the consumer;
    ``on_fatal(exc)`` is called once when the runner fail-stops."""

    _LANES = ("prepare", "decode", "device", "output")

    def __init__(self, processor: Lanes, sink: OutputSink, batcher: Batcher[Pair] | MicroBatcher[Pair], *, ack: Ack,
                 config: RunnerConfig | None = None, clock: Callable[[], float] = time.monotonic,
                 observer: RunnerObserver | None = None,
                 on_fatal: Callable[[BaseException], None] | None = None) -> None:
        self.processor, self.sink, self.batcher, self.clock = processor, sink, batcher, clock
        self.config = config or RunnerConfig()
        self.observer: RunnerObserver = observer or NullObserver()
        self.stats = RunnerStats()
        self.failure: BaseException | None = None
        self.failed = asyncio.Event()
        self._ack, self._on_fatal = ack, on_fatal
        self._wm: Watermarks[_Item] = Watermarks()
        self._slots = asyncio.Semaphore(self.config.max_in_flight)
        self._lane_slots = {"live": self._slots, "backfill": asyncio.Semaphore(self.config.backfill_in_flight)}
        self._preparing: dict[str, int] = {"live": 0, "backfill": 0}
        self._limits = {"live": self.config.max_in_flight, "backfill": self.config.backfill_in_flight}
        self._held: dict[str, int] = {"live": 0, "backfill": 0}
        depth = self.config.queue_depth
        self._decode_q: asyncio.Queue[Batch[Pair]] = asyncio.Queue(depth)
        # live batches before backfill ones (then first come, first served): a decoded backfill
        # batch waiting for the device never holds up a live batch; one place more than ``depth``
        # so that a live batch's decode never waits for a backfill batch to leave the queue
        self._device_q: asyncio.PriorityQueue[tuple[int, int, tuple[list[Pair], Any, float]]] = (
            asyncio.PriorityQueue(depth + 1))
        self._device_seq = 0
        # a lane batcher is told when a batch goes onto the device (a plain MicroBatcher is not)
        self._device_started: Callable[[Sequence[Pair]], None] | None = getattr(batcher, "device_started", None)
        self._output_q: asyncio.Queue[tuple[list[Pair], Any]] = asyncio.Queue(depth)
        self._send_q: asyncio.Queue[list[Sent]] = asyncio.Queue()  # bounded by max_in_flight
        own = self.config.backfill_threads > 0  # the backfill lane's own prepare and output threads
        live_out = asyncio.Semaphore(self.config.output_threads)
        self._out_slots = {"live": live_out,
                           "backfill": asyncio.Semaphore(self.config.backfill_threads) if own else live_out}
        self._ack_lock = asyncio.Lock()
        self._wake = asyncio.Event()
        # per lane, live first wherever both wait: prepared, waiting to enter the batcher; submitted,
        # waiting for a prepare call
        self._staged: dict[str, deque[Pair]] = {"live": deque(), "backfill": deque()}
        self._inbox: dict[str, deque[_Item]] = {"live": deque(), "backfill": deque()}
        self._inbox_ready = {"live": asyncio.Event(), "backfill": asyncio.Event()}
        live_prep = asyncio.Semaphore(self.config.prepare_threads)
        self._prep_slots = {"live": live_prep,
                            "backfill": asyncio.Semaphore(self.config.backfill_threads) if own else live_prep}
        self._calls: dict[str, int] = dict.fromkeys(self._LANES, 0)  # lane calls handed to threads, not yet back
        self._pools = {
            "prepare": ThreadPoolExecutor(self.config.prepare_threads, thread_name_prefix="lightbox-prepare"),
            "decode": ThreadPoolExecutor(1, thread_name_prefix="lightbox-decode"),
            "device": ThreadPoolExecutor(1, thread_name_prefix="lightbox-device"),
            "output": ThreadPoolExecutor(self.config.output_threads, thread_name_prefix="lightbox-output"),
        }
        # the pool each (lane call, input lane) runs in: the backfill lane's own threads run at a lower
        # CPU priority, so its fetches, encodes and store writes take only the CPU live work leaves
        self._pool_of = {(call, lane): call for call in self._LANES for lane in ("live", "backfill")}
        if own:
            for call in ("prepare", "output"):
                self._pools[f"backfill-{call}"] = ThreadPoolExecutor(
                    self.config.backfill_threads, thread_name_prefix=f"lightbox-backfill-{call}",
                    initializer=lower_thread_priority, initargs=(self.config.backfill_nice,))
                self._pool_of[(call, "backfill")] = f"backfill-{call}"
        self._busy: dict[object, tuple[str, float, int]] = {}  # lane calls running: lane, since, items
        self._delivering: dict[object, float] = {}  # sends waiting for the brokers: since
        self._lanes: list[asyncio.Task[None]] = []
        self._tasks: set[asyncio.Task[None]] = set()  # prepare, output and delivery tasks

    # -- public ------------------------------------------------------------------------------
    @property
    def in_flight(self) -> int:
        """Inputs handed and not yet released (acknowledged) or revoked."""
        return self._wm.pending

    def wake(self) -> None:
        """Make the batch timer look at the batcher now (its release conditions changed)."""
        self._wake.set()

    def free_slots(self, lane: str = "live") -> int:
        """How many more inputs of ``lane`` :meth:`submit` takes without waiting."""
        return self._limits[lane] - self._held[lane]

    def preparing(self, lane: str = "live") -> int:
        """Inputs of ``lane`` not yet in the batcher: in the prepare lane (fetch), or staged."""
        return self._preparing[lane] + len(self._staged[lane])

    def committable(self) -> dict[Any, int]:
        """Per (topic, partition): the offset the acknowledged prefix allows committing."""
        return self._wm.committable()

    async def start(self) -> None:
        """Start the sink (reads the topics' size limits) and the lanes."""
        await self.sink.start()
        loops: dict[str, Callable[[], Coroutine[Any, Any, None]]] = {
                 "prepare": functools.partial(self._prepare_loop, "live"),
                 "backfill-prepare": functools.partial(self._prepare_loop, "backfill"),
                 "batch-timer": self._timer_loop, "decode": self._decode_loop,
                 "device": self._device_loop, "output": self._output_loop, "send": self._send_loop,
                 "watchdog": self._watchdog_loop}
        for name, loop in loops.items():
            task = asyncio.create_task(loop(), name=f"lightbox-{name}")
            task.add_done_callback(functools.partial(self._lane_ended, name))
            self._lanes.append(task)

    async def submit(self, event: Any, record: InRecord | None = None, *, lane: str = "live") -> None:
        """Take one consumed input; returns once it is on its way (waits while its lane is full:
        ``max_in_flight`` live, ``backfill_in_flight`` backfill inputs). Raises :class:`RunnerFailed`
        after a fail-stop."""
        self._check()
        await self._lane_slots[lane].acquire()
        self._held[lane] += 1
        self._check()
        rec = record or record_of(event)
        item = _Item(event, rec, lane=lane)
        key = (rec.topic, rec.partition)
        try:
            item.ticket = self._wm.submit(key, rec.offset, item)
        except OffsetRewound:  # the consumer went back (a seek): a new generation for the partition
            log.warning("partition %s:%d rewound to offset %d; earlier in-flight inputs will not be acknowledged",
                        rec.topic, rec.partition, rec.offset)
            self._release_dropped(self._wm.revoke([key]))
            item.ticket = self._wm.submit(key, rec.offset, item)
        self.observer.received(rec)
        self.observer.in_flight(self._wm.pending)
        self._preparing[lane] += 1
        self._inbox[lane].append(item)
        self._inbox_ready[lane].set()
        if self._slots.locked():
            self._wake.set()  # the window is full: the batcher may stop waiting for batch-mates

    def revoke(self, partitions: Iterable[tuple[str, int]]) -> None:
        """Partitions went away: forget their queues; their in-flight work will ack nothing."""
        self._release_dropped(self._wm.revoke(list(partitions)))
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
        """Stop the lanes and the sink; threads still busy are abandoned (the process is ending)."""
        for task in [*self._lanes, *self._tasks]:
            task.cancel()
        await asyncio.gather(*self._lanes, *self._tasks, return_exceptions=True)
        try:  # after a fail-stop, unsent outputs do not matter (they are redone): no long flush
            await asyncio.wait_for(self.sink.stop(), None if self.failure is None else 2.0)
        finally:
            for pool in self._pools.values():
                pool.shutdown(wait=False, cancel_futures=True)
            self.processor.close()

    # -- lanes -------------------------------------------------------------------------------
    async def _prepare_loop(self, lane: str) -> None:
        """Hands submitted inputs to the prepare threads in groups: one thread hop per group, not
        per input (a hop costs the event loop a GIL hand-over, ~0.1 ms on a busy 2-core machine).
        The consumer hands inputs over one at a time, so a group shorter than
        ``max_prepare_batch`` lingers ``prepare_linger_s`` for more. Each call takes what is
        queued, up to ``max_prepare_batch``; a larger backlog goes to the other prepare threads
        (fetches wait on the network in parallel). One loop per input lane: a live input never queues
        behind backfill inputs, and backfill fetches run in the backfill lane's own threads if it has
        them (``backfill_threads``; else it shares the prepare threads)."""
        cfg = self.config
        inbox, ready, slots = self._inbox[lane], self._inbox_ready[lane], self._prep_slots[lane]
        while True:
            await ready.wait()
            ready.clear()
            if len(inbox) < cfg.max_prepare_batch and cfg.prepare_linger_s > 0:
                await asyncio.sleep(cfg.prepare_linger_s)
            while inbox:
                await slots.acquire()
                n = min(len(inbox), cfg.max_prepare_batch)
                self._spawn(self._prepare(lane, [inbox.popleft() for _ in range(n)]))

    async def _prepare(self, lane: str, items: list[_Item]) -> None:
        self.observer.lane_progress("prepare", sum(len(inbox) for inbox in self._inbox.values()))
        t0 = self.clock()
        try:
            results = await self._call("prepare", len(items), self._prepare_all, [i.record for i in items],
                                       pool=self._pool_of[("prepare", lane)])
        finally:
            self.observer.batch_done("prepare", len(items), self.clock() - t0)
            self._prep_slots[lane].release()
            for item in items:
                self._preparing[item.lane] -= 1
        dead: list[Sent] = []
        for item, res in zip(items, results, strict=True):
            if isinstance(res, Exception):  # prepare never raises by contract; this is the last line of defence
                log.error("prepare lane: %s for %s:%d:%d; it goes to the dead-letter topic", type(res).__name__,
                          item.record.topic, item.record.partition, item.record.offset,
                          extra=_log_ids([item.record]))
                dead.append((item, self._dead_letter(item, ProcessingFailed(f"{type(res).__name__}: {res}",
                                                                            stage="prepare"))))
            elif isinstance(res, OutRecord):
                dead.append((item, res))
            else:
                item.parsed = res.event
                self._staged[item.lane].append((item, res))
        if dead:
            self._send_q.put_nowait(dead)
        self._wake.set()  # staged jobs to feed, or (window full) nothing more to wait for

    def _prepare_all(self, records: list[InRecord]) -> list[Any]:
        """In a prepare thread: each record's Prepared job, dead letter, or (a broken contract) the
        exception it raised. A :class:`FatalError` stops the call (the runner fail-stops)."""
        out: list[Any] = []
        for rec in records:
            try:
                out.append(self.processor.prepare(rec))
            except FatalError:
                raise
            except Exception as exc:
                out.append(exc)
        return out

    def _stage_into_batcher(self, *, all_of_them: bool = False) -> list[Batch[Pair]]:
        """Prepared jobs enter the batcher only while a closed batch can go straight to decode:
        while one waits, they stay staged, and then arrive together — the backlog signal that
        lets the batcher grow batches under load (agents/batching.py)."""
        closed: list[Batch[Pair]] = []
        for staged in self._staged.values():  # live first
            while staged and (all_of_them or (not closed and not self._decode_q.full())):
                pair = staged.popleft()
                closed += self.batcher.add(pair, pair[1].shape_class, self.clock(), nbytes=pair[1].nbytes)
        return closed

    def _window_full(self) -> bool:
        """Every live in-flight slot is taken, every taken input reached the batcher (or left
        it), and decode and device are idle: no batch-mate can arrive before something completes,
        and waiting for the deadline would only leave the device idle. (While they are busy, the
        bucket keeps filling as slots free up: under a backlog batches still grow.)"""
        return (self._slots.locked() and not any(self._inbox.values()) and not any(self._preparing.values())
                and not any(self._staged.values())
                and self._decode_q.empty() and self._device_q.empty()
                and not self._calls["decode"] and not self._calls["device"])

    async def _timer_loop(self) -> None:
        """Feeds the batcher and closes batches at their deadlines, or at once when the
        in-flight window is full and the device idle (a deadline would then only add latency)."""
        while True:
            closed = self._stage_into_batcher() + self.batcher.poll(self.clock())
            if not closed and self._window_full() and not self._decode_q.full():
                closed = self.batcher.flush()
            for batch in closed:
                await self._decode_q.put(batch)
            if any(self._staged.values()) and not self._decode_q.full():
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
            rank = 0 if _lane_of(pairs) == "live" else 1
            await self._device_q.put((rank, self._device_seq, (pairs, state, seconds)))

    async def _device_loop(self) -> None:
        while True:
            _, _, (pairs, state, decode_s) = await self._device_q.get()
            self.observer.lane_progress("device", self._device_q.qsize())
            if self._device_started is not None:
                self._device_started(pairs)  # the lane batcher may let the next backfill batch decode meanwhile
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
        live = self._out_slots["live"]
        while True:
            await live.acquire()
            pairs, state = await self._output_q.get()
            self.observer.lane_progress("output", self._output_q.qsize())
            lane = _lane_of(pairs)
            if self._out_slots[lane] is live:
                self._spawn(self._output(lane, pairs, state))
            else:
                live.release()
                self._spawn(self._output(lane, pairs, state, wait=True))

    async def _output(self, lane: str, pairs: list[Pair], state: Any, *, wait: bool = False) -> None:
        if wait:
            await self._out_slots[lane].acquire()
        try:
            limit = self.sink.limits.get("processed")
            # the processor sizes key + value + headers (agents.process.record_size); framing is ours
            value_limit = None if limit is None else limit - RECORD_OVERHEAD
            t0 = self.clock()
            try:
                outs = await self._call("output", len(pairs),
                                        functools.partial(self.processor.output, max_record_bytes=value_limit), state,
                                        pool=self._pool_of[("output", lane)])
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
            self._send_q.put_nowait([(item, out) for (item, _), out in zip(pairs, outs, strict=True)])
        finally:
            self._out_slots[lane].release()

    async def _send_loop(self) -> None:
        """Coalesce what is ready into one send (one await for the brokers per group, not per record)."""
        while True:
            group = await self._send_q.get()
            while not self._send_q.empty() and len(group) < self.config.max_send_batch:
                group.extend(self._send_q.get_nowait())
            self._spawn(self._deliver([(item, self.observer.sending(self._fit(item, out))) for item, out in group]))

    async def _deliver(self, pending: list[Sent]) -> None:
        """Send until the brokers acknowledged every record: retriable errors are retried within
        ``delivery_timeout_s``; anything else, or running out of time, fail-stops."""
        token = object()
        started = self._delivering[token] = self.clock()
        try:
            while pending:
                results = await self.sink.send_batch([out for _, out in pending])
                retry: list[Sent] = []
                acked: list[Sent] = []
                last: BaseException | None = None
                for sent, err in zip(pending, results, strict=True):
                    if err is None:
                        acked.append(sent)
                    elif self.sink.retriable(err):
                        retry.append(sent)
                        last = err
                    else:
                        raise FatalError(f"output delivery of a {sent[1].kind} record failed: "
                                         f"{type(err).__name__}: {err}") from err
                await self._complete(acked)
                if retry:
                    waited = self.clock() - started
                    if waited >= self.config.delivery_timeout_s:
                        raise FatalError(f"output delivery kept failing for {waited:.0f} s "
                                         f"(delivery_timeout_s={self.config.delivery_timeout_s:g}); "
                                         f"last error: {type(last).__name__}: {last}")
                    self.stats.send_retries += 1
                    log.warning("retrying %d outputs after a retriable error (%s)", len(retry), type(last).__name__)
                    await asyncio.sleep(self.config.retry_backoff_s)
                pending = retry
        finally:
            del self._delivering[token]

    async def _complete(self, sent: list[Sent]) -> None:
        """Outputs the brokers acknowledged: release their inputs' contiguous prefixes, in order."""
        if not sent:
            return
        async with self._ack_lock:
            for item, out in sent:
                if self.failure is not None:
                    return  # fail-stop: acknowledge nothing more
                self.observer.output_acked(out)
                if out.kind == "processed":
                    self.stats.processed += 1
                else:
                    self.stats.dead_letters += 1
                assert item.ticket is not None
                if not self._wm.is_current(item.ticket):  # its partition was revoked meanwhile
                    self._release(item)
                    continue
                for ticket in self._wm.done(item.ticket):
                    await self._ack(ticket.token.event)
                    self._release(ticket.token)
            self.observer.in_flight(self._wm.pending)

    async def _watchdog_loop(self) -> None:
        cfg = self.config
        while True:
            await asyncio.sleep(cfg.watchdog_interval_s)
            now = self.clock()
            for lane, since, size in list(self._busy.values()):
                if now - since > cfg.stage_timeout_s:
                    raise FatalError(f"{lane} lane stuck: one call on {size} items has run for {now - since:.0f} s "
                                     f"(stage_timeout_s={cfg.stage_timeout_s:g})")
            for since in list(self._delivering.values()):
                if now - since > cfg.delivery_timeout_s:
                    raise FatalError(f"output delivery unacknowledged for {now - since:.0f} s "
                                     f"(delivery_timeout_s={cfg.delivery_timeout_s:g})")

    # -- helpers -----------------------------------------------------------------------------
    async def _call(self, lane: str, size: int, fn: Callable[..., R], *args: Any, pool: str | None = None) -> R:
        """``fn(*args)`` in the lane's threads (or ``pool``'s), visible to the watchdog while it runs."""
        token = object()

        def run() -> R:  # the clock starts when a thread picks the call up, not while it queues
            self._busy[token] = (lane, self.clock(), size)
            try:
                return fn(*args)
            finally:
                self._busy.pop(token, None)

        self._calls[lane] += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(self._pools[pool or lane], run)
        finally:
            self._calls[lane] -= 1

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_ended)

    def _task_ended(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self._fail(task.exception())  # type: ignore[arg-type]

    def _lane_ended(self, name: str, task: asyncio.Task[None]) -> None:
        if task.cancelled():
            return
        exc = task.exception()
        self._fail(exc if exc is not None else FatalError(f"the {name} lane ended"), lane=name)

    def _fail(self, exc: BaseException, lane: str | None = None) -> None:
        if self.failure is not None:
            return
        self.failure = exc
        where = f" ({lane} lane crashed)" if lane and not isinstance(exc, FatalError) else ""
        log.critical("lightbox worker fail-stop%s: %s: %s; %d inputs in flight stay uncommitted for the "
                     "partitions' next owner", where, type(exc).__name__, exc, self._wm.pending)
        self.failed.set()
        for task in self._lanes:
            task.cancel()
        if self._on_fatal is not None:
            self._on_fatal(exc)

    def _check(self) -> None:
        if self.failure is not None:
            raise RunnerFailed("the runner fail-stopped") from self.failure

    def _release_dropped(self, dropped: list[Ticket[_Item]]) -> None:
        for ticket in dropped:  # done, waiting for a lower offset: their work is over
            self._release(ticket.token)

    def _release(self, item: _Item) -> None:
        self._held[item.lane] -= 1
        self._lane_slots[item.lane].release()

    def _left_device(self, pairs: Sequence[Pair]) -> None:
        """A batch left the device lane (done, or failed before or in it): the batcher may let the
        next backfill batch go."""
        self.batcher.device_done(pairs)
        self._wake.set()

    def _batch_failed(self, lane: str, pairs: list[Pair], exc: Exception) -> None:
        """A batch-level exception: every item of the batch becomes a PROCESSING_FAILED dead letter."""
        self.stats.batch_failures += 1
        log.error("%s lane: a batch of %d failed with %s; its items go to the dead-letter topic",
                  lane, len(pairs), type(exc).__name__, extra=_log_ids([item.record for item, _ in pairs]))
        err = ProcessingFailed(f"{lane} lane: {type(exc).__name__}: {exc}", stage=lane)
        self._send_q.put_nowait([(item, self._dead_letter(item, err, p.event)) for item, p in pairs])

    def _dead_letter(self, item: _Item, err: LightboxError, event: dict[str, Any] | None = None,
                     rec: InRecord | None = None) -> OutRecord:
        try:
            return self.processor.dead_letter(rec or item.record, err, event)
        except Exception as exc:
            raise FatalError(f"cannot build a dead letter ({type(exc).__name__}: {exc})") from exc

    def _fit(self, item: _Item, out: OutRecord) -> OutRecord:
        """Never attempt a record the topic would refuse: an oversized output becomes an
        OUTPUT_TOO_LARGE dead letter; a dead letter still too large leaves the original value out
        (the input topic keeps it at the offset the dead letter names)."""
        limit = self.sink.limits.get(out.kind)
        size = record_size(out)
        if limit is None or size <= limit:
            return out
        what = "processed event" if out.kind == "processed" else "dead letter"
        message = f"{what} of {size} bytes exceeds its topic's limit of {limit} bytes"
        dlq_limit = self.sink.limits.get("dead_letter")
        for rec in (item.record, dataclasses.replace(item.record, value=None)):
            if rec.value is None and item.record.value is not None:
                message += f"; the original value ({len(item.record.value)} bytes) is left out"
            try:
                dead = self._dead_letter(item, OutputTooLarge(message, stage="output"), item.parsed, rec=rec)
            except FatalError as exc:
                if not isinstance(exc.__cause__, SchemaInvalid):
                    raise
                dead = self._dead_letter(item, ProcessingFailed(message, stage="output"), item.parsed, rec=rec)
            if dlq_limit is None or record_size(dead) <= dlq_limit:
                log.error("%s:%d:%d: %s", item.record.topic, item.record.partition, item.record.offset, message,
                          extra=_log_ids([item.record]))
                return dead
        raise FatalError(f"a dead letter for {item.record.topic}:{item.record.partition}:{item.record.offset} "
                         f"exceeds the dead-letter topic's limit of {dlq_limit} bytes even without its value")
