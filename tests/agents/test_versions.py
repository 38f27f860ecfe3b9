"""Versioned outputs and redrive attempts, on the real CPU pipeline (no broker).

A replayed input — the same event re-published on the backfill topic — yields the same output
event id and bytes when the pipeline and model versions are the same (downstream dedupes), and a
new id when either version changes; the event says which versions made it."""

from __future__ import annotations

from pathlib import Path

import pytest

from agents.process import BatchProcessor, InRecord, OutRecord, Prepared
from agents.wiring import build_processor
from lightbox.redrive import RedriveFilter
from schemas.events import EventCodecs
from schemas.headers import ATTEMPTS_HEADER, attempts_of
from streams.producer import ImageProducer
from streams.settings import Settings


@pytest.fixture(scope="module")
def processor(tmp_path_factory: pytest.TempPathFactory) -> BatchProcessor:
    return build_processor(Settings(device="cpu", segmenter="classical", data_dir=tmp_path_factory.mktemp("d")))


def with_versions(p: BatchProcessor, *, pipeline: str | None = None, model: str | None = None) -> BatchProcessor:
    return BatchProcessor(p.pipeline, p.presets, p.codecs, worker_id="other-worker",
                          pipeline_version=pipeline or p.pipeline_version, model_version=model or p.model_version)


def run_one(p: BatchProcessor, rec: InRecord) -> dict:
    prepared = p.prepare(rec)
    out = prepared if isinstance(prepared, OutRecord) else p.run([prepared])[0]
    assert not isinstance(prepared, Prepared) or out.kind == "processed"
    codecs = EventCodecs.create()
    return (codecs.processed if out.kind == "processed" else codecs.dead_letter).decode(out.value)


def test_same_versions_same_ids_and_bytes_new_version_new_ids(processor: BatchProcessor, catalog: list[Path]) -> None:
    value = EventCodecs.create().product.encode(
        ImageProducer.event({"data": catalog[3].read_bytes()}, sku="SKU-3", image_id="i", presets=["jd_main"]))
    live = run_one(processor, InRecord("lightbox.images.v1", 2, 41, value, key=b"SKU-3"))
    replayed = run_one(processor, InRecord("lightbox.images.backfill.v1", 0, 7, value, key=b"SKU-3",
                                           headers=[("lightbox-replay-of", b"lightbox.images.v1:2:41")]))
    assert replayed["event_id"] == live["event_id"]
    assert [v["data"] for v in replayed["variants"]] == [v["data"] for v in live["variants"]]

    new_model = run_one(with_versions(processor, model="u2netp-v2"), InRecord("b", 0, 8, value))
    new_pipeline = run_one(with_versions(processor, pipeline="9.9.9"), InRecord("b", 0, 9, value))
    ids = {live["event_id"], new_model["event_id"], new_pipeline["event_id"]}
    assert len(ids) == 3  # a new version, a new id
    assert {e["source_event_id"] for e in (live, new_model, new_pipeline)} == {live["source_event_id"]}
    assert (new_model["model_version"], new_model["pipeline_version"]) == ("u2netp-v2", processor.pipeline_version)
    assert (new_pipeline["model_version"], new_pipeline["pipeline_version"]) == (processor.model_version, "9.9.9")
    assert (live["model_version"], live["pipeline_version"]) == (processor.model_version, processor.pipeline_version)


def test_a_dead_letter_carries_the_attempt_from_the_header(processor: BatchProcessor) -> None:
    value = EventCodecs.create().product.encode(
        ImageProducer.event({"uri": "file:///no/such/file.jpg", "sha256": None}, sku="S", image_id="i",
                            presets=["jd_main"]))
    first = run_one(processor, InRecord("in", 0, 1, value))
    again = run_one(processor, InRecord("in", 0, 2, value, headers=[(ATTEMPTS_HEADER, b"3")]))
    assert (first["error_code"], first["attempts"]) == ("FETCH_FAILED", 1)
    assert (again["error_code"], again["attempts"]) == ("FETCH_FAILED", 3)


@pytest.mark.parametrize("headers,expected", [
    (None, 1), ([], 1), ([(ATTEMPTS_HEADER, b"2")], 2), ([("x", b"5"), (ATTEMPTS_HEADER, b"7")], 7),
    ([(ATTEMPTS_HEADER, b"0")], 1), ([(ATTEMPTS_HEADER, b"-4")], 1), ([(ATTEMPTS_HEADER, b"lots")], 1),
    ([(ATTEMPTS_HEADER, b"\xff")], 1), ([(ATTEMPTS_HEADER, None)], 1), ([(ATTEMPTS_HEADER, b"99999999999")], 1),
])
def test_attempts_header_parsing(headers: list[tuple[str, bytes | None]] | None, expected: int) -> None:
    assert attempts_of(headers) == expected


def test_redrive_filter() -> None:
    dead = {"error_code": "FETCH_FAILED", "failed_at": 5_000, "attempts": 1,
            "original": {"topic": "in", "partition": 0, "offset": 3, "value": b"v"}}
    assert RedriveFilter().why_not(dead) is None
    assert RedriveFilter(codes=frozenset({"DECODE_FAILED"})).why_not(dead) == "code"
    assert RedriveFilter(since_ms=5_001).why_not(dead) == "time"
    assert RedriveFilter(until_ms=5_000).why_not(dead) == "time"
    assert RedriveFilter(since_ms=5_000, until_ms=5_001).why_not(dead) is None
    assert RedriveFilter(source_topic="other").why_not(dead) == "topic"
    assert RedriveFilter(max_attempts=1).why_not(dead) == "max_attempts"
    assert RedriveFilter().why_not({**dead, "original": {**dead["original"], "value": None}}) == "no_value"
