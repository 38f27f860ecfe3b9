"""The fixed cost per image of the CPU stages: process CPU ms per 64×64 image, stage by stage.

    PYTHONPATH=. .venv/bin/python bench/bench_floor.py [--baseline main] [--images 400]
        [--batch 8] [--rounds 3] [--out bench/results]

The setting is the overhead benchmark's (``bench/bench_overhead.py``) without Kafka: 64×64
JPEGs (its ``tiny_jpegs``), one 64×64 JPEG preset (``bench/presets_64.toml``), background kept,
lighting on, no segmentation, the CPU backends that ``build_processor`` wires for
``device=cpu``. Batches of ``--batch`` images run through every stage of the pipeline in lane
order (decode, segment, correct, render, encode, quality, compliance), each step timed by the
process's CPU time (the decoder's pool threads included; other processes excluded), after one
untimed warm-up pass. Reported per stage: CPU ms per image, the least over ``--repeats`` passes.

Side by side: this tree (``current``) and the tree of ``--baseline`` (a git ref, extracted with
``git archive``; ``''`` for none), each in its own subprocess, alternating which goes first over
``--rounds``; the summary gives the medians over rounds and the ratio baseline / current per
stage. The issue's goal for decode + correct + render + encode is 0.3 ms per image.

A benchmark, not a test: it asserts nothing. Writes ``<out>/bench_floor.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GOAL_MS = 0.3  # decode + correct + render + encode per 64x64 image
PAID = ("decode", "correct", "preset", "encode")  # the stages the goal counts (render spans: preset:<name>)


def child(images: int, batch: int, repeats: int) -> dict[str, float]:
    """CPU ms per image of each stage, for the tree on ``sys.path`` (least over ``repeats``)."""
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    from agents.wiring import build_processor
    from bench.bench_overhead import tiny_jpegs
    from gpu_kernels.backends import RetouchOptions
    from gpu_kernels.pipeline import Job
    from gpu_kernels.presets import load_presets
    from gpu_kernels.spans import SpanRecorder
    from gpu_kernels.stages.base import run_step
    from streams.settings import Settings

    presets_file = str(ROOT / "bench" / "presets_64.toml")
    blobs = tiny_jpegs(8)  # the overhead benchmark's eight images
    proc = build_processor(Settings(segmenter="none", device="cpu"), "cpu")
    preset = load_presets(presets_file)["tiny_64"]
    options = RetouchOptions(background="keep", lighting="auto")
    pipeline = proc.pipeline

    def one_pass(spent: dict[str, float]) -> None:
        for k in range(0, images, batch):
            jobs = [Job(blobs[(k + j) % len(blobs)], [preset], options, SpanRecorder())
                    for j in range(min(batch, images - k))]
            ctx = pipeline.start(jobs)
            for stage in pipeline.stages:  # the list is in lane order
                for step in stage.steps(ctx):
                    c0 = time.process_time()
                    run_step(ctx, step)
                    spent[stage.name] = spent.get(stage.name, 0.0) + time.process_time() - c0
            bad = [r.error for r in ctx.finalize() if not r.ok]
            if bad:
                raise SystemExit(f"an item failed: {bad[0]}")

    one_pass({})  # warm-up: imports, tables, caches
    best: dict[str, float] = {}
    for _ in range(repeats):
        spent: dict[str, float] = {}
        one_pass(spent)
        for name, s in spent.items():
            best[name] = min(best.get(name, float("inf")), s / images * 1000)
    proc.close()
    return best


def run_tree(tree: Path, args: argparse.Namespace) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", "--images", str(args.images),
           "--batch", str(args.batch), "--repeats", str(args.repeats)]
    out = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, check=True)
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline", default="main", help="git ref of the baseline tree ('' for none)")
    ap.add_argument("--images", type=int, default=400)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=2, help="timed passes per round (the least is kept)")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.images, args.batch, args.repeats)))
        return 0
    from bench.bench_overhead import extract, git

    trees = {"current": ROOT}
    with tempfile.TemporaryDirectory(prefix="lightbox-floor-") as tmp:
        if args.baseline:
            trees["baseline"] = extract(args.baseline, Path(tmp))
        rows: dict[str, list[dict[str, float]]] = {k: [] for k in trees}
        for r in range(args.rounds):
            order = list(trees) if r % 2 == 0 else list(reversed(trees))  # alternate who goes first
            for name in order:
                rows[name].append(run_tree(trees[name], args))
                got = rows[name][-1]
                print(f"round {r + 1} {name:8s} " + "  ".join(f"{k} {v:.3f}" for k, v in got.items())
                      + f"  | paid {sum(got.get(k, 0.0) for k in PAID):.3f} ms/image", flush=True)
    summary: dict[str, dict[str, float]] = {}
    for name, vals in rows.items():
        stages = {k: statistics.median(v[k] for v in vals) for k in vals[0]}
        stages["paid"] = statistics.median(sum(v.get(k, 0.0) for k in PAID) for v in vals)
        stages["total"] = statistics.median(sum(v.values()) for v in vals)
        summary[name] = stages
    print("CPU ms per 64x64 image, median over rounds (paid = decode + correct + render + encode; "
          f"goal {GOAL_MS} ms):")
    for name, stages in summary.items():
        print(f"  {name:8s} " + "  ".join(f"{k} {v:.3f}" for k, v in stages.items()))
    ratios = {}
    if "baseline" in summary:
        base = summary["baseline"]
        ratios = {k: base[k] / v for k, v in summary["current"].items() if v > 0 and k in base}
        print("  baseline / current: " + "  ".join(f"{k} {v:.2f}x" for k, v in ratios.items()))
    args.out.mkdir(parents=True, exist_ok=True)
    report = {"commit": git("rev-parse", "--short", "HEAD"), "baseline": args.baseline,
              "baseline_commit": git("rev-parse", "--short", args.baseline) if args.baseline else None,
              "images": args.images, "batch": args.batch, "rounds": rows, "median": summary,
              "baseline_over_current": ratios, "goal_ms": GOAL_MS,
              "goal_met": summary["current"]["paid"] <= GOAL_MS, "cpus": os.cpu_count()}
    (args.out / "bench_floor.json").write_text(json.dumps(report, indent=1))
    print(f"wrote {args.out / 'bench_floor.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
