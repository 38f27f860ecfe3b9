"""Pure parts of the backfill tier: manifests, the token bucket, replay progress, the checkpoint."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from lightbox.ratelimit import TokenBucket
from lightbox.replay import Checkpoint, ReplayProgress, job_id
from tests.agents.test_runner import FakeClock  # seconds that move only when told to


# -- token bucket ----------------------------------------------------------------------------
def test_bucket_starts_full_then_paces_at_the_rate() -> None:
    clock = FakeClock()
    bucket = TokenBucket(10.0, burst=5, clock=clock)
    assert [bucket.take() for _ in range(5)] == [0.0] * 5  # the burst
    assert bucket.take() == pytest.approx(0.1)  # the 6th waits one token's time
    assert bucket.take() == pytest.approx(0.2)  # debt accumulates: the caller sleeps it off
    clock.t += 0.2
    assert bucket.tokens == pytest.approx(0.0)


def test_bucket_holds_the_rate_over_a_long_run() -> None:
    """A caller that sleeps what take() says publishes rate/s (+ the burst) over any long window."""
    clock = FakeClock()
    bucket = TokenBucket(50.0, burst=10, clock=clock)
    start, sent = clock.t, 0
    while clock.t - start < 60:
        clock.t += bucket.take()
        sent += 1
        clock.t += random.uniform(0, 0.01)  # the caller's own work
    assert 50 * 60 <= sent <= 50 * 60 + 10 + 1


def test_bucket_refills_only_up_to_the_burst() -> None:
    clock = FakeClock()
    bucket = TokenBucket(2.0, burst=3, clock=clock)
    for _ in range(3):
        bucket.take()
    clock.t += 3600
    assert bucket.tokens == 3
    assert [bucket.take() for _ in range(4)][-1] == pytest.approx(0.5)


@pytest.mark.parametrize("rate,burst", [(0, None), (-1, None), (float("inf"), None), (5, 0.5)])
def test_bucket_refuses_nonsense(rate: float, burst: float | None) -> None:
    with pytest.raises(ValueError, match="TokenBucket"):
        TokenBucket(rate, burst)


# -- manifests (read with streams.producer.read_manifest) -----------------------------------
def test_manifest_source_events_have_ids_fixed_per_job(tmp_path: Path) -> None:
    import asyncio

    from lightbox.replay import Defaults, ManifestSource
    from schemas.events import EventCodecs

    (tmp_path / "img").mkdir()
    m = tmp_path / "m.csv"
    m.write_text("sku,uri,presets,background,priority\n"
                 "A-1,s3://bucket/a.jpg,jd_main;amazon_main,transparent,5\n"
                 "B-2,img/b.png,,,\n"
                 "C-3,https://cdn.example/c.webp,thumb_webp,,\n")
    src = ManifestSource(m, Defaults(presets=("taobao_main",)))

    async def items(cursor: dict[int, int]) -> list[dict]:
        codec = EventCodecs.create().product
        return [codec.decode(it.value) async for it in src.items("job-1", await src.plan(), cursor)]

    first, again, rest = asyncio.run(items({})), asyncio.run(items({})), asyncio.run(items({0: 2}))
    assert asyncio.run(src.plan()) == {"total": 3}
    assert [e["sku"] for e in first] == ["A-1", "B-2", "C-3"] and [e["sku"] for e in rest] == ["C-3"]
    assert [e["event_id"] for e in first] == [e["event_id"] for e in again]  # the same job, the same ids
    assert rest[0]["event_id"] == first[2]["event_id"] and len({e["event_id"] for e in first}) == 3
    assert first[0]["presets"] == ["jd_main", "amazon_main"] and first[0]["retouch"]["background"] == "TRANSPARENT"
    assert first[0]["priority"] == 5 and first[1]["presets"] == ["taobao_main"]
    assert first[1]["source"]["uri"] == (tmp_path / "img" / "b.png").resolve().as_uri()  # relative to the manifest
    other = ManifestSource(m, Defaults(presets=("jd_main",)))
    assert other.spec() != src.spec()  # other defaults, another job


# -- progress and checkpoint ------------------------------------------------------------------
def test_progress_cursor_is_the_contiguous_acknowledged_prefix() -> None:
    p = ReplayProgress({0: 10})
    for seq in range(10, 15):
        p.sent(0, seq)
    p.acked(0, 12, (1, 500))
    p.acked(0, 11, (0, 300))
    assert p.cursor == {0: 10}  # 10 still in flight
    p.acked(0, 10, (2, 700))
    assert p.cursor == {0: 13} and p.pending == 2
    with pytest.raises(ValueError, match="not sent or is acknowledged"):
        p.acked(0, 12, (1, 500))


def test_progress_scan_from_never_passes_a_record_beyond_the_cursor() -> None:
    """Two source lanes into one target partition: lane 1's item is covered, lane 0's earlier
    (lower offset) one is not; a resumed run must scan from lane 0's offset, not past lane 1's."""
    p = ReplayProgress({}, {0: 90})
    p.sent(0, 5)
    p.sent(0, 6)
    p.sent(1, 40)
    p.acked(0, 6, (0, 100))  # uncovered: lane 0 seq 5 is still in flight
    p.acked(1, 40, (0, 101))  # covered
    assert p.cursor == {1: 41}
    assert p.snapshot_scan_from() == {0: 100}
    p.acked(0, 5, (0, 99))
    assert p.cursor == {0: 7, 1: 41} and p.snapshot_scan_from() == {0: 102}


def test_progress_randomized_against_a_model() -> None:
    rng = random.Random(7)
    for _ in range(200):
        p = ReplayProgress()
        seqs = sorted(rng.sample(range(100), 12))
        for s in seqs:
            p.sent(0, s)
        order = seqs[:]
        rng.shuffle(order)
        done: set[int] = set()
        for s in order[: rng.randrange(len(order) + 1)]:
            p.acked(0, s, (0, s))
            done.add(s)
            prefix = [x for i, x in enumerate(seqs) if all(y in done for y in seqs[: i + 1])]
            if not prefix:
                assert 0 not in p.cursor
            else:  # past the done prefix's last item; no item lies between it and the next pending one
                assert p.cursor[0] == prefix[-1] + 1


def test_checkpoint_round_trip_and_job_ids(tmp_path: Path) -> None:
    c = Checkpoint(job="j", topic="t", spec={"kind": "folder"}, plan={"total": 3}, cursor={0: 2, 3: 9},
                   scan_from={1: 5}, published=2)
    c.save(tmp_path / "c.json")
    assert Checkpoint.load(tmp_path / "c.json") == c
    assert Checkpoint.load(tmp_path / "missing.json") is None
    assert job_id({"a": 1, "b": 2}, "t") == job_id({"b": 2, "a": 1}, "t") != job_id({"a": 1, "b": 2}, "u")


def test_the_replay_position_is_read_from_the_current_and_the_earlier_header() -> None:
    from lightbox.replay import REPLAY_POSITION_HEADER, REPLAY_SEQ_HEADER, replay_position

    assert replay_position({REPLAY_POSITION_HEADER: b"3:17"}) == (3, 17)
    assert replay_position({REPLAY_SEQ_HEADER: b"0:5"}) == (0, 5)  # written by earlier versions
    assert replay_position({REPLAY_POSITION_HEADER: b"1:2", REPLAY_SEQ_HEADER: b"9:9"}) == (1, 2)
    assert replay_position({}) is None
    assert replay_position({REPLAY_POSITION_HEADER: b"garbage"}) is None
