"""A poison image among good ones, through a real `lightbox worker` on the real broker: whatever
the batch size and the poison's position in its batch, every good image is processed and only
the poison becomes a dead letter, with its own reason.

The worker is the real one (``python -m tests.isolation_kit worker``) with one extra stage in its
stage list that raises over its whole call when the call holds a poison-size image — a stand-in
for a kernel bug that one image triggers (OpenCV's ``-209`` on a 1x1 alpha band was one).
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

from lightbox.demo import WorkerProcess, collect_outputs
from streams.app import ensure_topics
from streams.producer import ImageProducer
from streams.settings import Settings
from tests.agents.test_kafka_e2e import worker_env
from tests.isolation_kit import photo, poison, write_presets

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


class PoisonWorker(WorkerProcess):
    def start(self) -> PoisonWorker:
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.isolation_kit", "worker"], env=self.env,
                                     stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     cwd=Path(__file__).resolve().parents[2])
        return self


async def publish(s: Settings, blobs: list[tuple[str, bytes]], root: Path) -> dict[str, str]:
    """Publish in order (one SKU, so one partition); {event_id: name}."""
    ids = {}
    async with ImageProducer(s.kafka.bootstrap, s.topics.input) as prod:
        futs = []
        for name, data in blobs:
            path = root / f"{name}.jpg"
            path.write_bytes(data)
            ev = prod.event_for_file(path, presets=["iso_small"], sku="SKU-iso")  # one key: one partition, in order
            ids[ev["event_id"]] = name
            futs.append(await prod.publish(ev))
        for fut in futs:
            await fut
    return ids


@pytest.mark.parametrize("size", [1, 2, 4, 8])
def test_a_poison_in_every_position_loses_no_good_image(size: int, settings: Settings, tmp_path: Path) -> None:
    # one batch per position: batch k holds the poison at position k; then a few good ones
    blobs: list[tuple[str, bytes]] = []
    for k in range(size):
        for pos in range(size):
            n = len(blobs)
            blobs.append((f"poison-{k}", poison(k)) if pos == k else (f"good-{n}", photo(n)))
    blobs += [(f"good-{len(blobs) + j}", photo(len(blobs) + j)) for j in range(2)]
    root = tmp_path / "inputs"
    root.mkdir()
    asyncio.run(ensure_topics(settings))
    ids = asyncio.run(publish(settings, blobs, root))  # a backlog: the worker's batches come out full
    env = {**worker_env(settings), "LIGHTBOX_FIXED_BATCH": str(size),
           "LIGHTBOX_PRESETS_FILE": str(write_presets(tmp_path))}
    worker = PoisonWorker(env, tmp_path / "worker.log").start()
    try:
        processed, dead = asyncio.run(collect_outputs(settings.kafka.bootstrap, [settings.topics.output,
                                                      settings.topics.dlq], len(blobs), 240, worker.running))
    finally:
        worker.stop()
    done = {ids[p["source_event_id"]]: p for p in processed}
    goods = {name for name, _ in blobs if name.startswith("good")}
    assert set(done) == goods, worker.log_tail()
    assert len(dead) == size
    for d in dead:
        assert d["error_code"] == "PROCESSING_FAILED" and d["stage"] == "poison", d
        assert "poisoned call over 1 images" in d["message"]
    if size > 1:
        # the goods really shared batches with the poisons: decoded in batches of `size`, and
        # some settled by the poison stage in a smaller call (the bisection around a poison)
        spans = [s for p in done.values() for s in p["spans"]]
        assert max(s["batch_size"] for s in spans if s["stage"] == "decode") == size
        assert any(s["batch_size"] < size for s in spans if s["stage"] == "poison")
