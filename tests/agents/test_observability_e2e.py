"""Observability with real parts: a ``lightbox worker`` process on the real broker, scraped by a
real Prometheus server, exporting traces over OTLP/HTTP to a receiver inside the test, logging
JSON; and ``/healthz`` of an in-process runner whose pipeline holds a blocking stage."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer

from gpu_kernels.stages.base import BatchContext, Stage
from lightbox.demo import WorkerProcess, collect_outputs
from lightbox.devservers.prometheus_local import LocalPrometheus, prometheus_binary
from streams.producer import ImageProducer
from streams.settings import Settings
from tests.otlp_receiver import OtlpReceiver, ReceivedSpan

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

PRESETS = ["taobao_main", "thumb_webp"]
GOOD = 8  # images through the worker


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http_get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError as exc:
        return 0, str(exc)


def wait_for(what: str, check: Any, timeout_s: float = 60.0, every_s: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(every_s)
    raise AssertionError(f"timed out waiting for {what} (last: {last!r})")


def stage_label(stage: str) -> str:
    base = stage.split(":", 1)[0]
    return "render" if base == "preset" else base


# ------------------------------------------------------------------------------ one worker run
@dataclass
class Run:
    settings: Settings
    traceparents: dict[str, str]  # event id -> the producer's traceparent
    processed: list[dict[str, Any]]
    dead: list[dict[str, Any]]
    output_headers: list[dict[str, bytes]]
    stage_series: set[str]  # stage labels of lightbox_stage_seconds_bucket in Prometheus
    images_total: dict[str, float]  # outcome -> Prometheus's value
    dead_letters: dict[str, float]
    lag: dict[str, float]  # input partition -> lightbox_consumer_lag once the run is done
    info: list[dict[str, str]]  # lightbox_info's label sets
    ready: tuple[int, str]
    live: tuple[int, str]
    spans: list[ReceivedSpan]
    log_lines: list[str]


async def _publish(s: Settings, catalog: list[Path], bad: Path) -> dict[str, str]:
    sent: dict[str, str] = {}
    async with ImageProducer(s.kafka.bootstrap, s.topics.input) as prod:
        futs = []
        for f in [*catalog[:GOOD], bad]:
            ev = prod.event_for_file(f, presets=PRESETS)
            tp = f"00-{uuid.uuid4().hex}-{uuid.uuid4().hex[:16]}-01"
            sent[ev["event_id"]] = tp
            futs.append(await prod.publish(ev, traceparent=tp))
        await asyncio.gather(*futs)
    return sent


async def _headers(s: Settings, n: int) -> list[dict[str, bytes]]:
    consumer = AIOKafkaConsumer(s.topics.output, bootstrap_servers=s.kafka.bootstrap, group_id=None,
                                auto_offset_reset="earliest", max_partition_fetch_bytes=64 << 20)
    await consumer.start()
    got: list[dict[str, bytes]] = []
    try:
        async with asyncio.timeout(60):
            while len(got) < n:
                for records in (await consumer.getmany(timeout_ms=500)).values():
                    got.extend({k: v for k, v in r.headers} for r in records)
    finally:
        await consumer.stop()
    return got


@pytest.fixture(scope="module")
def run(kafka_bootstrap: str, catalog: list[Path], bad_files: dict[str, Path],
        tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    if prometheus_binary() is None:
        pytest.skip("no prometheus binary (Debian: apt-get install prometheus; .ci/run installs it)")
    tmp = tmp_path_factory.mktemp("observe")
    tag = uuid.uuid4().hex[:8]
    s = Settings(kafka_bootstrap=kafka_bootstrap, group_id=f"lightbox-obs-{tag}", input_topic=f"o-{tag}.images",
                 backfill_topic=f"o-{tag}.backfill", output_topic=f"o-{tag}.processed", dlq_topic=f"o-{tag}.dlq",
                 data_dir=tmp / "faust", segmenter="classical", device="cpu")
    port = free_port()
    receiver = OtlpReceiver()
    env = {"LIGHTBOX_KAFKA_BOOTSTRAP": s.kafka.bootstrap, "LIGHTBOX_GROUP_ID": s.kafka.group_id,
           "LIGHTBOX_INPUT_TOPIC": s.topics.input, "LIGHTBOX_OUTPUT_TOPIC": s.topics.output,
           "LIGHTBOX_DLQ_TOPIC": s.topics.dlq, "LIGHTBOX_BACKFILL_TOPIC": s.topics.backfill,
           "LIGHTBOX_DATA_DIR": str(s.worker.data_dir), "LIGHTBOX_DEVICE": "cpu", "LIGHTBOX_SEGMENTER": "classical",
           "LIGHTBOX_METRICS_PORT": str(port), "LIGHTBOX_BACKFILL_METRICS_PORT": "0",  # port + 1 may be taken
           "LIGHTBOX_LOG_FORMAT": "json",
           "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, "OTEL_BSP_SCHEDULE_DELAY": "500"}
    log_path = tmp / "worker.log"
    worker = WorkerProcess(env, log_path, args=["--loglevel", "info"]).start()
    prom = None
    try:
        prom = LocalPrometheus.start([f"127.0.0.1:{port}"], scrape_interval_s=1.0, folder=tmp / "prometheus")
        wait_for("the worker's /readyz", lambda: http_get(f"http://127.0.0.1:{port}/readyz")[0] == 200
                 or not worker.running(), timeout_s=120)
        assert worker.running(), worker.log_tail()
        ready = http_get(f"http://127.0.0.1:{port}/readyz")
        sent = asyncio.run(_publish(s, catalog, bad_files["truncated.jpg"]))
        processed, dead = asyncio.run(collect_outputs(s.kafka.bootstrap, [s.topics.output, s.topics.dlq], len(sent),
                                                      300, worker.running))
        assert len(processed) + len(dead) == len(sent), worker.log_tail()
        headers = asyncio.run(_headers(s, len(processed)))
        live = http_get(f"http://127.0.0.1:{port}/healthz")

        def images_total() -> dict[str, float] | None:
            got = {r["metric"]["outcome"]: float(r["value"][1]) for r in prom.query("lightbox_images_total")}
            return got if sum(got.values()) == len(sent) else None

        totals = wait_for("Prometheus to scrape every output", images_total, timeout_s=60)
        stages = {r["metric"]["stage"] for r in prom.query('count by (stage) (lightbox_stage_seconds_bucket)')}
        dead_letters = {r["metric"]["code"]: float(r["value"][1]) for r in prom.query("lightbox_dead_letters_total")}

        def lag() -> dict[str, float] | None:  # refreshed every 5 s: every input partition, caught up
            got = {r["metric"]["partition"]: float(r["value"][1])
                   for r in prom.query(f'lightbox_consumer_lag{{topic="{s.topics.input}"}}')}
            return got if len(got) == s.topics.partitions and not any(got.values()) else None

        lags = wait_for("consumer lag of every input partition at 0", lag, timeout_s=60)
        info = [r["metric"] for r in prom.query("lightbox_info")]
    finally:
        rc = worker.stop()
        if prom is not None:
            prom.stop()
        receiver.close()
    assert rc == 0, worker.log_tail()
    yield Run(s, sent, processed, dead, headers, stages, totals, dead_letters, lags, info, ready, live,
              list(receiver.spans), log_path.read_text(errors="replace").splitlines())


def test_prometheus_scrapes_stage_buckets_and_an_image_count_equal_to_the_inputs(run: Run) -> None:
    assert sum(run.images_total.values()) == len(run.traceparents)
    assert run.images_total == {"processed": len(run.processed), "dead_letter": len(run.dead)}
    assert run.dead_letters == {"DECODE_FAILED": 1.0}
    from_events = {stage_label(s["stage"]) for ev in run.processed for s in ev["spans"]}
    assert {"fetch", "decode", "segment", "correct", "render", "encode", "quality", "produce"} <= from_events
    assert run.stage_series == from_events  # a bucket series for every stage the events went through


def test_ready_and_live_while_serving(run: Run) -> None:
    assert run.ready == (200, "ok\n")
    assert run.live == (200, "ok\n")


def test_consumer_lag_per_partition_and_the_info_metric(run: Run) -> None:
    assert sorted(run.lag) == [str(p) for p in range(run.settings.topics.partitions)]
    (info,) = run.info
    assert info["device"] == "cpu" and info["model"] and info["version"]


def test_one_trace_per_input_continues_the_producers_traceparent_with_a_span_per_stage(run: Run) -> None:
    consumer_spans = [s for s in run.spans if s.name == f"process {run.settings.topics.input}"]
    assert len(consumer_spans) == len(run.traceparents)  # one per input, dead letter included
    by_trace = {s.trace_id: s for s in consumer_spans}
    children: dict[str, list[ReceivedSpan]] = {}
    for s in run.spans:
        children.setdefault(s.parent_span_id, []).append(s)
    for ev in run.processed:
        _, trace_id, parent_id, _ = run.traceparents[ev["source_event_id"]].split("-")
        span = by_trace[trace_id]  # the producer's trace, continued
        assert span.parent_span_id == parent_id
        assert span.attributes["lightbox.outcome"] == "processed"
        assert span.attributes["messaging.system"] == "kafka"
        assert span.attributes["messaging.consumer.group.name"] == run.settings.kafka.group_id
        names = sorted(c.name for c in children[span.span_id])
        assert names == sorted(s["stage"] for s in ev["spans"])  # a child per stage, produce included
        for c in children[span.span_id]:
            assert span.start_ns <= c.start_ns + 5_000_000 and c.end_ns <= span.end_ns + 5_000_000
    (bad,) = [s for s in consumer_spans if s.attributes["lightbox.outcome"] == "dead_letter"]
    assert bad.attributes["lightbox.error_code"] == "DECODE_FAILED"
    # each batch: a span linked to every input it held, with the batched stages as children
    batches = [s for s in run.spans if s.name == "batch"]
    linked = {link for b in batches for link in b.links}
    assert {by_trace[run.traceparents[ev["source_event_id"]].split("-")[1]].span_id for ev in run.processed} <= linked
    assert all(any(c.name == "decode" for c in children[b.span_id]) for b in batches)


def test_the_output_traceparent_names_the_workers_span(run: Run) -> None:
    consumer_ids = {(s.trace_id, s.span_id) for s in run.spans if s.name.startswith("process ")}
    assert len(run.output_headers) == len(run.processed)
    for h in run.output_headers:
        _, trace_id, span_id, _ = h["traceparent"].decode().split("-")
        assert (trace_id, span_id) in consumer_ids


def test_json_logs_are_one_object_per_line_without_terminal_codes(run: Run) -> None:
    assert run.log_lines
    records = [json.loads(line) for line in run.log_lines]  # every line is one JSON object
    assert all({"ts", "level", "logger", "msg"} <= r.keys() for r in records)
    assert not any("\x1b" in line for line in run.log_lines)
    assert any(r["msg"].startswith("lightbox worker ") and "metrics on :" in r["msg"] for r in records)
    assert any(r["msg"].startswith("partitions assigned:") for r in records)
    (dead,) = [r for r in records if r["msg"].startswith("dead letter ")]
    assert dead["code"] == "DECODE_FAILED" and len(dead["trace_id"]) == 32


def test_text_logs_in_a_file_carry_no_terminal_codes(settings: Settings, tmp_path: Path) -> None:
    """Faust's start-up spinner hides the cursor with an escape code even when stdout is a file."""
    port = free_port()
    env = {"LIGHTBOX_KAFKA_BOOTSTRAP": settings.kafka.bootstrap, "LIGHTBOX_GROUP_ID": settings.kafka.group_id,
           "LIGHTBOX_INPUT_TOPIC": settings.topics.input, "LIGHTBOX_OUTPUT_TOPIC": settings.topics.output,
           "LIGHTBOX_DLQ_TOPIC": settings.topics.dlq, "LIGHTBOX_BACKFILL_TOPIC": settings.topics.backfill,
           "LIGHTBOX_DATA_DIR": str(settings.worker.data_dir), "LIGHTBOX_DEVICE": "cpu",
           "LIGHTBOX_SEGMENTER": "classical",
           "LIGHTBOX_METRICS_PORT": str(port), "LIGHTBOX_BACKFILL_METRICS_PORT": "0"}  # port + 1 may be taken
    worker = WorkerProcess(env, tmp_path / "worker.log").start()
    try:
        wait_for("/readyz", lambda: http_get(f"http://127.0.0.1:{port}/readyz")[0] == 200 or not worker.running(),
                 timeout_s=120)
        assert worker.running(), worker.log_tail()
    finally:
        rc = worker.stop()
    assert rc == 0, worker.log_tail()
    text = (tmp_path / "worker.log").read_text(errors="replace")
    assert "lightbox worker stopped" in text and f"metrics on :{port}" in text
    assert "\x1b" not in text


# ------------------------------------------------------------------------ a stage that blocks
class BlockingStage(Stage):
    """A device-lane stage that holds its batch until released."""

    name, lane, device = "block", "device", "cpu"

    def __init__(self) -> None:
        self.entered, self.release = threading.Event(), threading.Event()

    def apply(self, ctx: BatchContext, idx: list[int]) -> Sequence[object]:
        self.entered.set()
        self.release.wait(120)
        return [None] * len(idx)


def test_healthz_turns_unhealthy_while_a_stage_blocks(settings: Settings, catalog: list[Path]) -> None:
    from agents.batching import MicroBatcher
    from agents.process import InRecord
    from agents.runner import BatchRunner
    from agents.telemetry import Health, Metrics, MetricsServer, Telemetry
    from agents.wiring import batching_config, build_processor, kafka_sink, runner_config
    from gpu_kernels.pipeline import ImagePipeline, default_stages
    from schemas.events import EventCodecs
    from streams.app import ensure_topics

    proc = build_processor(settings, "cpu")
    p = proc.pipeline
    block = BlockingStage()
    stages = default_stages(p.decoder, p.retoucher, p.encoder, p.segmenter, p.classical)
    stages.insert(next(k for k, st in enumerate(stages) if st.name == "segment") + 1, block)  # after the model
    proc.pipeline = ImagePipeline(p.decoder, p.retoucher, p.encoder, p.segmenter, p.classical, stages=stages)
    metrics, health = Metrics(), Health(stall_after_s=1.0)
    server = MetricsServer(metrics, health, port=0, host="127.0.0.1").start()
    healthz = f"http://127.0.0.1:{server.port}/healthz"
    acked: list[Any] = []

    async def ack(event: Any) -> None:
        acked.append(event)

    async def go() -> None:
        await ensure_topics(settings)
        batching = batching_config(settings, "cpu")
        runner = BatchRunner(proc, kafka_sink(settings), MicroBatcher(batching), ack=ack,
                             config=runner_config(settings, batching), observer=Telemetry(metrics, health))
        await runner.start()
        try:
            codecs = EventCodecs.create()
            for offset, f in enumerate(catalog[:2]):
                value = codecs.product.encode(ImageProducer.event({"data": f.read_bytes()}, sku=f.stem,
                                                                  image_id=f.name, presets=["thumb_webp"]))
                await runner.submit(offset, InRecord(settings.topics.input, 0, offset, value))
            await asyncio.to_thread(block.entered.wait, 60)
            assert block.entered.is_set()
            _, body = await asyncio.to_thread(
                wait_for, "/healthz to fail", lambda: (r := http_get(healthz))[0] == 503 and r, 30, 0.2)
            assert "device" in body and "made no progress" in body
            assert metrics.in_flight._value.get() == 2  # held, not acknowledged
            block.release.set()
            await asyncio.to_thread(wait_for, "both outputs", lambda: len(acked) == 2, 60, 0.1)
            assert http_get(healthz) == (200, "ok\n")  # progressed again, nothing queued
        finally:
            block.release.set()
            await runner.stop()

    try:
        asyncio.run(go())
    finally:
        server.stop()
    assert acked == [0, 1]
    assert sum(s.value for fam in metrics.registry.collect() if fam.name == "lightbox_images"
               for s in fam.samples if s.name == "lightbox_images_total") == 2
