"""The stage breakdown of lightbox workers, drawn from Prometheus data (``lightbox_stage_seconds``).

    PYTHONPATH=. .venv/bin/python bench/plot_stage_breakdown.py --prometheus http://127.0.0.1:9090 \\
        [--minutes 15] [--out bench/results/stage_breakdown.png]

Three panels from the HTTP query API, over the window:

1. mean time per image in each stage (batch-amortized), stacked over time: ``rate(_sum) / rate(_count)``
   of the last 30 s, per stage;
2. where the worker's time went over the whole window: ``increase(_sum)`` per stage, as a share;
3. p50 and p99 per image and stage (``histogram_quantile`` over the window's bucket increases).

``bench/bench_observability.py`` calls :func:`draw` after its runs with its own Prometheus.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lightbox.devservers.prometheus_local import LocalPrometheus
from lightbox.report import ORDER  # pipeline order, for a legend that reads like the pipeline

__all__ = ["draw", "query_breakdown"]


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
    p.add_argument("--prometheus", help="base URL of a Prometheus that scrapes lightbox workers")
    p.add_argument("--minutes", type=float, default=15.0, help="window ending now")
    p.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results" / "stage_breakdown.png")
    p.add_argument("--from-json", type=Path, default=None,
                   help="redraw from bench_observability.json's stage_breakdown instead of querying")
    args = p.parse_args(argv)
    if args.from_json is not None:
        import json

        data = json.loads(args.from_json.read_text())["stage_breakdown"]
        draw(data, args.out)
        print(f"wrote {args.out}")
        return 0
    end = time.time()
    data = query_breakdown(_Remote(args.prometheus), end - 60 * args.minutes, end)
    draw(data, args.out)
    print(f"wrote {args.out} ({data['images']:.0f} images in the window)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
