"""The latency report's arithmetic (pure)."""

from __future__ import annotations

import pytest

from lightbox.report import stage_family, stage_table


def event(spans: list[tuple[str, int, int]], latency_ms: int) -> dict:
    return {"spans": [{"stage": s, "start_us": 0, "duration_us": d, "batch_size": b, "device": "cpu"}
                      for s, d, b in spans], "latency_us": latency_ms * 1000}


def test_preset_spans_fold_into_render_and_encode() -> None:
    assert stage_family("preset:jd_main") == "render"
    assert stage_family("encode:jd_main") == "encode"
    assert stage_family("decode") == "decode"


def test_stage_table_means_shares_and_amortized_cost() -> None:
    events = [event([("decode", 40_000, 4), ("preset:a", 10_000, 1), ("preset:b", 30_000, 1)], 100),
              event([("decode", 80_000, 4), ("preset:a", 20_000, 1)], 300)]
    rows, e2e = stage_table(events)
    by = {r.stage: r for r in rows}
    assert [r.stage for r in rows] == ["decode", "render"]
    assert by["decode"].mean_ms == pytest.approx(60.0)
    assert by["decode"].per_image_ms == pytest.approx(15.0)  # batches of 4
    assert by["render"].mean_ms == pytest.approx(30.0)  # (10 + 30) and 20, per event
    assert sum(r.share for r in rows) == pytest.approx(1.0)
    assert by["decode"].share == pytest.approx(60 / 90)
    assert e2e["n"] == 2 and e2e["p50_ms"] == pytest.approx(200.0)


def test_a_stage_missing_from_some_events_counts_as_zero_there() -> None:
    rows, _ = stage_table([event([("segment", 10_000, 1)], 1), event([("decode", 1_000, 1)], 1)])
    assert {r.stage: r.mean_ms for r in rows} == {"decode": pytest.approx(0.5), "segment": pytest.approx(5.0)}


def test_no_events_gives_an_empty_table() -> None:
    assert stage_table([]) == ([], {"n": 0})
