"""Metrics and health endpoints of a worker (agents.telemetry), scraped over real HTTP."""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from agents.telemetry import Health, Metrics, MetricsServer


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def served() -> Iterator[tuple[Metrics, Health, Clock, str]]:
    clock = Clock()
    metrics, health = Metrics(), Health(stall_after_s=30, clock=clock)
    server = MetricsServer(metrics, health, port=0, host="127.0.0.1").start()
    try:
        yield metrics, health, clock, f"http://127.0.0.1:{server.port}"
    finally:
        server.stop()


def _get(url: str, accept: str = "text/plain") -> tuple[int, str]:
    req = urllib.request.Request(url, headers={"Accept": accept})
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def test_metrics_from_spans_and_outputs(served: tuple[Metrics, Health, Clock, str]) -> None:
    metrics, _, _, base = served
    spans = [{"stage": "decode", "duration_us": 40_000, "batch_size": 4, "device": "cpu"},
             {"stage": "preset:taobao_main", "duration_us": 8_000, "batch_size": 2, "device": "cpu"},
             {"stage": "encode:taobao_main", "duration_us": 3_000, "batch_size": 1, "device": "cpu"}]
    metrics.observe_spans(spans)
    metrics.observe_output(kind="processed", error_code=None, e2e_s=0.3)
    metrics.observe_output(kind="dead_letter", error_code="DECODE_FAILED", e2e_s=None)
    metrics.set_info(version="0.1.0", model="u2netp", device="cpu")
    status, text = _get(f"{base}/metrics")
    assert status == 200
    got = _samples(text)
    # batch-amortized: 40 ms over a batch of 4 is 10 ms per image
    assert got[("lightbox_stage_seconds_sum", (("device", "cpu"), ("stage", "decode")))] == pytest.approx(0.010)
    assert got[("lightbox_stage_seconds_sum", (("device", "cpu"), ("stage", "render")))] == pytest.approx(0.004)
    assert got[("lightbox_images_total", (("outcome", "processed"),))] == 1
    assert got[("lightbox_images_total", (("outcome", "dead_letter"),))] == 1
    assert got[("lightbox_dead_letters_total", (("code", "DECODE_FAILED"),))] == 1
    assert got[("lightbox_e2e_seconds_count", ())] == 1
    assert got[("lightbox_info", (("device", "cpu"), ("model", "u2netp"), ("version", "0.1.0")))] == 1

def test_spans_of_several_presets_and_outputs_share_one_series_per_stage_and_device() -> None:
    metrics = Metrics()  # a registry of its own
    for _ in range(3):
        metrics.observe_spans([
            {"stage": "encode:taobao_main", "duration_us": 2_000, "batch_size": 2, "device": "cpu"},
            {"stage": "encode:thumb_webp", "duration_us": 1_000, "batch_size": 1, "device": None},
            {"stage": "preset:thumb_webp", "duration_us": 6_000, "batch_size": 3, "device": "gpu"}])
    got = _samples(generate_latest(metrics.registry).decode())
    assert got[("lightbox_stage_seconds_count", (("device", "cpu"), ("stage", "encode")))] == 6
    assert got[("lightbox_stage_seconds_sum", (("device", "cpu"), ("stage", "encode")))] == pytest.approx(3 * 0.002)
    assert got[("lightbox_stage_seconds_sum", (("device", "gpu"), ("stage", "render")))] == pytest.approx(3 * 0.002)
    assert not any(k[0].startswith("lightbox_stage_seconds") and ("stage", "preset") in k[1] for k in got)



def test_exemplars_carry_trace_ids_in_openmetrics(served: tuple[Metrics, Health, Clock, str]) -> None:
    metrics, _, _, base = served
    metrics.observe_output(kind="processed", error_code=None, e2e_s=0.2, exemplar={"trace_id": "ab" * 16})
    _, text = _get(f"{base}/metrics", accept="application/openmetrics-text; version=1.0.0")
    assert '# {trace_id="' + "ab" * 16 + '"}' in text


def test_healthz_fails_when_a_lane_with_work_stops_progressing(served: tuple[Metrics, Health, Clock, str]) -> None:
    _, health, clock, base = served
    assert _get(f"{base}/healthz")[0] == 200  # nothing seen yet: idle
    health.progress("device", queued=3)
    clock.now += 10
    assert _get(f"{base}/healthz")[0] == 200
    clock.now += 25  # 35 s without progress, 3 items queued
    status, body = _get(f"{base}/healthz")
    assert status == 503 and "device" in body
    health.progress("device", queued=0)
    clock.now += 100  # idle with nothing queued is healthy however long it lasts
    assert _get(f"{base}/healthz")[0] == 200


def test_readyz_needs_the_model_and_partitions(served: tuple[Metrics, Health, Clock, str]) -> None:
    _, health, _, base = served
    assert _get(f"{base}/readyz") == (503, "model not loaded\n")
    health.model_loaded = True
    assert _get(f"{base}/readyz")[0] == 503
    health.assigned = True
    assert _get(f"{base}/readyz") == (200, "ok\n")


def test_a_dependency_that_is_down_makes_readyz_false_and_keeps_healthz_live(
        served: tuple[Metrics, Health, Clock, str]) -> None:
    """While the store is down the lanes wait on it: not ready (it says which, and since when), still
    live (a restart would not bring the store back); ready again once it answers."""
    from agents.dependencies import Dependencies

    _, health, clock, base = served
    health.model_loaded = health.assigned = True
    health.dependencies = deps = Dependencies(clock=clock)
    deps.failed("output store s3://b/p", "timeout")
    health.progress("output", queued=3)
    clock.now += 200  # far past stall_after_s with work queued
    status, body = _get(f"{base}/readyz")
    assert status == 503 and body == "waiting: output store s3://b/p unreachable (timeout) for 200 s\n"
    assert _get(f"{base}/healthz")[0] == 200
    deps.reached("output store s3://b/p")
    health.progress("output", queued=0)
    assert _get(f"{base}/readyz") == (200, "ok\n") and deps.healed_at == clock.now


def test_json_logs_are_one_object_per_line_with_trace_ids(capsys: pytest.CaptureFixture[str]) -> None:
    import json
    import logging
    import logging.config

    from opentelemetry.sdk.trace import TracerProvider

    from agents.logs import logging_config

    logging.config.dictConfig(logging_config("json", "INFO"))
    try:
        log = logging.getLogger("lightbox.test")
        tracer = TracerProvider().get_tracer("test")
        with tracer.start_as_current_span("batch") as span:
            log.warning("dead letter\nwith a newline", extra={"code": "DECODE_FAILED", "offset": 7})
        log.info("no span")
        lines = capsys.readouterr().err.strip().splitlines()
    finally:
        logging.config.dictConfig(logging_config("text", "WARNING"))
    first, second = (json.loads(line) for line in lines[-2:])
    assert first["msg"] == "dead letter\nwith a newline" and first["level"] == "warning"
    assert first["code"] == "DECODE_FAILED" and first["offset"] == 7
    assert first["trace_id"] == f"{span.get_span_context().trace_id:032x}"
    assert "trace_id" not in second


# -- observe: the runner's observer (agents.telemetry.Telemetry) ------------------------------------------------
def _out(offset: int, *, kind: str = "processed", spans: tuple[dict[str, object], ...] = (),
         batch: tuple[tuple[str, int, int], ...] = (), origin_ns: int | None = None,
         created_ms: int | None = None, code: str | None = None) -> Any:
    from agents.process import InRecord, OutRecord

    rec = InRecord("images", 0, offset, b"v", headers=[("traceparent", b"00-" + b"a" * 32 + b"-" + b"b" * 16 + b"-01")])
    return OutRecord(kind, None, b"out", [("lightbox-source", b"s")], rec, error_code=code,  # type: ignore[arg-type]
                     spans=spans, origin_ns=origin_ns, created_ms=created_ms, batch=batch)


def test_telemetry_turns_outputs_into_metrics() -> None:
    from agents.telemetry import Telemetry

    now_ns = [5_000_000_000]
    metrics, health = Metrics(), Health()
    tel = Telemetry(metrics, health, clock_ns=lambda: now_ns[0], wall_ms=lambda: 1_000_500)
    spans = ({"stage": "fetch", "start_us": 0, "duration_us": 2_000, "batch_size": 1, "device": "cpu"},
             {"stage": "decode", "start_us": 100_000, "duration_us": 40_000, "batch_size": 4, "device": "cpu"},
             {"stage": "preset:jd_main", "start_us": 140_000, "duration_us": 8_000, "batch_size": 2, "device": "cpu"},
             {"stage": "produce", "start_us": 150_000, "duration_us": 1_000, "batch_size": 1, "device": "cpu"})
    batch = (("images", 0, 1), ("images", 0, 2))
    first = _out(1, spans=spans, batch=batch, origin_ns=5_010_000_000, created_ms=1_000_000)
    second = _out(2, spans=spans, batch=batch, origin_ns=5_010_000_000, created_ms=1_000_000)
    dead = _out(3, kind="dead_letter", code="DECODE_FAILED")
    for out in (first, second, dead):
        tel.received(out.source)
    tel.in_flight(3)
    for out in (first, second, dead):
        assert tel.sending(out) is out  # no tracing: headers untouched
        tel.output_acked(out)
    got = {(s.name, tuple(sorted(s.labels.items()))): s.value
           for fam in metrics.registry.collect() for s in fam.samples}
    assert got[("lightbox_stage_seconds_sum", (("device", "cpu"), ("stage", "decode")))] == pytest.approx(2 * 0.010)
    assert got[("lightbox_stage_seconds_sum", (("device", "cpu"), ("stage", "fetch")))] == pytest.approx(2 * 0.002)
    # batch sizes once per batch (not per output), per batched stage
    assert got[("lightbox_batch_size_count", (("stage", "decode"),))] == 1
    assert got[("lightbox_batch_size_sum", (("stage", "render"),))] == 2
    assert ("lightbox_batch_size_count", (("stage", "fetch"),)) not in got
    # received at 5.000 s, processing started at 5.010 s, fetched for 2 ms, decode began 100 ms in: 108 ms
    assert got[("lightbox_queue_wait_seconds_sum", ())] == pytest.approx(2 * 0.108)
    assert got[("lightbox_e2e_seconds_sum", ())] == pytest.approx(2 * 0.5)
    assert got[("lightbox_images_total", (("outcome", "processed"),))] == 2
    assert got[("lightbox_dead_letters_total", (("code", "DECODE_FAILED"),))] == 1
    assert got[("lightbox_in_flight", ())] == 3


def test_telemetry_health_counts_a_batch_in_a_lanes_hands_as_queued() -> None:
    from agents.telemetry import Telemetry

    clock = Clock()
    health = Health(stall_after_s=30, clock=clock)
    tel = Telemetry(Metrics(), health)
    tel.lane_progress("device", 0)  # took the only batch: nothing waits behind it, one in hand
    clock.now += 31
    assert health.live()[0] is False and health.stalled() == ["device"]
    tel.batch_done("device", 4, 31.0)
    assert health.live() == (True, "ok")
    clock.now += 1000  # idle with nothing queued
    assert health.live() == (True, "ok")


def test_telemetry_rewrites_the_output_traceparent_when_tracing() -> None:
    from opentelemetry.sdk.trace import TracerProvider

    from agents.telemetry import Telemetry
    from agents.tracing import Tracing

    tel = Telemetry(Metrics(), Health(), Tracing(TracerProvider().get_tracer("t"), group="g"))
    out = _out(9)
    tel.received(out.source)
    sent = tel.sending(out)
    headers = dict(sent.headers)
    assert headers["lightbox-source"] == b"s"
    _, trace_id, span_id, _ = headers["traceparent"].decode().split("-")
    assert trace_id == "a" * 32 and span_id != "b" * 16  # the producer's trace, the worker's span
    tel.output_acked(sent)
    assert tel.tracing is not None and tel.tracing.trace_id(("images", 0, 9)) is None  # span ended


def test_telemetry_traces_one_batch_span_per_batch_and_stage_spans_per_input() -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from agents.telemetry import Telemetry
    from agents.tracing import Tracing

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tel = Telemetry(Metrics(), Health(), Tracing(provider.get_tracer("t"), group="g"))
    spans = ({"stage": "fetch", "start_us": 0, "duration_us": 500, "batch_size": 1, "device": "cpu"},
             {"stage": "decode", "start_us": 1000, "duration_us": 4000, "batch_size": 2, "device": "cpu"},
             {"stage": "produce", "start_us": 6000, "duration_us": 300, "batch_size": 1, "device": "cpu"})
    outs = [_out(k, spans=spans, batch=(("images", 0, 1), ("images", 0, 2)), origin_ns=1_000_000_000)
            for k in (1, 2)]  # equal batch tuples, distinct objects
    for out in outs:
        tel.received(out.source)
    for out in outs:
        tel.output_acked(tel.sending(out))
    names = sorted(s.name for s in exporter.get_finished_spans())
    # per input: consumer, fetch, decode, produce; per batch: batch + decode (the batched stages)
    assert names == sorted(["batch", "decode"] + 2 * ["process images", "fetch", "decode", "produce"])


def test_a_busy_metrics_port_fails_the_start_naming_the_setting(tmp_path: Any) -> None:
    import socket

    from agents.observe import Observability
    from streams.settings import Settings

    with socket.socket() as busy:
        busy.bind(("0.0.0.0", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(OSError, match=f"metrics port {port}: .*LIGHTBOX_METRICS_PORT"):
            Observability(Settings(metrics_port=port, data_dir=tmp_path))
    obs = Observability(Settings(metrics_port=0, data_dir=tmp_path))  # 0: no server at all
    assert obs.server is None
    obs.close()
