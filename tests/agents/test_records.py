"""agents/records.py: the record-size policy and the records' bodies, without a broker or a store."""

from __future__ import annotations

from agents.records import (
    InRecord,
    OutRecord,
    dead_letter_record,
    fits,
    headers_of,
    over_limit,
    shrink_order,
    store_upfront,
    value_limit,
)
from gpu_kernels.pipeline import Variant
from schemas.errors import OutputTooLarge
from streams.records import RECORD_OVERHEAD, record_size


def _variant(preset: str, size: int) -> Variant:
    return Variant(preset, 10, 10, "jpeg", b"x" * size, "0" * 64)


def test_the_value_budget_and_the_topic_limit_are_the_same_policy() -> None:
    """A record whose key + value + headers fit the budget of a topic fits the topic itself, and
    one byte more does not."""
    rec = InRecord("t", 0, 7, b"v", key=b"k")
    headers = headers_of(rec)
    value = b"v" * 500
    out = OutRecord("processed", b"k", value, headers, rec)
    exact = record_size(out)
    assert value_limit(None) is None and value_limit(exact) == exact - RECORD_OVERHEAD
    assert fits(value, b"k", headers, value_limit(exact)) and over_limit(out, exact) is None
    assert not fits(value, b"k", headers, value_limit(exact - 1)) and over_limit(out, exact - 1) == exact
    assert over_limit(out, None) is None and fits(value, b"k", headers, None)


def test_variants_leave_the_event_largest_first_and_only_while_inline() -> None:
    variants = [_variant("a", 30), _variant("b", 90), _variant("c", 60)]
    assert shrink_order(variants, [True, True, True]) == [1, 2, 0]
    assert shrink_order(variants, [True, False, True]) == [2, 0]


def test_the_store_takes_every_variant_up_front_only_with_offload_always() -> None:
    variants = [_variant("a", 30), _variant("b", 90)]
    assert store_upfront(variants, has_store=True, offload="always", inline_max_bytes=0) == [(0, False), (1, False)]
    assert store_upfront(variants, has_store=True, offload="always", inline_max_bytes=30) == [(0, True), (1, False)]
    assert store_upfront(variants, has_store=True, offload="oversize", inline_max_bytes=30) == []
    assert store_upfront(variants, has_store=False, offload="always", inline_max_bytes=30) == []


def test_a_dead_letter_keeps_the_original_record_and_outputs_pass_only_the_trace_headers() -> None:
    rec = InRecord("in", 2, 41, b"payload", key=b"k",
                   headers=[("traceparent", b"00-ab"), ("secret", b"s"), ("tracestate", None)], timestamp_ms=5)
    body = dead_letter_record(rec, OutputTooLarge("too big", stage="output"), {"event_id": "e1"},
                              worker_id="w", pipeline_version="9", now_ms=123)
    assert body["original"]["value"] == b"payload" and body["original"]["offset"] == 41
    assert (body["error_code"], body["stage"], body["source_event_id"], body["failed_at"]) == (
        "OUTPUT_TOO_LARGE", "output", "e1", 123)
    assert headers_of(rec) == [("traceparent", b"00-ab"), ("tracestate", None), ("lightbox-source", b"in:2:41")]
    bare = dead_letter_record(InRecord("in", 2, 41, None), OutputTooLarge("x"), None, worker_id="w",
                              pipeline_version="9", now_ms=1)
    assert bare["original"]["value"] is None and bare["source_event_id"] is None and bare["stage"] == "unknown"
    assert bare["event_id"] == body["event_id"]  # the same input and pipeline: the same dead letter
