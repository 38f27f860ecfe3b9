"""The backfill tier's consumer: its own aiokafka consumer (group ``<group_id>.backfill``), not a
second Faust agent.

Why not a Faust agent: in faust-streaming 0.15.3 all agents share one consumer whose conductor
waits, for every topic, while any one agent's buffer is full; a backfill agent that takes only
spare capacity fills its buffer and so holds up live records (docs/backfills.md has the
measurement). And Faust's ``pause_partitions`` filters records already fetched against the
paused set after the position moved past them, so they are lost to the stream. aiokafka's own
``pause`` keeps the position, and a consumer of its own pulls only what the runner has room for.

The loop, every ``backfill_check_ms``: live work is about while it is queued in the worker or the
live lag is over ``backfill_max_live_lag`` (:func:`agents.tiers.pause_backfill`); the
:class:`~agents.tiers.BackfillGate` then says how many more backfill inputs the worker may hold
(``backfill_busy_in_flight`` while live work is about or was within ``backfill_idle_ms``, else
``backfill_in_flight``). With no room the backfill partitions are paused, else resumed and at most
that many records pulled (polling even while paused, so the group keeps the consumer).

Offsets: the runner acknowledges an input only when it and every lower offset of its partition
are done (the watermark), so the highest acknowledged offset + 1 is committed, every second and
on revoke.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agents.records import InRecord
from agents.tiers import BACKFILL, BackfillGate, pause_backfill
from streams.security import aiokafka_kwargs
from streams.settings import BackfillSettings, KafkaSettings

__all__ = ["BackfillConsumer", "BackfillEvent"]

log = logging.getLogger(__name__)

#: bytes the backfill consumer asks of one partition per fetch (small on purpose: see BackfillConsumer.run)
FETCH_BYTES = 256 << 10


@dataclass(eq=False, slots=True)
class BackfillEvent:
    """What the runner hands back to :meth:`BackfillConsumer.ack` (in place of a Faust event)."""

    topic: str
    partition: int
    offset: int


class BackfillConsumer:
    """See the module docstring. ``runner()`` is the runner this consumer feeds (None until it
    started); ``live_work()`` the worker's live work: ``(queued, lag)``, live inputs queued in the
    worker and live records waiting in the brokers (:attr:`agents.worker.LightboxWorker.live_work`;
    in a backfill process, what its worker shares: :class:`agents.backfill_process.LiveSignal`)."""

    def __init__(self, kafka: KafkaSettings, backfill: BackfillSettings, *, topic: str, client_id: str,
                 runner: Callable[[], Any], live_work: Callable[[], tuple[int, int]],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.kafka, self.backfill, self.topic, self.client_id = kafka, backfill, topic, client_id
        self._runner, self._live_work = runner, live_work
        self.gate = BackfillGate(idle_s=backfill.idle_ms / 1000, busy_cap=backfill.busy_in_flight,
                                 clock=clock)
        self.group_id = f"{kafka.group_id}.backfill"
        self.pauses = 0
        self._acked: dict[Any, int] = {}  # TopicPartition -> next offset to commit
        self._committed: dict[Any, int] = {}
        self._consumer: Any = None

    def ack(self, event: BackfillEvent) -> None:
        from aiokafka import TopicPartition

        tp = TopicPartition(event.topic, event.partition)
        self._acked[tp] = max(self._acked.get(tp, 0), event.offset + 1)

    async def commit(self, tps: Any = None) -> None:
        consumer = self._consumer
        if consumer is None:
            return
        assigned = consumer.assignment()
        todo = {tp: off for tp, off in self._acked.items()
                if tp in assigned and (tps is None or tp in tps) and self._committed.get(tp) != off}
        if not todo:
            return
        try:
            await consumer.commit(todo)
        except Exception as exc:  # a rebalance under way: the next owner redoes those (same outputs)
            log.warning("backfill tier: commit failed (%s); uncommitted inputs will be processed again",
                        type(exc).__name__)
            return
        self._committed.update(todo)

    async def lag(self) -> dict[tuple[str, int], int]:
        """Backfill records waiting in the brokers, per partition this worker holds: log end offset
        (asked of the brokers, so a paused partition's backlog counts too) minus the position."""
        consumer = self._consumer
        if consumer is None:
            return {}
        assigned = consumer.assignment()
        try:
            ends = await consumer.end_offsets(list(assigned)) if assigned else {}
        except Exception:  # a rebalance or a broker away: next round
            return {}
        out: dict[tuple[str, int], int] = {}
        for tp, end in ends.items():
            try:
                pos = await consumer.position(tp)
            except Exception:  # moved away meanwhile
                continue
            out[(tp.topic, tp.partition)] = max(0, end - pos)
        return out

    async def run(self) -> None:
        from aiokafka import ConsumerRebalanceListener

        from streams.clients import new_consumer

        kafka, backfill = self.kafka, self.backfill
        outer = self

        class Listener(ConsumerRebalanceListener):  # type: ignore[misc]
            async def on_partitions_revoked(self, revoked: Any) -> None:
                await outer.commit(set(revoked))
                runner = outer._runner()
                if runner is not None:
                    runner.revoke((tp.topic, tp.partition) for tp in revoked)
                for tp in revoked:
                    outer._acked.pop(tp, None)
                    outer._committed.pop(tp, None)

            async def on_partitions_assigned(self, assigned: Any) -> None:
                pass

        consumer = self._consumer = await new_consumer(
            kafka.bootstrap, security=aiokafka_kwargs(kafka), group_id=self.group_id, client_id=self.client_id,
            # small fetches: a paused partition's fetched records are dropped and fetched again on
            # resume (aiokafka), and the loop pauses and resumes many times a second; the brokers
            # still return a first record larger than this whole (Kafka's KIP-74), so inline images pass
            max_partition_fetch_bytes=FETCH_BYTES, fetch_max_bytes=4 * FETCH_BYTES,
            session_timeout_ms=int(kafka.session_timeout_s * 1000),
            heartbeat_interval_ms=int(min(3.0, kafka.session_timeout_s / 3) * 1000))
        consumer.subscribe([self.topic], listener=Listener())
        await consumer.start()
        paused, last_commit = False, asyncio.get_running_loop().time()
        try:
            while True:
                runner = self._runner()
                assigned = consumer.assignment()
                room = 0
                if runner is not None:
                    free, limit = runner.free_slots(BACKFILL), runner.config.backfill_in_flight
                    queued, lag = self._live_work()
                    live_active = pause_backfill(queued, lag, backfill.max_live_lag)
                    room = min(free, self.gate.room(live_active, held=limit - free, limit=limit))
                pause = room == 0
                if pause and assigned:
                    consumer.pause(*assigned)
                elif assigned:
                    consumer.resume(*assigned)
                if pause != paused:
                    self.pauses += pause
                paused = pause
                # a poll even while paused keeps the group membership (max.poll.interval.ms)
                batch = await consumer.getmany(timeout_ms=int(backfill.check_ms), max_records=max(1, room))
                for records in batch.values():
                    for r in records:
                        rec = InRecord(topic=r.topic, partition=r.partition, offset=r.offset, value=r.value,
                                       key=r.key, headers=[(k, None if v is None else bytes(v))
                                                           for k, v in (r.headers or ())],
                                       timestamp_ms=r.timestamp)
                        assert runner is not None
                        await runner.submit(BackfillEvent(r.topic, r.partition, r.offset), rec, tier=BACKFILL)
                now = asyncio.get_running_loop().time()
                if now - last_commit >= 1.0:
                    last_commit = now
                    await self.commit()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("backfill tier: the consumer loop failed")
            raise

    async def close(self) -> None:
        """Commit what the runner acknowledged and leave the group (after the runner drained)."""
        consumer = self._consumer
        if consumer is None:
            return
        with contextlib.suppress(Exception):
            await self.commit()
        self._consumer = None
        await consumer.stop()
