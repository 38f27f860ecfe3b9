"""A `lightbox worker` among standard Kafka clients: a real schema registry (Apicurio Registry), a real
broker, confluent-kafka's producer and consumer with its AvroSerializer and AvroDeserializer.

- events a standard producer writes in each compression codec, framed with registry ids that are
  not lightbox's, are all processed; a compatible v2 registered mid-stream loses nothing; the records
  of an aborted transaction are not (read_committed);
- the registry down for about 30 s mid-stream dead-letters nothing, /readyz says why, the stream resumes;
- every output, read by the standard deserializer, equals what lightbox decodes it as;
- a refused registry password stops the worker with one line naming the credential;
- a batch in a codec the worker cannot read pauses its partition with one line; the others go on.
"""

from __future__ import annotations

import asyncio
import io
import os
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.serialization import MessageField, SerializationContext
from PIL import Image

from lightbox.demo import WorkerProcess
from lightbox.devservers.launch import free_port
from schemas.codec import split_frame
from streams.app import ensure_topics
from streams.consume import read_events
from streams.registry import event_codecs
from streams.settings import Settings
from tests.registry_kit import PRODUCT, basic_auth_gate, deserializer, other_subjects, product_v2, serializer

pytestmark = [pytest.mark.kafka, pytest.mark.registry, pytest.mark.slow]

CODECS = ("gzip", "snappy", "lz4", "zstd")


def _env(s: Settings, registry_url: str, **more: str) -> dict[str, str]:
    return {"LIGHTBOX_KAFKA_BOOTSTRAP": s.kafka.bootstrap, "LIGHTBOX_GROUP_ID": s.kafka.group_id,
            "LIGHTBOX_INPUT_TOPIC": s.topics.input, "LIGHTBOX_OUTPUT_TOPIC": s.topics.output,
            "LIGHTBOX_DLQ_TOPIC": s.topics.dlq, "LIGHTBOX_BACKFILL_TOPIC": s.topics.backfill,
            "LIGHTBOX_DATA_DIR": str(s.worker.data_dir), "LIGHTBOX_DEVICE": "cpu", "LIGHTBOX_SEGMENTER": "classical",
            "LIGHTBOX_BACKFILL_ENABLED": "false", "LIGHTBOX_SCHEMA_REGISTRY_URL": registry_url, **more}


def _png(i: int) -> bytes:
    """A small product shot as an uncompressed PNG: the batch compresses well, so every codec is used
    (a producer sends a batch uncompressed when compressing does not make it smaller)."""
    img = Image.new("RGB", (96, 72), "white")
    img.paste((40 * (i % 6), 90, 200 - 10 * (i % 9)), (20, 14, 76, 58))
    buf = io.BytesIO()
    img.save(buf, "PNG", compress_level=0)
    return buf.getvalue()


def _event(i: int, **more: Any) -> dict[str, Any]:
    return {"event_id": str(uuid.uuid4()), "sku": f"SKU-{i}", "image_id": f"{i}.png", "merchant_id": "m",
            "source": {"data": _png(i)}, "content_type": "image/png", "presets": ["thumb_webp"],
            "retouch": {"background": "WHITE", "lighting": "AUTO", "segmentation": "AUTO"}, "priority": 0,
            "created_at": int(time.time() * 1000), **more}


def _send(s: Settings, codec: str, values: list[tuple[str, bytes]], partition: int | None = None) -> None:
    """One standard producer with ``compression.type=codec``; the records go as one batch."""
    producer = Producer({"bootstrap.servers": s.kafka.bootstrap, "compression.type": codec, "linger.ms": 200,
                         "enable.idempotence": True})
    for key, value in values:
        kw = {} if partition is None else {"partition": partition}
        producer.produce(s.topics.input, value=value, key=key.encode(), **kw)
    assert producer.flush(30) == 0


def _aborted(s: Settings, values: list[bytes]) -> None:
    """Records of a transaction the producer aborts."""
    producer = Producer({"bootstrap.servers": s.kafka.bootstrap, "transactional.id": f"tx-{uuid.uuid4().hex[:6]}"})
    producer.init_transactions(30)
    producer.begin_transaction()
    for value in values:
        producer.produce(s.topics.input, value=value, key=b"SKU-aborted")
    producer.flush(30)
    producer.abort_transaction(30)


def _read_standard(s: Settings, registry_url: str, expected: int, timeout_s: float) -> dict[str, list[Any]]:
    """Every record of the output and dead-letter topics through confluent-kafka's consumer and
    AvroDeserializer: {topic: [(raw value, decoded)]}."""
    read = deserializer(registry_url)
    consumer = Consumer({"bootstrap.servers": s.kafka.bootstrap, "group.id": f"std-{uuid.uuid4().hex[:6]}",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe([s.topics.output, s.topics.dlq])
    got: dict[str, list[Any]] = {s.topics.output: [], s.topics.dlq: []}
    deadline = time.monotonic() + timeout_s
    try:
        while sum(map(len, got.values())) < expected and time.monotonic() < deadline:
            msg = consumer.poll(1.0)
            if msg is None or msg.error():
                continue
            ctx = SerializationContext(msg.topic(), MessageField.VALUE)
            got[msg.topic()].append((msg.value(), read(msg.value(), ctx)))
    finally:
        consumer.close()
    return got


def _readyz(port: int) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError as exc:
        return 0, str(exc)


def test_standard_clients_every_codec_a_v2_and_a_registry_outage(settings: Settings, schema_registry: Any,
                                                                 tmp_path: Path) -> None:
    url = schema_registry.api_url
    other_subjects(url, tag=uuid.uuid4().hex[:6])  # the registry holds other subjects: ids are not lightbox's
    asyncio.run(ensure_topics(settings))
    port = free_port()
    worker = WorkerProcess(_env(settings, url, LIGHTBOX_SCHEMA_REGISTRY_TIMEOUT_S="2",
                                LIGHTBOX_KAFKA_COMPRESSION_TYPE="zstd", LIGHTBOX_METRICS_PORT=str(port)),
                           tmp_path / "worker.log").start()
    ctx = SerializationContext(settings.topics.input, MessageField.VALUE)
    v1 = serializer(url, PRODUCT)
    sent: dict[str, str] = {}  # event id -> what
    _aborted(settings, [v1(_event(90 + k), ctx) for k in range(2)])  # read_committed: never processed
    try:
        for n, codec in enumerate(CODECS):
            events = [_event(2 * n + k) for k in range(2)]
            _send(settings, codec, [(e["sku"], v1(e, ctx)) for e in events])
            sent.update({e["event_id"]: f"v1/{codec}" for e in events})
        # a compatible v2, registered by the producer just before the registry goes away
        v2 = serializer(url, product_v2())
        v2_values = [v2(_event(10 + k, campaign="spring"), ctx) for k in range(4)]
        v2_ids = [event_codecs(settings.replace(schema_registry_url=url)).product.decode(v)["event_id"]
                  for v in v2_values]
        deadline = time.monotonic() + 120
        while len(_read_standard(settings, url, 8, 15)[settings.topics.output]) < 8:
            assert worker.running() and time.monotonic() < deadline, worker.log_tail()
        schema_registry.kill()
        down_at = time.monotonic()
        _send(settings, "lz4", [(f"SKU-v2-{k}", v) for k, v in enumerate(v2_values)])
        sent.update(dict.fromkeys(v2_ids, "v2/lz4"))
        not_ready = ""
        while time.monotonic() - down_at < 20:
            status, body = _readyz(port)
            if status == 503 and "schema registry" in body:
                not_ready = body
            time.sleep(1)
        assert "unreachable" in not_ready, not_ready
        schema_registry.restart()
        got = _read_standard(settings, url, len(sent), 120)
        assert worker.running(), worker.log_tail()
    finally:
        code = worker.stop()
    log = (tmp_path / "worker.log").read_text()
    assert code == 0, log[-3000:]
    assert got[settings.topics.dlq] == [], [d for _, d in got[settings.topics.dlq]]
    processed = {d["source_event_id"]: d for _, d in got[settings.topics.output]}
    assert set(processed) == set(sent), {sent[i] for i in set(sent) - set(processed)}
    assert "schema registry" in log and "unreachable" in log and "reachable again after" in log, log[-3000:]
    assert f"outputs framed as ProcessedImageEvent id {split_frame(got[settings.topics.output][0][0])[0]} " in log
    # what the standard deserializer reads is what lightbox reads from the same bytes
    ours = asyncio.run(_lightbox_read(settings, url, len(sent)))
    theirs = {d["event_id"]: d for _, d in got[settings.topics.output]}
    assert ours == theirs


async def _lightbox_read(s: Settings, url: str, n: int) -> dict[str, dict[str, Any]]:
    codecs = event_codecs(s.replace(schema_registry_url=url))
    out = {}
    async for kind, ev in read_events(s.kafka.bootstrap, [s.topics.output], limit=n, idle_s=10, codecs=codecs):
        assert kind == "processed"
        out[ev["event_id"]] = ev
    return out


def test_a_refused_registry_password_stops_the_worker_with_one_line(settings: Settings, schema_registry: Any,
                                                                    tmp_path: Path) -> None:
    from agents.worker import EXIT_FAIL_STOP

    with basic_auth_gate(schema_registry.api_url, "lightbox", "right-password") as gated:
        env = _env(settings, gated, LIGHTBOX_SCHEMA_REGISTRY_USER_INFO="lightbox:wrong-password")
        worker = WorkerProcess(env, tmp_path / "worker.log").start()
        assert worker.proc is not None
        code = worker.proc.wait(120)
    log = (tmp_path / "worker.log").read_text()
    assert code == EXIT_FAIL_STOP, log[-2000:]
    assert "refused LIGHTBOX_SCHEMA_REGISTRY_USER_INFO (user 'lightbox') (HTTP 401)" in log, log[-2000:]
    assert "wrong-password" not in log and "Traceback" not in log, log[-2000:]


def test_a_batch_the_worker_cannot_decompress_pauses_its_partition_with_one_line(
        settings: Settings, schema_registry: Any, tmp_path: Path) -> None:
    """A worker without cramjam (shadowed here) cannot read lz4: that partition is set aside with one
    line naming it and the fix; the gzip batch on another partition is processed; no crash."""
    url = schema_registry.api_url
    asyncio.run(ensure_topics(settings))
    shadow = tmp_path / "shadow"
    shadow.mkdir()
    (shadow / "cramjam.py").write_text("raise ImportError('cramjam is not installed here')\n")
    env = _env(settings, url, PYTHONPATH=os.pathsep.join([str(shadow), os.environ.get("PYTHONPATH", "")]))
    ctx = SerializationContext(settings.topics.input, MessageField.VALUE)
    v1 = serializer(url, PRODUCT)
    _send(settings, "lz4", [(f"SKU-{k}", v1(_event(k), ctx)) for k in range(2)], partition=0)
    readable = [_event(5 + k) for k in range(2)]
    _send(settings, "gzip", [(e["sku"], v1(e, ctx)) for e in readable], partition=1)
    worker = WorkerProcess(env, tmp_path / "worker.log").start()
    try:
        got = _read_standard(settings, url, 2, 120)
        deadline = time.monotonic() + 30
        while "cannot read the record batch" not in (tmp_path / "worker.log").read_text():
            assert time.monotonic() < deadline, worker.log_tail()
            time.sleep(0.5)
        time.sleep(3)  # it goes on fetching: the line stays one line, the worker stays up
        assert worker.running(), worker.log_tail()
    finally:
        worker.stop()
    log = (tmp_path / "worker.log").read_text()
    assert sorted(d["source_event_id"] for _, d in got[settings.topics.output]) == sorted(
        e["event_id"] for e in readable)
    lines = [line for line in log.splitlines() if "cannot read the record batch" in line]
    assert len(lines) == 1, log[-3000:]
    assert f"{settings.topics.input} partition 0 at offset 0" in lines[0] and "lz4" in lines[0], lines[0]
    assert "pip install cramjam" in lines[0]
    assert "crash" not in log.lower() and "Traceback" not in log, log[-3000:]
