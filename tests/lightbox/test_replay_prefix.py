"""`lightbox replay prefix` on a real S3 (s3proxy) and the real broker: the listing (images only,
sorted, nested keys in, folder markers, other objects and sibling prefixes out), URIs the worker's
fetcher reads back, a dry run that counts, a resume after an interruption and after a crash past the
last checkpoint (no gaps, no repeats, new objects under the prefix left for another job), and a
worker that processes a replayed object from S3."""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path
from typing import Any

import obstore
import pytest
from typer.testing import CliRunner

from blobio.fetch import Fetcher, FetchPolicy, split_uri
from lightbox.cli import app
from lightbox.replay import REPLAY_POSITION_HEADER, Defaults, PrefixSource, ReplayError, run_replay
from schemas.events import EventCodecs
from streams.app import ensure_topics
from streams.settings import Settings
from tests.agents.test_backfill import read_raw, seqs_of, worker_env

pytestmark = pytest.mark.kafka

# below the prefix: 7 images (two nested, one name with a space and a non-ASCII letter) ...
IMAGES = ["a-001.jpg", "a-002.JPG", "b 3 é.png", "c-004.webp", "sub/d-005.jpg", "sub/deep/e-006.jpeg", "z-007.jpg"]
# ... and what the listing leaves out: not images, and a zero-byte object (a folder marker)
OTHERS = {"notes.txt": b"not an image", "sub/manifest.json": b"{}", "sub/empty.jpg": b""}


@pytest.fixture
def prefix(s3_env: Any, catalog: list[Path]) -> tuple[str, dict[str, bytes]]:
    """A fresh prefix with IMAGES and OTHERS; another object in a sibling prefix that merely starts
    with the same text. Returns (prefix, {key: bytes} of the images)."""
    tag = f"bf-{uuid.uuid4().hex[:8]}"
    client = s3_env.client()
    images = {f"{tag}/{name}": catalog[i].read_bytes() for i, name in enumerate(IMAGES)}
    for key, data in {**images, **{f"{tag}/{k}": v for k, v in OTHERS.items()},
                      f"{tag}-sibling/x.jpg": catalog[0].read_bytes()}.items():
        obstore.put(client, key, data)
    return tag, images


def source(s3: Any, tag: str, **kw: Any) -> PrefixSource:
    return PrefixSource(f"s3://{s3.bucket}/{tag}/", Defaults(presets=("jd_main",)), endpoint=s3.endpoint, **kw)


def decoded(records: list[Any]) -> list[dict[str, Any]]:
    codec = EventCodecs.create().product
    return [codec.decode(r.value) for r in records]


def test_prefix_source_lists_images_sorted_as_uris_the_fetcher_reads(s3_env: Any,
                                                                    prefix: tuple[str, dict[str, bytes]]) -> None:
    tag, images = prefix
    src = source(s3_env, tag)

    async def events(s: PrefixSource, cursor: dict[int, int]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        plan = await s.plan()  # no checkpoint (a dry run): the listing stays in memory
        codec = EventCodecs.create().product
        return plan, [codec.decode(it.value) async for it in s.items("job-1", plan, cursor)]

    plan, evs = asyncio.run(events(src, {}))
    assert plan["total"] == len(IMAGES) and plan["listing"] is None
    assert "2 non-image" in plan["note"] and "1 empty" in plan["note"]
    keys = [split_uri(ev["source"]["uri"])[2].lstrip("/") for ev in evs]
    assert keys == sorted(images)  # sorted by key; nested keys in; the sibling prefix, text and marker out
    assert all(split_uri(ev["source"]["uri"])[:2] == ("s3", s3_env.bucket) for ev in evs)
    assert [ev["sku"] for ev in evs] == [Path(k).stem for k in keys]
    assert all(ev["source"]["sha256"] is None and "data" not in ev["source"] for ev in evs)
    # the worker's fetcher (allow-listed bucket, the same endpoint) reads every URI back byte for byte
    fetcher = Fetcher(FetchPolicy(max_bytes=16 << 20, allow=(f"s3://{s3_env.bucket}",), s3_endpoint=s3_env.endpoint))
    assert [fetcher.fetch(ev["source"]) for ev in evs] == [images[k] for k in keys]
    # event ids are fixed per job and position; a cursor continues from its item
    _, again = asyncio.run(events(source(s3_env, tag), {0: 5}))
    assert [ev["event_id"] for ev in again] == [ev["event_id"] for ev in evs[5:]]

    # --pattern replaces the suffix filter: on the name without a '/', on the key below the prefix with one
    _, by_name = asyncio.run(events(source(s3_env, tag, pattern="*.json"), {}))
    assert [ev["image_id"] for ev in by_name] == ["manifest.json"]
    _, by_path = asyncio.run(events(source(s3_env, tag, pattern="sub/*.jp*g"), {}))
    assert [ev["image_id"] for ev in by_path] == ["d-005.jpg", "e-006.jpeg"]  # `*` crosses '/'; empty.jpg is out

    with pytest.raises(ReplayError, match="no image objects"):
        asyncio.run(source(s3_env, f"{tag}/nothing-here").plan())
    with pytest.raises(ReplayError, match="not an object-store prefix"):
        PrefixSource(f"https://{s3_env.bucket}/{tag}/", Defaults())


def test_prefix_replay_counts_resumes_and_survives_a_crash_past_the_checkpoint(
        settings: Settings, s3_env: Any, prefix: tuple[str, dict[str, bytes]], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A dry run counts (CLI). A run stopped after 2-3 of 7 saves its position; a second run continues
    from it, publishes two or more and "crashes" (its checkpoint put back to how it started: its records
    sit on the topic past the saved position); the same command (CLI) then publishes the rest without
    gaps or repeats. An object added under the prefix meanwhile is not part of the job."""
    tag, images = prefix
    asyncio.run(ensure_topics(settings))
    ckpt = tmp_path / "ckpt.json"
    common = ["--presets", "jd_main", "--topic", settings.topics.backfill, "-b", settings.kafka.bootstrap,
              "--checkpoint", str(ckpt)]
    url = f"s3://{s3_env.bucket}/{tag}/"
    monkeypatch.setenv("COLUMNS", "200")

    dry = CliRunner().invoke(app, ["replay", "prefix", url, *common, "--dry-run", "--rate", "7"])
    assert dry.exit_code == 0, dry.output
    text = " ".join(dry.output.split())
    assert f"{len(IMAGES)} images, 0 already published, {len(IMAGES)} to publish" in text
    assert "about 1 s at 7 img/s" in text and "2 non-image" in text and "1 empty" in text
    assert not ckpt.exists() and not list(tmp_path.glob("*.keys"))  # a dry run writes nothing

    def run(stop_at: int, saved: list[str]) -> Any:
        """Stop once ``stop_at`` are published in all; ``saved`` gets the checkpoint as this run
        started (nothing saves it again before the end)."""
        stop = asyncio.Event()

        def progress(done: int, total: int) -> None:
            if not saved:
                saved.append(ckpt.read_text())
            if done >= stop_at:
                stop.set()

        return asyncio.run(run_replay(source(s3_env, tag), bootstrap=settings.kafka.bootstrap,
                                      topic=settings.topics.backfill, checkpoint=ckpt, stop=stop, on_progress=progress,
                                      max_in_flight=1, checkpoint_every_s=3600))

    first = run(2, [])  # stopped: what was in flight is finished and saved
    assert not first.complete and 2 <= first.published <= 3
    saved = json.loads(ckpt.read_text())
    assert saved["cursor"] == {"0": first.published}
    listing = Path(saved["plan"]["listing"])
    assert listing == tmp_path / "ckpt.json.keys"
    assert [json.loads(line) for line in listing.read_text().splitlines()] == sorted(images)

    # a new object lands under the prefix, sorting first: it must not shift the job's items
    obstore.put(s3_env.client(), f"{tag}/0-new.jpg", next(iter(images.values())))
    at_start: list[str] = []
    second = run(first.published + 2, at_start)
    assert not second.complete and second.this_run >= 2 and second.published < len(IMAGES)
    ckpt.write_text(at_start[0])  # a crash: what the second run published sits on the topic, unrecorded
    assert json.loads(at_start[0])["cursor"] == {"0": first.published}

    resumed = CliRunner().invoke(app, ["replay", "prefix", url, *common, "--rate", "50"])  # s3_env: the endpoint
    assert resumed.exit_code == 0, resumed.output
    text = " ".join(resumed.output.split())
    assert f"{len(IMAGES)}/{len(IMAGES)} published" in text and f"{second.this_run} found already published" in text
    assert f"job {first.job}" in text  # the CLI and the API name the same job

    records = asyncio.run(read_raw(settings.kafka.bootstrap, settings.topics.backfill))
    seen = seqs_of(records, first.job)
    assert sorted(seen) == [(0, i) for i in range(len(IMAGES))] and set(seen.values()) == {1}
    by_seq = {int(dict(r.headers)[REPLAY_POSITION_HEADER].split(b":")[1]): ev
              for r, ev in zip(records, decoded(records), strict=True)}
    uris = [by_seq[i]["source"]["uri"] for i in range(len(IMAGES))]
    assert [split_uri(u)[2].lstrip("/") for u in uris] == sorted(images)  # the new object is not in the job
    assert len({by_seq[i]["event_id"] for i in by_seq}) == len(IMAGES)

    done = CliRunner().invoke(app, ["replay", "prefix", url, *common])
    assert done.exit_code == 0 and "0 this run" in " ".join(done.output.split()), done.output


@pytest.mark.slow
def test_worker_processes_an_image_replayed_from_s3(settings: Settings, s3_env: Any, catalog: list[Path],
                                                    tmp_path: Path) -> None:
    """A prefix with one image, replayed to the backfill topic; a worker allowed to read the bucket
    fetches it from S3 and processes it."""
    from lightbox.demo import WorkerProcess, collect_outputs

    tag = f"bf-{uuid.uuid4().hex[:8]}"
    obstore.put(s3_env.client(), f"{tag}/SKU-S3-BF.jpg", catalog[3].read_bytes())
    asyncio.run(ensure_topics(settings))
    res = asyncio.run(run_replay(source(s3_env, tag), bootstrap=settings.kafka.bootstrap,
                                 topic=settings.topics.backfill, checkpoint=tmp_path / "c.json"))
    assert res.complete and res.published == 1
    replayed = decoded(asyncio.run(read_raw(settings.kafka.bootstrap, settings.topics.backfill, idle_s=1.0)))
    assert [ev["source"]["uri"] for ev in replayed] == [f"s3://{s3_env.bucket}/{tag}/SKU-S3-BF.jpg"]

    env = {**worker_env(settings, []), **s3_env.env(), "LIGHTBOX_FETCH_ALLOW": f"s3://{s3_env.bucket}"}
    worker = WorkerProcess(env, tmp_path / "worker.log").start()
    try:
        processed, dead = asyncio.run(collect_outputs(settings.kafka.bootstrap,
                                                      [settings.topics.output, settings.topics.dlq], 1, 180,
                                                      worker.running))
    finally:
        worker.stop()
    assert not dead and len(processed) == 1, (dead, worker.log_tail())
    out = processed[0]
    assert out["source_event_id"] == replayed[0]["event_id"] and out["sku"] == "SKU-S3-BF"
    assert [v["preset"] for v in out["variants"]] == ["jd_main"]
