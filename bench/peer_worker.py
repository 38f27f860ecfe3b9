"""The peer benchmark's ``worker`` tool: the same photos through a real ``lightbox worker`` on Kafka.

Per run: fresh topics on the benchmark's broker (output and dead letters with
``message.timestamp.type=LogAppendTime``), one ProductImageEvent per photo that names the file
(``file://``, the worker reads only under ``LIGHTBOX_FILE_ROOTS``, the photos' folder), the same
three presets, default settings otherwise; then one ``lightbox worker`` process is started and
stopped (SIGTERM) once every event has its output. Reported like a whole ``process`` run:

- ``seconds``: from the worker's start to the last output's broker append time (start-up, group
  join and model load included, as a ``process`` run includes its own start);
- ``steady_ms_per_image``: (last - first output's append time) / (outputs - 1), the rate once
  the worker runs;
- ``cpu_s``: the worker's CPU time (user + system, /proc) until the last output;
- ``stages_ms``: milliseconds per image per stage from the processed events' spans (each
  batched span divided by its batch size).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

__all__ = ["run_worker", "start_worker", "worker_env"]


async def _publish(bootstrap: str, topic: str, files: list[Path], presets: list[str]) -> None:
    from streams.producer import ImageProducer

    async with ImageProducer(bootstrap, topic) as prod:
        futs = [await prod.publish(prod.event_for_file(f, presets=presets, inline=False)) for f in files]
        await prod.flush(futs)


async def _outputs(bootstrap: str, topics: list[str], n: int, deadline: float,
                   proc: subprocess.Popen[bytes]) -> list[tuple[int, str, bytes]]:
    """``(append time ms, topic, value)`` of the first ``n`` records on ``topics``."""
    from aiokafka import AIOKafkaConsumer

    consumer = AIOKafkaConsumer(*topics, bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                                auto_offset_reset="earliest")
    await consumer.start()
    got: list[tuple[int, str, bytes]] = []
    try:
        while len(got) < n:
            if proc.poll() is not None:
                raise RuntimeError(f"the worker exited with {proc.returncode} after {len(got)} of {n} outputs")
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {len(got)} of {n} outputs arrived in time")
            for records in (await consumer.getmany(timeout_ms=200)).values():
                got += [(r.timestamp, r.topic, r.value) for r in records]
    finally:
        await consumer.stop()
    return got


def worker_env(bootstrap: str, topics: dict[str, str], tag: str, out: Path, files: list[Path],
               tree: Path = ROOT) -> dict[str, str]:
    """The environment of a ``lightbox worker`` on ``topics``: default settings but for the
    addresses, a group of its own, the variants written under ``OUT/variants`` and ``file://``
    reads allowed in the folders of ``files``; on the CPU, metrics off."""
    from bench.harness import run_env

    roots = sorted({str(f.resolve().parent) for f in files})
    return {**os.environ, "PYTHONPATH": str(tree),
            **run_env(bootstrap, topics, f"peers-{tag}", out / "data", LIGHTBOX_OUTPUT_DIR=str(out / "variants"),
                      LIGHTBOX_FILE_ROOTS=",".join(roots))}


def start_worker(bootstrap: str, topics: dict[str, str], tag: str, out: Path, files: list[Path],
                 tree: Path = ROOT) -> subprocess.Popen[bytes]:
    """A ``lightbox worker`` process (``worker_env``), its output in ``OUT/worker.log``."""
    out.mkdir(parents=True, exist_ok=True)
    with (out / "worker.log").open("wb") as log:
        return subprocess.Popen([sys.executable, "-m", "lightbox.cli", "worker"], cwd=tree,
                                env=worker_env(bootstrap, topics, tag, out, files, tree), stdout=log,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


def run_worker(files: list[Path], out: Path, bootstrap: str, presets: list[str], tree: Path = ROOT) -> dict[str, Any]:
    """One whole ``lightbox worker`` run over ``files`` (see the module docstring), of the source
    tree ``tree`` (its folder first on the path; default this checkout)."""
    from bench.bench_overhead import _proc_cpu_s, create_topics
    from lightbox.devservers.launch import terminate
    from lightbox.report import per_event_stage_ms
    from schemas.codec import split_frame
    from schemas.events import EventCodecs

    tag = uuid.uuid4().hex[:8]
    topics = {k: f"peers.{tag}.{k}" for k in ("input", "backfill", "output", "dlq")}
    asyncio.run(create_topics(bootstrap, topics))
    asyncio.run(_publish(bootstrap, topics["input"], files, presets))
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    proc = start_worker(bootstrap, topics, tag, out, files, tree)
    try:
        got = asyncio.run(_outputs(bootstrap, [topics["output"], topics["dlq"]], len(files),
                                   time.monotonic() + 600, proc))
        cpu = _proc_cpu_s(proc.pid)
    finally:
        terminate(proc.pid, 60)  # SIGTERM (a graceful stop), SIGKILL after 60 s
    dead = sum(1 for _, topic, _ in got if topic == topics["dlq"])
    if dead:
        raise RuntimeError(f"the worker dead-lettered {dead} of {len(files)} photos; see {out / 'worker.log'}")
    times = sorted(t for t, _, _ in got)
    codecs = EventCodecs.create()
    events = [codecs.processed.decode(v) for _, _, v in got if split_frame(v)[0] == codecs.processed.writer_id]
    stages: dict[str, float] = {}
    for ev in events:
        for k, v in per_event_stage_ms(ev, amortized=True).items():
            stages[k] = stages.get(k, 0.0) + v / len(events)
    return {"seconds": round(times[-1] / 1000 - t0, 3), "cpu_s": round(cpu, 3),
            "steady_ms_per_image": round((times[-1] - times[0]) / max(1, len(times) - 1), 1),
            "stages_ms": {k: round(v, 2) for k, v in sorted(stages.items())}}
