"""What goes out: the records a worker produces and how they are kept within their topics' size.
Pure: builds event bodies and plans which variants leave the event for the object store; it
performs no I/O (the processor, :mod:`agents.process`, does the fetches and the store writes this
module plans) and imports no Kafka client.

The record-size policy lives here, in one place:

* a processed event's *value budget* is its topic's ``max.message.bytes`` less the framing
  (:func:`value_limit`); the processor keeps key + value + headers within it by moving variants
  out of line, largest first (:func:`shrink_order`), or turns the event into an
  ``OUTPUT_TOO_LARGE`` dead letter when no store is set or that is not enough;
* before a send, every record is checked against its topic's limit once more (:func:`over_limit`):
  delivery replaces one that would be refused by a dead letter, without the original value when
  that is what it takes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from gpu_kernels.pipeline import JobResult, Variant
from schemas.errors import LightboxError
from schemas.events import dead_letter_id, processed_event_id
from schemas.headers import attempts_of
from streams.records import RECORD_OVERHEAD, Outgoing, payload_size, record_size

__all__ = ["PASS_HEADERS", "Headers", "InRecord", "OutRecord", "RecordKey", "created_ms", "dead_letter_record",
           "fits", "headers_of", "over_limit", "processed_record", "shrink_order", "store_upfront",
           "value_limit", "variant_record"]

Headers = list[tuple[str, bytes | None]]
PASS_HEADERS = ("traceparent", "tracestate")
RecordKey = tuple[str, int, int]  # topic, partition, offset


@dataclass(frozen=True, slots=True)
class InRecord:
    """A consumed Kafka record, as the agent saw it."""

    topic: str
    partition: int
    offset: int
    value: bytes | None
    key: bytes | None = None
    headers: Headers | None = None
    timestamp_ms: int | None = None


@dataclass(frozen=True, slots=True)
class OutRecord:
    """One record to produce. The fields after ``error_code`` are for observers (metrics and
    traces) and never travel: the item's per-stage span records as in the event, the monotonic
    nanoseconds their ``start_us`` count from, the input's ``created_at`` and the batch's inputs."""

    kind: Literal["processed", "dead_letter"]
    key: bytes | None
    value: bytes
    headers: Headers
    source: InRecord
    error_code: str | None = None
    spans: tuple[dict[str, Any], ...] = ()
    origin_ns: int | None = None
    created_ms: int | None = None
    batch: tuple[RecordKey, ...] = ()


# -- the size policy ---------------------------------------------------------------------------
def value_limit(topic_limit: int | None) -> int | None:
    """The budget of a record's key + value + headers on a topic of ``topic_limit`` bytes (None: no limit)."""
    return None if topic_limit is None else topic_limit - RECORD_OVERHEAD


def fits(value: bytes, key: bytes | None, headers: Sequence[tuple[str, bytes | None]], budget: int | None) -> bool:
    """Whether a record's key + value + headers stay within a :func:`value_limit` budget."""
    return budget is None or payload_size(value, key, headers) <= budget


def over_limit(out: Outgoing, topic_limit: int | None) -> int | None:
    """The record's size when its topic (``max.message.bytes`` = ``topic_limit``) would refuse it, else None."""
    size = record_size(out)
    return size if topic_limit is not None and size > topic_limit else None


def shrink_order(variants: Sequence[Variant], inline: Sequence[bool]) -> list[int]:
    """The variants to move out of line, one at a time until an event fits: the largest first,
    only those still inline."""
    return [k for k in sorted(range(len(variants)), key=lambda k: -variants[k].size) if inline[k]]


def store_upfront(variants: Sequence[Variant], *, has_store: bool, offload: Literal["always", "oversize"],
                  inline_max_bytes: int) -> list[tuple[int, bool]]:
    """Variants that go to the store before the event is sealed, each with whether it keeps its
    bytes inline too: all of them with ``offload="always"`` (those up to ``inline_max_bytes``
    keep theirs), none with ``"oversize"`` (only :func:`shrink_order` moves them then)."""
    if not has_store or offload != "always":
        return []
    return [(k, v.size <= inline_max_bytes) for k, v in enumerate(variants)]


# -- the records -------------------------------------------------------------------------------
def created_ms(event: dict[str, Any] | None) -> int | None:
    """An event's ``created_at`` in epoch milliseconds (None when unknown)."""
    created = (event or {}).get("created_at")
    if isinstance(created, datetime):
        return int(created.timestamp() * 1000)
    return int(created) if isinstance(created, int) else None


def headers_of(rec: InRecord) -> Headers:
    """An output's headers: the input's trace context and where the input came from."""
    kept = [(k, v) for k, v in (rec.headers or []) if k in PASS_HEADERS]
    src = f"{rec.topic}:{rec.partition}:{rec.offset}".encode()
    return [*kept, ("lightbox-source", src)]


def variant_record(v: Variant) -> dict[str, Any]:
    """One variant as the event carries it: inline bytes, no URI yet."""
    c = v.compliance
    return {"preset": v.preset, "width": v.width, "height": v.height, "format": v.format,
            "data": v.data, "uri": None, "sha256": v.sha256, "size": v.size,
            "compliance": None if c is None else {"white_border": c.white_border, "fill": c.fill,
                                                  "cut_off": c.cut_off, "min_side_ok": c.min_side_ok,
                                                  "compliant": c.compliant}}


def processed_record(ev: dict[str, Any], res: JobResult, variants: list[dict[str, Any]], *, worker_id: str,
                     model_version: str, pipeline_version: str, now_ms: int) -> dict[str, Any]:
    """The ``ProcessedImageEvent`` body of input event ``ev`` (its spans are added when it is sealed)."""
    q = res.quality
    created = created_ms(ev)
    return {
        "event_id": processed_event_id(ev["event_id"], pipeline_version, model_version),
        "source_event_id": ev["event_id"],
        "sku": ev["sku"], "image_id": ev["image_id"], "merchant_id": ev["merchant_id"],
        "variants": variants,
        "quality": {"subject_coverage": q.subject_coverage if q else 0.0,
                    "background_whiteness": q.background_whiteness if q else 0.0,
                    "sharpness": q.sharpness if q else 0.0},
        "spans": [],
        "latency_us": max(0, (now_ms - (created or now_ms)) * 1000),
        "worker_id": worker_id, "model_version": model_version,
        "pipeline_version": pipeline_version, "processed_at": now_ms,
    }


def dead_letter_record(rec: InRecord, exc: LightboxError, event: dict[str, Any] | None, *, worker_id: str,
                       pipeline_version: str, now_ms: int) -> dict[str, Any]:
    """The ``DeadLetterEvent`` body of input ``rec`` (its original record kept whole, value included
    unless ``rec.value`` is None)."""
    return {
        "event_id": dead_letter_id(rec.topic, rec.partition, rec.offset, pipeline_version),
        "source_event_id": event.get("event_id") if event else None,
        "original": {
            "topic": rec.topic, "partition": rec.partition, "offset": rec.offset,
            "timestamp_ms": rec.timestamp_ms, "key": rec.key, "value": rec.value,
            "headers": [{"key": k, "value": v} for k, v in (rec.headers or [])],
        },
        "error_code": str(exc.code), "message": exc.message, "stage": exc.stage or "unknown",
        "attempts": attempts_of(rec.headers), "worker_id": worker_id, "failed_at": now_ms,
    }
