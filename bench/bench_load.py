"""A worker under sustained load on a real broker: ``soak`` (a steady share of its capacity for N
minutes: memory, latency drift, nothing lost) and ``backfill`` (live first under a backlog: live
p99 with a backlog against alone, the drain against the spare capacity).

    PYTHONPATH=. .venv/bin/python bench/bench_load.py soak [--minutes 30 | --short] [--out out/soak]
    PYTHONPATH=. .venv/bin/python bench/bench_load.py backfill [--seconds 120] [--rounds 2] [--out out/bench_backfill]

What each measures and writes: :data:`SOAK_DOC`, :data:`BACKFILL_DOC` (and ``--help``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import os
import platform
import random
import statistics
import sys
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from PIL import Image

from bench.harness import busy_s, proc_cpu_s
from lightbox.demo import WorkerProcess
from schemas.events import EventCodecs
from streams.app import ensure_topics
from streams.producer import ImageProducer
from streams.settings import Settings

# --- soak ----------------------------------------------------------------------------------------

SOAK_DOC = """Soak: a `lightbox worker` fed real photos at a steady fraction of its capacity for N minutes.

On demand (not in the suite). Starts a local Kafka and one CPU worker (classical segmenter, two
small presets), measures the worker's capacity with a burst, then publishes at ``--fraction`` of
it, evenly spaced, for ``--minutes``. Every ``--bucket-s`` seconds (a minute by default) it
records: inputs published, outputs received (processed + dead letters), p50/p99 latency (publish
to output seen by a reader) of the outputs of that bucket, and — sampled every 5 s — the RSS of
the worker and its children (the backfill process), their open file descriptors and threads.
When the feed stops it waits for every output, runs ``lightbox audit`` over the input topic, and
writes ``soak.json`` and ``soak.png`` to ``--out``.

Summary figures (the issue's goals): RSS growth from the end of the first 5 minutes to the end,
p99 of the last 5 minutes against the first 5, missing outputs (the audit). ``--short``: 3
minutes in 30 s buckets, "first/last 5 minutes" become the first and last minute.

Photos: scikit-image's photographs written as supplier files (``lightbox.samples.make_catalog``:
JPEG, progressive JPEG, PNG, WebP, colour and grey) and downscaled to at most 640 px, so a CPU
worker on a shared machine keeps up; every third input is one of them re-encoded with a fresh
JPEG quality, so the inputs are not byte-identical repeats.

    python bench/bench_load.py soak --minutes 30 --out out/soak
    python bench/bench_load.py soak --short --out /tmp/soak
"""

PRESETS_TOML = """\
[soak_main]
width = 320
height = 320
format = "jpeg"
quality = 85
fill = 0.8

[soak_thumb]
width = 160
height = 160
format = "webp"
quality = 80
fill = 0.8
"""
PRESETS = ["soak_main", "soak_thumb"]


# -- the worker's processes, read from /proc ---------------------------------------------------
def _children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            text = Path(f"/proc/{pid}/task/{tid}/children").read_text().split()
            out += [int(c) for c in text]
    except OSError:
        pass
    return out


def process_tree(pid: int) -> list[int]:
    tree, todo = [], [pid]
    while todo:
        p = todo.pop()
        tree.append(p)
        todo += _children(p)
    return tree


def _status(pid: int, key: str) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def sample_tree(pid: int) -> dict[str, int]:
    """RSS (bytes), open fds and threads of ``pid`` and all its descendants."""
    rss = fds = threads = 0
    pids = process_tree(pid)
    for p in pids:
        rss += _status(p, "VmRSS") * 1024
        threads += _status(p, "Threads")
        with contextlib.suppress(OSError):
            fds += len(os.listdir(f"/proc/{p}/fd"))
    return {"rss": rss, "fds": fds, "threads": threads, "processes": len(pids)}


# -- the run -----------------------------------------------------------------------------------
@dataclass
class Bucket:
    t0: float
    inputs: int = 0
    outputs: int = 0
    dead: int = 0
    latencies: list[float] = field(default_factory=list)
    samples: list[dict[str, int]] = field(default_factory=list)

    def row(self, start: float) -> dict[str, Any]:
        lat = sorted(self.latencies)

        def q(p: float) -> float | None:
            return None if not lat else lat[min(len(lat) - 1, int(p * len(lat)))]

        def mean(key: str) -> float | None:
            return statistics.fmean(s[key] for s in self.samples) if self.samples else None

        return {"minute": round((self.t0 - start) / 60, 2), "inputs": self.inputs, "outputs": self.outputs,
                "dead_letters": self.dead, "p50_s": q(0.5), "p99_s": q(0.99),
                "rss_mib": None if mean("rss") is None else round(mean("rss") / 2**20, 1),  # type: ignore[operator]
                "fds": mean("fds"), "threads": mean("threads"), "processes": mean("processes")}


class Soak:
    def __init__(self, bootstrap: str, settings: Any, photos: list[bytes]) -> None:
        from streams.producer import ImageProducer

        self.s, self.bootstrap, self.photos = settings, bootstrap, photos
        self.producer = ImageProducer(bootstrap, settings.topics.input)
        self.sent: dict[str, float] = {}  # event id -> publish time
        self.sent_at: dict[tuple[int, int], float] = {}  # input position -> publish time
        self.seen: set[str] = set()
        self.done_at: list[tuple[float, float, bool]] = []  # (time seen, latency, dead letter)
        self.n = 0

    def _event(self) -> dict[str, Any]:
        blob = self.photos[self.n % len(self.photos)]
        if self.n % 3 == 2:  # a fresh re-encode: not a byte-identical repeat
            with Image.open(io.BytesIO(blob)) as im:
                buf = io.BytesIO()
                im.convert("RGB").save(buf, "JPEG", quality=70 + self.n % 25)
                blob = buf.getvalue()
        self.n += 1
        return self.producer.event({"data": blob}, sku=f"SKU-{self.n % 97}", image_id=f"soak-{self.n}",
                                   presets=PRESETS)

    async def publish(self, count: int, rate: float | None, stop_at: float | None = None,
                      on_send: Any = None) -> int:
        """``count`` events (or until ``stop_at``), ``rate`` per second (None: as fast as possible)."""
        pending = []
        start = time.monotonic()
        k = 0
        while k < count and (stop_at is None or time.monotonic() < stop_at):
            if rate:
                delay = start + k / rate - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
            ev = self._event()
            now = time.monotonic()
            self.sent[ev["event_id"]] = now
            pending.append((now, await self.producer.publish(ev)))
            if on_send:
                on_send()
            k += 1
            if len(pending) > 64:
                await self._acks(pending)
        await self._acks(pending)
        return k

    async def _acks(self, pending: list[tuple[float, Any]]) -> None:
        for t, fut in pending:
            meta = await fut
            self.sent_at[(meta.partition, meta.offset)] = t
        pending.clear()

    async def read(self, on_output: Any) -> None:
        from streams.consume import read_events

        async for kind, ev in read_events(self.bootstrap, [self.s.topics.output, self.s.topics.dlq]):
            now = time.monotonic()
            if kind == "processed":
                t = self.sent.get(ev["source_event_id"])
                key = ev["source_event_id"]
            else:
                pos = (ev["original"]["partition"], ev["original"]["offset"])
                t = self.sent_at.get(pos)
                key = f"{pos}"
            if t is None or key in self.seen:
                continue
            self.seen.add(key)
            self.done_at.append((now, now - t, kind != "processed"))
            on_output(now, now - t, kind != "processed")

    async def wait_outputs(self, expected: int, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while len(self.done_at) < expected and time.monotonic() < deadline:
            await asyncio.sleep(0.5)
        return len(self.done_at) >= expected


async def run(args: argparse.Namespace) -> dict[str, Any]:
    from lightbox.audit import run_audit
    from lightbox.demo import WorkerProcess
    from lightbox.devservers.kafka_local import LocalKafka
    from lightbox.samples import make_catalog
    from streams.app import ensure_topics
    from streams.settings import Settings

    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    paths = make_catalog(out / "photos", args.photos)
    photos = []
    for p in paths:
        with Image.open(p) as im:
            im.load()
            fmt = im.format or "JPEG"
            small = im.copy()
        small.thumbnail((640, 640), Image.Resampling.LANCZOS)
        buf = io.BytesIO()
        small.save(buf, fmt, **({"quality": 88} if fmt in ("JPEG", "WEBP") else {}))
        photos.append(buf.getvalue())
    presets = out / "presets.toml"
    presets.write_text(PRESETS_TOML)
    kafka = LocalKafka.start()  # a temp data dir, removed at stop
    tag = uuid.uuid4().hex[:6]
    s = Settings(kafka_bootstrap=kafka.bootstrap, group_id=f"soak-{tag}", input_topic=f"soak-{tag}.images",
                 backfill_topic=f"soak-{tag}.backfill", output_topic=f"soak-{tag}.processed",
                 dlq_topic=f"soak-{tag}.dlq", data_dir=out / f"worker-{tag}")
    await ensure_topics(s)
    env = {"LIGHTBOX_KAFKA_BOOTSTRAP": s.kafka.bootstrap, "LIGHTBOX_GROUP_ID": s.kafka.group_id,
           "LIGHTBOX_INPUT_TOPIC": s.topics.input, "LIGHTBOX_OUTPUT_TOPIC": s.topics.output,
           "LIGHTBOX_DLQ_TOPIC": s.topics.dlq, "LIGHTBOX_BACKFILL_TOPIC": s.topics.backfill,
           "LIGHTBOX_DATA_DIR": str(s.worker.data_dir), "LIGHTBOX_DEVICE": "cpu", "LIGHTBOX_SEGMENTER": "classical",
           "LIGHTBOX_PRESETS_FILE": str(presets), "LIGHTBOX_METRICS_PORT": "0"}
    worker = WorkerProcess(env, out / "worker.log").start()
    assert worker.proc is not None
    soak = Soak(kafka.bootstrap, s, photos)
    await soak.producer.__aenter__()
    buckets: list[Bucket] = []
    reader = asyncio.create_task(soak.read(lambda *a: None))
    try:
        # capacity: a warm-up burst, then a measured one (the backlog lets batches grow)
        await soak.publish(args.warmup, None)
        if not await soak.wait_outputs(args.warmup, 600):
            raise SystemExit(f"warm-up: {len(soak.done_at)}/{args.warmup} outputs; see {worker.log_path}")
        t0, before = time.monotonic(), len(soak.done_at)
        await soak.publish(args.burst, None)
        await soak.wait_outputs(before + args.burst, 900)
        capacity = args.burst / (time.monotonic() - t0)
        rate = args.fraction * capacity
        print(f"capacity {capacity:.2f} images/s; feeding {rate:.2f}/s ({args.fraction:.0%}) for "
              f"{args.minutes} min", flush=True)
        start = time.monotonic()
        stop_at = start + args.minutes * 60
        done_before = len(soak.done_at)

        def bucket_at(t: float) -> Bucket:
            k = int((t - start) // args.bucket_s)
            while len(buckets) <= k:
                buckets.append(Bucket(start + len(buckets) * args.bucket_s))
            return buckets[k]

        async def sampler() -> None:
            while True:
                now = time.monotonic()
                assert worker.proc is not None
                bucket_at(now).samples.append(sample_tree(worker.proc.pid))
                await asyncio.sleep(5)

        def sent() -> None:
            bucket_at(time.monotonic()).inputs += 1

        samp = asyncio.create_task(sampler())
        feed = asyncio.create_task(soak.publish(10**9, rate, stop_at, sent))
        last_print = start
        while not feed.done():
            await asyncio.sleep(1)
            for t, lat, dead in soak.done_at[done_before:]:
                b = bucket_at(t)
                b.outputs += 1
                b.dead += dead
                b.latencies.append(lat)
            done_before = len(soak.done_at)
            if time.monotonic() - last_print >= args.bucket_s and len(buckets) >= 2:
                last_print = time.monotonic()
                print(json.dumps(buckets[-2].row(start)), flush=True)
            if not worker.running():
                raise SystemExit(f"the worker exited; see {worker.log_path}")
        published = await feed
        expected = args.warmup + args.burst + published
        drained = await soak.wait_outputs(expected, 600)
        for t, lat, dead in soak.done_at[done_before:]:
            if t < stop_at:
                b = bucket_at(t)
                b.outputs += 1
                b.dead += dead
                b.latencies.append(lat)
        samp.cancel()
        audit = await run_audit(kafka.bootstrap, [s.topics.input], [s.topics.output, s.topics.dlq])
    finally:
        reader.cancel()
        await soak.producer.__aexit__(None, None, None)
        rc = worker.stop()
        kafka.stop()
    rows = [b.row(start) for b in buckets if b.t0 < stop_at]
    summary = summarise(rows, buckets, args, start)
    result = {"args": {k: str(v) for k, v in vars(args).items()}, "capacity_per_s": capacity, "rate_per_s": rate,
              "published_in_soak": published, "drained": drained, "worker_exit": rc,
              "audit": audit.as_dict(), "summary": summary, "buckets": rows}
    (out / "soak.json").write_text(json.dumps(result, indent=1, default=str))
    plot(rows, summary, out / "soak.png", args)
    return result


def summarise(rows: list[dict[str, Any]], buckets: list[Bucket], args: argparse.Namespace,
              start: float) -> dict[str, Any]:
    head_s = 60.0 if args.short else 300.0
    end = start + args.minutes * 60
    first = [lat for b in buckets if b.t0 < start + head_s for lat in b.latencies]
    last = [lat for b in buckets if b.t0 >= end - head_s for lat in b.latencies]

    def p99(xs: list[float]) -> float | None:
        xs = sorted(xs)
        return xs[min(len(xs) - 1, int(0.99 * len(xs)))] if xs else None

    def rss_at(pred: Any) -> float | None:
        vals = [s["rss"] for b in buckets if pred(b) for s in b.samples]
        return statistics.fmean(vals) if vals else None

    rss_head = rss_at(lambda b: start + head_s - args.bucket_s <= b.t0 < start + head_s)
    rss_tail = rss_at(lambda b: end - args.bucket_s <= b.t0 < end)
    p_first, p_last = p99(first), p99(last)
    return {"window_s": head_s,
            "rss_mib_after_first_window": rss_head and round(rss_head / 2**20, 1),
            "rss_mib_last_bucket": rss_tail and round(rss_tail / 2**20, 1),
            "rss_growth": (rss_tail / rss_head - 1) if rss_head and rss_tail else None,
            "p99_first_window_s": p_first, "p99_last_window_s": p_last,
            "p99_last_over_first": (p_last / p_first) if p_first and p_last else None}


def plot(rows: list[dict[str, Any]], summary: dict[str, Any], path: Path, args: argparse.Namespace) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = [r["minute"] for r in rows]
    fig, ax = plt.subplots(4, 1, figsize=(9, 11), sharex=True)
    per = args.bucket_s / 60
    ax[0].plot(x, [r["inputs"] / per for r in rows], "o-", label="inputs / min")
    ax[0].plot(x, [r["outputs"] / per for r in rows], "s-", label="outputs / min")
    ax[0].set_ylabel("per minute")
    ax[0].legend()
    ax[1].plot(x, [r["p50_s"] for r in rows], "o-", label="p50")
    ax[1].plot(x, [r["p99_s"] for r in rows], "s-", label="p99")
    ax[1].set_ylabel("latency (s)")
    ax[1].legend()
    ax[2].plot(x, [r["rss_mib"] for r in rows], "o-", color="C3")
    ax[2].set_ylabel("RSS worker + children (MiB)")
    ax[3].plot(x, [r["fds"] for r in rows], "o-", label="open fds")
    ax[3].plot(x, [r["threads"] for r in rows], "s-", label="threads")
    ax[3].set_ylabel("count")
    ax[3].legend()
    ax[3].set_xlabel("minute of the soak")
    growth = summary.get("rss_growth")
    ratio = summary.get("p99_last_over_first")
    fig.suptitle(f"lightbox soak: {args.minutes} min at {args.fraction:.0%} of capacity; "
                 f"RSS growth {'n/a' if growth is None else f'{growth:+.1%}'}, p99 last/first "
                 f"{'n/a' if ratio is None else f'{ratio:.2f}'}")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def soak_main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="bench_load.py soak", description=SOAK_DOC,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--fraction", type=float, default=0.4, help="share of the measured capacity to feed")
    ap.add_argument("--bucket-s", type=float, default=60.0)
    ap.add_argument("--photos", type=int, default=24)
    ap.add_argument("--warmup", type=int, default=12)
    ap.add_argument("--burst", type=int, default=48)
    ap.add_argument("--short", action="store_true", help="3 minutes in 30 s buckets")
    ap.add_argument("--out", type=Path, default=Path("out/soak"))
    args = ap.parse_args(argv)
    if args.short:
        args.minutes, args.bucket_s, args.burst = 3.0, 30.0, 24
    res = asyncio.run(run(args))
    print(json.dumps({k: res[k] for k in ("capacity_per_s", "rate_per_s", "published_in_soak", "drained")}))
    print(json.dumps(res["summary"]))
    a = res["audit"]
    print(f"audit: inputs {a['inputs']}, processed {a['processed']}, dead letters {a['dead_letters']}, "
          f"missing {len(a['missing'])}, duplicates {a['duplicates']}, ok {a['ok']}")
    return 0 if a["ok"] else 1


# --- backfill ------------------------------------------------------------------------------------

BACKFILL_DOC = """Live first under a backfill, on a real broker and real worker processes (CPU, classical segmenter).

    PYTHONPATH=. .venv/bin/python bench/bench_load.py backfill [--seconds 120] [--rounds 2] [--backlog-factor 10]
        [--burst 300] [--out out/bench_backfill]

First a capacity phase: a burst of ``--burst`` live events on a fresh worker; capacity = outputs per
second over the middle 80 % of the burst's outputs. Then ``--rounds`` rounds of three phases, each
on fresh topics and a fresh worker (``lightbox worker``, device cpu), with Poisson live traffic at
``--load`` (0.5) × capacity for ``--seconds``:

* ``alone`` — live traffic only;
* ``baseline`` — a backlog of ``--backlog-factor`` (10) × as many images as the live window
  publishes waits on the backfill topic first, and the worker runs the previous backfill policy
  (``BASELINE_ENV``: the backfill tier shares the live prepare/output threads at the same CPU
  priority, takes up to ``backfill_in_flight`` inputs whenever no live work is queued);
* ``candidate`` — the same backlog, the worker's default backfill settings (or ``--candidate-env``).

``--baseline-env`` replaces the first policy with other settings (``--baseline-env ""``: the
defaults), to compare two settings side by side, e.g. ``--baseline-env LIGHTBOX_BACKFILL_PROCESS=false``
(the backfill tier in the worker's process) against the defaults (on a CPU worker on Linux, the tier in a
process of its own). The CPU use
per phase is the machine's (cores busy), the worker process's (a backfill process apart), the
backfill process's, the local broker's and this bench's; ``worker_runqueue`` is how long the
worker's threads were runnable but waiting for a core (in cores, from ``/proc/<pid>/task/*/schedstat``).

The phases alternate (odd rounds alone, baseline, candidate; even rounds the reverse), so a slow
spell of the shared machine hits both sides; each round's ratios use that round's own alone run.

Live latency is the processed event's ``latency_us`` (event creation by the producer to the
output's seal in the worker); where it goes comes from the event's spans (``wait:<stage>`` is the
time between the previous span's end and that stage's start; ``before prepare`` is the latency not
covered by spans: the broker hop and the wait for a prepare thread). Drain rate = backfill outputs
per second during the live window; spare capacity = capacity − live rate, with the capacity
measured again in each round (the mean of a burst, as in the first phase, at its start and one at
its end: the shared machine's capacity moves), while the live rate stays the one set from the first
capacity phase. Goals: live
p99 with the backlog ≤ 1.2 × live p99 alone; drain ≥ 80 % of spare capacity. Writes
``bench_backfill.json`` and ``bench_backfill.png`` (live latency over time per phase, backlog depth
over time, where live latency goes) to ``--out``. Small images (longer side ``--side`` px) and one
small preset, so the CPU has capacity. Not a test: it asserts nothing. On a shared machine, say so
next to the figures.
"""

PRESET = "thumb_webp"
ROOT = Path(".")  # the images' folder: file:// is allowed only under it (set in main)
BROKER_PID = 0  # the local broker's process (its CPU use per phase), 0: an outside broker
#: the first policy: backfill shares the live threads (in the worker's process) at the same
#: priority and fills its window whenever no live work is queued
BASELINE_ENV = {"LIGHTBOX_BACKFILL_THREADS": "0", "LIGHTBOX_BACKFILL_NICE": "0", "LIGHTBOX_BACKFILL_IDLE_MS": "0",
                "LIGHTBOX_BACKFILL_BUSY_IN_FLIGHT": "0", "LIGHTBOX_BACKFILL_FILL_TO": "0",
                "LIGHTBOX_BACKFILL_PROCESS": "false"}
WORKER = [sys.executable, "-m", "lightbox.cli", "worker"]
MODES = ("alone", "baseline", "candidate")


@dataclass
class Outputs:
    """Processed events read from the output topic as they come: (arrival s, source id, latency s),
    and each one's latency breakdown (seconds per part)."""

    rows: list[tuple[float, str, float]] = field(default_factory=list)
    by_source: dict[str, float] = field(default_factory=dict)
    parts: dict[str, dict[str, float]] = field(default_factory=dict)


def breakdown(latency_us: int, spans: list[dict[str, Any]]) -> dict[str, float]:
    """Where one event's latency went: each stage's span, the wait before it, and what came before
    the first span (broker hop, waiting for a prepare thread)."""
    parts: dict[str, float] = defaultdict(float)
    end = 0
    for sp in sorted(spans, key=lambda x: x["start_us"]):
        if sp["start_us"] > end:
            parts[f"wait:{sp['stage']}"] += (sp["start_us"] - end) / 1e6
        parts[sp["stage"]] += sp["duration_us"] / 1e6
        end = max(end, sp["start_us"] + sp["duration_us"])
    parts["before prepare"] = max(0, latency_us - end) / 1e6
    return dict(parts)


async def follow(bootstrap: str, topic: str, out: Outputs, stop: asyncio.Event) -> None:
    from aiokafka import AIOKafkaConsumer

    codec = EventCodecs.create().processed
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=None, auto_offset_reset="earliest",
                                enable_auto_commit=False, metadata_max_age_ms=1000)
    await consumer.start()
    try:
        while not stop.is_set():
            batch = await consumer.getmany(timeout_ms=200, max_records=1000)
            now = time.monotonic()
            for records in batch.values():
                for r in records:
                    ev = codec.decode(r.value)
                    lat = ev["latency_us"] / 1e6
                    out.rows.append((now, ev["source_event_id"], lat))
                    out.by_source[ev["source_event_id"]] = lat
                    out.parts[ev["source_event_id"]] = breakdown(ev["latency_us"], ev["spans"])
    finally:
        await consumer.stop()


def sched_s(pid: int) -> dict[int, tuple[float, float]]:
    """Per thread of ``pid``: seconds on a CPU and seconds runnable but waiting for one (/proc schedstat)."""
    out = {}
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            run, wait = task.joinpath("schedstat").read_text().split()[:2]
            out[int(task.name)] = (int(run) / 1e9, int(wait) / 1e9)
    return out


def runqueue_wait(before: dict[int, tuple[float, float]], after: dict[int, tuple[float, float]]) -> float:
    """Seconds the threads alive at both samples waited runnable for a CPU in between."""
    return sum(after[t][1] - before[t][1] for t in after.keys() & before.keys())


def small_images(folder: Path, side: int) -> list[Path]:
    from PIL import Image

    from lightbox.samples import make_catalog

    src = make_catalog(folder / "src", 24)
    out = folder / "small"
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for p in src:
        with Image.open(p) as src_im:
            rgb = src_im.convert("RGB")
        rgb.thumbnail((side, side))
        dst = out / f"{p.stem}.jpg"
        rgb.save(dst, quality=90)
        paths.append(dst)
    return paths


def fresh_settings(bootstrap: str, data: Path) -> Settings:
    tag = uuid.uuid4().hex[:8]
    return Settings(kafka_bootstrap=bootstrap, group_id=f"bench-{tag}", input_topic=f"b-{tag}.images",
                    backfill_topic=f"b-{tag}.backfill", output_topic=f"b-{tag}.processed", dlq_topic=f"b-{tag}.dlq",
                    data_dir=data / tag, segmenter="classical", device="cpu")


def worker_env(s: Settings, extra: dict[str, str]) -> dict[str, str]:
    return {"LIGHTBOX_FILE_ROOTS": str(ROOT.resolve()),
            "LIGHTBOX_KAFKA_BOOTSTRAP": s.kafka.bootstrap, "LIGHTBOX_GROUP_ID": s.kafka.group_id,
            "LIGHTBOX_INPUT_TOPIC": s.topics.input, "LIGHTBOX_OUTPUT_TOPIC": s.topics.output,
            "LIGHTBOX_DLQ_TOPIC": s.topics.dlq, "LIGHTBOX_BACKFILL_TOPIC": s.topics.backfill,
            "LIGHTBOX_DATA_DIR": str(s.worker.data_dir), "LIGHTBOX_DEVICE": "cpu", "LIGHTBOX_SEGMENTER": "classical",
            **extra}


async def publish_many(prod: ImageProducer, images: list[Path], n: int, tag: str) -> list[str]:
    ids, futs = [], []
    for i in range(n):
        ev = prod.event_for_file(images[i % len(images)], presets=[PRESET], inline=False, sku=f"{tag}-{i}")
        futs.append(await prod.publish(ev))
        ids.append(ev["event_id"])
        if len(futs) >= 2000:
            await prod.flush(futs)
            futs = []
    await prod.flush(futs)
    return ids


async def wait_for(out: Outputs, ids: list[str], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if all(i in out.by_source for i in ids):
            return True
        await asyncio.sleep(0.2)
    return False


async def poisson(prod: ImageProducer, images: list[Path], rate: float, seconds: float, rng: random.Random,
                  t0: float) -> list[tuple[float, str]]:
    """Publish at Poisson arrivals of ``rate`` per second for ``seconds``; (send time, event id)."""
    sent: list[tuple[float, str]] = []
    futs = []
    next_at = time.monotonic()
    end = next_at + seconds
    i = 0
    while True:
        next_at += rng.expovariate(rate)
        if next_at >= end:
            break
        delay = next_at - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        ev = prod.event_for_file(images[i % len(images)], presets=[PRESET], inline=False, sku=f"LIVE-{i}")
        futs.append(await prod.publish(ev))
        sent.append((time.monotonic() - t0, ev["event_id"]))
        i += 1
    await prod.flush(futs)
    return sent


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


async def phase(name: str, bootstrap: str, data: Path, images: list[Path], args: argparse.Namespace,
                extra_env: dict[str, str], *, burst: int = 0, rate: float = 0.0, backlog: int = 0) -> dict[str, Any]:
    s = fresh_settings(bootstrap, data)
    await ensure_topics(s)
    out, stop = Outputs(), asyncio.Event()
    reader = asyncio.create_task(follow(bootstrap, s.topics.output, out, stop))
    backfill_ids: list[str] = []
    if backlog:
        async with ImageProducer(bootstrap, s.topics.backfill) as prod:
            backfill_ids = await publish_many(prod, images, backlog, "BF")
    env, command = extra_env, WORKER
    worker = WorkerProcess(worker_env(s, env), data / f"{name}.log", command=command,
                           args=os.environ.get("BENCH_WORKER_ARGS", "").split()).start()
    result: dict[str, Any] = {"phase": name, "env": extra_env}
    bf_set = set(backfill_ids)
    try:
        async with ImageProducer(bootstrap, s.topics.input) as prod:
            warm = await publish_many(prod, images, 4, "WARM")
            if not await wait_for(out, warm, 180):
                raise RuntimeError(f"{name}: the worker did not answer; see {data / f'{name}.log'}")
            t0 = time.monotonic()
            if burst:
                ids = await publish_many(prod, images, burst, "BURST")
                await wait_for(out, ids, 900)
                times = sorted(t for t, sid, _ in out.rows if sid in set(ids))
                lo, hi = times[len(times) // 10], times[(len(times) * 9) // 10]
                result["capacity"] = (len(times) * 0.8) / max(1e-6, hi - lo)
                return result
            bf_before = sum(1 for _, sid, _ in out.rows if sid in bf_set)
            pid = worker.proc.pid if worker.proc else 0
            others = {"backfill_process": _children(pid), "broker": [BROKER_PID] if BROKER_PID else [],
                      "bench": [os.getpid()]}
            busy0, worker0, sched0 = busy_s(), proc_cpu_s(pid), sched_s(pid)
            others0 = {k: sum(proc_cpu_s(p) for p in pids) for k, pids in others.items()}
            sent = await poisson(prod, images, rate, args.seconds, random.Random(args.seed), t0)
            window = time.monotonic() - t0
            busy = (busy_s() - busy0) / window  # cores busy on average, the whole machine
            result["cpu"] = {"machine_busy": busy, "machine_idle": (os.cpu_count() or 1) - busy,
                             "worker": (proc_cpu_s(pid) - worker0) / window,
                             # the worker's threads, runnable but waiting for a core (cores' worth)
                             "worker_runqueue": runqueue_wait(sched0, sched_s(pid)) / window,
                             **{k: (sum(proc_cpu_s(p) for p in pids) - others0[k]) / window
                                for k, pids in others.items()}}
            bf_after = sum(1 for _, sid, _ in out.rows if sid in bf_set)
            await wait_for(out, [sid for _, sid in sent], 120)
    finally:
        worker.stop()
        stop.set()
        await reader
    live = [(t, out.by_source[sid]) for t, sid in sent if sid in out.by_source]
    lats = [lat for _, lat in live]
    parts: dict[str, list[float]] = defaultdict(list)
    for _, sid in sent:
        for k, v in out.parts.get(sid, {}).items():
            parts[k].append(v)
    result.update({
        "live_sent": len(sent), "live_done": len(live), "live_rate": len(sent) / args.seconds,
        "live_p50_s": pct(lats, 0.5), "live_p90_s": pct(lats, 0.9), "live_p99_s": pct(lats, 0.99),
        "live_mean_s": statistics.fmean(lats), "live_max_s": max(lats),
        # mean seconds per live event in each part (a part an event did not have counts 0)
        "live_parts_mean_s": {k: sum(v) / max(1, len(live)) for k, v in sorted(parts.items())},
        "live_series": live,
    })
    if backlog:
        drained = bf_after - bf_before
        bf_done = sorted(t - t0 for t, sid, _ in out.rows if sid in bf_set)
        bf_parts: dict[str, list[float]] = defaultdict(list)
        for sid in bf_set:
            for k, v in out.parts.get(sid, {}).items():
                bf_parts[k].append(v)
        result.update({"backlog": backlog, "backfill_done_in_window": drained, "window_s": window,
                       "backfill_parts_mean_s": {k: sum(v) / max(1, len(bf_done)) for k, v in sorted(bf_parts.items())},
                       "drain_rate": drained / window, "backfill_done_total": len(bf_done),
                       "backlog_series": [(t, backlog - (i + 1)) for i, t in enumerate(bf_done)]})
    return result


COLOURS = {"alone": "tab:blue", "baseline": "tab:red", "candidate": "tab:green"}


def draw(rounds: list[dict[str, Any]], summary: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2, ax3) = plt.subplots(3, 1, figsize=(11, 11), gridspec_kw={"height_ratios": [3, 2, 2]})
    for mode in MODES:
        for i, rnd in enumerate(rounds):
            res = rnd[mode]
            t = [x for x, _ in res["live_series"]]
            y = [lat * 1000 for _, lat in res["live_series"]]
            label = f"{mode} (median p99 {summary[mode]['p99_median_s'] * 1000:.0f} ms)" if i == 0 else None
            ax1.scatter(t, y, s=3, alpha=0.3, color=COLOURS[mode], label=label)
    ax1.set_ylabel("live end-to-end latency (ms)")
    ax1.set_xlabel("seconds since live traffic started (all rounds overlaid)")
    ax1.set_yscale("log")
    ax1.legend(loc="upper right", markerscale=4)
    ratios = ", ".join(f"{m} p99 ratio {summary[m]['p99_ratio_median']:.2f} "
                       f"drain {summary[m]['drain_share_median']:.0%}" for m in ("baseline", "candidate"))
    ax1.set_title(f"live at {summary['live_rate']:.1f} img/s ({summary['load']:.0%} of "
                  f"{summary['capacity']:.1f} img/s), "
                  f"{len(rounds)} rounds; medians over rounds: {ratios} (goals ≤ 1.2, ≥ 80 %)", fontsize=9)
    for mode, style in (("baseline", "--"), ("candidate", "-")):
        for i, rnd in enumerate(rounds):
            series = rnd[mode].get("backlog_series", [])
            ax2.plot([t for t, _ in series], [d for _, d in series], color=COLOURS[mode], ls=style, lw=1,
                     label=f"{mode}" if i == 0 else None)
    ax2.axvline(summary["seconds"], color="grey", lw=1, ls=":")
    ax2.set_ylabel("backlog depth (images)")
    ax2.set_xlabel("seconds since live traffic started (dotted: end of live traffic)")
    ax2.legend(loc="upper right")
    keys = sorted({k for rnd in rounds for m in MODES for k in rnd[m]["live_parts_mean_s"]})
    width = 0.8 / len(MODES)
    for j, mode in enumerate(MODES):
        vals = [statistics.fmean(rnd[mode]["live_parts_mean_s"].get(k, 0.0) for rnd in rounds) * 1000 for k in keys]
        ax3.bar([i + j * width for i in range(len(keys))], vals, width, color=COLOURS[mode], label=mode)
    ax3.set_xticks([i + width for i in range(len(keys))], keys, rotation=30, ha="right", fontsize=8)
    ax3.set_ylabel("mean ms per live event")
    ax3.set_title("where live latency goes (spans; wait:X = queued before stage X)", fontsize=9)
    ax3.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def env_arg(text: str) -> dict[str, str]:
    """``K=V,K=V`` → a dict (settings for the candidate's worker)."""
    return dict(kv.split("=", 1) for kv in text.split(",") if kv)


async def backfill_main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(prog="bench_load.py backfill", description=BACKFILL_DOC,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=120.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--load", type=float, default=0.5)
    ap.add_argument("--backlog-factor", type=float, default=10.0)
    ap.add_argument("--burst", type=int, default=300)
    ap.add_argument("--side", type=int, default=320)
    ap.add_argument("--backfill-max-batch", type=int, default=1)
    ap.add_argument("--max-batch", type=int, default=4)
    ap.add_argument("--backfill-in-flight", type=int, default=16)
    ap.add_argument("--candidate-env", type=env_arg, default={},
                    help="extra worker settings for the candidate, e.g. LIGHTBOX_BACKFILL_NICE=19")
    ap.add_argument("--baseline-env", type=env_arg, default=None,
                    help="the baseline's worker settings instead of the first policy (BASELINE_ENV), to compare "
                         "two settings side by side, e.g. LIGHTBOX_BACKFILL_PROCESS=true")
    ap.add_argument("--seed", type=int, default=13)
    ap.add_argument("--out", type=Path, default=Path("out/bench_backfill"))
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    data = args.out / "data"
    images = small_images(args.out / "images", args.side)
    global ROOT
    ROOT = args.out / "images"
    env = {"LIGHTBOX_MAX_BATCH": str(args.max_batch), "LIGHTBOX_BACKFILL_MAX_BATCH": str(args.backfill_max_batch),
           "LIGHTBOX_BACKFILL_IN_FLIGHT": str(args.backfill_in_flight)}
    baseline = BASELINE_ENV if args.baseline_env is None else args.baseline_env
    envs = {"alone": env, "baseline": env | baseline, "candidate": env | args.candidate_env}

    from lightbox.devservers.kafka_local import LocalKafka

    bootstrap = os.environ.get("LIGHTBOX_KAFKA_BOOTSTRAP")
    kafka = None if bootstrap else LocalKafka.start()
    bootstrap = bootstrap or kafka.bootstrap  # type: ignore[union-attr]
    global BROKER_PID
    BROKER_PID = kafka.pid if kafka is not None else 0
    rounds: list[dict[str, Any]] = []
    try:
        cap = await phase("capacity", bootstrap, data, images, args, env, burst=args.burst)
        rate = args.load * cap["capacity"]
        backlog = int(args.backlog_factor * rate * args.seconds)
        print(f"capacity {cap['capacity']:.1f} img/s; live at {rate:.1f} img/s; backlog {backlog}", file=sys.stderr)
        for r in range(args.rounds):
            # a shared machine's capacity moves with other load: each round measures its own
            rnd: dict[str, Any] = {"capacity_before": (await phase(f"r{r + 1}-capacity", bootstrap, data, images, args,
                                                                   env, burst=args.burst))["capacity"]}
            print(f"round {r + 1} capacity {rnd['capacity_before']:.1f} img/s", file=sys.stderr)
            for mode in MODES if r % 2 == 0 else MODES[::-1]:
                rnd[mode] = await phase(f"r{r + 1}-{mode}", bootstrap, data, images, args, envs[mode], rate=rate,
                                        backlog=0 if mode == "alone" else backlog)
                (args.out / "partial.json").write_text(json.dumps([*rounds, rnd], default=float))
                print(f"round {r + 1} {mode}: p50 {rnd[mode]['live_p50_s'] * 1000:.0f} ms, "
                      f"p99 {rnd[mode]['live_p99_s'] * 1000:.0f} ms"
                      + (f", drain {rnd[mode]['drain_rate']:.1f} img/s" if mode != "alone" else ""), file=sys.stderr)
            # and again after it: the round's spare capacity uses the mean of the two bursts
            rnd["capacity_after"] = (await phase(f"r{r + 1}-capacity-after", bootstrap, data, images, args, env,
                                                 burst=args.burst))["capacity"]
            rnd["capacity"] = (rnd["capacity_before"] + rnd["capacity_after"]) / 2
            print(f"round {r + 1} capacity after {rnd['capacity_after']:.1f} img/s", file=sys.stderr)
            rounds.append(rnd)
    finally:
        if kafka is not None:
            kafka.stop()
    summary: dict[str, Any] = {"capacity": cap["capacity"], "load": args.load, "live_rate": rate,
                               "seconds": args.seconds, "backlog": backlog, "rounds": []}
    for i, rnd in enumerate(rounds):
        row: dict[str, Any] = {"round": i + 1, "capacity_img_s": rnd["capacity"],
                               "capacity_before_img_s": rnd["capacity_before"],
                               "capacity_after_img_s": rnd["capacity_after"]}
        for mode in MODES:
            res = rnd[mode]
            row[f"{mode}_p50_ms"] = res["live_p50_s"] * 1000
            row[f"{mode}_p99_ms"] = res["live_p99_s"] * 1000
            if mode != "alone":
                spare = rnd["capacity"] - res["live_rate"]
                row[f"{mode}_p99_ratio"] = res["live_p99_s"] / rnd["alone"]["live_p99_s"]
                row[f"{mode}_p90_ratio"] = res["live_p90_s"] / rnd["alone"]["live_p90_s"]
                row[f"{mode}_drain_img_s"] = res["drain_rate"]
                row[f"{mode}_drain_share"] = res["drain_rate"] / spare if spare > 0 else float("nan")
        summary["rounds"].append(row)
    for mode in MODES:
        m: dict[str, Any] = {"p99_median_s": statistics.median(rnd[mode]["live_p99_s"] for rnd in rounds),
                             "p50_median_s": statistics.median(rnd[mode]["live_p50_s"] for rnd in rounds)}
        if mode != "alone":
            m["p99_ratio_median"] = statistics.median(r[f"{mode}_p99_ratio"] for r in summary["rounds"])
            m["p90_ratio_median"] = statistics.median(r[f"{mode}_p90_ratio"] for r in summary["rounds"])
            # every round's live latencies together, against every round's alone ones
            pooled = [lat for rnd in rounds for _, lat in rnd[mode]["live_series"]]
            alone = [lat for rnd in rounds for _, lat in rnd["alone"]["live_series"]]
            m["p99_ratio_pooled"] = pct(pooled, 0.99) / pct(alone, 0.99)
            m["drain_share_median"] = statistics.median(r[f"{mode}_drain_share"] for r in summary["rounds"])
            m["goal_p99_ok"] = m["p99_ratio_median"] <= 1.2
            m["goal_drain_ok"] = m["drain_share_median"] >= 0.8
        summary[mode] = m
    report = {"summary": summary, "settings": vars(args) | {"out": str(args.out)}, "envs": envs,
              "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                          "note": "capacity measured per round: other load on the machine moves it"},
              "capacity_phase": cap, "rounds": rounds}
    (args.out / "bench_backfill.json").write_text(json.dumps(report, indent=1, default=float))
    draw(rounds, summary, args.out / "bench_backfill.png")
    print(json.dumps(summary, indent=1))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["soak"]:
        return soak_main(argv[1:])
    if argv[:1] == ["backfill"]:
        asyncio.run(backfill_main(argv[1:]))
        return 0
    print(__doc__)
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
