"""Drives a :class:`~agents.batching.MicroBatcher` and a :class:`~agents.process.BatchProcessor`
from an asyncio loop: events in, batches to the device thread, outputs to Kafka, acks back.

Delivery (DESIGN.md): an input is acknowledged to Faust — and so becomes committable — only
after its processed event or dead letter is acknowledged by the brokers (acks=all, idempotent
producer). Bounded in flight: at most ``max_in_flight`` inputs are held; past that ``submit``
waits, the agent stops pulling, and Faust pauses the partitions' fetch.

Double buffering: while the device thread finishes batch N (segment, retouch, render, encode),
the decode thread decodes batch N+1 and the event loop keeps fetching and filling the batcher;
at most one closed batch waits for decode and one decoded batch waits for the device.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

from agents.batching import Batch, MicroBatcher
from agents.process import BatchProcessor, InRecord, OutRecord, Prepared

__all__ = ["BatchRunner", "OutputSink", "RunnerStats"]

log = logging.getLogger(__name__)

Ack = Callable[[Any], Awaitable[Any]]


class OutputSink(Protocol):
    """Where outputs go: ``send`` queues one record and returns an awaitable broker ack."""

    async def start(self) -> None: ...
    async def send(self, kind: str, out: OutRecord) -> Awaitable[Any]: ...
    async def stop(self) -> None: ...


@dataclass
class RunnerStats:
    processed: int = 0
    dead_letters: int = 0
    batches: int = 0
    batch_items: int = 0


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


class BatchRunner:
    def __init__(self, processor: BatchProcessor, sink: OutputSink, batcher: MicroBatcher[Any], *,
                 max_in_flight: int = 64, clock: Callable[[], float] = time.monotonic) -> None:
        self.processor, self.sink, self.batcher, self.clock = processor, sink, batcher, clock
        self.stats = RunnerStats()
        self._slots = asyncio.Semaphore(max_in_flight)
        self._ready: asyncio.Queue[Batch[tuple[Prepared, Any, Ack]]] = asyncio.Queue(maxsize=1)
        self._decoded: asyncio.Queue[tuple[Sequence[tuple[Prepared, Any, Ack]], Any, float]] = asyncio.Queue(maxsize=1)
        self._wake = asyncio.Event()
        self._device = ThreadPoolExecutor(1, thread_name_prefix="lightbox-device")
        self._decoder = ThreadPoolExecutor(1, thread_name_prefix="lightbox-decode")
        self._io = ThreadPoolExecutor(2, thread_name_prefix="lightbox-io")
        self._tasks: list[asyncio.Task[None]] = []
        self._sends: set[asyncio.Task[None]] = set()
        self._failure: BaseException | None = None

    async def start(self) -> None:
        await self.sink.start()
        self._tasks = [asyncio.create_task(self._timer_loop(), name="lightbox-batch-timer"),
                       asyncio.create_task(self._decode_loop(), name="lightbox-decode-loop"),
                       asyncio.create_task(self._device_loop(), name="lightbox-device-loop")]

    async def submit(self, event: Any, ack: Ack) -> None:
        """Take one consumed event; returns once it is queued (waits while the worker is full)."""
        if self._failure is not None:
            raise RuntimeError("output delivery failed; refusing new input") from self._failure
        await self._slots.acquire()
        loop = asyncio.get_running_loop()
        prepared = await loop.run_in_executor(self._io, self.processor.prepare, record_of(event))
        if isinstance(prepared, OutRecord):
            self._spawn_send([(prepared, event, ack)])
            return
        closed = self.batcher.add((prepared, event, ack), prepared.shape_class, self.clock(),
                                  nbytes=prepared.nbytes)
        for batch in closed:
            await self._ready.put(batch)
        self._wake.set()

    async def _timer_loop(self) -> None:
        while True:
            deadline = self.batcher.next_deadline()
            timeout = None if deadline is None else max(0.0, deadline - self.clock())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout)
            self._wake.clear()
            for batch in self.batcher.poll(self.clock()):
                await self._ready.put(batch)

    async def _decode_loop(self) -> None:
        while True:
            batch = await self._ready.get()
            await self._decoded.put(await self._decode(batch.items))

    async def _device_loop(self) -> None:
        while True:
            await self._finish(*await self._decoded.get())

    async def _decode(self, items: Sequence[tuple[Prepared, Any, Ack]]) -> tuple[Sequence[Any], Any, float]:
        loop = asyncio.get_running_loop()
        t0 = self.clock()
        decoded = await loop.run_in_executor(self._decoder, self.processor.decode, [p for p, _, _ in items])
        return items, decoded, self.clock() - t0

    async def _finish(self, items: Sequence[tuple[Prepared, Any, Ack]], decoded: Any, decode_s: float) -> None:
        loop = asyncio.get_running_loop()
        t0 = self.clock()
        outs = await loop.run_in_executor(self._device, self.processor.finish, [p for p, _, _ in items], decoded)
        # the batch's service time: its decode plus its device work (they overlap other batches)
        self.batcher.record_service(len(items), decode_s + self.clock() - t0)
        self._wake.set()  # a new service estimate can move deadlines
        self.stats.batches += 1
        self.stats.batch_items += len(items)
        self._spawn_send([(o, ev, ack) for o, (_, ev, ack) in zip(outs, items, strict=True)])

    def _spawn_send(self, outs: list[tuple[OutRecord, Any, Ack]]) -> None:
        task = asyncio.create_task(self._send_and_ack(outs))
        self._sends.add(task)
        task.add_done_callback(self._sends.discard)

    async def _send_and_ack(self, outs: list[tuple[OutRecord, Any, Ack]]) -> None:
        try:
            acks = [await self.sink.send(o.kind, o) for o, _, _ in outs]
            await asyncio.gather(*acks)
        except Exception as exc:  # not acked: these inputs stay uncommitted and are redelivered
            log.error("output delivery failed, %d inputs left unacknowledged: %r", len(outs), exc)
            self._failure = exc
            return
        for out, event, ack in outs:
            await ack(event)
            if out.kind == "processed":
                self.stats.processed += 1
            else:
                self.stats.dead_letters += 1
            self._slots.release()

    async def drain(self, timeout_s: float = 30.0) -> None:
        """Graceful stop: run what the batcher and the queues hold, wait for their outputs.

        A batch caught inside the decode or device thread at this moment is not waited for: its
        inputs stay unacknowledged, so the partition's next owner processes them again (same
        event ids and bytes)."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        decoded = []
        while not self._decoded.empty():
            decoded.append(self._decoded.get_nowait())
        pending = []
        while not self._ready.empty():
            pending.append(self._ready.get_nowait())
        pending.extend(self.batcher.flush())
        try:
            async with asyncio.timeout(timeout_s):
                for args in decoded:
                    await self._finish(*args)
                for batch in pending:
                    await self._finish(*await self._decode(batch.items))
                if self._sends:
                    await asyncio.gather(*list(self._sends), return_exceptions=True)
        except TimeoutError:
            log.warning("drain timed out; unacknowledged inputs will be redelivered")

    async def stop(self) -> None:
        await self.sink.stop()
        self._device.shutdown(wait=False, cancel_futures=True)
        self._decoder.shutdown(wait=False, cancel_futures=True)
        self._io.shutdown(wait=False, cancel_futures=True)
        self.processor.pipeline.close()
