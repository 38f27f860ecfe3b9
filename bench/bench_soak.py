"""Soak: a `lightbox worker` fed real photos at a steady fraction of its capacity for N minutes.

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

    python bench/bench_soak.py --minutes 30 --out out/soak
    python bench/bench_soak.py --short --out /tmp/soak
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import statistics
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import contextlib

from PIL import Image

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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--fraction", type=float, default=0.4, help="share of the measured capacity to feed")
    ap.add_argument("--bucket-s", type=float, default=60.0)
    ap.add_argument("--photos", type=int, default=24)
    ap.add_argument("--warmup", type=int, default=12)
    ap.add_argument("--burst", type=int, default=48)
    ap.add_argument("--short", action="store_true", help="3 minutes in 30 s buckets")
    ap.add_argument("--out", type=Path, default=Path("out/soak"))
    args = ap.parse_args()
    if args.short:
        args.minutes, args.bucket_s, args.burst = 3.0, 30.0, 24
    res = asyncio.run(run(args))
    print(json.dumps({k: res[k] for k in ("capacity_per_s", "rate_per_s", "published_in_soak", "drained")}))
    print(json.dumps(res["summary"]))
    a = res["audit"]
    print(f"audit: inputs {a['inputs']}, processed {a['processed']}, dead letters {a['dead_letters']}, "
          f"missing {len(a['missing'])}, duplicates {a['duplicates']}, ok {a['ok']}")
    return 0 if a["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
