"""`lightbox audit`: the pure reconciliation, and one run on real topics."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from lightbox.audit import AuditInput, AuditOutput, reconcile

V1 = (("taobao_main", "jpeg", 800, 800, 1000, "aa", "d1"),)
V2 = (("taobao_main", "jpeg", 800, 800, 1001, "ab", "d2"),)


def inp(offset: int, event_id: str | None, topic: str = "in", partition: int = 0, sha: str | None = None
        ) -> AuditInput:
    return AuditInput(topic, partition, offset, event_id, sha or f"sha-{offset}", (("traceparent", b"t"),))


def processed(source_event_id: str, source: str | None, variants: tuple = V1, event_id: str | None = None
              ) -> AuditOutput:
    eid = event_id or f"p-{source_event_id}"
    return AuditOutput("processed", eid, source_event_id, source, (eid, variants))


def dead(source: str, code: str = "DECODE_FAILED", source_event_id: str | None = None,
         original: tuple | None = None) -> AuditOutput:
    sha = original[0] if original else f"sha-{source.rsplit(':', 1)[1]}"
    return AuditOutput("dead_letter", f"d-{source}", source_event_id, source, (code, sha), error_code=code,
                       original=original or (sha, (("traceparent", b"t"),)))


def test_every_input_accounted_for() -> None:
    r = reconcile([inp(0, "a"), inp(1, "b"), inp(2, None)],
                  [processed("a", "in:0:0"), dead("in:0:1", "TOO_LARGE", "b"), dead("in:0:2", "SCHEMA_INVALID")])
    assert (r.inputs, r.processed, r.dead_letters, r.missing, r.duplicates) == (3, 1, 2, [], 0)
    assert r.error_codes == {"SCHEMA_INVALID": 1, "TOO_LARGE": 1}
    assert r.ok and r.duplicates_identical


def test_missing_inputs_are_listed_by_position() -> None:
    r = reconcile([inp(0, "a"), inp(1, "b"), inp(2, None), inp(3, None)],
                  [processed("a", "in:0:0"), dead("in:0:3", "SCHEMA_INVALID")])
    assert r.missing == ["in:0:1", "in:0:2"]
    assert not r.ok
    # listed in log order (partition, then offset as a number)
    r = reconcile([inp(10, "x", partition=1), inp(2, "y", partition=1), inp(9, "z")], [])
    assert r.missing == ["in:0:9", "in:1:2", "in:1:10"]


def test_identical_duplicates_pass_and_differing_ones_fail() -> None:
    same = reconcile([inp(0, "a"), inp(1, None)],
                     [processed("a", "in:0:0"), processed("a", "in:0:0"), dead("in:0:1"), dead("in:0:1")])
    assert (same.duplicates, same.duplicated_inputs, same.duplicates_identical, same.ok) == (2, 2, True, True)

    other_bytes = reconcile([inp(0, "a")], [processed("a", "in:0:0"), processed("a", "in:0:0", V2)])
    assert other_bytes.conflicts == ["in:0:0"] and not other_bytes.duplicates_identical and not other_bytes.ok

    other_id = reconcile([inp(0, "a")], [processed("a", "in:0:0"), processed("a", "in:0:0", event_id="x")])
    assert other_id.conflicts == ["in:0:0"]

    both_kinds = reconcile([inp(0, "a")], [processed("a", "in:0:0"), dead("in:0:0", "PROCESSING_FAILED", "a")])
    assert both_kinds.conflicts == ["in:0:0"] and both_kinds.processed == 1


def test_matched_by_event_id_across_topics_and_by_position_when_unreadable() -> None:
    # the same event replayed on the backfill topic is one logical input: two outputs, identical
    r = reconcile([inp(0, "a"), inp(5, "a", topic="backfill")],
                  [processed("a", "in:0:0"), processed("a", "backfill:0:5")])
    assert (r.inputs, r.processed, r.duplicates, r.ok) == (1, 1, 1, True)
    # dead-lettered on both: ids differ (they come from positions) but each position agrees
    same = ("sha-a", (("traceparent", b"t"),))
    d = reconcile([inp(0, "a", sha="sha-a"), inp(5, "a", topic="backfill", sha="sha-a")],
                  [dead("in:0:0", source_event_id="a", original=same),
                   dead("backfill:0:5", source_event_id="a", original=same)])
    assert d.ok and d.dead_letters == 1
    # an output without an event id finds its input through its position
    r = reconcile([inp(0, "a")], [dead("in:0:0", "PROCESSING_FAILED")])
    assert r.dead_letters == 1 and r.ok


def test_outputs_outside_the_range_are_counted_not_matched() -> None:
    r = reconcile([inp(1, "b")], [processed("a", "in:0:0"), processed("b", "in:0:1"), dead("in:0:7")])
    assert (r.inputs, r.processed, r.outside_range, r.ok) == (1, 1, 2, True)


def test_a_dead_letter_must_carry_its_input_unchanged() -> None:
    bad = dead("in:0:0", original=("sha-0", (("traceparent", b"other"),)))
    r = reconcile([inp(0, None)], [bad])
    assert r.original_mismatches == ["in:0:0"] and not r.ok


def test_bad_digest_fails() -> None:
    out = AuditOutput("processed", "p-a", "a", "in:0:0", ("p-a", V1), digest_ok=False)
    assert reconcile([inp(0, "a")], [out]).bad_digests == 1


# -- on real topics --------------------------------------------------------------------------------
@pytest.mark.kafka
def test_audit_on_real_topics(settings, catalog: list[Path], bad_files: dict[str, Path], tmp_path: Path,
                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Inputs through the real processor and sink: one input left without output, one output sent
    twice. The audit (and the CLI) finds exactly that."""
    from aiokafka import AIOKafkaProducer

    from agents.process import InRecord, OutRecord
    from agents.wiring import build_processor
    from lightbox.audit import run_audit
    from lightbox.cli import app
    from streams.app import ensure_topics
    from streams.consume import read_records
    from streams.producer import ImageProducer

    settings = settings.model_copy(update={"presets_file": None})

    async def publish() -> None:
        await ensure_topics(settings)
        async with ImageProducer(settings.kafka.bootstrap, settings.topics.input) as prod:
            futs = [await prod.publish(prod.event_for_file(f, presets=["thumb_webp"])) for f in catalog[:3]]
            futs.append(await prod.publish(prod.event_for_file(bad_files["truncated.jpg"], presets=["thumb_webp"])))
            futs.append(await prod.publish_raw(b"not avro", key=b"k"))
            await prod.flush(futs)

    asyncio.run(publish())
    records = asyncio.run(read_records(settings.kafka.bootstrap, [settings.topics.input]))
    assert len(records) == 5
    processor = build_processor(settings, "cpu")
    outs: list[OutRecord] = []
    for r in records:
        got = processor.prepare(InRecord(r.topic, r.partition, r.offset, r.value, r.key, list(r.headers),
                                         r.timestamp_ms))
        outs.extend([got] if isinstance(got, OutRecord) else processor.run([got]))
    left_out = next(o for o in outs if o.kind == "processed")
    sent = [o for o in outs if o is not left_out]
    sent.append(next(o for o in sent if o.kind == "processed"))  # a duplicate, identical

    async def send() -> None:  # as the worker's sink does: one topic per kind, the record's key and headers
        topics = {"processed": settings.topics.output, "dead_letter": settings.topics.dlq}
        prod = AIOKafkaProducer(bootstrap_servers=settings.kafka.bootstrap, acks="all", enable_idempotence=True,
                                max_request_size=48 << 20)
        await prod.start()
        try:
            await asyncio.gather(*[await prod.send(topics[o.kind], o.value, key=o.key,
                                                   headers=[(k, v or b"") for k, v in o.headers]) for o in sent])
        finally:
            await prod.stop()

    asyncio.run(send())
    report = asyncio.run(run_audit(settings.kafka.bootstrap, [settings.topics.input, settings.topics.backfill],
                                   [settings.topics.output, settings.topics.dlq]))
    src = left_out.source
    assert report.missing == [f"{src.topic}:{src.partition}:{src.offset}"]
    assert (report.inputs, report.processed, report.dead_letters) == (5, 2, 2)
    assert (report.duplicates, report.duplicates_identical, report.original_mismatches) == (1, True, [])
    assert report.error_codes == {"DECODE_FAILED": 1, "SCHEMA_INVALID": 1}

    # a time range selects inputs by record timestamp
    first, last = min(r.timestamp_ms for r in records), max(r.timestamp_ms for r in records)
    topics = ([settings.topics.input], [settings.topics.output, settings.topics.dlq])
    assert asyncio.run(run_audit(settings.kafka.bootstrap, *topics, since_ms=first)).inputs == 5
    assert asyncio.run(run_audit(settings.kafka.bootstrap, *topics, since_ms=last + 1)).inputs == 0
    assert asyncio.run(run_audit(settings.kafka.bootstrap, *topics, until_ms=first)).inputs == 0

    for key, val in (("KAFKA_BOOTSTRAP", settings.kafka.bootstrap), ("INPUT_TOPIC", settings.topics.input),
                     ("BACKFILL_TOPIC", settings.topics.backfill), ("OUTPUT_TOPIC", settings.topics.output),
                     ("DLQ_TOPIC", settings.topics.dlq)):
        monkeypatch.setenv(f"LIGHTBOX_{key}", val)
    res = CliRunner().invoke(app, ["audit", "--json"])
    assert res.exit_code == 1, res.output
    assert json.loads(res.output)["missing"] == report.missing
    # an offset range that leaves the missing input out passes
    res = CliRunner().invoke(app, ["audit", "--from-offset", str(src.offset + 1)])
    assert res.exit_code == 0 and "missing 0" in res.output, res.output
