"""What tracing + metrics cost: the same backlog through a ``lightbox worker`` with observability
off and on, side by side, on a real broker and the real CPU pipeline.

    PYTHONPATH=. .venv/bin/python bench/bench_observability.py [--pairs 4] [--events 80]
        [--max-side 800] [--presets jd_main,thumb_webp] [--out bench/results]
    PYTHONPATH=. .venv/bin/python bench/bench_observability.py --prometheus URL [--minutes 15]
    PYTHONPATH=. .venv/bin/python bench/bench_observability.py --from-json bench/results/bench_observability.json

- off: ``LIGHTBOX_METRICS_PORT=0`` and no ``OTEL_*`` endpoint (no metrics server, no tracer);
- on: the metrics server scraped every second by a real Prometheus (``/usr/bin/prometheus``),
  and traces exported over OTLP/HTTP (batching span processor) to a receiver in this process
  that decodes every span (so the export is real).

Both run ``LIGHTBOX_FIXED_BATCH=4`` by default (``--fixed-batch 0``: adaptive) so that the
controller's load-dependent choices do not blur the comparison. Runs alternate off/on (the pair
order flips every pair so drift spreads out); each run is a fresh worker on fresh topics, warmed
up, then given a backlog (closed loop) through :func:`bench_batching.one_run`. Per run:
steady-state throughput (outputs over their broker append times) and the worker's CPU time per
image (robust to the other users of a shared machine). The cost is reported per pair and as the
median of the pair ratios.

``--observer-only`` (also run after the pairs): the observer's CPU microseconds per image in
process, metrics only and metrics + tracing, with GPU-like outputs: the figure to set against a
GPU worker's time per image, where the pipeline is too fast for the CPU pairs to say much.

Afterwards the stage breakdown is drawn from the Prometheus data of the "on" runs
(:func:`draw`). Writes ``<out>/bench_observability.json`` and ``<out>/stage_breakdown.png``.
A benchmark: it asserts nothing.

The stage breakdown (``lightbox_stage_seconds``) in three panels from Prometheus's HTTP query
API, over a window: (1) mean time per image in each stage (batch-amortized), stacked over time:
``rate(_sum) / rate(_count)`` of the last 30 s, per stage; (2) where the worker's time went over
the whole window: ``increase(_sum)`` per stage, as a share; (3) p50 and p99 per image and stage
(``histogram_quantile`` over the window's bucket increases). ``--prometheus URL`` draws it from
any Prometheus that scrapes lightbox workers (the last ``--minutes``), ``--from-json`` redraws
it from a run's JSON; both write ``<out>/stage_breakdown.png``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import platform
import shutil
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_batching as bb
import numpy as np

from lightbox.devservers.kafka_local import LocalKafka
from lightbox.devservers.launch import free_port
from lightbox.devservers.prometheus_local import LocalPrometheus
from lightbox.report import ORDER  # pipeline order, for a legend that reads like the pipeline
from lightbox.samples import make_catalog
from tests.otlp_receiver import OtlpReceiver


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    for k in [k for k in os.environ if k.startswith("OTEL_")]:
        del os.environ[k]  # "off" must really be off
    port = free_port()
    receiver = OtlpReceiver()
    batch = {"LIGHTBOX_FIXED_BATCH": str(args.fixed_batch)} if args.fixed_batch else {}
    bb.CONFIGS["off"] = {"LIGHTBOX_METRICS_PORT": "0", **batch}
    bb.CONFIGS["on"] = {"LIGHTBOX_METRICS_PORT": str(port), "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, **batch}
    workdir = Path(tempfile.mkdtemp(prefix="lightbox-bench-observe-"))
    files = bb.shrink(make_catalog(workdir / "catalog", args.images), args.max_side)
    t_start = time.monotonic()
    kafka = LocalKafka.start()
    prom = LocalPrometheus.start([f"127.0.0.1:{port}"], scrape_interval_s=1.0, folder=workdir / "prometheus")
    print(f"broker {kafka.bootstrap}, prometheus {prom.url} scraping :{port}, OTLP {receiver.endpoint}; "
          f"work dir {workdir}", flush=True)
    b = bb.Bench(kafka.bootstrap, kafka.pid, [f.read_bytes() for f in files], [f.name for f in files],
                 args.presets.split(","), args.segmenter, workdir, args.warmup, args.drain_s, 180.0)
    runs: list[bb.RunResult] = []
    on_window: list[float] = []
    try:
        rng = np.random.default_rng(args.seed)
        backlog = [(0.0, int(i)) for i in rng.integers(0, len(files), args.events)]
        for pair in range(args.pairs):
            order = ("off", "on") if pair % 2 == 0 else ("on", "off")
            for config in order:
                t = time.time()
                spans_before = len(receiver.spans)
                r = await bb.one_run(b, config, backlog, load=None, offered=None, closed_loop=True)
                runs.append(r)
                if config == "on":
                    on_window += [t, time.time()]
                    await asyncio.sleep(2.5)  # a last scrape and span export
                print(f"pair {pair + 1}/{args.pairs} {config:>3}: {r.throughput_per_s:5.2f} img/s, "
                      f"{r.worker_cpu_ms_per_image:6.1f} CPU ms/img, mean batch {r.mean_batch:.1f}, "
                      f"other cores busy {r.other_cpu_cores:.2f}, spans received {len(receiver.spans) - spans_before}",
                      flush=True)
        breakdown = query_breakdown(prom, min(on_window), max(on_window)) if on_window else None
        if breakdown is not None:
            draw(breakdown, args.out / "stage_breakdown.png",
                 title=f"lightbox worker on CPU (shared {os.cpu_count()}-core machine), segmenter {args.segmenter}, "
                       f"presets {args.presets}, images <= {args.max_side} px: Prometheus data of the 'on' runs")
    finally:
        prom.stop()
        kafka.stop()
        receiver.close()
        if args.keep:
            print(f"work dir kept: {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)

    pairs = []
    for k in range(0, len(runs), 2):
        a, c = runs[k], runs[k + 1]
        off, on = (a, c) if a.config == "off" else (c, a)
        pairs.append({"throughput_cost_pct": 100 * (1 - on.throughput_per_s / off.throughput_per_s),
                      "cpu_cost_pct": 100 * (on.worker_cpu_ms_per_image / off.worker_cpu_ms_per_image - 1),
                      "off": off.throughput_per_s, "on": on.throughput_per_s,
                      "other_cores": [off.other_cpu_cores, on.other_cpu_cores]})
    return {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": {"cpu_count": os.cpu_count(), "platform": platform.platform(), "shared": True},
        "git": bb.git_state(),
        "setup": {"events_per_run": args.events, "fixed_batch": args.fixed_batch, "warmup": args.warmup,
                  "presets": b.presets,
                  "segmenter": args.segmenter, "max_side": args.max_side, "images": len(files),
                  "scrape_interval_s": 1.0, "otlp": "http/protobuf, BatchSpanProcessor defaults"},
        "pairs": pairs,
        "throughput_cost_pct_median": statistics.median(p["throughput_cost_pct"] for p in pairs),
        "cpu_cost_pct_median": statistics.median(p["cpu_cost_pct"] for p in pairs),
        "runs": [asdict(r) for r in runs],
        "spans_received": len(receiver.spans),
        "stage_breakdown": breakdown,
        "total_s": time.monotonic() - t_start,
    }


class _Sink:
    """An OTLP/HTTP endpoint that reads and drops each request (decoding would bill this process)."""

    def __init__(self) -> None:
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                self.send_response(200)
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self._server.server_port}/v1/traces"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def observer_cost(n: int = 4000, batch: int = 8) -> dict[str, Any]:
    """CPU microseconds per image that the observer adds to a worker process: the calls on the
    event loop plus the span export thread (batching processor, protobuf, HTTP to a sink that
    drops the requests). Outputs look like a GPU worker's: 11 span records, batches of ``batch``.
    The figure to set against a device's time per image."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.sampling import TraceIdRatioBased

    from agents.process import InRecord, OutRecord
    from agents.telemetry import Health, Metrics, Telemetry
    from agents.tracing import Tracing

    names = ["fetch", "decode", "segment", "correct", "preset:jd_main", "preset:thumb_webp", "encode:jd_main",
             "encode:thumb_webp", "quality", "compliance", "produce"]
    spans = tuple({"stage": s, "start_us": 100 * k, "duration_us": 90, "batch_size": batch, "device": "gpu"}
                  for k, s in enumerate(names))

    def run(tel: Telemetry) -> float:
        outs = []
        for i in range(n):
            tp = f"00-{os.urandom(16).hex()}-{os.urandom(8).hex()}-01".encode()
            rec = InRecord("images", 0, i, b"", headers=[("traceparent", tp)])
            keys = tuple(("images", 0, j) for j in range(i - i % batch, i - i % batch + batch))
            outs.append(OutRecord("processed", None, b"", [("traceparent", tp)], rec, spans=spans,
                                  origin_ns=time.monotonic_ns(), created_ms=time.time_ns() // 1_000_000, batch=keys))
        t0 = time.process_time()
        for k in range(0, n, batch):
            for out in outs[k:k + batch]:
                tel.received(out.source)
            tel.lane_progress("device", 0)
            tel.batch_done("device", batch, 0.001)
            for out in outs[k:k + batch]:
                tel.output_acked(tel.sending(out))
        if tel.tracing is not None:
            tel.tracing.close()  # flushes: the export's CPU is counted
        return 1e6 * (time.process_time() - t0) / n

    def traced(sink: _Sink, **kw: Any) -> Telemetry:
        sampler = kw.pop("sampler", None)
        provider = TracerProvider(sampler=sampler)
        exporter = OTLPSpanExporter(endpoint=sink.endpoint)
        provider.add_span_processor(BatchSpanProcessor(exporter, max_queue_size=1 << 16))  # no drops: all are paid
        return Telemetry(Metrics(), Health(), Tracing(provider.get_tracer("bench"), group="g", provider=provider, **kw))

    sink = _Sink()
    try:
        out = {"images": n, "batch": batch, "span_records_per_image": len(spans),
               "metrics_us_per_image": run(Telemetry(Metrics(), Health())),
               "metrics_tracing_us_per_image": run(traced(sink)),
               "metrics_tracing_batch_stages_only_us_per_image": run(traced(sink, item_stages=False)),
               "metrics_tracing_sampled_10pct_us_per_image": run(traced(sink, sampler=TraceIdRatioBased(0.1)))}
    finally:
        sink.close()
    return out


def _order(stage: str) -> int:
    return ORDER.index(stage) if stage in ORDER else len(ORDER)


def query_breakdown(prom: Any, start: float, end: float, step_s: float = 2.0) -> dict[str, Any]:
    """The panels' data. ``prom`` has ``query(expr, at)`` and ``query_range(expr, start, end, step)``."""
    window = f"{max(1, int(end - start))}s"
    mean = prom.query_range("sum by (stage) (rate(lightbox_stage_seconds_sum[30s]))"
                            " / sum by (stage) (rate(lightbox_stage_seconds_count[30s]))", start, end, step_s)
    series = {r["metric"]["stage"]: [(float(t), float(v)) for t, v in r["values"]] for r in mean}
    total = {r["metric"]["stage"]: float(r["value"][1])
             for r in prom.query(f"sum by (stage) (increase(lightbox_stage_seconds_sum[{window}]))", at=end)}
    quantiles: dict[str, dict[str, float]] = {}
    for q in (0.5, 0.99):
        for r in prom.query(f"histogram_quantile({q}, sum by (stage, le) "
                            f"(increase(lightbox_stage_seconds_bucket[{window}])))", at=end):
            quantiles.setdefault(r["metric"]["stage"], {})[f"p{int(q * 100)}"] = float(r["value"][1])
    images = sum(float(r["value"][1]) for r in prom.query(f"sum(increase(lightbox_images_total[{window}]))", at=end))
    return {"start": start, "end": end, "step_s": step_s, "series": series, "total_s": total,
            "quantiles": quantiles, "images": images}


def draw(data: dict[str, Any], path: Path, title: str = "lightbox stage breakdown (Prometheus)") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    stages = sorted(set(data["series"]) | set(data["total_s"]), key=_order)
    colours = {s: plt.get_cmap("tab10")(k % 10) for k, s in enumerate(stages)}
    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(17, 5.2), gridspec_kw={"width_ratios": [2.2, 1, 1.3]})

    # 1: stacked mean ms per image over time, on the query's regular grid: 0 where a stage saw no
    # image in the last 30 s (between runs), so gaps show as gaps rather than as ramps
    step = float(data.get("step_s", 2.0))
    seen = sorted({t for s in data["series"].values() for t, _ in s})
    if seen:
        t0 = seen[0]
        grid = [t0 + k * step for k in range(round((seen[-1] - t0) / step) + 1)]
        ys = []
        for s in stages:
            pts = {round((t - t0) / step): v for t, v in data["series"].get(s, [])}
            ys.append([1000 * pts[k] if k in pts and np.isfinite(pts[k]) else 0.0 for k in range(len(grid))])
        ax1.stackplot([t - t0 for t in grid], ys, labels=stages, colors=[colours[s] for s in stages], alpha=0.85)
    ax1.set_xlabel("seconds into the window")
    ax1.set_ylabel("ms per image (batch-amortized), 30 s mean")
    ax1.set_title("time per image, by stage")
    ax1.legend(loc="upper left", fontsize=8, ncol=2)

    # 2: share of all stage time over the window
    total = sum(data["total_s"].values()) or 1.0
    shares = [100 * data["total_s"].get(s, 0.0) / total for s in stages]
    ax2.barh(stages[::-1], shares[::-1], color=[colours[s] for s in stages[::-1]])
    for y, v in enumerate(shares[::-1]):
        ax2.text(v + 0.5, y, f"{v:.1f} %", va="center", fontsize=8)
    ax2.set_xlabel("% of stage time")
    ax2.set_title(f"where the time went ({data['images']:.0f} images)")
    ax2.set_xlim(0, max([*shares, 1.0]) * 1.25)

    # 3: p50 / p99 per stage
    x = np.arange(len(stages))
    p50 = [1000 * data["quantiles"].get(s, {}).get("p50", float("nan")) for s in stages]
    p99 = [1000 * data["quantiles"].get(s, {}).get("p99", float("nan")) for s in stages]
    ax3.bar(x - 0.2, p50, 0.4, label="p50", color="#4c72b0")
    ax3.bar(x + 0.2, p99, 0.4, label="p99", color="#dd8452")
    ax3.set_xticks(x, stages, rotation=45, ha="right")
    ax3.set_yscale("log")
    ax3.set_ylabel("ms per image (bucket-interpolated)")
    ax3.set_title("p50 / p99 per stage")
    ax3.legend(fontsize=8)

    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


class _Remote:
    """A Prometheus reached by URL (the query half of :class:`LocalPrometheus`)."""

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")

    query = LocalPrometheus.query
    query_range = LocalPrometheus.query_range
    _get = LocalPrometheus._get


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--pairs", type=int, default=4, help="off/on pairs")
    p.add_argument("--events", type=int, default=80, help="backlog per run")
    p.add_argument("--warmup", type=int, default=6)
    p.add_argument("--drain-s", type=float, default=240.0)
    p.add_argument("--images", type=int, default=16)
    p.add_argument("--max-side", type=int, default=800)
    p.add_argument("--presets", default="jd_main,thumb_webp")
    p.add_argument("--segmenter", default="classical", choices=("classical", "model", "none"))
    p.add_argument("--seed", type=int, default=12)
    p.add_argument("--fixed-batch", type=int, default=4,
                   help="both configs run this batch size (0: the adaptive controller, whose choices vary with "
                        "the machine's load and would blur the comparison)")
    p.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    p.add_argument("--keep", action="store_true")
    p.add_argument("--observer-only", action="store_true",
                   help="only the observer's CPU cost per image, in process (no broker, no worker)")
    p.add_argument("--prometheus", help="only the stage breakdown, from this Prometheus (base URL) that scrapes "
                                        "lightbox workers")
    p.add_argument("--minutes", type=float, default=15.0, help="--prometheus: the window, ending now")
    p.add_argument("--from-json", type=Path, default=None,
                   help="only the stage breakdown, redrawn from a bench_observability.json")
    args = p.parse_args(argv)
    if args.from_json is not None or args.prometheus:
        png = args.out / "stage_breakdown.png"
        args.out.mkdir(parents=True, exist_ok=True)
        if args.from_json is not None:
            data = json.loads(args.from_json.read_text())["stage_breakdown"]
        else:
            end = time.time()
            data = query_breakdown(_Remote(args.prometheus), end - 60 * args.minutes, end)
        draw(data, png)
        print(f"wrote {png} ({data['images']:.0f} images in the window)")
        return 0
    if args.observer_only:
        print(json.dumps(observer_cost(), indent=2))
        return 0
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    result = asyncio.run(bench(args))
    result["observer_cost"] = observer_cost()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bench_observability.json").write_text(json.dumps(result, indent=2))
    for k, pr in enumerate(result["pairs"]):
        print(f"pair {k + 1}: off {pr['off']:.2f} img/s, on {pr['on']:.2f} img/s: throughput cost "
              f"{pr['throughput_cost_pct']:+.1f} %, CPU/img cost {pr['cpu_cost_pct']:+.1f} %")
    print(f"median throughput cost {result['throughput_cost_pct_median']:+.1f} %, median CPU/img cost "
          f"{result['cpu_cost_pct_median']:+.1f} % (shared machine); wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
