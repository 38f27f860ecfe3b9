"""Live first under a backfill, on a real broker and real worker processes (CPU, classical segmenter).

    PYTHONPATH=. .venv/bin/python bench/bench_backfill.py [--seconds 120] [--rounds 2] [--backlog-factor 10]
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

from __future__ import annotations

import argparse
import asyncio
import contextlib
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
sys.path.insert(0, str(Path(__file__).resolve().parent))


from bench.harness import busy_s, proc_cpu_s
from lightbox.demo import WorkerProcess
from schemas.events import EventCodecs
from streams.app import ensure_topics
from streams.producer import ImageProducer
from streams.settings import Settings

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


def children(pid: int) -> list[int]:
    """Processes whose parent is ``pid`` (a worker's backfill process), from /proc."""
    out = []
    for entry in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(entry.name))
    return out


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
            others = {"backfill_process": children(pid), "broker": [BROKER_PID] if BROKER_PID else [],
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


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
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
    args = ap.parse_args()
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


if __name__ == "__main__":
    asyncio.run(main())
