"""The backfill tier on a real broker: replay (interrupted and resumed, killed and resumed, a topic
range), live-first workers, redrive, and audit over the backfill tier."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from lightbox.replay import (
    REPLAY_JOB_HEADER,
    REPLAY_OF_HEADER,
    REPLAY_POSITION_HEADER,
    Defaults,
    FolderSource,
    TopicSource,
    run_replay,
)
from streams.app import ensure_topics
from streams.settings import Settings

pytestmark = pytest.mark.kafka


async def read_raw(bootstrap: str, topic: str, *, idle_s: float = 2.0) -> list[Any]:
    """Every record of ``topic`` (no group)."""
    from aiokafka import AIOKafkaConsumer

    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=None, auto_offset_reset="earliest",
                                enable_auto_commit=False, max_partition_fetch_bytes=64 << 20)
    await consumer.start()
    out: list[Any] = []
    try:
        last = time.monotonic()
        while time.monotonic() - last < idle_s:
            batch = await consumer.getmany(timeout_ms=300)
            for records in batch.values():
                out.extend(records)
                last = time.monotonic()
    finally:
        await consumer.stop()
    return out


def seqs_of(records: list[Any], job: str) -> Counter[tuple[int, int]]:
    found: Counter[tuple[int, int]] = Counter()
    for r in records:
        h = dict(r.headers)
        if h.get(REPLAY_JOB_HEADER) == job.encode():
            part, _, seq = h[REPLAY_POSITION_HEADER].decode().partition(":")
            found[(int(part), int(seq))] += 1
    return found


def test_replay_interrupted_resumes_without_gaps_or_repeats(settings: Settings, catalog_dir: Path,
                                                            tmp_path: Path) -> None:
    asyncio.run(ensure_topics(settings))
    folder = catalog_dir / "good"
    ckpt = tmp_path / "ckpt.json"

    def source() -> FolderSource:
        return FolderSource(folder, Defaults(presets=("jd_main",)))

    stop = asyncio.Event()

    def stop_after(done: int, total: int) -> None:
        if done >= 7:
            stop.set()

    async def go() -> tuple[Any, Any, Any]:
        dry = await run_replay(source(), bootstrap=settings.kafka.bootstrap, topic=settings.topics.backfill,
                               checkpoint=ckpt, dry_run=True)
        assert not ckpt.exists()  # a dry run writes nothing
        first = await run_replay(source(), bootstrap=settings.kafka.bootstrap, topic=settings.topics.backfill,
                                 checkpoint=ckpt, stop=stop, on_progress=stop_after, max_in_flight=2)
        second = await run_replay(source(), bootstrap=settings.kafka.bootstrap, topic=settings.topics.backfill,
                                  checkpoint=ckpt, rate=200.0)
        return dry, first, second

    dry, first, second = asyncio.run(go())
    n = len(list(folder.iterdir()))
    assert dry.dry_run and dry.total == n and dry.published == 0
    assert not first.complete and 7 <= first.published < n
    assert second.complete and second.published == n and second.this_run == n - first.published
    records = asyncio.run(read_raw(settings.kafka.bootstrap, settings.topics.backfill))
    seen = seqs_of(records, first.job)
    assert sorted(seen) == [(0, i) for i in range(n)] and set(seen.values()) == {1}
    # a third run of the same command is a no-op
    third = asyncio.run(run_replay(source(), bootstrap=settings.kafka.bootstrap, topic=settings.topics.backfill,
                                   checkpoint=ckpt))
    assert third.complete and third.this_run == 0


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", "from lightbox.cli import main; main()", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, **(env or {})})


@pytest.mark.slow
def test_replay_killed_resumes_without_gaps_or_repeats(settings: Settings, catalog_dir: Path,
                                                       tmp_path: Path) -> None:
    """kill -9 between checkpoints: records published after the last checkpoint are found on the
    topic and skipped by the next run of the same command."""
    asyncio.run(ensure_topics(settings))
    ckpt = tmp_path / "ckpt.json"
    args = ("replay", "folder", str(catalog_dir / "good"), "--presets", "jd_main", "--topic", settings.topics.backfill,
            "-b", settings.kafka.bootstrap, "--checkpoint", str(ckpt))
    proc = _cli(*args, "--rate", "8")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # wait for a checkpoint with progress, then a bit more
        if ckpt.exists() and json.loads(ckpt.read_text())["published"] >= 4:
            break
        time.sleep(0.05)
    time.sleep(0.6)  # past the checkpoint: a few more get published, not checkpointed
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    killed_at = json.loads(ckpt.read_text())
    assert not killed_at["complete"]
    second = _cli(*args)
    out, errs = second.communicate(timeout=120)
    assert second.returncode == 0, errs.decode()[-2000:]
    assert "found already published" in " ".join(out.decode().split())  # the scan past the checkpoint found some
    records = asyncio.run(read_raw(settings.kafka.bootstrap, settings.topics.backfill))
    seen = seqs_of(records, killed_at["job"])
    n = len(list((catalog_dir / "good").iterdir()))
    assert sorted(seen) == [(0, i) for i in range(n)] and set(seen.values()) == {1}


def test_replay_a_topic_range_references_the_originals(settings: Settings, catalog: list[Path],
                                                      tmp_path: Path) -> None:
    from streams.producer import ImageProducer

    asyncio.run(ensure_topics(settings))

    async def go() -> Any:
        async with ImageProducer(settings.kafka.bootstrap, settings.topics.input) as prod:
            futs = [await prod.publish(prod.event_for_file(f, presets=["jd_main"], inline=False)) for f in catalog[:6]]
            metas = await asyncio.gather(*futs)
        src = TopicSource(settings.kafka.bootstrap, settings.topics.input, start_offset=1)
        res = await run_replay(src, bootstrap=settings.kafka.bootstrap, topic=settings.topics.backfill,
                               checkpoint=tmp_path / "c.json")
        return metas, res

    metas, res = asyncio.run(go())
    originals = asyncio.run(read_raw(settings.kafka.bootstrap, settings.topics.input))
    replayed = asyncio.run(read_raw(settings.kafka.bootstrap, settings.topics.backfill))
    wanted = {(r.partition, r.offset): r for r in originals if r.offset >= 1}
    assert res.complete and res.published == len(wanted) == len(replayed) and len(metas) == 6
    for r in replayed:
        h = dict(r.headers)
        topic, p, off = h[REPLAY_OF_HEADER].decode().rsplit(":", 2)
        orig = wanted.pop((int(p), int(off)))
        assert topic == settings.topics.input
        assert r.value == orig.value and r.key == orig.key  # same event, same event_id
    assert not wanted


def worker_env(s: Settings, roots: list[Path], **extra: str) -> dict[str, str]:
    """A worker on the test's topics; file:// only under ``roots`` (closed by default)."""
    return {"LIGHTBOX_FILE_ROOTS": ",".join(str(r.resolve()) for r in roots),
            "LIGHTBOX_KAFKA_BOOTSTRAP": s.kafka.bootstrap, "LIGHTBOX_GROUP_ID": s.kafka.group_id,
            "LIGHTBOX_INPUT_TOPIC": s.topics.input, "LIGHTBOX_OUTPUT_TOPIC": s.topics.output,
            "LIGHTBOX_DLQ_TOPIC": s.topics.dlq, "LIGHTBOX_BACKFILL_TOPIC": s.topics.backfill,
            "LIGHTBOX_DATA_DIR": str(s.worker.data_dir), "LIGHTBOX_DEVICE": "cpu", "LIGHTBOX_SEGMENTER": "classical",
            **extra}


@pytest.mark.slow
def test_redrive_round_trip(settings: Settings, catalog: list[Path], tmp_path: Path) -> None:
    """Two inputs fail (their files are missing); one file is put in place (the fix); redrive: the
    fixed one is processed, the other fails again with attempts 2; the republished records are
    the originals (value, key, headers) plus the attempt count."""
    from lightbox.demo import WorkerProcess, collect_outputs
    from lightbox.redrive import REDRIVE_OF_HEADER, RedriveFilter, run_redrive
    from schemas.headers import ATTEMPTS_HEADER
    from streams.producer import ImageProducer

    fixed, still_missing = tmp_path / "later" / "SKU-fixed.jpg", tmp_path / "never" / "SKU-broken.jpg"
    worker = WorkerProcess(worker_env(settings, [tmp_path]), tmp_path / "worker.log").start()
    try:
        async def publish() -> dict[str, str]:
            async with ImageProducer(settings.kafka.bootstrap, settings.topics.input) as prod:
                ids = {}
                for f in (fixed, still_missing):
                    ev = prod.event({"uri": f.as_uri(), "sha256": None}, sku=f.stem, image_id=f.name,
                                    presets=["jd_main"])
                    await (await prod.publish(ev))
                    ids[f.stem] = ev["event_id"]
                return ids

        ids = asyncio.run(publish())
        _, dead = asyncio.run(collect_outputs(settings.kafka.bootstrap, [settings.topics.dlq], 2, 120,
                                              worker.running))
        assert sorted((d["error_code"], d["attempts"]) for d in dead) == [("FETCH_FAILED", 1)] * 2, worker.log_tail()

        fixed.parent.mkdir()
        fixed.write_bytes(catalog[0].read_bytes())  # the fix
        flt = RedriveFilter(codes=frozenset({"FETCH_FAILED"}))
        dry = asyncio.run(run_redrive(settings.kafka.bootstrap, settings.topics.dlq, settings.topics.input, flt,
                                      dry_run=True))
        assert (dry.read, dry.redriven) == (2, 2)
        none = asyncio.run(run_redrive(settings.kafka.bootstrap, settings.topics.dlq, settings.topics.input,
                                       RedriveFilter(codes=frozenset({"DECODE_FAILED"}))))
        assert (none.redriven, none.left_out["code"]) == (0, 2)
        res = asyncio.run(run_redrive(settings.kafka.bootstrap, settings.topics.dlq, settings.topics.input, flt))
        assert res.redriven == 2

        processed, dead = asyncio.run(collect_outputs(
            settings.kafka.bootstrap, [settings.topics.output, settings.topics.dlq], 4, 180, worker.running))
        assert [p["source_event_id"] for p in processed] == [ids["SKU-fixed"]], worker.log_tail()
        again = [d for d in dead if d["attempts"] == 2]
        assert [(d["source_event_id"], d["error_code"]) for d in again] == [(ids["SKU-broken"], "FETCH_FAILED")]
        assert sorted(d["attempts"] for d in dead) == [1, 1, 2]
    finally:
        worker.stop()

    inputs = asyncio.run(read_raw(settings.kafka.bootstrap, settings.topics.input))
    originals = [r for r in inputs if ATTEMPTS_HEADER not in dict(r.headers)]
    redriven = [r for r in inputs if ATTEMPTS_HEADER in dict(r.headers)]
    assert len(originals) == len(redriven) == 2
    for r in redriven:
        h = dict(r.headers)
        orig = next(o for o in originals if o.value == r.value)
        assert r.key == orig.key and h[ATTEMPTS_HEADER] == b"2" and h[REDRIVE_OF_HEADER].startswith(b"t-")
        assert h["traceparent"] == dict(orig.headers)["traceparent"]  # the original headers travel


@pytest.mark.slow
@pytest.mark.parametrize("process", ["false", "true"], ids=["in-process", "backfill-process"])
def test_live_events_overtake_a_backfill_backlog(settings: Settings, catalog: list[Path], tmp_path: Path,
                                                 process: str) -> None:
    """A backlog of 48 on the backfill topic is being worked through; 3 live events published then
    come out after at most the few backfill inputs the worker already held (backfill_in_flight),
    long before the backlog is done. Both ways of running the lane: in the worker's process, and in
    a backfill process of its own (the CPU default on Linux), which sees the worker's live work."""
    import numpy as np
    from PIL import Image

    from agents.backfill import FETCH_BYTES
    from lightbox.demo import WorkerProcess, collect_outputs
    from streams.producer import ImageProducer

    held = 4
    asyncio.run(ensure_topics(settings))
    # the first backlog image travels inline and is larger than one backfill fetch: the brokers
    # still hand it over whole
    big = tmp_path / "big-inline.jpg"
    with Image.open(catalog[0]) as im:
        pixels = np.asarray(im.convert("RGB").resize((1600, 1600))).astype(np.int16)
    noise = np.random.default_rng(5).integers(-6, 7, pixels.shape)
    Image.fromarray(np.clip(pixels + noise, 0, 255).astype(np.uint8)).save(big, quality=95)
    assert big.stat().st_size > FETCH_BYTES
    backlog = [big] + [catalog[i % len(catalog)] for i in range(1, 48)]

    async def publish(topic: str, files: list[Path], tag: str) -> set[str]:
        """All sent, then one wait: the live three reach the worker together."""
        async with ImageProducer(settings.kafka.bootstrap, topic) as prod:
            events = [prod.event_for_file(f, presets=["thumb_webp"], inline=f == big, sku=f"{tag}-{i}")
                      for i, f in enumerate(files)]
            await prod.flush([await prod.publish(ev) for ev in events])
            return {ev["event_id"] for ev in events}

    backfill_ids = asyncio.run(publish(settings.topics.backfill, backlog, "BF"))
    worker = WorkerProcess(worker_env(settings, [catalog[0].parent], LIGHTBOX_BACKFILL_IN_FLIGHT=str(held),
                                      LIGHTBOX_BACKFILL_MAX_BATCH="1", LIGHTBOX_MAX_BATCH="2",
                                      LIGHTBOX_BACKFILL_PROCESS=process),
                           tmp_path / "worker.log").start()
    try:
        first, _ = asyncio.run(collect_outputs(settings.kafka.bootstrap, [settings.topics.output], 3, 180,
                                               worker.running))
        assert len(first) == 3 and {e["source_event_id"] for e in first} <= set(backfill_ids), worker.log_tail()
        live_ids = asyncio.run(publish(settings.topics.input, catalog[:3], "LIVE"))
        processed, dead = asyncio.run(collect_outputs(
            settings.kafka.bootstrap, [settings.topics.output, settings.topics.dlq], len(backlog) + 3, 300,
            worker.running))
    finally:
        worker.stop()
    assert not dead and len(processed) == len(backlog) + 3, worker.log_tail()
    live = [e for e in processed if e["source_event_id"] in live_ids]
    backfill = [e for e in processed if e["source_event_id"] in backfill_ids]
    assert len(live) == 3 and len(backfill) == len(backlog)
    def at(e: dict[str, Any]) -> float:
        return float(e["processed_at"].timestamp() * 1000)

    def taken(e: dict[str, Any]) -> float:
        """When the worker took the input: its spans count from there (fetch latency left out)."""
        return at(e) - max(s["start_us"] + s["duration_us"] for s in e["spans"]) / 1000

    arrived = min(taken(e) for e in live)
    last_live = max(at(e) for e in live)
    between = [e for e in backfill if arrived <= at(e) <= last_live]
    after = [e for e in backfill if at(e) > last_live]
    # the live events waited only for backfill inputs already in the worker (a batch of one each)
    if process == "false":  # one runner: the live inputs queued behind at most what it held
        assert len(between) <= held + 1, (len(between), worker.log_tail())
    # (in a backfill process the tier goes on beside live work, at the idle priority: 7 outputs here
    # the one time it was printed; the live inputs wait for none of them)
    assert len(after) >= len(backlog) // 2, (len(after), len(between))

    # lightbox audit covers the backfill tier: every input of both topics has exactly one output
    from lightbox.audit import run_audit

    report = asyncio.run(run_audit(settings.kafka.bootstrap, [settings.topics.input, settings.topics.backfill],
                                   [settings.topics.output, settings.topics.dlq]))
    assert report.ok and report.missing == [] and report.conflicts == []
    assert (report.inputs, report.processed, report.dead_letters) == (len(backlog) + 3, len(backlog) + 3, 0)


def test_the_backfill_lag_is_exported_beside_the_live_lag(settings: Settings) -> None:
    """A worker with no room for backfill work (its partitions paused) still reports the backlog
    waiting on them, per partition, in ``lightbox_consumer_lag`` (what the backfill dashboards read)."""
    from types import SimpleNamespace

    from agents.observe import Observability
    from agents.wiring import backfill_consumer

    asyncio.run(ensure_topics(settings))
    s = settings.model_copy(update={"metrics_port": 0})

    async def go() -> dict[tuple[str, int], int]:
        from aiokafka import AIOKafkaProducer

        prod = AIOKafkaProducer(bootstrap_servers=s.kafka.bootstrap)
        await prod.start()
        try:
            for i in range(7):
                await prod.send_and_wait(s.topics.backfill, b"x", partition=i % 2)
        finally:
            await prod.stop()
        consumer = backfill_consumer(s, runner=lambda: None, live_work=lambda: (0, 0))
        task = asyncio.create_task(consumer.run())
        obs = Observability(s)
        obs._backfill = consumer
        app = SimpleNamespace(consumer=SimpleNamespace(assignment=lambda: set()))
        try:
            for _ in range(300):  # the group forms (a hang guard, not a speed bound)
                lags = await consumer.lag()
                if sum(lags.values()) == 7:
                    break
                await asyncio.sleep(0.1)
            await obs.refresh(app)  # type: ignore[arg-type]
            exported = {(k[0], int(k[1])): int(v._value.get())
                        for k, v in obs.metrics.consumer_lag._metrics.items()}
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await consumer.close()
            obs.close()
        assert exported == lags
        return lags

    lags = asyncio.run(go())
    assert lags == {(s.topics.backfill, 0): 4, (s.topics.backfill, 1): 3} | {
        (s.topics.backfill, p): 0 for p in range(2, s.topics.partitions)}


def test_the_backfill_consumer_holds_back_while_the_shared_live_work_says_live_inputs_wait(settings: Settings) -> None:
    """What a backfill process does with its worker's live work (``LiveSignal``): while live inputs
    are queued, the consumer takes at most ``backfill_busy_in_flight`` backfill inputs; once live
    work is gone, the rest up to its window. Real broker; the runner only records what it is handed."""
    from types import SimpleNamespace

    from agents.backfill_process import LiveSignal
    from agents.wiring import backfill_consumer

    asyncio.run(ensure_topics(settings))
    s = settings.model_copy(update={"backfill_busy_in_flight": 2, "backfill_in_flight": 16, "backfill_idle_ms": 0})

    class Recorder:  # holds what it is handed: free slots shrink with every input
        config = SimpleNamespace(backfill_in_flight=16)

        def __init__(self) -> None:
            self.handed: list[int] = []

        def free_slots(self, tier: str) -> int:
            return 16 - len(self.handed)

        async def submit(self, event: Any, rec: Any, tier: str) -> None:
            self.handed.append(rec.offset)

        def revoke(self, tps: Any) -> None:
            pass

    async def go() -> tuple[int, int]:
        from aiokafka import AIOKafkaProducer

        prod = AIOKafkaProducer(bootstrap_servers=s.kafka.bootstrap)
        await prod.start()
        try:
            for _ in range(10):
                await prod.send_and_wait(s.topics.backfill, b"x", partition=0)
        finally:
            await prod.stop()
        live, runner = LiveSignal.create(), Recorder()
        live.write(3, 0)  # the worker has live inputs queued
        consumer = backfill_consumer(s, runner=lambda: runner, live_work=live.read)
        task = asyncio.create_task(consumer.run())
        try:
            for _ in range(300):  # the group forms and fetches (a hang guard, not a speed bound)
                if runner.handed:
                    break
                await asyncio.sleep(0.1)
            await asyncio.sleep(2.0)  # ~40 more checks: none may take a third input
            busy = len(runner.handed)
            live.write(0, 0)  # live work gone
            for _ in range(100):
                if len(runner.handed) == 10:
                    break
                await asyncio.sleep(0.1)
            return busy, len(runner.handed)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await consumer.close()
            live.close()

    assert asyncio.run(go()) == (2, 10)


def _stat(pid: int | str) -> list[str]:
    """The fields of /proc/<pid>/stat after the command name: state, ppid, … (OSError: gone)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def _children(pid: int, named: bytes = b"") -> list[int]:
    """Live processes whose parent is ``pid`` and whose command line holds ``named`` (from /proc: no
    procps needed)."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = _stat(entry.name)
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if int(fields[1]) == pid and fields[0] != "Z" and named in cmdline:
                out.append(int(entry.name))
    return out


async def sources_until(settings: Settings, wanted: set[str], timeout_s: float) -> set[str]:
    """Source event ids of the outputs (processed and dead letters) until ``wanted`` are all there."""
    from streams.consume import read_events

    seen: set[str] = set()

    async def go() -> None:
        async for _kind, ev in read_events(settings.kafka.bootstrap, [settings.topics.output, settings.topics.dlq]):
            seen.add(ev["source_event_id"])
            if seen >= wanted:
                return

    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(go(), timeout_s)
    return seen


def _gone(pid: int, timeout_s: float) -> bool:
    """``pid`` ended (gone, or a zombie nobody reaped yet) within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if _stat(pid)[0] == "Z":
                return True
        except OSError:
            return True
        time.sleep(0.1)
    return False


def _free_port_pair() -> int:
    """A port ``p`` such that ``p`` and ``p + 1`` are both free now."""
    import socket

    for _ in range(50):
        with socket.socket() as a, socket.socket() as b:
            a.bind(("127.0.0.1", 0))
            p = a.getsockname()[1]
            try:
                b.bind(("127.0.0.1", p + 1))
            except OSError:
                continue
            return int(p)
    raise RuntimeError("no two adjacent free ports")


def _metric_lines(port: int, series: str) -> list[float]:
    """Values of ``series`` (name and labels exactly as exposed) on ``port``'s /metrics."""
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return [float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(series + " ")]


PROCESSED = 'lightbox_images_total{outcome="processed"}'


def _nice(pid: int) -> int:
    return int(_stat(pid)[16])


def test_a_worker_whose_backfill_process_cannot_have_its_metrics_port_exits_before_joining(
        settings: Settings, tmp_path: Path) -> None:
    """The backfill process's metrics port (the worker's + 1) is taken: the worker says which
    setting to change and exits 70 before it starts a child or joins its group."""
    import socket

    from lightbox.demo import WorkerProcess

    port = _free_port_pair()
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", port + 1))
        taken.listen()
        worker = WorkerProcess(worker_env(settings, [tmp_path], LIGHTBOX_BACKFILL_PROCESS="true",
                                          LIGHTBOX_METRICS_PORT=str(port)), tmp_path / "worker.log").start()
        assert worker.proc is not None
        assert worker.proc.wait(120) == 70, worker.log_tail()
    log = worker.log_tail()
    assert "could not start" in log and f"metrics port {port + 1}" in log and "LIGHTBOX_BACKFILL_METRICS_PORT" in log
    assert "backfill tier: process" not in log  # no child was started


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads processes from /proc (Linux)")
def test_a_backfill_process_works_the_backlog_and_ends_with_its_worker(settings: Settings, catalog: list[Path],
                                                                       tmp_path: Path) -> None:
    """LIGHTBOX_BACKFILL_PROCESS=true: the worker starts `lightbox backfill-worker` at a lower CPU
    priority; live and backfill inputs each come out once; the child's death fail-stops the worker
    (exit 70); a SIGTERM to the worker stops both cleanly (exit 0), and the audit of both topics is clean."""
    from lightbox.audit import run_audit
    from lightbox.demo import WorkerProcess, collect_outputs
    from streams.producer import ImageProducer

    asyncio.run(ensure_topics(settings))

    async def publish(topic: str, files: list[Path], tag: str) -> set[str]:
        async with ImageProducer(settings.kafka.bootstrap, topic) as prod:
            events = [prod.event_for_file(f, presets=["thumb_webp"], sku=f"{tag}-{i}") for i, f in enumerate(files)]
            await prod.flush([await prod.publish(ev) for ev in events])
            return {ev["event_id"] for ev in events}

    port = _free_port_pair()  # the worker's /metrics, and the backfill process's on the next port

    def start(log: str) -> tuple[WorkerProcess, int]:
        worker = WorkerProcess(worker_env(settings, [catalog[0].parent], LIGHTBOX_BACKFILL_PROCESS="true",
                                          LIGHTBOX_BACKFILL_NICE="7", LIGHTBOX_METRICS_PORT=str(port)),
                               tmp_path / log).start()
        assert worker.proc is not None
        deadline = time.monotonic() + 60
        # a child caught between fork and exec still reads as its parent, and mid-exec its command line
        # is empty: wait until it names itself
        while (not (kids := _children(worker.proc.pid, named=b"backfill-worker")) and worker.running()
               and time.monotonic() < deadline):
            time.sleep(0.2)
        assert len(kids) == 1, worker.log_tail()
        return worker, kids[0]

    ids = asyncio.run(publish(settings.topics.backfill, catalog[:6], "BF"))
    ids |= asyncio.run(publish(settings.topics.input, catalog[:3], "LIVE"))
    worker, child = start("worker-1.log")
    try:
        assert worker.proc is not None
        processed, dead = asyncio.run(collect_outputs(settings.kafka.bootstrap, [settings.topics.output,
                                                                                 settings.topics.dlq],
                                                      len(ids), 180, worker.running))
        assert not dead and sorted(e["source_event_id"] for e in processed) == sorted(ids), worker.log_tail()
        # (the child lowers its priority itself, first thing: by now it has)
        assert _nice(child) == min(19, _nice(worker.proc.pid) + 7)
        assert os.sched_getscheduler(child) == os.SCHED_IDLE and os.sched_getscheduler(worker.proc.pid) != os.SCHED_IDLE
        # each process counts its own tier's outputs; the backfill lag is on the backfill process's port
        lag = f'lightbox_consumer_lag{{partition="0",topic="{settings.topics.backfill}"}}'
        want = {port: [3.0], port + 1: [6.0], -1: [0.0]}  # -1: the lag, refreshed every 5 s
        deadline = time.monotonic() + 30
        while (got := {port: _metric_lines(port, PROCESSED), port + 1: _metric_lines(port + 1, PROCESSED),
                       -1: _metric_lines(port + 1, lag)}) != want and time.monotonic() < deadline:
            time.sleep(0.5)
        assert got == want, worker.log_tail()
        os.kill(child, signal.SIGKILL)  # the backfill tier is gone: the worker must not go on without it
        assert worker.proc.wait(60) == 70, worker.log_tail()
        assert "backfill process" in worker.log_tail(80)
    finally:
        worker.stop()

    more = asyncio.run(publish(settings.topics.backfill, catalog[6:8], "BF2"))
    more |= asyncio.run(publish(settings.topics.input, catalog[3:4], "LIVE2"))
    worker, child = start("worker-2.log")
    try:  # a restarted worker may repeat the first one's last outputs (at least once): wait for the set
        seen = asyncio.run(sources_until(settings, ids | more, 180))
        assert seen >= ids | more, worker.log_tail()
    finally:
        code = worker.stop()
    assert code == 0, worker.log_tail()
    assert _gone(child, 10), "the backfill process outlived its worker"
    assert "backfill worker stopped" in worker.log_tail(80)
    worker, child = start("worker-3.log")  # a worker killed outright: the kernel tells the child (SIGTERM)
    assert worker.proc is not None
    deadline = time.monotonic() + 60  # once it has lowered its priority it has asked for the signal too
    while _nice(child) == _nice(worker.proc.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    worker.proc.kill()
    worker.proc.wait(10)
    assert _gone(child, 30), "the backfill process outlived a killed worker"
    report = asyncio.run(run_audit(settings.kafka.bootstrap, [settings.topics.input, settings.topics.backfill],
                                   [settings.topics.output, settings.topics.dlq]))
    # the first worker's outputs may repeat after its fail-stop (at least once): none missing, none conflicting
    assert report.missing == [] and report.conflicts == [] and report.inputs == len(ids) + len(more)
