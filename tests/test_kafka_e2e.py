"""End to end on a real Kafka broker: a `lightbox worker` process, real photos, bad inputs."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

import pytest
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.structs import TopicPartition

from gpu_kernels.presets import load_presets
from lightbox.demo import WorkerProcess, collect_outputs
from streams.producer import ImageProducer
from streams.settings import Settings

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

PRESETS = ["taobao_main", "xiaohongshu_cover", "thumb_webp"]


def worker_env(s: Settings) -> dict[str, str]:
    return {"LIGHTBOX_KAFKA_BOOTSTRAP": s.kafka_bootstrap, "LIGHTBOX_GROUP_ID": s.group_id,
            "LIGHTBOX_INPUT_TOPIC": s.input_topic, "LIGHTBOX_OUTPUT_TOPIC": s.output_topic,
            "LIGHTBOX_DLQ_TOPIC": s.dlq_topic, "LIGHTBOX_BACKFILL_TOPIC": s.backfill_topic,
            "LIGHTBOX_DATA_DIR": str(s.data_dir), "LIGHTBOX_DEVICE": "cpu", "LIGHTBOX_SEGMENTER": "classical"}


async def publish_all(s: Settings, good: list[Path], bad: dict[str, Path]) -> tuple[dict, dict]:
    """Publish; return {event_id: file} for readable events and {(partition, offset): what} for all."""
    by_id, by_pos = {}, {}
    async with ImageProducer(s.kafka_bootstrap, s.input_topic) as prod:
        sent = []
        for f in good:
            ev = prod.event_for_file(f, presets=PRESETS)
            sent.append((ev["event_id"], f.name, await prod.publish(ev)))
        for name, f in bad.items():
            ev = prod.event_for_file(f, presets=PRESETS)
            sent.append((ev["event_id"], name, await prod.publish(ev)))
        ev = prod.event_for_file(good[0], presets=["jd_main", "tmall_giant"])
        sent.append((ev["event_id"], "unknown-preset", await prod.publish(ev)))
        ev = prod.event({"uri": "file:///no/such/dir/SKU-x.jpg", "sha256": None}, sku="SKU-x",
                        image_id="x", presets=PRESETS)
        sent.append((ev["event_id"], "missing-file", await prod.publish(ev)))
        sent.append((None, "not-avro", await prod.publish_raw(b"{\"sku\": \"json, not avro\"}", key=b"SKU-y")))
        for event_id, what, fut in sent:
            meta = await fut
            by_pos[(meta.partition, meta.offset)] = what
            if event_id:
                by_id[event_id] = what
    return by_id, by_pos


async def committed(s: Settings) -> dict[TopicPartition, int]:
    admin = AIOKafkaAdminClient(bootstrap_servers=s.kafka_bootstrap)
    await admin.start()
    try:
        offsets = await admin.list_consumer_group_offsets(s.group_id)
        return {tp: meta.offset for tp, meta in offsets.items() if tp.topic == s.input_topic}
    finally:
        await admin.close()


def test_every_input_yields_exactly_one_output(settings: Settings, catalog: list[Path],
                                               bad_files: dict[str, Path], tmp_path: Path) -> None:
    worker = WorkerProcess(worker_env(settings), tmp_path / "worker.log").start()
    try:
        by_id, by_pos = asyncio.run(publish_all(settings, catalog, bad_files))
        assert len(by_pos) == len(catalog) + len(bad_files) + 3 >= 20 + 7
        processed, dead = asyncio.run(collect_outputs(
            settings.kafka_bootstrap, [settings.output_topic, settings.dlq_topic], len(by_pos), 300,
            worker.running))
        assert len(processed) + len(dead) == len(by_pos), worker.log_tail()

        # exactly one output per input: processed by source event id, dead letters by position
        assert Counter(p["source_event_id"] for p in processed) == Counter(
            {eid: 1 for eid, what in by_id.items() if what.startswith("SKU-")})
        dead_pos = Counter((d["original"]["partition"], d["original"]["offset"]) for d in dead)
        assert all(n == 1 for n in dead_pos.values())
        codes = {by_pos[pos]: d["error_code"] for pos, d in
                 (((d["original"]["partition"], d["original"]["offset"]), d) for d in dead)}
        assert codes == {"empty.jpg": "DECODE_FAILED", "truncated.jpg": "DECODE_FAILED",
                         "notes-as-image.jpg": "UNSUPPORTED_FORMAT", "pixel-bomb.png": "TOO_LARGE",
                         "unknown-preset": "UNKNOWN_PRESET", "missing-file": "FETCH_FAILED",
                         "not-avro": "SCHEMA_INVALID"}

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
    finally:
        rc = worker.stop()
    assert rc is not None


def test_a_killed_worker_loses_nothing_and_replays_identically(settings: Settings, catalog: list[Path],
                                                                tmp_path: Path) -> None:
    """SIGKILL a worker mid-stream; its successor in the group redoes what was not committed.
    Every input ends with an output, and a duplicate carries the same event id and bytes."""
    import signal

    from streams.consume import read_events

    env = {**worker_env(settings), "LIGHTBOX_SESSION_TIMEOUT_S": "8"}
    first = WorkerProcess(env, tmp_path / "w1.log").start()
    second = None
    try:
        by_id, _ = asyncio.run(publish_all(settings, catalog, {}))
        good = {eid for eid, what in by_id.items() if what.startswith("SKU-")}

        async def until(n: int) -> None:
            async for _ in read_events(settings.kafka_bootstrap, [settings.output_topic], limit=n, idle_s=240):
                pass

        asyncio.run(until(6))
        assert first.proc is not None
        first.proc.send_signal(signal.SIGKILL)
        first.proc.wait(30)
        second = WorkerProcess(env, tmp_path / "w2.log").start()

        async def all_outputs() -> list[dict]:
            seen: dict[str, int] = {}
            out = []
            async for _kind, ev in read_events(settings.kafka_bootstrap, [settings.output_topic], idle_s=120):
                out.append(ev)
                seen[ev["source_event_id"]] = 1
                if good <= set(seen):
                    break
            return out

        outputs = asyncio.run(asyncio.wait_for(all_outputs(), 400))
        assert good <= {ev["source_event_id"] for ev in outputs}, second.log_tail()
        by_source: dict[str, list[dict]] = {}
        for ev in outputs:
            by_source.setdefault(ev["source_event_id"], []).append(ev)
        for evs in by_source.values():
            assert len({e["event_id"] for e in evs}) == 1
            assert len({tuple(v["sha256"] for v in e["variants"]) for e in evs}) == 1
            assert len({tuple(v["data"] for v in e["variants"]) for e in evs}) == 1
    finally:
        first.stop()
        if second is not None:
            second.stop()
