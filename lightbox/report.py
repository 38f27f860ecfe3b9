"""The latency report: per-stage breakdown of processed events (ms and share, p50/p99). Pure."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["StageStats", "draw_stage_chart", "per_event_stage_ms", "stage_family", "stage_table"]

ORDER = ("fetch", "decode", "segment", "refine", "correct", "render", "shadow", "encode", "quality", "compliance",
         "produce")


def stage_family(stage: str) -> str:
    """``preset:jd_main`` → ``render``, ``encode:jd_main`` → ``encode``; others as they are."""
    head = stage.split(":", 1)[0]
    return "render" if head == "preset" else head


@dataclass(frozen=True)
class StageStats:
    stage: str
    mean_ms: float
    p50_ms: float
    p99_ms: float
    share: float  # of the mean sum of all stages
    per_image_ms: float  # mean of duration / batch size: the stage's cost amortized over its batch


def per_event_stage_ms(event: Mapping[str, Any], *, amortized: bool = False) -> dict[str, float]:
    """Milliseconds per stage family in one ProcessedImageEvent (per-preset spans summed).

    A batched stage's span lasts as long as the whole batch took; ``amortized`` divides each
    span by its batch size, i.e. this image's share of the work."""
    out: dict[str, float] = defaultdict(float)
    for s in event["spans"]:
        out[stage_family(s["stage"])] += s["duration_us"] / 1000.0 / (max(1, s["batch_size"]) if amortized else 1)
    return dict(out)


def stage_table(events: Iterable[Mapping[str, Any]]) -> tuple[list[StageStats], dict[str, float]]:
    """Stage rows in pipeline order, and end-to-end latency stats (p50/p99/mean ms, n)."""
    per_stage: dict[str, list[float]] = defaultdict(list)
    amortized: dict[str, float] = defaultdict(float)
    e2e: list[float] = []
    n = 0
    for ev in events:
        n += 1
        for stage, ms in per_event_stage_ms(ev).items():
            per_stage[stage].append(ms)
        for stage, ms in per_event_stage_ms(ev, amortized=True).items():
            amortized[stage] += ms
        e2e.append(ev["latency_us"] / 1000.0)
    if n == 0:
        return [], {"n": 0}
    # a stage missing from some events counts as 0 ms there, so shares add up to 1
    means = {s: sum(v) / n for s, v in per_stage.items()}
    total = sum(means.values()) or 1.0
    known = [s for s in ORDER if s in per_stage] + sorted(s for s in per_stage if s not in ORDER)
    rows = []
    for s in known:
        vals = np.array(per_stage[s] + [0.0] * (n - len(per_stage[s])))
        rows.append(StageStats(s, means[s], float(np.percentile(vals, 50)), float(np.percentile(vals, 99)),
                               means[s] / total, amortized[s] / n))
    arr = np.array(e2e)
    return rows, {"n": n, "p50_ms": float(np.percentile(arr, 50)), "p99_ms": float(np.percentile(arr, 99)),
                  "mean_ms": float(arr.mean())}


def draw_stage_chart(events: Sequence[Mapping[str, Any]], out_png: str | Path) -> Path:
    """A horizontal bar chart of mean ms per stage with p50–p99 whiskers, as a PNG."""
    try:
        import matplotlib
    except ImportError:
        raise RuntimeError("the stage chart needs matplotlib: pip install 'lightbox[report]'") from None

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows, e2e = stage_table(events)
    fig, ax = plt.subplots(figsize=(8, 0.6 * len(rows) + 1.8))
    ys = np.arange(len(rows))[::-1]
    ax.barh(ys + 0.2, [r.mean_ms for r in rows], height=0.4, color="#a6bddb",
            label="the image waited (the stage's whole batch), mean")
    ax.barh(ys - 0.2, [r.per_image_ms for r in rows], height=0.4, color="#2b6ca3",
            label="its share of the work (batch time ÷ batch size)")
    for y, r in zip(ys, rows, strict=True):
        ax.text(r.per_image_ms, y - 0.2, f"  {r.per_image_ms:.1f} ms", va="center", fontsize=8)
        ax.text(r.mean_ms, y + 0.2, f"  {r.mean_ms:.1f} ms (p99 {r.p99_ms:.0f}, {r.share:.0%})", va="center",
                fontsize=8, color="#555555")
    ax.set_yticks(ys, [r.stage for r in rows])
    ax.set_xlabel("milliseconds")
    ax.margins(x=0.25)
    ax.legend(loc="lower right", fontsize=8, frameon=False)
    ax.set_title(f"lightbox stage latency, {e2e['n']} images; end to end p50 {e2e.get('p50_ms', 0):.0f} ms, "
                 f"p99 {e2e.get('p99_ms', 0):.0f} ms", fontsize=9)
    fig.tight_layout()
    out = Path(out_png)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out
