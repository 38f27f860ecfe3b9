"""The GPU validation run's one JSON, one PNG and one archive, from the rows as they landed.

    python3 bench/gpu_suite_report.py WORK OUT

Reads ``OUT/gpu_suite.rows.jsonl`` (one line per figure, ``bench/gpu_rows.py``) and
``WORK/steps.jsonl`` (each step's exit code and seconds), writes ``OUT/gpu_suite.json``
(machine, steps, every row grouped by step, a summary line per step and the GPU goals judged
where the figures exist) and ``OUT/gpu_suite.png`` (end-to-end img/s and p99 by batch, model
img/s by batch, decode img/s by batch, step seconds; matplotlib when installed, else the summary
as text with OpenCV), then ``OUT/gpu_suite.tar.gz`` with both, the rows and every step's log.
The rows file goes into the archive: OUT keeps the three files.
"""

from __future__ import annotations

import json
import re
import sys
import tarfile
from pathlib import Path
from typing import Any

NOT_FIGURES = ("preflight", "setup", "skipped", "error")
STEPS = ("preflight", "e2e", "model", "decode", "retouch", "parity")


def _jsonl(path: Path) -> list[dict[str, Any]]:
    out = []
    if path.is_file():
        for line in path.read_text(errors="replace").splitlines():
            try:
                row = json.loads(line)
            except ValueError:
                continue  # a line cut by a kill: the rows before it stand
            if isinstance(row, dict):
                out.append(row)
    return out


def parity_summary(log: Path) -> dict[str, Any]:
    text = log.read_text(errors="replace") if log.is_file() else ""
    counts = {k: int(v) for v, k in re.findall(r"(\d+) (passed|failed|skipped|error|errors)", text)}
    status = "failed" if counts.get("failed") or counts.get("error") or counts.get("errors") else (
        "skipped" if counts.get("skipped") and not counts.get("passed") else "ok" if counts else "missing")
    reasons = sorted(set(re.findall(r"SKIPPED \[\d+\] [^:]+:\d+: (.*)", text)))
    return {"status": status, "counts": counts, "skip_reasons": reasons[:5]}


def build(work: Path, rows_file: Path) -> dict[str, Any]:
    steps = _jsonl(work / "steps.jsonl")
    rows = _jsonl(rows_file)
    by_step: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by_step.setdefault(str(r.get("step", "?")), []).append(r)
    pre = next((r for r in by_step.get("preflight", []) if r.get("kind") == "preflight"), {})
    summary: dict[str, Any] = {}
    ran = {s["step"]: s for s in steps}
    for name in STEPS:
        s = ran.get(name)
        line: dict[str, Any] = {"status": "not run"}
        if s is not None:
            line = {"status": "skipped" if s.get("skipped") else "ok" if s["rc"] == 0 else
                    f"cut at {s.get('limit_s')} s" if s["rc"] in (124, 137) else f"exit {s['rc']}",
                    "seconds": s.get("seconds", 0),
                    "rows": sum(r.get("kind") not in NOT_FIGURES for r in by_step.get(name, []))}
            if s.get("skipped"):
                line["reason"] = s["skipped"]
        skips = [r["skipped"] for r in by_step.get(name, []) if r.get("kind") == "skipped" and "skipped" in r]
        errors = [str(r.get("error", ""))[-300:] for r in by_step.get(name, []) if r.get("kind") == "error"]
        if skips:
            line["skipped"] = skips[0]
        if errors:
            line["errors"] = errors[:3]
        summary[name] = line
    summary["parity"] |= {"tests": parity_summary(work / "parity.log")}
    if pre.get("mode") == "cpu":  # say so in every line: no figure of a CPU run is a GPU figure
        summary = {k: v | {"mode": "cpu (no CUDA device: dry runs)"} for k, v in summary.items()}
    return {"machine": pre, "mode": pre.get("mode", "unknown"), "steps": steps, "summary": summary,
            "goals": goals(pre, by_step), "rows": by_step}


def goals(pre: dict[str, Any], by_step: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    if pre.get("mode") != "gpu":
        return {"note": "no GPU in this run: the GPU goals are not judged"}
    out: dict[str, Any] = {}
    e2e = [r for r in by_step.get("e2e", []) if r.get("kind") == "row" and "img_per_s" in r]
    if e2e:
        best = max(e2e, key=lambda r: r["img_per_s"])
        out["e2e_3000_img_per_s"] = {"best": best["img_per_s"], "batch": best["batch"],
                                     "met": best["img_per_s"] >= 3000}
        out["e2e_p99_100_ms"] = {"p99_ms_at_best": best["p99_ms"], "met": best["p99_ms"] <= 100,
                                 "note": "closed loop at full load; the goal is at 70 % load"}
    return out or {"note": "no end-to-end rows landed"}


def _series(rows: list[dict[str, Any]], key: Any) -> dict[str, list[tuple[int, float]]]:
    series: dict[str, list[tuple[int, float]]] = {}
    for r in rows:
        if r.get("kind") in ("row", "decode") and "img_per_s" in r and "batch" in r:
            series.setdefault(key(r), []).append((int(r["batch"]), float(r["img_per_s"])))
    return series


def draw(report: dict[str, Any], png: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        _draw_text(report, png)
        return
    rows = report["rows"]
    fig, axes = plt.subplots(2, 2, figsize=(13, 9))
    ax = axes[0][0]
    e2e = sorted((r for r in rows.get("e2e", []) if r.get("kind") == "row" and "img_per_s" in r),
                 key=lambda r: r["batch"])
    if e2e:
        b = [r["batch"] for r in e2e]
        ax.plot(b, [r["img_per_s"] for r in e2e], marker="o", color="C0", label="img/s")
        ax2 = ax.twinx()
        ax2.plot(b, [r["p99_ms"] for r in e2e], marker="s", color="C3", label="p99 ms")
        ax2.plot(b, [r["p50_ms"] for r in e2e], marker="^", color="C1", label="p50 ms")
        ax2.set_ylabel("latency ms")
        ax2.legend(fontsize=8, loc="upper right")
    ax.set(title=f"lightbox process, 3 presets ({report['mode']})", xscale="log", xlabel="batch", ylabel="img/s")
    for ax, step, key, title in (
            (axes[0][1], "model", lambda r: f"{r.get('precision')} {r.get('mode')}", "u2netp img/s by batch"),
            (axes[1][0], "decode", lambda r: f"hw load {r.get('hw_decoder_load', '?')}", "decode img/s by batch")):
        for label, pts in _series(rows.get(step, []), key).items():
            ax.plot(*zip(*sorted(pts), strict=True), marker="o", label=label)
            ax.legend(fontsize=7)
        ax.set(title=f"{title} ({report['mode']})", xscale="log", xlabel="batch", ylabel="img/s")
    ax = axes[1][1]
    steps = report["steps"]
    ax.barh([s["step"] for s in steps], [s.get("seconds", 0) for s in steps],
            color=["C2" if s.get("rc") == 0 else "C3" for s in steps])
    ax.set(title="step seconds (red: non-zero exit, cut or skipped)", xlabel="s")
    machine = report["machine"]
    fig.suptitle(f"lightbox GPU validation run: {machine.get('gpu', 'no GPU')} ({report['mode']} mode)", fontsize=10)
    fig.tight_layout()
    fig.savefig(png, dpi=90)
    plt.close(fig)


def _draw_text(report: dict[str, Any], png: Path) -> None:
    import cv2
    import numpy as np

    lines = [f"lightbox GPU validation run ({report['mode']} mode; matplotlib missing: text only)"]
    lines += [f"{k}: {json.dumps(v)[:110]}" for k, v in report["summary"].items()]
    lines += [f"goal {k}: {json.dumps(v)[:100]}" for k, v in report["goals"].items()]
    img = np.full((30 + 26 * len(lines), 1100, 3), 255, np.uint8)
    for i, ln in enumerate(lines):
        cv2.putText(img, ln, (10, 28 + 26 * i), cv2.FONT_HERSHEY_SIMPLEX, 0.5, (0, 0, 0), 1, cv2.LINE_AA)
    cv2.imwrite(str(png), img)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__)
        return 2
    work, out = Path(argv[0]), Path(argv[1])
    rows_file = out / "gpu_suite.rows.jsonl"
    report = build(work, rows_file)
    out_json, out_png = out / "gpu_suite.json", out / "gpu_suite.png"
    out_json.write_text(json.dumps(report, indent=1, default=str) + "\n")
    draw(report, out_png)
    with tarfile.open(out / "gpu_suite.tar.gz", "w:gz") as tar:
        for path in (out_json, out_png, rows_file, *sorted(work.glob("*.log")), *sorted(work.glob("*.json")),
                     work / "steps.jsonl"):
            if path.is_file():
                tar.add(path, arcname=f"gpu_suite/{path.name}")
    rows_file.unlink(missing_ok=True)
    for name, line in report["summary"].items():
        print(f"{name:9s} {json.dumps(line)[:180]}")
    print(f"goals     {json.dumps(report['goals'])[:200]}")
    print(f"wrote {out_json}, {out_png}, {out / 'gpu_suite.tar.gz'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
