"""End to end on a real Kafka broker: a `lightbox worker` process, real photos, bad inputs."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError
from aiokafka.structs import TopicPartition

from gpu_kernels.presets import load_presets
from lightbox.demo import WorkerProcess
from streams.consume import read_events
from streams.producer import ImageProducer, new_traceparent
from streams.settings import Settings

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

PRESETS = ["taobao_main", "xiaohongshu_cover", "thumb_webp"]


def worker_env(s: Settings) -> dict[str, str]:
    return {"LIGHTBOX_KAFKA_BOOTSTRAP": s.kafka.bootstrap, "LIGHTBOX_GROUP_ID": s.kafka.group_id,
            "LIGHTBOX_INPUT_TOPIC": s.topics.input, "LIGHTBOX_OUTPUT_TOPIC": s.topics.output,
            "LIGHTBOX_DLQ_TOPIC": s.topics.dlq, "LIGHTBOX_BACKFILL_TOPIC": s.topics.backfill,
            "LIGHTBOX_DATA_DIR": str(s.worker.data_dir), "LIGHTBOX_DEVICE": "cpu", "LIGHTBOX_SEGMENTER": "classical",
            "LIGHTBOX_FILE_ROOTS": "/no/such/dir"}  # file:// is refused without roots; the missing file is in them


@dataclass
class Sent:
    what: str  # a file name or the kind of bad input
    event_id: str | None
    value: bytes
    headers: list[tuple[str, bytes]]


async def publish_all(s: Settings, good: list[Path], bad: dict[str, Path]) -> tuple[dict, dict[tuple[int, int], Sent]]:
    """Publish; return {event_id: what} for readable events and {(partition, offset): Sent} for all."""
    by_id, by_pos = {}, {}
    async with ImageProducer(s.kafka.bootstrap, s.topics.input) as prod:
        sent = []

        async def publish(ev: dict, what: str) -> None:
            tp = new_traceparent()
            sent.append((Sent(what, ev["event_id"], prod.codecs.product.encode(ev), [("traceparent", tp.encode())]),
                         await prod.publish(ev, traceparent=tp)))

        for f in good:
            await publish(prod.event_for_file(f, presets=PRESETS), f.name)
        for name, f in bad.items():
            await publish(prod.event_for_file(f, presets=PRESETS), name)
        await publish(prod.event_for_file(good[0], presets=["jd_main", "tmall_giant"]), "unknown-preset")
        await publish(prod.event({"uri": "file:///no/such/dir/SKU-x.jpg", "sha256": None}, sku="SKU-x",
                                 image_id="x", presets=PRESETS), "missing-file")
        raw = b"{\"sku\": \"json, not avro\"}"
        sent.append((Sent("not-avro", None, raw, []), await prod.publish_raw(raw, key=b"SKU-y")))
        for what, fut in sent:
            meta = await fut
            by_pos[(meta.partition, meta.offset)] = what
            if what.event_id:
                by_id[what.event_id] = what.what
    return by_id, by_pos


async def read_everything(s: Settings, idle_s: float = 3.0) -> list[tuple[str, dict]]:
    """Every event on the output and dead-letter topics, from the start, until ``idle_s`` without one."""
    return [x async for x in read_events(s.kafka.bootstrap, [s.topics.output, s.topics.dlq], idle_s=idle_s)]


def outputs_covering(s: Settings, by_id: dict, by_pos: dict, timeout_s: float,
                     alive: Any) -> tuple[list[dict], list[dict]]:
    """Read every output (no count limit) until each input has one, then once more to the end,
    so late duplicates are seen too."""
    deadline = time.monotonic() + timeout_s
    while True:
        events = asyncio.run(read_everything(s))
        processed = [ev for kind, ev in events if kind == "processed"]
        dead = [ev for kind, ev in events if kind == "dead_letter"]
        covered = ({p["source_event_id"] for p in processed} |
                   {(d["original"]["partition"], d["original"]["offset"]) for d in dead})
        want = {eid for eid, what in by_id.items() if what.startswith("SKU-")}
        if want <= covered and all(pos in covered or by_pos[pos].event_id in want for pos in by_pos):
            return processed, dead
        if time.monotonic() > deadline or not alive():
            return processed, dead


async def committed(s: Settings) -> dict[TopicPartition, int]:
    admin = AIOKafkaAdminClient(bootstrap_servers=s.kafka.bootstrap)
    await admin.start()
    try:
        offsets = await admin.list_consumer_group_offsets(s.kafka.group_id)
        return {tp: meta.offset for tp, meta in offsets.items() if tp.topic == s.topics.input}
    finally:
        await admin.close()


def test_every_input_yields_exactly_one_output(settings: Settings, catalog: list[Path],
                                               bad_files: dict[str, Path], tmp_path: Path) -> None:
    worker = WorkerProcess(worker_env(settings), tmp_path / "worker.log").start()
    rc = None
    try:
        by_id, by_pos = asyncio.run(publish_all(settings, catalog, bad_files))
        assert len(by_pos) == len(catalog) + len(bad_files) + 3 >= 20 + 7
        processed, dead = outputs_covering(settings, by_id, by_pos, 300, worker.running)

        # exactly one output per input, no duplicates: processed by source event id, dead letters by position
        assert Counter(p["source_event_id"] for p in processed) == Counter(
            {eid: 1 for eid, what in by_id.items() if what.startswith("SKU-")}), worker.log_tail()
        dead_pos = Counter((d["original"]["partition"], d["original"]["offset"]) for d in dead)
        assert len(processed) + len(dead) == len(by_pos) and all(n == 1 for n in dead_pos.values())
        codes = {by_pos[pos].what: d["error_code"] for pos, d in
                 (((d["original"]["partition"], d["original"]["offset"]), d) for d in dead)}
        assert codes == {"empty.jpg": "DECODE_FAILED", "truncated.jpg": "DECODE_FAILED",
                         "notes-as-image.jpg": "UNSUPPORTED_FORMAT", "pixel-bomb.png": "TOO_LARGE",
                         "unknown-preset": "UNKNOWN_PRESET", "missing-file": "FETCH_FAILED",
                         "not-avro": "SCHEMA_INVALID"}
        # a dead letter carries the original record as it was consumed: topic, position, bytes, headers
        for d in dead:
            orig = d["original"]
            sent = by_pos[(orig["partition"], orig["offset"])]
            assert orig["topic"] == settings.topics.input
            assert orig["value"] == sent.value
            assert [(h["key"], h["value"]) for h in orig["headers"]] == sent.headers
            assert d["source_event_id"] == sent.event_id
        missing = next(d for d in dead
                       if by_pos[(d["original"]["partition"], d["original"]["offset"])] .what == "missing-file")
        assert missing["message"].startswith("not found:")

        presets = load_presets()
        for ev in processed:
            assert [(v["preset"], v["width"], v["height"]) for v in ev["variants"]] == [
                (p, presets[p].width, presets[p].height) for p in PRESETS]
            assert all(v["size"] == len(v["data"]) > 0 for v in ev["variants"])
            assert ev["spans"] and all(s["duration_us"] > 0 for s in ev["spans"])
            assert {"fetch", "decode", "produce"} <= {s["stage"] for s in ev["spans"]}
            assert ev["latency_us"] > 0

        # offsets are committed once outputs are acknowledged: the group ends at the log end
        async def wait_committed() -> dict[TopicPartition, int]:
            ends: dict[int, int] = {}
            for part, off in by_pos:
                ends[part] = max(ends.get(part, 0), off + 1)
            for _ in range(60):
                got = await committed(settings)
                if {tp.partition: off for tp, off in got.items() if tp.partition in ends} == ends:
                    return got
                await asyncio.sleep(0.5)
            return got

        got = asyncio.run(wait_committed())
        ends = {}
        for part, off in by_pos:
            ends[part] = max(ends.get(part, 0), off + 1)
        assert {tp.partition: off for tp, off in got.items() if tp.partition in ends} == ends
        rc = worker.stop()
    finally:
        if rc is None:
            worker.stop()
    assert rc == 0, worker.log_tail()  # SIGTERM: a clean stop


def test_a_killed_worker_loses_nothing_and_replays_identically(settings: Settings, catalog: list[Path],
                                                                tmp_path: Path) -> None:
    """SIGKILL a worker mid-stream; its successor in the group redoes what was not committed.
    Every input ends with an output, and a duplicate carries the same event id and bytes."""
    import signal

    env = {**worker_env(settings), "LIGHTBOX_SESSION_TIMEOUT_S": "8"}
    first = WorkerProcess(env, tmp_path / "w1.log").start()
    second = None
    try:
        by_id, _ = asyncio.run(publish_all(settings, catalog, {}))
        good = {eid for eid, what in by_id.items() if what.startswith("SKU-")}

        async def until(n: int) -> None:
            async for _ in read_events(settings.kafka.bootstrap, [settings.topics.output], limit=n, idle_s=240):
                pass

        asyncio.run(until(6))
        assert first.proc is not None
        first.proc.send_signal(signal.SIGKILL)
        first.proc.wait(30)
        second = WorkerProcess(env, tmp_path / "w2.log").start()

        outputs, _ = outputs_covering(settings, by_id, {}, 400, second.running)
        assert good <= {ev["source_event_id"] for ev in outputs}, second.log_tail()
        by_source: dict[str, list[dict]] = {}
        for ev in outputs:
            by_source.setdefault(ev["source_event_id"], []).append(ev)
        for evs in by_source.values():
            assert len({e["event_id"] for e in evs}) == 1
            assert len({tuple(v["sha256"] for v in e["variants"]) for e in evs}) == 1
            assert len({tuple(v["data"] for v in e["variants"]) for e in evs}) == 1
        assert second.stop() == 0, second.log_tail()  # SIGTERM: a clean stop
    finally:
        first.stop()
        if second is not None:
            second.stop()


async def group_members(s: Settings) -> int:
    admin = AIOKafkaAdminClient(bootstrap_servers=s.kafka.bootstrap)
    await admin.start()
    try:
        (resp,) = await admin.describe_consumer_groups([s.kafka.group_id])
        return len(resp.groups[0][5 if len(resp.groups[0]) == 6 else 6])
    finally:
        await admin.close()


def test_a_worker_that_cannot_start_exits_at_once_without_joining(settings: Settings, tmp_path: Path) -> None:
    env = {**worker_env(settings), "LIGHTBOX_PRESETS_FILE": str(tmp_path / "no-such-presets.toml")}
    worker = WorkerProcess(env, tmp_path / "worker.log").start()
    assert worker.proc is not None
    assert worker.proc.wait(120) == 70, worker.log_tail()
    assert "could not start" in worker.log_tail()  # built before joining: it never held partitions


def test_a_worker_that_cannot_go_on_fail_stops_leaves_the_group_and_commits_nothing_unfinished(
        settings: Settings, catalog: list[Path], tmp_path: Path) -> None:
    """The output folder turns unwritable once the worker runs: one fail-stop line, exit 70, the
    group left (its partitions free at once), and no committed offset passes an input without an
    output."""
    out = tmp_path / "out"
    env = {**worker_env(settings), "LIGHTBOX_OUTPUT_DIR": str(out)}
    worker = WorkerProcess(env, tmp_path / "worker.log").start()
    try:
        async def joined() -> None:
            for _ in range(240):
                with contextlib.suppress(KafkaError):
                    if await group_members(settings) == 1:
                        return
                await asyncio.sleep(0.5)
            raise AssertionError("the worker never joined its group")

        asyncio.run(joined())
        for f in catalog[:6]:  # a file where each SKU's folder would go: every write now fails
            (out / f.stem).write_text("in the way")
        _, by_pos = asyncio.run(publish_all(settings, catalog[:6], {}))
        assert worker.proc is not None
        assert worker.proc.wait(180) == 70, worker.log_tail()
        log = worker.log_tail(200)
        assert sum("fail-stop" in line for line in log.splitlines()) == 1, log
        assert "StoreUnavailable" in log
        assert asyncio.run(group_members(settings)) == 0
        outputs = asyncio.run(read_everything(settings))
        done = ({ev["source_event_id"] for kind, ev in outputs if kind == "processed"}
                | {(ev["original"]["partition"], ev["original"]["offset"]) for kind, ev in outputs
                   if kind != "processed"})
        for tp, off in asyncio.run(committed(settings)).items():
            assert all(sent.event_id in done or (p, o) in done
                       for (p, o), sent in by_pos.items() if p == tp.partition and o < off)
    finally:
        worker.stop()


def test_topics_take_their_settings_and_the_sink_reads_their_limits(settings: Settings) -> None:
    from agents.wiring import kafka_sink
    from streams.app import ensure_topics

    s = settings.model_copy(update={"output_max_message_bytes": 1_500_000})
    assert sorted(asyncio.run(ensure_topics(s))) == sorted(
        [s.topics.input, s.topics.backfill, s.topics.output, s.topics.dlq])

    async def limits() -> dict:
        sink = kafka_sink(s)
        await sink.start()
        try:
            return dict(sink.limits)
        finally:
            await sink.stop()

    got = asyncio.run(limits())
    assert got["processed"] == 1_500_000
    assert got["dead_letter"] != 1_500_000 and got["dead_letter"] >= 1_000_000  # the broker's default
