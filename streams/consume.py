"""Reading lightbox's output and dead-letter topics (the `tail` command, the demo, tests)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from aiokafka.structs import TopicPartition

from schemas.codec import record_name, split_frame
from schemas.errors import SchemaInvalid
from schemas.events import EventCodecs
from streams import clients
from streams.registry import default_codecs

__all__ = ["RawRecord", "read_events", "read_records"]


def decode_any(codecs: EventCodecs, value: bytes) -> tuple[str, dict[str, Any]]:
    """``("processed" | "dead_letter" | "product", record)`` by the schema the record names."""
    schema_id, _ = split_frame(value)
    name = record_name(codecs.store.parsed(schema_id))
    for kind, codec in (("processed", codecs.processed), ("dead_letter", codecs.dead_letter),
                        ("product", codecs.product)):
        if name == codec.reader_name:
            return kind, codec.decode(value)
    raise SchemaInvalid(f"schema id {schema_id} ({name}) is not a lightbox event", stage="tail")


async def read_events(bootstrap: str, topics: Sequence[str], *, from_beginning: bool = True,
                      limit: int | None = None, idle_s: float | None = None,
                      codecs: EventCodecs | None = None,
                      security: Mapping[str, Any] | None = None) -> AsyncIterator[tuple[str, dict[str, Any]]]:
    """Decoded events from every partition of ``topics`` (no consumer group, nothing committed).

    Stops after ``limit`` events, or ``idle_s`` seconds without one. ``security``: aiokafka keyword
    arguments (``streams.security.aiokafka_kwargs``); from the ``LIGHTBOX_KAFKA_*`` environment when ``None``."""
    codecs = codecs or default_codecs()
    # No group: the consumer reads every partition of the topics (and picks up topics that
    # appear later), from the start or the end, and commits nothing.
    consumer = await clients.new_consumer(bootstrap, *topics, security=security,
                                          auto_offset_reset="earliest" if from_beginning else "latest",
                                          metadata_max_age_ms=2000)
    await consumer.start()
    try:
        seen, last = 0, time.monotonic()
        while limit is None or seen < limit:
            batch = await consumer.getmany(timeout_ms=200, max_records=100)
            if not batch:
                if idle_s is not None and time.monotonic() - last > idle_s:
                    return
                continue
            last = time.monotonic()
            for records in batch.values():
                for r in records:
                    yield decode_any(codecs, r.value)
                    seen += 1
                    if limit is not None and seen >= limit:
                        return
    finally:
        await consumer.stop()


@dataclass(frozen=True, slots=True)
class RawRecord:
    """One record as the log holds it (value undecoded)."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...]


async def read_records(bootstrap: str, topics: Sequence[str], *, from_offset: int | None = None,
                       to_offset: int | None = None, since_ms: int | None = None,
                       until_ms: int | None = None, security: Mapping[str, Any] | None = None) -> list[RawRecord]:
    """Every record of ``topics`` (all partitions) in a range, read up to the log end as it was
    when the read began (no consumer group, nothing committed; a missing topic reads as empty).

    Offsets ``[from_offset, to_offset)`` apply to each partition; ``[since_ms, until_ms)`` to
    record timestamps (the read starts at the first offset at or after ``since_ms``). ``security``
    as for :func:`read_events`."""
    found = await clients.topic_partitions(bootstrap, topics, security)
    tps = [TopicPartition(t, p) for t in topics for p in found.get(t, [])]
    if not tps:
        return []
    consumer = await clients.new_consumer(bootstrap, security=security)
    await consumer.start()
    try:
        consumer.assign(tps)
        first = await consumer.beginning_offsets(tps)
        ends = await consumer.end_offsets(tps)
        starts = {tp: max(first[tp], from_offset or 0) for tp in tps}
        if since_ms is not None:
            found = await consumer.offsets_for_times({tp: since_ms for tp in tps})
            starts = {tp: max(starts[tp], ends[tp] if found[tp] is None else found[tp].offset) for tp in tps}
        if to_offset is not None:
            ends = {tp: min(ends[tp], to_offset) for tp in tps}
        todo = {tp for tp in tps if starts[tp] < ends[tp]}
        for tp in tps:
            consumer.seek(tp, starts[tp])
        out: list[RawRecord] = []
        while todo:
            batch = await consumer.getmany(*todo, timeout_ms=500, max_records=500)
            for tp, records in batch.items():
                for r in records:
                    if r.offset >= ends[tp] or (until_ms is not None and r.timestamp >= until_ms):
                        continue
                    if since_ms is not None and r.timestamp < since_ms:
                        continue
                    out.append(RawRecord(r.topic, r.partition, r.offset, r.timestamp, r.key, r.value,
                                         tuple((k, bytes(v or b"")) for k, v in r.headers)))
            for tp in list(todo):
                if await consumer.position(tp) >= ends[tp]:
                    todo.discard(tp)
        return out
    finally:
        await consumer.stop()
