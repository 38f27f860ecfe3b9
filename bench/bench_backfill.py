"""Live first under a backfill, on a real broker and a real worker process (CPU, classical segmenter).

    .venv/bin/python bench/bench_backfill.py [--seconds 120] [--backlog-factor 10]
        [--backfill-max-batch 1] [--backfill-in-flight 16] [--out out/bench_backfill]

Phases, each on fresh topics and a fresh worker (``lightbox worker``, device cpu):

1. capacity — a burst of ``--burst`` live events; capacity = outputs per second over the middle
   80 % of the burst's outputs.
2. alone — Poisson live traffic at ``--load`` (0.5) × capacity for ``--seconds``.
3. with backlog — first ``--backlog-factor`` (10) × as many images as phase 2 publishes go to
   the backfill topic, then the same Poisson live traffic for ``--seconds``.

Live latency is the processed event's ``latency_us`` (event creation by the producer to the
output's seal in the worker). The backlog drain rate is backfill outputs per second over the live
window of phase 3; spare capacity = capacity − live rate. Goals (issue 13): live p99 with the
backlog ≤ 1.2 × live p99 alone; drain ≥ 80 % of spare capacity. Writes ``bench_backfill.json`` and
``bench_backfill.png`` (live latency over time in both phases, backlog depth over time) to ``--out``.
Small images (longer side ``--side`` px) and one small preset, so the CPU has capacity. Not a
test: it asserts nothing. On a shared machine, say so next to the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import statistics
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lightbox.demo import WorkerProcess
from schemas.events import EventCodecs
from streams.app import ensure_topics
from streams.producer import ImageProducer
from streams.settings import Settings

PRESET = "thumb_webp"
ROOT = Path(".")  # the images' folder: file:// is allowed only under it (set in main)


@dataclass
class Outputs:
    """Processed events read from the output topic as they come: (arrival s, source id, latency s)."""

    rows: list[tuple[float, str, float]] = field(default_factory=list)
    by_source: dict[str, float] = field(default_factory=dict)


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
    finally:
        await consumer.stop()


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
            "LIGHTBOX_KAFKA_BOOTSTRAP": s.kafka_bootstrap, "LIGHTBOX_GROUP_ID": s.group_id,
            "LIGHTBOX_INPUT_TOPIC": s.input_topic, "LIGHTBOX_OUTPUT_TOPIC": s.output_topic,
            "LIGHTBOX_DLQ_TOPIC": s.dlq_topic, "LIGHTBOX_BACKFILL_TOPIC": s.backfill_topic,
            "LIGHTBOX_DATA_DIR": str(s.data_dir), "LIGHTBOX_DEVICE": "cpu", "LIGHTBOX_SEGMENTER": "classical",
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
    reader = asyncio.create_task(follow(bootstrap, s.output_topic, out, stop))
    backfill_ids: list[str] = []
    if backlog:
        async with ImageProducer(bootstrap, s.backfill_topic) as prod:
            backfill_ids = await publish_many(prod, images, backlog, "BF")
    worker = WorkerProcess(worker_env(s, extra_env), data / f"{name}.log",
                           args=os.environ.get("BENCH_WORKER_ARGS", "").split()).start()
    result: dict[str, Any] = {"phase": name}
    try:
        async with ImageProducer(bootstrap, s.input_topic) as prod:
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
            bf_before = sum(1 for _, sid, _ in out.rows if sid in set(backfill_ids))
            sent = await poisson(prod, images, rate, args.seconds, random.Random(args.seed), t0)
            window = time.monotonic() - t0
            bf_set = set(backfill_ids)
            bf_after = sum(1 for _, sid, _ in out.rows if sid in bf_set)
            await wait_for(out, [sid for _, sid in sent], 120)
    finally:
        worker.stop()
        stop.set()
        await reader
    live = [(t, out.by_source[sid]) for t, sid in sent if sid in out.by_source]
    lats = [lat for _, lat in live]
    bf_done = sorted(t - t0 for t, sid, _ in out.rows if sid in bf_set)
    result.update({
        "live_sent": len(sent), "live_done": len(live), "live_rate": len(sent) / args.seconds,
        "live_p50_s": pct(lats, 0.5), "live_p99_s": pct(lats, 0.99), "live_mean_s": statistics.fmean(lats),
        "live_max_s": max(lats), "live_series": live,
    })
    if backlog:
        drained = bf_after - bf_before
        result.update({"backlog": backlog, "backfill_done_in_window": drained, "window_s": window,
                       "drain_rate": drained / window, "backfill_done_total": len(bf_done),
                       "backlog_series": [(t, backlog - (i + 1)) for i, t in enumerate(bf_done)]})
    return result


def draw(alone: dict[str, Any], loaded: dict[str, Any], summary: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(10, 7.5), sharex=True)
    for res, colour, label in ((alone, "tab:blue", "live alone"), (loaded, "tab:red", "live with backlog")):
        t = [x for x, _ in res["live_series"]]
        y = [lat * 1000 for _, lat in res["live_series"]]
        ax1.scatter(t, y, s=4, alpha=0.35, color=colour, label=f"{label} (p99 {res['live_p99_s'] * 1000:.0f} ms)")
        ax1.axhline(res["live_p99_s"] * 1000, color=colour, lw=1, ls="--")
    ax1.set_ylabel("live end-to-end latency (ms)")
    ax1.set_yscale("log")
    ax1.legend(loc="upper right")
    ax1.set_title(f"live at {summary['live_rate']:.1f} img/s ({summary['load']:.0%} of {summary['capacity']:.1f} "
                  f"img/s); p99 ratio {summary['p99_ratio']:.2f} (goal ≤ 1.2); drain {summary['drain_share']:.0%} "
                  f"of spare (goal ≥ 80 %)", fontsize=9)
    series = loaded.get("backlog_series", [])
    ax2.plot([t for t, _ in series], [d for _, d in series], color="tab:red")
    ax2.set_ylabel("backlog depth (images)")
    ax2.set_xlabel("seconds since live traffic started")
    ax2.axvline(summary["seconds"], color="grey", lw=1, ls=":")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=120.0)
    ap.add_argument("--load", type=float, default=0.5)
    ap.add_argument("--backlog-factor", type=float, default=10.0)
    ap.add_argument("--burst", type=int, default=300)
    ap.add_argument("--side", type=int, default=320)
    ap.add_argument("--backfill-max-batch", type=int, default=1)
    ap.add_argument("--max-batch", type=int, default=4)
    ap.add_argument("--backfill-in-flight", type=int, default=16)
    ap.add_argument("--seed", type=int, default=13)
    ap.add_argument("--out", type=Path, default=Path("out/bench_backfill"))
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    data = args.out / "data"
    images = small_images(args.out / "images", args.side)
    global ROOT
    ROOT = args.out / "images"
    env = {"LIGHTBOX_MAX_BATCH": str(args.max_batch), "LIGHTBOX_BACKFILL_MAX_BATCH": str(args.backfill_max_batch),
           "LIGHTBOX_BACKFILL_IN_FLIGHT": str(args.backfill_in_flight)}

    from lightbox.kafka_local import LocalKafka

    bootstrap = os.environ.get("LIGHTBOX_KAFKA_BOOTSTRAP")
    kafka = None if bootstrap else LocalKafka.start()
    bootstrap = bootstrap or kafka.bootstrap  # type: ignore[union-attr]
    try:
        cap = await phase("capacity", bootstrap, data, images, args, env, burst=args.burst)
        rate = args.load * cap["capacity"]
        print(f"capacity {cap['capacity']:.1f} img/s; live at {rate:.1f} img/s", file=sys.stderr)
        alone = await phase("alone", bootstrap, data, images, args, env, rate=rate)
        backlog = int(args.backlog_factor * alone["live_sent"])
        loaded = await phase("with_backlog", bootstrap, data, images, args, env, rate=rate, backlog=backlog)
    finally:
        if kafka is not None:
            kafka.stop()
    spare = cap["capacity"] - loaded["live_rate"]
    summary = {
        "capacity": cap["capacity"], "load": args.load, "live_rate": rate, "seconds": args.seconds,
        "live_p99_alone_s": alone["live_p99_s"], "live_p99_with_backlog_s": loaded["live_p99_s"],
        "live_p50_alone_s": alone["live_p50_s"], "live_p50_with_backlog_s": loaded["live_p50_s"],
        "p99_ratio": loaded["live_p99_s"] / alone["live_p99_s"],
        "backlog": loaded["backlog"], "drain_rate": loaded["drain_rate"], "spare_capacity": spare,
        "drain_share": loaded["drain_rate"] / spare if spare > 0 else float("nan"),
    }
    summary["goal_p99_ok"] = summary["p99_ratio"] <= 1.2
    summary["goal_drain_ok"] = summary["drain_share"] >= 0.8
    report = {"summary": summary, "settings": vars(args) | {"out": str(args.out)},
              "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                          "note": "shared development machine (up to 8 engineers at once): noisy"},
              "phases": {"capacity": cap, "alone": alone, "with_backlog": loaded}}
    (args.out / "bench_backfill.json").write_text(json.dumps(report, indent=1, default=float))
    draw(alone, loaded, summary, args.out / "bench_backfill.png")
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    asyncio.run(main())
