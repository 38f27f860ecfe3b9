"""Metrics and health endpoints of a worker (agents.telemetry), scraped over real HTTP."""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
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
