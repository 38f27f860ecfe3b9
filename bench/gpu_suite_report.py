"""Merge the parts of ``bench/gpu_suite.sh`` into one JSON and draw one PNG.

    python3 bench/gpu_suite_report.py PARTS_DIR OUT.json OUT.png

Every part keeps its full JSON under ``parts``; ``summary`` has one line per part (ran,
skipped and why, failed) and the headline figures; ``goals`` checks the GPU goals of issue 15
where the figures exist. The PNG has four panels (model img/s by batch, end-to-end img/s and
p99 by batch, DALI decode img/s by batch, step times); matplotlib draws it when installed,
otherwise OpenCV writes the summary as text.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any


def _load(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def parity_summary(log: Path) -> dict[str, Any]:
    text = log.read_text(errors="replace") if log.is_file() else ""
    counts = {k: int(v) for v, k in re.findall(r"(\d+) (passed|failed|skipped|error|errors)", text)}
    status = "failed" if counts.get("failed") or counts.get("error") or counts.get("errors") else (
        "skipped" if counts.get("skipped") and not counts.get("passed") else "ok" if counts else "missing")
    reasons = sorted(set(re.findall(r"SKIPPED \[\d+\] [^:]+:\d+: (.*)", text)))
    return {"status": status, "counts": counts, "skip_reasons": reasons[:5]}


def merge(parts: Path) -> dict[str, Any]:
    steps = [json.loads(ln) for ln in (parts / "steps.jsonl").read_text().splitlines() if ln.strip()] \
        if (parts / "steps.jsonl").is_file() else []
    data = {"codec": _load(parts / "codec.json"), "retouch": _load(parts / "gpu_check_retouch.json"),
            "model": _load(parts / "model.json"), "torch": _load(parts / "torch.json"),
            "e2e": _load(parts / "e2e.json")}
    summary: dict[str, Any] = {"parity": parity_summary(parts / "parity.log")}
    for name, part in data.items():
        if part is None:
            summary[name] = {"status": "missing"}
            continue
        line = {"status": part.get("status", "?")}
        for key in ("reason", "skipped", "error"):
            if key in part:
                line[key] = str(part[key])[:300]
        summary[name] = line
    goals: dict[str, Any] = {}
    e2e = data["e2e"] or {}
    if e2e.get("device") == "gpu" and e2e.get("rows"):
        best = max(r["img_per_s"] for r in e2e["rows"])
        goals["e2e_1000_img_per_s"] = {"best": best, "met": best >= 1000}
    codec = data["codec"] or {}
    if codec.get("goal_4000_img_per_s_at_batch_128"):
        goals["decode_4000_img_per_s"] = codec["goal_4000_img_per_s_at_batch_128"]
    if not goals:
        goals["note"] = "no GPU figures in this run: GPU goals not judged"
    return {"steps": steps, "summary": summary, "goals": goals, "parts": data}


def draw(report: dict[str, Any], png: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        _draw_text(report, png)
        return
    fig, axes = plt.subplots(2, 2, figsize=(13, 9))
    ax = axes[0][0]
    model = report["parts"].get("model") or {}
    series: dict[str, list[tuple[int, float]]] = {}
    for r in (model.get("grid") or []) + ((report["parts"].get("torch") or {}).get("grid") or []):
        if "img_per_s" in r:
            series.setdefault(f"{r['precision']} {r['mode']}", []).append((r["batch"], r["img_per_s"]))
    for label, pts in series.items():
        ax.plot(*zip(*pts, strict=True), marker="o", label=label)
    ax.set(title=f"u2netp img/s by batch ({model.get('device', '-')})", xscale="log", xlabel="batch", ylabel="img/s")
    if series:
        ax.legend(fontsize=8)
    ax = axes[0][1]
    e2e = report["parts"].get("e2e") or {}
    rows = e2e.get("rows") or []
    if rows:
        b = [r["batch"] for r in rows]
        ax.plot(b, [r["img_per_s"] for r in rows], marker="o", color="C0", label="img/s")
        ax2 = ax.twinx()
        ax2.plot(b, [r["p99_ms"] for r in rows], marker="s", color="C3", label="p99 ms")
        ax2.plot(b, [r["p50_ms"] for r in rows], marker="^", color="C1", label="p50 ms")
        ax2.set_ylabel("latency ms")
        ax2.legend(fontsize=8, loc="upper right")
    ax.set(title=f"lightbox process, 3 presets ({e2e.get('device', '-')})", xscale="log", xlabel="batch",
           ylabel="img/s")
    ax = axes[1][0]
    codec = report["parts"].get("codec") or {}
    dec: dict[str, list[tuple[int, float]]] = {}
    for r in codec.get("decode") or []:
        if "img_per_s" in r:
            dec.setdefault(f"hw load {r.get('hw_decoder_load', '?')}", []).append((r["batch"], r["img_per_s"]))
    for label, pts in dec.items():
        ax.plot(*zip(*pts, strict=True), marker="o", label=label)
    ax.set(title=f"DALI decode img/s ({codec.get('status', 'missing')})", xscale="log", xlabel="batch")
    if dec:
        ax.legend(fontsize=8)
    ax = axes[1][1]
    steps = report["steps"]
    ax.barh([s["step"] for s in steps], [s.get("seconds", 0) for s in steps],
            color=["C2" if s.get("rc") == 0 else "C3" for s in steps])
    ax.set(title="step seconds (red: non-zero exit or skipped)", xlabel="s")
    lines = [f"{k}: {v.get('status')}" + (f" ({v.get('reason') or v.get('skipped')})"
                                          if v.get("reason") or v.get("skipped") else "")
             for k, v in report["summary"].items()]
    fig.suptitle("lightbox GPU suite — " + "; ".join(ln[:70] for ln in lines[:3]), fontsize=9)
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=90)
    plt.close(fig)


def _draw_text(report: dict[str, Any], png: Path) -> None:
    import cv2
    import numpy as np

    lines = ["lightbox GPU suite (matplotlib missing: text only)"]
    lines += [f"{k}: {json.dumps(v)[:110]}" for k, v in report["summary"].items()]
    lines += [f"goal {k}: {json.dumps(v)[:100]}" for k, v in report["goals"].items()]
    img = np.full((30 + 26 * len(lines), 1100, 3), 255, np.uint8)
    for i, ln in enumerate(lines):
        cv2.putText(img, ln, (10, 28 + 26 * i), cv2.FONT_HERSHEY_SIMPLEX, 0.5, (0, 0, 0), 1, cv2.LINE_AA)
    png.parent.mkdir(parents=True, exist_ok=True)
    cv2.imwrite(str(png), img)


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(__doc__)
        return 2
    parts, out_json, out_png = Path(argv[0]), Path(argv[1]), Path(argv[2])
    report = merge(parts)
    out_json.parent.mkdir(parents=True, exist_ok=True)
    out_json.write_text(json.dumps(report, indent=1) + "\n")
    draw(report, out_png)
    for name, line in report["summary"].items():
        print(f"{name:8s} {json.dumps(line)[:200]}")
    print(f"goals    {json.dumps(report['goals'])}")
    print(f"wrote {out_json} and {out_png}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
