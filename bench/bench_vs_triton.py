"""The same u2netp behind Triton's dynamic batcher vs lightbox's in-process adaptive batcher:
open-loop Poisson arrivals at 25 / 50 / 90 / 120 % of capacity.

    PYTHONPATH=. .venv/bin/python bench/bench_vs_triton.py [--seconds 40] [--seed 15]
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

from __future__ import annotations

import argparse
import json
import os
import platform
import queue
import sys
import threading
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np

from agents.batching import Batch, BatchingConfig, MicroBatcher
from gpu_kernels.segment import ensure_u2netp
from gpu_kernels.segment.onnx_runner import OnnxSegmenter
from gpu_kernels.segment.triton_runner import TritonSegmenter
from lightbox.devservers.launch import free_port
from lightbox.devservers.triton_local import TritonServer, find_triton_python
from lightbox.offline import OUTPUT_THREADS  # the worker's output lane: where a CPU model's refinement runs

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


def summarize(arrivals: np.ndarray, done: list[float], wall: tuple[float, float, float]) -> dict[str, Any]:
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


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
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
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "note": "shared machine"},
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
                row = {"side": side, "load": load, "offered_rps": rate, **summarize(arrivals, done, wall), **extra}
                report["runs"].append(row)
                latency[side] = np.asarray(done) - arrivals
                print(json.dumps(row), flush=True)
            diff = {"load": load, **p99_difference(latency["lightbox"], latency["triton"], seed=args.seed + n)}
            report.setdefault("p99_differences", []).append(diff)
            print(f"load {load:.0%}: p99 lightbox - Triton {diff['p99_lightbox_minus_triton_ms']:+.0f} ms "
                  f"(95 % interval {diff['ci95_ms'][0]:+.0f} .. {diff['ci95_ms'][1]:+.0f} ms)", flush=True)
        clients.close()
    (args.out / "bench_vs_triton.json").write_text(json.dumps(report, indent=2))
    plot(report, args.out / "bench_vs_triton.png")
    print(f"wrote {args.out / 'bench_vs_triton.json'} and .png")


def plot(report: dict[str, Any], path: Path) -> None:
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
    fig.suptitle(f"u2netp on CPU ({cfg['threads']} ORT threads, shared 2-core machine): capacity "
                 f"{report['capacity_rps']['lightbox']:.2f} req/s in-process, {report['capacity_rps']['triton']:.2f} "
                 f"via Triton; loads {'/'.join(f'{v:.0%}' for v in cfg['loads'])} of {report['load_basis_rps']:.2f} "
                 f"req/s, {cfg['seconds']:.0f} s each")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
