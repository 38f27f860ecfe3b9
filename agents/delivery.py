"""The runner's way out: coalesced sends, retries, acknowledgements in offset order, and records
fitted to their topics' size limits. Why this order makes delivery at-least-once without ever
committing past a lost input: the top of :mod:`agents.runner`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from agents.intake import Intake, Item, Pair, Sent, log_ids
from agents.interfaces import Ack, OutputSink, Processor, RunnerConfig, RunnerObserver, RunnerStats
from agents.records import InRecord, OutRecord, over_limit
from agents.supervision import Supervisor
from agents.watermark import Ticket, Watermarks
from schemas.errors import FatalError, LightboxError, OutputTooLarge, ProcessingFailed, SchemaInvalid

__all__ = ["Delivery"]

log = logging.getLogger("agents.runner")  # one logger for the runner and its helpers


class Delivery:
    """Outputs to the brokers and acknowledgements back. :meth:`put` queues a group of outputs;
    :meth:`loop` coalesces what is queued into one send of at most ``max_send_batch`` records;
    each send is retried (retriable errors) until every record is acknowledged — brokers that
    keep failing are a dependency that is down (:mod:`agents.dependencies`), waited for without
    end — and each acknowledged output releases its input's contiguous done prefix
    (:class:`~agents.watermark.Watermarks`) to ``ack``, in offset order, under one lock."""

    #: the dependency's name in logs and ``/readyz``
    BROKERS = "the Kafka brokers"

    def __init__(self, sink: OutputSink, processor: Processor, *, ack: Ack, config: RunnerConfig,
                 watermarks: Watermarks[Item], intake: dict[str, Intake], supervisor: Supervisor,
                 stats: RunnerStats, clock: Callable[[], float], observer: RunnerObserver,
                 spawn: Callable[[Coroutine[Any, Any, None]], None]) -> None:
        self.sink, self.processor, self.config, self.clock = sink, processor, config, clock
        self.observer = observer
        self._ack, self._wm, self._intake = ack, watermarks, intake
        self._sup, self._stats, self._spawn = supervisor, stats, spawn
        self._queue: asyncio.Queue[list[Sent]] = asyncio.Queue()  # bounded by the inputs held
        self._ack_lock = asyncio.Lock()

    def put(self, sent: list[Sent]) -> None:
        self._queue.put_nowait(sent)

    async def loop(self) -> None:
        """Coalesce what is ready into one send (one await for the brokers per group, not per record)."""
        while True:
            group = await self._queue.get()
            while not self._queue.empty() and len(group) < self.config.max_send_batch:
                group.extend(self._queue.get_nowait())
            self._spawn(self._deliver([(item, self.observer.sending(self.fit(item, out))) for item, out in group]))

    async def probe(self) -> None:
        """Every ``probe_interval_s``: ask the brokers whether they answer (:meth:`OutputSink.reachable`),
        so that ``/readyz`` and intake follow a broker link that is down even while nothing is sent."""
        deps = self._sup.dependencies
        while True:
            await asyncio.sleep(self.config.probe_interval_s)
            try:
                answered = await self.sink.reachable(self.config.probe_timeout_s)
                why = "no answer"
            except Exception as exc:  # a probe that breaks says "not ready", never ends the worker
                answered, why = False, f"probe failed: {type(exc).__name__}"
            if answered:
                deps.reached(self.BROKERS)
            else:
                deps.failed(self.BROKERS, why)

    async def _deliver(self, pending: list[Sent]) -> None:
        """Send until the brokers acknowledged every record. A retriable error is retried after
        ``retry_backoff_s``; a second one in a row makes the brokers a dependency that is down
        (intake pauses, ``/readyz`` says so) and retries follow its capped backoff until a send is
        acknowledged. A refusal (fenced, too large, denied) fail-stops."""
        token = object()
        self._sup.delivering[token] = self.clock()
        deps = self._sup.dependencies
        failures = 0
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
                if acked:
                    deps.reached(self.BROKERS)
                await self._complete(acked)
                if retry:
                    failures += 1
                    self._stats.send_retries += 1
                    if failures == 1:
                        log.warning("retrying %d outputs after a retriable error (%s)", len(retry),
                                    type(last).__name__)
                        delay = self.config.retry_backoff_s
                    else:
                        delay = deps.failed(self.BROKERS, type(last).__name__)
                    await asyncio.sleep(delay)
                pending = retry
        finally:
            del self._sup.delivering[token]

    async def _complete(self, sent: list[Sent]) -> None:
        """Outputs the brokers acknowledged: release their inputs' contiguous prefixes, in order."""
        if not sent:
            return
        async with self._ack_lock:
            for item, out in sent:
                if self._sup.failure is not None:
                    return  # fail-stop: acknowledge nothing more
                self.observer.output_acked(out)
                if out.kind == "processed":
                    self._stats.processed += 1
                else:
                    self._stats.dead_letters += 1
                assert item.ticket is not None
                if not self._wm.is_current(item.ticket):  # its partition was revoked meanwhile
                    self.release(item)
                    continue
                for ticket in self._wm.done(item.ticket):
                    await self._ack(ticket.token.event)
                    self.release(ticket.token)
            self.observer.in_flight(self._wm.pending)

    def release(self, item: Item) -> None:
        """An input's work is over: its tier may take another, and the item lets go of its ticket.
        The two refer to each other (``item.ticket``, ``ticket.token``): left so, a released input's
        record and decoded event live on as cyclic garbage until a full collection, which after a
        backlog comes only hundreds of inputs later (measured: 440 released inputs, ~40 MiB of
        records, still held after a drain)."""
        item.ticket = None
        self._intake[item.tier].release()

    def release_dropped(self, dropped: list[Ticket[Item]]) -> None:
        for ticket in dropped:  # done, waiting for a lower offset: their work is over
            self.release(ticket.token)

    def batch_failed(self, lane: str, pairs: list[Pair], exc: Exception) -> None:
        """A batch-level exception: every item of the batch becomes a PROCESSING_FAILED dead letter."""
        self._stats.batch_failures += 1
        log.error("%s lane: a batch of %d failed with %s; its items go to the dead-letter topic",
                  lane, len(pairs), type(exc).__name__, extra=log_ids([item.record for item, _ in pairs]))
        err = ProcessingFailed(f"{lane} lane: {type(exc).__name__}: {exc}", stage=lane)
        self.put([(item, self.dead_letter(item, err, p.event)) for item, p in pairs])

    def dead_letter(self, item: Item, err: LightboxError, event: dict[str, Any] | None = None,
                    rec: InRecord | None = None) -> OutRecord:
        """The dead letter of ``item`` (or of ``rec``); a processor that cannot build one fail-stops."""
        try:
            return self.processor.dead_letter(rec or item.record, err, event)
        except Exception as exc:
            raise FatalError(f"cannot build a dead letter ({type(exc).__name__}: {exc})") from exc

    def fit(self, item: Item, out: OutRecord) -> OutRecord:
        """Never attempt a record the topic would refuse: an oversized output becomes an
        OUTPUT_TOO_LARGE dead letter; a dead letter still too large leaves the original value out
        (the input topic keeps it at the offset the dead letter names)."""
        limit = self.sink.limits.get(out.kind)
        size = over_limit(out, limit)
        if size is None:
            return out
        what = "processed event" if out.kind == "processed" else "dead letter"
        message = f"{what} of {size} bytes exceeds its topic's limit of {limit} bytes"
        dlq_limit = self.sink.limits.get("dead_letter")
        for rec in (item.record, dataclasses.replace(item.record, value=None)):
            if rec.value is None and item.record.value is not None:
                message += f"; the original value ({len(item.record.value)} bytes) is left out"
            try:
                dead = self.dead_letter(item, OutputTooLarge(message, stage="output"), item.parsed, rec=rec)
            except FatalError as exc:
                if not isinstance(exc.__cause__, SchemaInvalid):
                    raise
                dead = self.dead_letter(item, ProcessingFailed(message, stage="output"), item.parsed, rec=rec)
            if over_limit(dead, dlq_limit) is None:
                log.error("%s:%d:%d: %s", item.record.topic, item.record.partition, item.record.offset, message,
                          extra=log_ids([item.record]))
                return dead
        raise FatalError(f"a dead letter for {item.record.topic}:{item.record.partition}:{item.record.offset} "
                         f"exceeds the dead-letter topic's limit of {dlq_limit} bytes even without its value")
