"""The streaming peer benchmark's arithmetic: its arrival schedule and its per-level summary."""

from __future__ import annotations

import itertools

import pytest

from bench.bench_stream_peers import LOADS, SERVICES, _pct, events_for, poisson, summarise


def test_poisson_schedule_is_seeded_starts_at_zero_and_keeps_the_rate() -> None:
    a, b = poisson(4.0, 400, seed=7), poisson(4.0, 400, seed=7)
    assert a == b and a != poisson(4.0, 400, seed=8)
    assert a[0] == 0.0 and all(y >= x for x, y in itertools.pairwise(a))
    assert 399 / a[-1] == pytest.approx(4.0, rel=0.15)  # 400 arrivals span about 100 s at 4/s


def test_events_per_level_follow_the_rate_with_a_floor() -> None:
    assert events_for(2.0, 40, 8) == 80
    assert events_for(0.05, 40, 8) == 8


def test_percentile_interpolates_between_ranks() -> None:
    xs = [1.0, 2.0, 3.0, 4.0, 5.0]
    assert _pct(xs, 50) == 3.0 and _pct(xs, 100) == 5.0 and _pct(xs, 0) == 1.0
    assert _pct(xs, 99) == pytest.approx(4.96)
    assert _pct([7.0], 99) == 7.0


def _level(thr: float, p99: float, cpu: float, failed: int = 0) -> dict[str, float]:
    return {"throughput": thr, "p50_s": p99 / 2, "p99_s": p99, "cpu_s_per_image": cpu, "failed": failed}


def test_summary_takes_medians_over_rounds_and_orients_ratios_towards_lightbox() -> None:
    capacity = {"small": {"peer": [{"capacity": 1.0, "cpu_s_per_image": 2.0}],
                          "lightbox": [{"capacity": 3.0, "cpu_s_per_image": 0.5}]}}
    rounds = {"peer": [_level(1.0, 4.0, 2.0), _level(1.0, 6.0, 2.0), _level(1.0, 8.0, 2.0, failed=1)],
              "lightbox": [_level(2.0, 1.0, 0.5), _level(2.0, 2.0, 0.5), _level(9.0, 3.0, 0.5)]}
    levels = {"small": {s: [{f"{load:g}": row for load in LOADS} for row in rounds[s]] for s in SERVICES}}
    got = summarise(capacity, levels)["small"]
    assert got["capacity_ratio"] == 3.0
    lv = got["levels"]["1.2"]
    assert lv["peer"]["p99_s"] == 6.0 and lv["lightbox"]["p99_s"] == 2.0  # medians, not means
    assert lv["throughput_ratio"] == 2.0  # lightbox / peer
    assert lv["p99_ratio"] == 3.0 and lv["cpu_ratio"] == 4.0  # peer / lightbox: above 1, lightbox ahead
    assert lv["failed"] == {"peer": 1, "lightbox": 0}  # failures are summed, never hidden by a median
