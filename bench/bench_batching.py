"""QPS–latency of adaptive micro-batching vs fixed batch sizes, on a real broker and the real
CPU pipeline.

    PYTHONPATH=. .venv/bin/python bench/bench_batching.py [--quick] [--seconds S] [--seed 6]
        [--presets jd_main,thumb_webp] [--segmenter classical] [--max-side 800] [--out bench/results]

About 10 minutes on a 2-core machine (``--quick``: about 4). The sample catalog
(:func:`lightbox.samples.make_catalog`, 1.2-1.9 MP photos) is shrunk to ``--max-side`` pixels
(0 keeps it) so a shared 2-core CPU does a few images/s and each point gets enough events.

One local Kafka broker for the whole benchmark; every run gets a fresh ``lightbox worker``
process (``LIGHTBOX_DEVICE=cpu``) on fresh, uniquely named topics and consumer group.

1. Capacity (closed loop): an adaptive worker gets a backlog of events at once; capacity is the
   steady-state output rate (outputs 20 %..100 % of the backlog over their append times).
2. Open loop: Poisson arrivals (seeded per load level, so every config sees the same arrival
   times and images) at 25 / 50 / 90 / 120 % of capacity (``--quick``: 25 and 120 %) for
   ``LIGHTBOX_FIXED_BATCH`` 1, 4, 16 and the adaptive controller (all with
   ``LIGHTBOX_MAX_BATCH=16``). Arrival windows: 40 / 25 / 20 / 20 s (quick: 20 / 12 s; so
   the light loads get enough events for a p99). Warm-up events are published first, waited
   for and excluded.
   End-to-end latency of an event = the processed record's broker append time (the output
   topic is created with ``message.timestamp.type=LogAppendTime``) minus the event's
   ``created_at`` (set when the benchmark sends it; one machine, one wall clock). Throughput =
   measured outputs / (last append - first created_at). A run waits for all its outputs.
   The config order is rotated per load level so slow drift of the machine spreads out.
3. Writes ``<out>/bench_batching.json`` (every figure, the goal ratios) and
   ``<out>/bench_batching.png`` (p50 and p99 latency and throughput vs offered load, one line
   per config).

A benchmark, not a test: it asserts nothing and reports what it measured. The machine is
shared: per run it records the worker's CPU time per image (robust to contention) and the mean
number of cores other processes kept busy (``other_cpu_cores``); a run with a high value was
slowed down by someone else. Outputs under bench/results/ are not committed.

``bench_batching.py triton``: the same u2netp behind Triton's dynamic batcher against lightbox's
in-process batcher, open-loop (see :data:`TRITON_DOC`; needs Triton's own interpreter).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import platform
import queue
import shutil
import sys
import tempfile
import threading
import time
import uuid
from collections import deque
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np

from agents.batching import Batch, BatchingConfig, MicroBatcher
from bench.harness import (
    CpuMeter,
    OutputReader,
    create_topics,
    git_state,
    percentiles,
    poisson_schedule,
    run_env,
    run_topics,
)
from gpu_kernels.segment import ensure_u2netp
from gpu_kernels.segment.onnx_runner import OnnxSegmenter
from gpu_kernels.segment.triton_runner import TritonSegmenter
from lightbox.demo import WorkerProcess
from lightbox.devservers.kafka_local import LocalKafka
from lightbox.devservers.launch import free_port
from lightbox.devservers.triton_local import TritonServer, find_triton_python
from lightbox.offline import OUTPUT_THREADS  # the worker's output threads: where a CPU model's refinement runs
from lightbox.samples import make_catalog
from schemas.events import EventCodecs
from streams.producer import ImageProducer

__all__ = ["CONFIGS", "RunResult", "main", "summarize"]

# name -> worker environment on top of the common one
CONFIGS: dict[str, dict[str, str]] = {
    "fixed-1": {"LIGHTBOX_FIXED_BATCH": "1"},
    "fixed-4": {"LIGHTBOX_FIXED_BATCH": "4"},
    "fixed-16": {"LIGHTBOX_FIXED_BATCH": "16"},
    "adaptive": {},
}
MAX_BATCH = 16
PARTITIONS = 4
LOG_APPEND_TIME = 1  # aiokafka ConsumerRecord.timestamp_type


@dataclass
class RunResult:
    """One worker run. Times in ms, rates in images/s."""

    config: str
    load: float | None  # share of capacity; None for the capacity run
    offered_per_s: float | None
    events: int
    outputs: int
    dead_letters: int
    missing: int
    throughput_per_s: float
    latency_ms: dict[str, float]
    worker_latency_ms_p50: float  # ProcessedImageEvent.latency_us (created_at -> produce), for reference
    mean_batch: float
    batch_sizes: dict[str, int]
    drain_s: float  # last output appended - last event created: grows with the backlog under overload
    wall_s: float
    startup_s: float  # worker start until the warm-up outputs arrived
    load_average_1min: float
    # CPU over the measured window (first event sent .. last output read), from /proc: the worker's
    # CPU time per image (contention-robust: what batching saves or costs), and the mean number of
    # cores busy with processes other than the worker, the broker and this benchmark (the machine
    # is shared; its other users slow runs down unpredictably).
    worker_cpu_ms_per_image: float = float("nan")
    other_cpu_cores: float = float("nan")
    timestamp_types: list[int] = field(default_factory=list)


# ------------------------------------------------------------------------------------ one run
@dataclass(frozen=True)
class Bench:
    bootstrap: str
    broker_pid: int
    images: list[bytes]
    names: list[str]
    presets: list[str]
    segmenter: str
    workdir: Path
    warmup: int
    drain_s: float
    start_timeout_s: float


async def one_run(b: Bench, config: str, schedule: Sequence[tuple[float, int]], *, load: float | None,
                  offered: float | None, closed_loop: bool = False) -> RunResult:
    """A fresh worker on fresh topics; ``schedule``: (seconds after start, image index) per event."""
    tag = f"{config}-{'cap' if load is None else int(load * 100)}-{uuid.uuid4().hex[:6]}"
    topics = run_topics(tag)
    await create_topics(b.bootstrap, topics, PARTITIONS)
    env = run_env(b.bootstrap, topics, tag, b.workdir / "data" / tag, partitions=PARTITIONS,
                  LIGHTBOX_SEGMENTER=b.segmenter, LIGHTBOX_MAX_BATCH=str(MAX_BATCH), **CONFIGS[config])
    worker = WorkerProcess(env, b.workdir / "logs" / f"{tag}.log").start()
    codecs = EventCodecs.create()
    reader = OutputReader(b.bootstrap, topics["output"], topics["dlq"], codecs)
    t_wall = time.monotonic()
    try:
        await reader.start()
        async with ImageProducer(b.bootstrap, topics["input"], codecs=codecs) as prod:
            def event(i: int, warm: bool = False) -> dict[str, Any]:
                return prod.event({"data": b.images[i]}, sku=f"{'WARM' if warm else 'SKU'}-{i}",
                                  image_id=b.names[i], presets=b.presets)

            # warm-up: the worker joins its group, loads the pipeline, sees a few batches
            warm = [event(i % len(b.images), warm=True) for i in range(b.warmup)]
            await prod.flush([await prod.publish(ev) for ev in warm])
            if not await reader.wait_for({ev["event_id"] for ev in warm}, b.start_timeout_s, worker.running):
                raise RuntimeError(f"{tag}: warm-up outputs did not arrive; worker log:\n{worker.log_tail()}")
            startup_s = time.monotonic() - t_wall

            created: dict[str, int] = {}
            futs = []
            assert worker.proc is not None
            meter = CpuMeter(worker.proc.pid, b.broker_pid)
            t0 = time.monotonic()
            for at, idx in schedule:
                delay = t0 + at - time.monotonic()
                if delay > 0 and not closed_loop:
                    await asyncio.sleep(delay)
                ev = event(idx)
                created[ev["event_id"]] = ev["created_at"]
                futs.append(await prod.publish(ev))
            await prod.flush(futs)
            done = await reader.wait_for(set(created), b.drain_s, worker.running)
            cpu = meter.read()
        load_avg = os.getloadavg()[0]
    finally:
        await reader.stop()
        worker.stop()
    if not done:
        print(f"  ! {tag}: not every output arrived; worker log tail:\n{worker.log_tail(10)}", flush=True)
    return summarize(config, load, offered, created, reader.processed, reader.dead,
                     wall_s=time.monotonic() - t_wall, startup_s=startup_s, load_avg=load_avg,
                     cpu=cpu, closed_loop=closed_loop)


def summarize(config: str, load: float | None, offered: float | None, created: dict[str, int],
              processed: dict[str, dict[str, Any]], dead: Sequence[str | None], *, wall_s: float,
              startup_s: float, load_avg: float, cpu: dict[str, float] | None = None,
              closed_loop: bool = False) -> RunResult:
    """Figures of one run from ``created`` (event id -> created_at ms) and the outputs read."""
    outs = {eid: processed[eid] for eid in created if eid in processed}
    lat = [outs[eid]["appended_ms"] - created[eid] for eid in outs]
    appended = sorted(o["appended_ms"] for o in outs.values())
    if closed_loop and len(appended) >= 5:  # steady state: skip the first fifth (first batches)
        k = len(appended) // 5
        thr = (len(appended) - 1 - k) / max(1e-3, (appended[-1] - appended[k]) / 1000)
    elif appended:
        thr = len(appended) / max(1e-3, (appended[-1] - min(created.values())) / 1000)
    else:
        thr = 0.0
    drain_s = (appended[-1] - max(created.values())) / 1000 if appended else float("nan")
    sizes: dict[str, int] = {}
    for o in outs.values():
        sizes[str(o["batch"])] = sizes.get(str(o["batch"]), 0) + 1
    n_dead = sum(1 for d in dead if d in created)
    return RunResult(
        config=config, load=load, offered_per_s=offered, events=len(created), outputs=len(outs),
        dead_letters=n_dead, missing=len(created) - len(outs) - n_dead, throughput_per_s=thr,
        latency_ms=percentiles(lat),
        worker_latency_ms_p50=percentiles([o["worker_latency_ms"] for o in outs.values()])["p50"],
        # per item: the size of the batch each image ran in (so mean over images, not batches)
        mean_batch=float(np.mean([o["batch"] for o in outs.values()])) if outs else 0.0,
        batch_sizes=dict(sorted(sizes.items(), key=lambda kv: int(kv[0]))), drain_s=drain_s, wall_s=wall_s,
        startup_s=startup_s, load_average_1min=load_avg,
        timestamp_types=sorted({o["timestamp_type"] for o in outs.values()}),
        worker_cpu_ms_per_image=1000 * cpu["worker_s"] / max(1, len(outs)) if cpu else float("nan"),
        other_cpu_cores=cpu["other_cores"] if cpu else float("nan"))


def shrink(files: list[Path], max_side: int) -> list[Path]:
    """Downscale each image in place (same format) so its longer side is at most ``max_side``."""
    from PIL import Image

    if max_side <= 0:
        return files
    for f in files:
        with Image.open(f) as im:
            fmt = im.format
            im.load()
            small = im.copy()
        small.thumbnail((max_side, max_side), Image.Resampling.LANCZOS)
        small.save(f, format=fmt, **({"quality": 90} if fmt in ("JPEG", "WEBP") else {}))
    return files


def megapixels(files: list[Path]) -> float:
    from PIL import Image

    sizes = []
    for f in files:
        with Image.open(f) as im:
            sizes.append(im.size[0] * im.size[1] / 1e6)
    return float(np.mean(sizes))


# ------------------------------------------------------------------------------------ report
def goals(runs: list[RunResult]) -> dict[str, Any]:
    def get(config: str, load: float) -> RunResult | None:
        return next((r for r in runs if r.config == config and r.load == load), None)

    out: dict[str, Any] = {}
    sat = [r for r in runs if r.load == 1.2 and r.config != "adaptive"]
    ad = get("adaptive", 1.2)
    if sat and ad:
        best = max(sat, key=lambda r: r.throughput_per_s)
        ratio = ad.throughput_per_s / best.throughput_per_s
        out["adaptive_vs_best_fixed_throughput_at_120"] = {
            "ratio": ratio, "goal": ">= 0.9", "met": ratio >= 0.9, "best_fixed": best.config,
            "adaptive_per_s": ad.throughput_per_s, "best_fixed_per_s": best.throughput_per_s,
            # contention-robust companions: the worker's CPU per image, the machine's other load
            "cpu_ms_per_image": {r.config: r.worker_cpu_ms_per_image for r in [*sat, ad]},
            "other_cpu_cores": {r.config: r.other_cpu_cores for r in [*sat, ad]}}
    one, ad25 = get("fixed-1", 0.25), get("adaptive", 0.25)
    if one and ad25:
        ratio = ad25.latency_ms["p99"] / one.latency_ms["p99"]
        out["adaptive_p99_vs_batch1_p99_at_25"] = {
            "ratio": ratio, "goal": "<= 1.25", "met": ratio <= 1.25,
            "adaptive_p99_ms": ad25.latency_ms["p99"], "batch1_p99_ms": one.latency_ms["p99"]}
    return out


def plot(runs: list[RunResult], capacity: float, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    fig, axes = plt.subplots(1, 3, figsize=(16, 4.9), gridspec_kw={"width_ratios": [1, 1, 0.8]})
    styles = {"fixed-1": ("tab:blue", "o"), "fixed-4": ("tab:orange", "s"),
              "fixed-16": ("tab:green", "^"), "adaptive": ("tab:red", "D")}
    series = {c: sorted((r for r in runs if r.config == c and r.load is not None), key=lambda r: r.load or 0)
              for c in styles}
    ms = FuncFormatter(lambda v, _: f"{v / 1000:g} s" if v >= 1000 else f"{v:g} ms")
    lo = min((r.latency_ms[q] for rs in series.values() for r in rs for q in ("p50", "p99")), default=1.0)
    hi = max((r.latency_ms[q] for rs in series.values() for r in rs for q in ("p50", "p99")), default=1e4)
    for ax, what in zip(axes, ("p50", "p99", "throughput"), strict=True):
        for config, (color, marker) in styles.items():
            rs = series[config]
            ys = [r.throughput_per_s if what == "throughput" else r.latency_ms[what] for r in rs]
            if rs:
                ax.plot([r.offered_per_s for r in rs], ys, marker=marker, color=color,
                        lw=2.4 if config == "adaptive" else 1.4, label=config, alpha=0.9)
        ax.axvline(capacity, color="grey", ls="--", lw=1)
        ax.text(capacity, 0.02, f" capacity {capacity:.2f}/s", transform=ax.get_xaxis_transform(),
                va="bottom", fontsize=8, color="grey")
        ax.set_xlabel("offered load (images/s, Poisson)")
        ax.grid(True, which="both", alpha=0.3)
        secax = ax.secondary_xaxis("top", functions=(lambda x: 100 * x / capacity, lambda p: p * capacity / 100))
        secax.set_xlabel("% of measured capacity", fontsize=8)
        if what == "throughput":
            top = max([capacity, *(r.offered_per_s or 0 for rs in series.values() for r in rs)]) * 1.1
            ax.plot([0, top], [0, top], color="grey", lw=0.8, ls=":", label="= offered")
            ax.set_xlim(0, top)
            ax.set_ylim(0, top)
            ax.set_ylabel("throughput (images/s)")
            ax.set_title("throughput")
            ax.legend(fontsize=8, loc="upper left")
        else:
            ax.set_yscale("log")
            ax.set_ylim(lo / 1.3, hi * 1.3)
            ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
            ax.yaxis.set_major_formatter(ms)
            ax.yaxis.set_minor_formatter(NullFormatter())
            ax.set_ylabel("end-to-end latency (log scale)")
            ax.set_title(f"{what} latency (created_at → output appended)")
    axes[0].legend(title="batch size", fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ------------------------------------------------------------------------------------ main
def line(r: RunResult, i: int, n: int) -> str:
    where = "capacity" if r.load is None else f"{r.load:4.0%} = {r.offered_per_s:5.2f}/s"
    lat = r.latency_ms
    return (f"[{i:2d}/{n}] {r.config:9s} {where:>16s}  thr {r.throughput_per_s:5.2f}/s  "
            f"p50 {lat['p50']:7.0f} ms  p99 {lat['p99']:7.0f} ms  batch {r.mean_batch:4.1f}  "
            f"n={r.outputs}/{r.events}{f' dead={r.dead_letters}' if r.dead_letters else ''}"
            f"{f' MISSING={r.missing}' if r.missing else ''}  drain {r.drain_s:4.1f} s  "
            f"cpu/img {r.worker_cpu_ms_per_image:4.0f} ms  others {r.other_cpu_cores:3.1f} cores  ({r.wall_s:.0f} s)")


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    windows = {0.25: 20.0, 1.2: 12.0} if args.quick else {0.25: 40.0, 0.5: 25.0, 0.9: 20.0, 1.2: 20.0}
    if args.seconds:
        windows = dict.fromkeys(windows, args.seconds)
    loads = tuple(windows)
    cap_events = args.capacity_events or (30 if args.quick else 60)
    workdir = Path(tempfile.mkdtemp(prefix="lightbox-bench-batching-"))
    files = shrink(make_catalog(workdir / "catalog", args.images), args.max_side)
    mp = megapixels(files)
    git_at_start = git_state()  # workers run the working tree: note if it changes under the run
    t_start = time.monotonic()
    kafka = LocalKafka.start()
    print(f"broker {kafka.bootstrap} up; catalog {len(files)} images "
          f"({sum(f.stat().st_size for f in files) / len(files) / 1e6:.2f} MB avg); work dir {workdir}", flush=True)
    b = Bench(kafka.bootstrap, kafka.pid, [f.read_bytes() for f in files], [f.name for f in files],
              args.presets.split(","), args.segmenter, workdir, args.warmup, args.drain_s, 180.0)
    runs: list[RunResult] = []
    configs = [c for c in CONFIGS if c in args.configs.split(",")] if args.configs else list(CONFIGS)
    n = 1 + len(loads) * len(configs)
    try:
        rng = np.random.default_rng(args.seed)
        backlog = [(0.0, int(i)) for i in rng.integers(0, len(files), cap_events)]
        cap = await one_run(b, "adaptive", backlog, load=None, offered=None, closed_loop=True)
        runs.append(cap)
        capacity = cap.throughput_per_s
        print(line(cap, 1, n), flush=True)
        i = 1
        for li, load in enumerate(loads):
            rate = load * capacity
            schedule = poisson_schedule(rate, windows[load], len(files), args.seed * 100 + li)
            names = configs
            for config in names[li % len(names):] + names[:li % len(names)]:  # rotate: spread drift
                i += 1
                r = await one_run(b, config, schedule, load=load, offered=len(schedule) / windows[load])
                runs.append(r)
                print(line(r, i, n), flush=True)
    finally:
        kafka.stop()
        if args.keep:
            print(f"work dir kept: {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    open_runs = [r for r in runs if r.load is not None]
    return {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": {"cpu_count": os.cpu_count(), "platform": platform.platform()},
        "git": {"start": git_at_start, "end": git_state()},
        "setup": {"device": "cpu", "segmenter": args.segmenter, "presets": b.presets, "max_batch": MAX_BATCH,
                  "partitions": PARTITIONS, "images": len(files), "max_side": args.max_side,
                  "image_megapixels_mean": mp, "seed": args.seed,
                  "arrival_window_s": {f"{int(k * 100)}%": v for k, v in windows.items()},
                  "warmup_events": args.warmup, "capacity_backlog": cap_events, "loads": list(loads),
                  "latency": "output LogAppendTime - created_at (ms)", "quick": args.quick},
        "capacity_per_s": capacity,
        "capacity_run": asdict(cap),
        "runs": [asdict(r) for r in open_runs],
        "goals": goals(open_runs),
        "total_s": time.monotonic() - t_start,
    }


# --- triton: the same model behind Triton's dynamic batcher ------------------------------------

TRITON_DOC = """The same u2netp behind Triton's dynamic batcher vs lightbox's in-process adaptive batcher:
open-loop Poisson arrivals at 25 / 50 / 90 / 120 % of capacity.

    PYTHONPATH=. .venv/bin/python bench/bench_batching.py triton [--seconds 40] [--seed 15]
        [--queue-delay-ms 10] [--max-batch 16] [--threads 2] [--capacity RPS] [--loads 0.25,0.5,0.9,1.2]
        [--out bench/results]

Needs Triton's own environment (Debian's Python 3.11 with nvidia-pytriton, onnxruntime, numpy;
``LIGHTBOX_TRITON_PYTHON`` or ~/.cache/lightbox/tritonenv/bin/python, see
``lightbox.devservers.triton_local.find_triton_python``).

One request = one photo (skimage's astronaut, coffee, chelsea, rocket, in turn), segmented end to
end: lightbox's pre-processing, u2netp on ONNX Runtime (same model file, same session options,
``--threads`` intra-op threads), the mask resized back and post-processed. The two sides differ
only in where the model runs and who forms the batches:

- ``lightbox``: one device thread drives :class:`agents.batching.MicroBatcher` (CPU defaults,
  ``max_batch``) the way the worker does (double buffering: arrivals are added only while no
  closed batch waits for the device) over an in-process :class:`OnnxSegmenter` with buckets up
  to ``max_batch``; the device thread runs pre-processing and the model (``infer_batch``), and
  the worker's output-lane threads (``lightbox.offline.OUTPUT_THREADS``) each image's mask
  refinement, as the worker's ``segment`` and ``refine`` stages do on a CPU.
- ``triton``: pytriton's ``tritonserver`` (``lightbox/devservers/triton_serve.py``, ONNX Runtime
  inside the Python backend, dynamic batcher up to ``max_batch`` with ``--queue-delay-ms``);
  each request is sent by its own client thread (a pool of 64, one :class:`TritonSegmenter`
  each), as a fleet of workers would; pre/post-processing runs in the client threads.

Capacity: each side gets a backlog of ``4 * max_batch`` requests at once (closed loop); the load
levels are fractions of lightbox's capacity so both see the same arrival times (seeded per
level). That closed-loop capacity moves from run to run (3.45-5.19 req/s on the 2-core machine
here, with the hour and with how fast the batcher's sizes climb), and the offered loads with it;
``--capacity RPS`` fixes the basis instead (both capacities are still measured and reported), so
runs from different hours offer the same loads. Latency = completion - scheduled arrival;
throughput = completed / (last completion - first arrival). Per level, lightbox's p99 minus
Triton's with a 95 % bootstrap interval (the requests resampled together): with a few dozen
requests a level a p99 is one or two of them, so only a difference whose interval leaves 0 out
says one side is ahead. Writes ``<out>/bench_vs_triton.json`` and ``.png`` (p50, p99 and
throughput vs offered load). A benchmark, not a test: it asserts nothing. The machine (2 cores
here) may be shared with other work: ``other_cpu_cores`` per run is the mean load of other
processes.
"""

LOADS = (0.25, 0.5, 0.9, 1.2)
CLIENT_THREADS = 64


def photos() -> list[np.ndarray]:
    import skimage.data

    return [skimage.data.astronaut(), skimage.data.coffee(), skimage.data.chelsea(), skimage.data.rocket()]


def cpu_seconds_all() -> tuple[float, float]:
    """(busy CPU seconds of the whole machine, of this process and its children)."""
    with open("/proc/stat") as f:
        fields = [float(v) for v in f.readline().split()[1:]]
    hz = os.sysconf("SC_CLK_TCK")
    busy = (sum(fields) - fields[3] - fields[4]) / hz
    t = os.times()
    return busy, t.user + t.system + t.children_user + t.children_system


def run_lightbox(seg: OnnxSegmenter, images: list[np.ndarray], arrivals: np.ndarray, max_batch: int,
                 t0: float, refiners: ThreadPoolExecutor) -> tuple[list[float], list[int]]:
    """Completion time per request and the batch sizes, in-process adaptive batching: the device
    thread (this one) runs the model part of each batch (``infer_batch``), the output lane's
    threads (``refiners``) each image's mask refinement, as the worker's stages do on a CPU."""
    batcher: MicroBatcher[int] = MicroBatcher(BatchingConfig.for_device("cpu", max_batch=max_batch))
    done: list[float] = [0.0] * len(arrivals)
    sizes: list[int] = []
    ready: deque[Batch[int]] = deque()
    refining: list[Future[None]] = []

    def refine(k: int, pending: Any) -> None:
        pending.alpha(images[k % len(images)])
        done[k] = time.monotonic() - t0

    i = dispatched = 0
    while dispatched < len(arrivals):
        now = time.monotonic() - t0
        if not ready:  # double buffering: take arrivals only while no closed batch waits
            while not ready and i < len(arrivals) and arrivals[i] <= now:  # a batch closed: stop adding
                ready.extend(batcher.add(i, "u2netp", now))
                i += 1
            ready.extend(batcher.poll(now))
        if ready:
            batch = ready.popleft()
            start = time.monotonic()
            pending = seg.infer_batch([images[k % len(images)] for k in batch.items])
            batcher.record_service(len(batch), time.monotonic() - start)
            batcher.device_done(batch.items)
            sizes.append(len(batch))
            refining += [refiners.submit(refine, k, p) for k, p in zip(batch.items, pending, strict=True)]
            dispatched += len(batch)
            continue
        wake = [t for t in (batcher.next_deadline(), arrivals[i] if i < len(arrivals) else None) if t is not None]
        time.sleep(max(0.0, min(wake) - (time.monotonic() - t0)) if wake else 0.001)
    for f in refining:
        f.result()
    return done, sizes


class ClientPool:
    """``CLIENT_THREADS`` threads, each with its own :class:`TritonSegmenter` made in that thread
    (tritonclient's HTTP client is tied to the thread that made it), made before any timing."""

    def __init__(self, url: str, images: list[np.ndarray]) -> None:
        self.images = images
        self.tasks: queue.Queue[tuple[int, float, list[float], threading.Semaphore] | None] = queue.Queue()
        ready = threading.Barrier(CLIENT_THREADS + 1)
        self.threads = [threading.Thread(target=self._serve, args=(url, ready), daemon=True)
                        for _ in range(CLIENT_THREADS)]
        for t in self.threads:
            t.start()
        ready.wait()

    def _serve(self, url: str, ready: threading.Barrier) -> None:
        seg = TritonSegmenter(url, "u2netp")
        ready.wait()
        while (task := self.tasks.get()) is not None:
            k, t0, done, finished = task
            seg.segment_batch([self.images[k % len(self.images)]])
            done[k] = time.monotonic() - t0
            finished.release()
        seg.close()

    def run(self, arrivals: np.ndarray, t0: float) -> list[float]:
        """Completion time per request; each request one photo, sent at its arrival time."""
        done: list[float] = [0.0] * len(arrivals)
        finished = threading.Semaphore(0)
        for k, at in enumerate(arrivals):
            delay = at - (time.monotonic() - t0)
            if delay > 0:
                time.sleep(delay)
            self.tasks.put((k, t0, done, finished))
        for _ in arrivals:
            finished.acquire()
        return done

    def close(self) -> None:
        for _ in self.threads:
            self.tasks.put(None)
        for t in self.threads:
            t.join(timeout=30)


def server_cpu_seconds(session_id: int) -> float:
    """CPU seconds of every process in the server's session (tritonserver, its Python stub)."""
    hz, total = os.sysconf("SC_CLK_TCK"), 0.0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == session_id:  # field 6 of stat: the session id
            total += (int(fields[11]) + int(fields[12])) / hz
    return total


def triton_counts(metrics_url: str) -> tuple[float, float]:
    """(inferences, executions) of the served model from Triton's /metrics."""
    import urllib.request

    with urllib.request.urlopen(metrics_url, timeout=5) as r:
        text = r.read().decode()
    vals = {"nv_inference_count": 0.0, "nv_inference_exec_count": 0.0}
    for line in text.splitlines():
        for name in vals:
            if line.startswith(name + "{"):
                vals[name] += float(line.rsplit(" ", 1)[1])
    return vals["nv_inference_count"], vals["nv_inference_exec_count"]


def triton_summarize(arrivals: np.ndarray, done: list[float], wall: tuple[float, float, float]) -> dict[str, Any]:
    lat = np.asarray(done) - arrivals
    span = max(done) - float(arrivals[0])
    cores_all, cores_self, seconds = wall
    return {"requests": len(arrivals), "throughput_rps": len(arrivals) / span,
            "p50_ms": float(np.percentile(lat, 50) * 1000), "p99_ms": float(np.percentile(lat, 99) * 1000),
            "mean_ms": float(lat.mean() * 1000),
            "other_cpu_cores": max(0.0, (cores_all - cores_self) / seconds)}


def p99_difference(lightbox: np.ndarray, triton: np.ndarray, resamples: int = 2000, seed: int = 0) -> dict[str, Any]:
    """lightbox's p99 minus Triton's, in ms, with a 95 % bootstrap interval: the requests (the same
    arrival times on both sides) resampled together. With a few dozen requests a level, a p99 is
    one or two of them; the interval says whether a difference is more than that."""
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(lightbox), size=(resamples, len(lightbox)))
    diffs = np.percentile(lightbox[picks], 99, axis=1) - np.percentile(triton[picks], 99, axis=1)
    lo, hi = np.percentile(diffs, [2.5, 97.5])
    return {"p99_lightbox_minus_triton_ms": float((np.percentile(lightbox, 99) - np.percentile(triton, 99)) * 1000),
            "ci95_ms": [float(lo * 1000), float(hi * 1000)]}


def timed(fn: Any, *args: Any, server_sid: int = 0) -> tuple[Any, tuple[float, float, float]]:
    """``fn(*args)`` and (machine busy CPU s, this process's and the Triton server's CPU s, wall s)."""
    a0, s0, w0 = *cpu_seconds_all(), time.monotonic()
    t0 = server_cpu_seconds(server_sid) if server_sid else 0.0
    out = fn(*args)
    a1, s1, w1 = *cpu_seconds_all(), time.monotonic()
    t1 = server_cpu_seconds(server_sid) if server_sid else 0.0
    return out, (a1 - a0, s1 - s0 + t1 - t0, w1 - w0)


def triton_main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="bench_batching.py triton", description=TRITON_DOC,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=40.0, help="arrival window per load level")
    ap.add_argument("--seed", type=int, default=15)
    ap.add_argument("--max-batch", type=int, default=16)
    ap.add_argument("--queue-delay-ms", type=float, default=10.0, help="Triton's max queue delay")
    ap.add_argument("--threads", type=int, default=2, help="ONNX Runtime intra-op threads (both sides)")
    ap.add_argument("--capacity", type=float, default=None,
                    help="req/s the load levels are fractions of (default: lightbox's measured closed-loop capacity)")
    ap.add_argument("--loads", default=",".join(map(str, LOADS)),
                    help="the load levels, as fractions of the basis (comma-separated)")
    ap.add_argument("--out", type=Path, default=Path("bench/results"))
    args = ap.parse_args(argv)
    loads = [float(v) for v in args.loads.split(",")]
    python, why = find_triton_python()
    if python is None:
        sys.exit(f"bench_vs_triton: {why}")
    args.out.mkdir(parents=True, exist_ok=True)
    model = ensure_u2netp().batched
    images = photos()
    log = args.out / "bench_vs_triton.triton.log"
    report: dict[str, Any] = {
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "load_avg_start": os.getloadavg()},
        "config": {"seconds": args.seconds, "seed": args.seed, "max_batch": args.max_batch,
                   "triton_queue_delay_ms": args.queue_delay_ms, "threads": args.threads, "loads": loads,
                   "client_threads": CLIENT_THREADS, "images": "skimage astronaut, coffee, chelsea, rocket",
                   "triton_backend": "pytriton Python backend, ONNX Runtime CPU inside the bound function"},
        "runs": []}
    with TritonServer(python, model, http_port=free_port(), grpc_port=free_port(), metrics_port=free_port(),
                      max_batch=args.max_batch, queue_delay_us=int(args.queue_delay_ms * 1000),
                      threads=args.threads, log_path=log) as server, \
            OnnxSegmenter(model, max_batch=args.max_batch, threads=args.threads, warmup=True) as local, \
            ThreadPoolExecutor(OUTPUT_THREADS, thread_name_prefix="lightbox-output") as refiners:
        with TritonSegmenter(server.url, "u2netp") as warm:
            warm.warm_up()
        clients = ClientPool(server.url, images)
        assert server.proc is not None
        sid = server.proc.pid  # started in its own session
        backlog = np.zeros(4 * args.max_batch)
        capacity: dict[str, float] = {}
        t0 = time.monotonic()
        done, sizes = run_lightbox(local, images, backlog, args.max_batch, t0, refiners)
        capacity["lightbox"] = len(backlog) / max(done)
        t0 = time.monotonic()
        capacity["triton"] = len(backlog) / max(clients.run(backlog, t0))
        report["capacity_rps"] = capacity
        basis = args.capacity or capacity["lightbox"]
        report["load_basis_rps"] = basis
        print(f"capacity (closed loop, backlog {len(backlog)}): {capacity}; loads are fractions of {basis:.2f} req/s",
              flush=True)
        for n, load in enumerate(loads):
            rate = load * basis
            rng = np.random.default_rng(args.seed + n)
            arrivals = np.cumsum(rng.exponential(1 / rate, int(rate * args.seconds * 1.5) + 10))
            arrivals = arrivals[arrivals < args.seconds]
            order = ("lightbox", "triton") if n % 2 == 0 else ("triton", "lightbox")
            latency: dict[str, np.ndarray] = {}
            for side in order:
                t0 = time.monotonic()
                if side == "lightbox":
                    (done, sizes), wall = timed(run_lightbox, local, images, arrivals, args.max_batch, t0, refiners)
                    extra = {"mean_batch": float(np.mean(sizes)), "batches": len(sizes),
                             "batch_sizes": {int(b): int(k) for b, k in zip(*np.unique(sizes, return_counts=True),
                                                                             strict=True)}}
                else:
                    inf0, exe0 = triton_counts(server.metrics_url)
                    done, wall = timed(clients.run, arrivals, t0, server_sid=sid)
                    inf1, exe1 = triton_counts(server.metrics_url)
                    extra = {"mean_batch": (inf1 - inf0) / max(1.0, exe1 - exe0), "batches": int(exe1 - exe0)}
                row = {"side": side, "load": load, "offered_rps": rate, **triton_summarize(arrivals, done, wall),
                       **extra}
                report["runs"].append(row)
                latency[side] = np.asarray(done) - arrivals
                print(json.dumps(row), flush=True)
            diff = {"load": load, **p99_difference(latency["lightbox"], latency["triton"], seed=args.seed + n)}
            report.setdefault("p99_differences", []).append(diff)
            print(f"load {load:.0%}: p99 lightbox - Triton {diff['p99_lightbox_minus_triton_ms']:+.0f} ms "
                  f"(95 % interval {diff['ci95_ms'][0]:+.0f} .. {diff['ci95_ms'][1]:+.0f} ms)", flush=True)
        clients.close()
    (args.out / "bench_vs_triton.json").write_text(json.dumps(report, indent=2))
    triton_plot(report, args.out / "bench_vs_triton.png")
    print(f"wrote {args.out / 'bench_vs_triton.json'} and .png")


def triton_plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    for side, colour in (("lightbox", "tab:blue"), ("triton", "tab:orange")):
        rows = [r for r in report["runs"] if r["side"] == side]
        x = [r["offered_rps"] for r in rows]
        label = "lightbox in-process adaptive" if side == "lightbox" else "Triton dynamic batcher"
        axes[0].plot(x, [r["p50_ms"] for r in rows], "o-", color=colour, label=label)
        axes[1].plot(x, [r["p99_ms"] for r in rows], "o-", color=colour, label=label)
        axes[2].plot(x, [r["throughput_rps"] for r in rows], "o-", color=colour, label=label)
    axes[2].plot(x, x, ":", color="grey", label="offered")
    for ax, title in zip(axes, ("p50 latency (ms)", "p99 latency (ms)", "throughput (req/s)"), strict=True):
        ax.set_title(title)
        ax.set_xlabel("offered load (req/s)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    axes[0].set_yscale("log")
    axes[1].set_yscale("log")
    cfg = report["config"]
    fig.suptitle(f"u2netp on CPU ({cfg['threads']} ORT threads, {report['machine']['cpus']} cores, max batch "
                 f"{cfg['max_batch']}): capacity "
                 f"{report['capacity_rps']['lightbox']:.2f} req/s in-process, {report['capacity_rps']['triton']:.2f} "
                 f"via Triton; loads {'/'.join(f'{v:.0%}' for v in cfg['loads'])} of {report['load_basis_rps']:.2f} "
                 f"req/s, {cfg['seconds']:.0f} s each")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["triton"]:
        triton_main(argv[1:])
        return 0
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--quick", action="store_true", help="loads 25 and 120 %% only, shorter runs (~3-4 min)")
    p.add_argument("--seconds", type=float, default=None, help="one arrival window for every load (smoke runs)")
    p.add_argument("--max-side", type=int, default=800, help="shrink catalog images to this side (0: keep)")
    p.add_argument("--capacity-events", type=int, default=None, help="backlog for capacity (default 60, quick 30)")
    p.add_argument("--warmup", type=int, default=6, help="warm-up events per run (excluded)")
    p.add_argument("--drain-s", type=float, default=120.0, help="longest wait for a run's last outputs")
    p.add_argument("--images", type=int, default=16, help="catalog images (cycled at random)")
    p.add_argument("--presets", default="jd_main,thumb_webp")
    p.add_argument("--segmenter", default="classical", choices=("classical", "model", "none"))
    p.add_argument("--seed", type=int, default=6)
    p.add_argument("--configs", default="", help=f"comma-separated, of {', '.join(CONFIGS)} (default: all)")
    p.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    p.add_argument("--keep", action="store_true", help="keep the work dir (worker logs)")
    args = p.parse_args(argv)
    # fresh topics make aiokafka log transient NotLeaderForPartition errors while leaders settle
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    result = asyncio.run(bench(args))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bench_batching.json").write_text(json.dumps(result, indent=2))
    runs = [RunResult(**r) for r in result["runs"]]
    title = (f"lightbox worker on CPU ({result['machine']['cpu_count']} cores, shared), segmenter "
             f"{args.segmenter}, presets {args.presets}, images <= {args.max_side or 'full'} px; "
             f"Poisson arrivals; capacity {result['capacity_per_s']:.2f} img/s")
    plot(runs, result["capacity_per_s"], args.out / "bench_batching.png", title)
    print(json.dumps(result["goals"], indent=2))
    print(f"wrote {args.out / 'bench_batching.json'} and {args.out / 'bench_batching.png'} "
          f"({result['total_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
