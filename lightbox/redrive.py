"""``lightbox redrive``: after a fix, republish dead letters to the input topic.

Reads the dead-letter topic (no consumer group, nothing committed) up to its end at the start,
keeps the dead letters that match the filters (error codes, a time range on ``failed_at``, the
original's topic, fewer than ``max_attempts`` attempts) and republishes each one's original
record — value, key and headers as they were — with two headers set:

- ``lightbox-attempts``: the dead letter's ``attempts`` + 1. The worker's dead-letter builder
  reads it, so an input that fails again shows the new count.
- ``lightbox-redrive-of``: ``topic:partition:offset`` of the dead letter it came from.

A dead letter whose original value was left out (it was too large for the dead-letter topic)
cannot be redriven from the dead letter; it is counted and named (the original still sits in its
topic at the offset the dead letter gives — replay that range instead).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator, Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from schemas.events import EventCodecs
from schemas.headers import ATTEMPTS_HEADER
from streams import clients
from streams.registry import default_codecs

__all__ = ["ATTEMPTS_HEADER", "REDRIVE_OF_HEADER", "RedriveFilter", "RedriveResult", "dead_letters", "run_redrive"]

REDRIVE_OF_HEADER = "lightbox-redrive-of"


@dataclass(frozen=True, slots=True)
class RedriveFilter:
    """Which dead letters to redrive; ``None`` or empty: any."""

    codes: frozenset[str] = frozenset()
    since_ms: int | None = None
    until_ms: int | None = None  # exclusive
    source_topic: str | None = None
    max_attempts: int = 5  # a dead letter with this many attempts stays (a poison input)

    def why_not(self, dead: Mapping[str, Any]) -> str | None:
        """Why ``dead`` is left out, or None when it is to be redriven."""
        if self.codes and dead["error_code"] not in self.codes:
            return "code"
        failed_at = _ms(dead["failed_at"])
        if self.since_ms is not None and failed_at < self.since_ms:
            return "time"
        if self.until_ms is not None and failed_at >= self.until_ms:
            return "time"
        if self.source_topic is not None and dead["original"]["topic"] != self.source_topic:
            return "topic"
        if int(dead["attempts"]) >= self.max_attempts:
            return "max_attempts"
        if dead["original"]["value"] is None:
            return "no_value"
        return None


def _ms(value: Any) -> int:
    return int(value.timestamp() * 1000) if hasattr(value, "timestamp") else int(value)


@dataclass
class RedriveResult:
    read: int = 0
    redriven: int = 0
    by_code: Counter[str] = field(default_factory=Counter)
    left_out: Counter[str] = field(default_factory=Counter)  # reason -> count
    no_value: list[str] = field(default_factory=list)  # positions of originals that must be replayed instead
    dry_run: bool = False


async def dead_letters(bootstrap: str, topic: str, *, since_ms: int | None = None,
                       security: Mapping[str, Any] | None = None,
                       codecs: EventCodecs | None = None) -> AsyncIterator[tuple[str, dict[str, Any]]]:
    """``(position, dead letter)`` for every record of ``topic`` from ``since_ms`` (record time) to
    the end as it is now. A record that is not a dead letter is skipped."""
    from aiokafka import TopicPartition

    from schemas.errors import SchemaInvalid
    from streams.clients import topic_partitions

    codecs = codecs or default_codecs()
    parts = (await topic_partitions(bootstrap, [topic], security)).get(topic)
    if not parts:
        return
    async with clients.consumer(bootstrap, security=security) as consumer:
        tps = [TopicPartition(topic, p) for p in sorted(parts)]
        ends = await consumer.end_offsets(tps)
        starts = await consumer.beginning_offsets(tps)
        if since_ms is not None:
            found = await consumer.offsets_for_times({tp: since_ms for tp in tps})
            starts = {tp: (found[tp].offset if found.get(tp) is not None else ends[tp]) for tp in tps}
        todo = [tp for tp in tps if starts[tp] < ends[tp]]
        if not todo:
            return
        consumer.assign(todo)
        for tp in todo:
            consumer.seek(tp, starts[tp])
        while todo:
            batch = await consumer.getmany(*todo, timeout_ms=500, max_records=500)
            for tp, records in batch.items():
                for r in records:
                    if r.offset >= ends[tp] or r.value is None:
                        continue
                    try:
                        yield f"{tp.topic}:{tp.partition}:{r.offset}", codecs.dead_letter.decode(r.value)
                    except SchemaInvalid:
                        continue
            todo = [tp for tp in todo if await consumer.position(tp) < ends[tp]]


async def run_redrive(bootstrap: str, dlq_topic: str, input_topic: str, flt: RedriveFilter, *,
                      dry_run: bool = False, security: Mapping[str, Any] | None = None,
                      on_progress: Callable[[int, int], None] | None = None) -> RedriveResult:
    """Republish the matching dead letters' originals to ``input_topic`` (see the module docstring)."""
    from streams.clients import new_producer

    result = RedriveResult(dry_run=dry_run)
    producer = None
    if not dry_run:
        producer = await new_producer(bootstrap, security)
        await producer.start()
    futures = []
    try:
        # a little before since: a dead letter's record time follows its failed_at
        since = None if flt.since_ms is None else flt.since_ms - 60_000
        async for where, dead in dead_letters(bootstrap, dlq_topic, since_ms=since, security=security):
            result.read += 1
            why = flt.why_not(dead)
            if why is not None:
                result.left_out[why] += 1
                if why == "no_value":
                    result.no_value.append(f"{dead['original']['topic']}:{dead['original']['partition']}:"
                                           f"{dead['original']['offset']}")
                continue
            result.redriven += 1
            result.by_code[dead["error_code"]] += 1
            if producer is None:
                continue
            original = dead["original"]
            headers = [(h["key"], h["value"] or b"") for h in original["headers"]
                       if h["key"] not in (ATTEMPTS_HEADER, REDRIVE_OF_HEADER)]
            headers += [(ATTEMPTS_HEADER, str(int(dead["attempts"]) + 1).encode()),
                        (REDRIVE_OF_HEADER, where.encode())]
            futures.append(await producer.send(input_topic, original["value"], key=original["key"], headers=headers))
            if on_progress is not None:
                on_progress(result.redriven, result.read)
        if futures:
            await asyncio.gather(*futures)
    finally:
        if producer is not None:
            await producer.stop()
    return result


def parse_codes(text: str | None, known: Collection[str]) -> frozenset[str]:
    codes = frozenset(c.strip().upper() for c in (text or "").split(",") if c.strip())
    unknown = sorted(codes - set(known))
    if unknown:
        raise ValueError(f"unknown error code(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    return codes
