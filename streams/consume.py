"""Reading lightbox's output and dead-letter topics (the `tail` command, the demo, tests)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

from aiokafka import AIOKafkaConsumer

from schemas.codec import split_frame
from schemas.errors import SchemaInvalid
from schemas.events import EventCodecs
from streams.security import client_kwargs, preflight

__all__ = ["read_events"]


def decode_any(codecs: EventCodecs, value: bytes) -> tuple[str, dict[str, Any]]:
    """``("processed" | "dead_letter" | "product", record)`` by the schema the record names."""
    schema_id, _ = split_frame(value)
    name = codecs.store.parsed(schema_id).get("name", "")
    for kind, codec in (("processed", codecs.processed), ("dead_letter", codecs.dead_letter),
                        ("product", codecs.product)):
        if name.endswith(codec.subject):
            return kind, codec.decode(value)
    raise SchemaInvalid(f"schema id {schema_id} ({name}) is not a lightbox event", stage="tail")


async def read_events(bootstrap: str, topics: Sequence[str], *, from_beginning: bool = True,
                      limit: int | None = None, idle_s: float | None = None,
                      codecs: EventCodecs | None = None,
                      security: Mapping[str, Any] | None = None) -> AsyncIterator[tuple[str, dict[str, Any]]]:
    """Decoded events from every partition of ``topics`` (no consumer group, nothing committed).

    Stops after ``limit`` events, or ``idle_s`` seconds without one. ``security``: aiokafka keyword
    arguments (``streams.security.aiokafka_kwargs``); from the ``LIGHTBOX_KAFKA_*`` environment when ``None``."""
    codecs = codecs or EventCodecs.create()
    # No group: the consumer reads every partition of the topics (and picks up topics that
    # appear later), from the start or the end, and commits nothing.
    await preflight(bootstrap, kw := client_kwargs(security))
    consumer = AIOKafkaConsumer(*topics, **kw, bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                                auto_offset_reset="earliest" if from_beginning else "latest",
                                max_partition_fetch_bytes=64 << 20, fetch_max_bytes=128 << 20,
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
