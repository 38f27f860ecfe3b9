"""Traces of a worker, exported over real OTLP/HTTP to a receiver inside the test."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from agents.tracing import tracing_from_env
from tests.otlp_receiver import OtlpReceiver

PRODUCER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PRODUCER_SPAN = "00f067aa0ba902b7"


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    r = OtlpReceiver()
    yield r
    r.close()


def test_off_without_an_endpoint() -> None:
    assert tracing_from_env(group="g", worker_id="w", environ={}) is None
    assert tracing_from_env(group="g", worker_id="w", environ={"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:1",
                                                               "OTEL_SDK_DISABLED": "true"}) is None


def test_an_input_continues_the_producers_trace_with_a_span_per_stage(receiver: OtlpReceiver,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
    tracing = tracing_from_env(group="lightbox-workers", worker_id="w1")
    assert tracing is not None
    headers = [("traceparent", f"00-{PRODUCER_TRACE}-{PRODUCER_SPAN}-01".encode()), ("other", b"x")]
    keys = [("images", 2, 40), ("images", 2, 41)]
    for topic, part, off in keys:
        tracing.received(topic, part, off, headers if off == 40 else [])
    origin = time.monotonic_ns()
    stages = [{"stage": "decode", "start_us": 0, "duration_us": 5000, "batch_size": 2, "device": "cpu"},
              {"stage": "segment", "start_us": 5000, "duration_us": 20000, "batch_size": 2, "device": "cpu"},
              {"stage": "preset:taobao_main", "start_us": 25000, "duration_us": 3000, "batch_size": 2, "device": "cpu"}]
    tracing.batch(keys, stages, origin)
    out_headers = tracing.output_headers(keys[0], [("traceparent", headers[0][1]), ("lightbox-source", b"s")])
    for key in keys:
        tracing.finished(key, outcome="processed", produce_start_ns=time.monotonic_ns())
    tracing.close()

    by_name: dict[str, list[object]] = {}
    for s in receiver.spans:
        by_name.setdefault(s.name, []).append(s)
    (first, second) = sorted(by_name["process images"], key=lambda s: s.attributes["messaging.kafka.offset"])
    assert first.trace_id == PRODUCER_TRACE and first.parent_span_id == PRODUCER_SPAN
    assert second.trace_id != PRODUCER_TRACE  # no traceparent: a trace of its own
    assert first.attributes["messaging.system"] == "kafka"
    assert first.attributes["messaging.destination.partition.id"] == "2"
    assert first.attributes["messaging.consumer.group.name"] == "lightbox-workers"
    (batch,) = by_name["batch"]
    assert set(batch.links) == {first.span_id, second.span_id}
    for stage in ("decode", "segment", "preset:taobao_main"):
        (child,) = by_name[stage]
        assert child.parent_span_id == batch.span_id and child.attributes["lightbox.batch_size"] == 2
    assert by_name["preset:taobao_main"][0].attributes["lightbox.preset"] == "taobao_main"
    assert {s.parent_span_id for s in by_name["produce"]} == {first.span_id, second.span_id}
    # the output names the worker's span, not the producer's
    traceparent = dict(out_headers)["traceparent"]
    assert traceparent is not None and first.span_id in traceparent.decode() and PRODUCER_TRACE in traceparent.decode()
    assert ("lightbox-source", b"s") in out_headers
