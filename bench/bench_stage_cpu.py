"""The correct and render stages before/after, in thread CPU time, on the end-to-end photo set.

The 20 photos of ``bench_e2e.photo_set`` are decoded and segmented once (u2netp, this tree) and
saved; then the correct and render stages (``CorrectStage``, ``RenderStage`` with a default
``CpuRetoucher``, white background, lighting on, presets taobao_main, xiaohongshu_cover,
thumb_webp, batches of 4) run over them in this tree and, with ``--before TREE``, in another
checkout (a subprocess with ``PYTHONPATH=TREE``), alternating, ``--rounds`` times. Reported: the
CPU time of the thread that ran each stage, per image, median over rounds; thread CPU time is
what the stage itself costs, whatever else the (shared) machine runs.

Usage: ``git worktree add --detach /tmp/base <commit>;
PYTHONPATH=. python bench/bench_stage_cpu.py --before /tmp/base [--rounds 3]``
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

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np

PRESETS = ("taobao_main", "xiaohongshu_cover", "thumb_webp")


def save_inputs(path: Path, n: int) -> None:
    """Decode and segment the photo set once; images and masks to ``path`` (npz)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from agents.wiring import build_processor
    from bench.bench_e2e import photo_set
    from gpu_kernels.backends import RetouchOptions
    from gpu_kernels.pipeline import Job
    from gpu_kernels.presets import load_presets
    from gpu_kernels.spans import SpanRecorder
    from gpu_kernels.stages.base import run_lane
    from streams.settings import Settings

    files = photo_set(path.parent / "photos", n)
    proc = build_processor(Settings(segmenter="model", device="cpu", segment_runtime="auto"))
    book = load_presets(None)
    presets = [book[p] for p in PRESETS]
    segment, refine = (next(s for s in proc.pipeline.stages if s.name == n) for n in ("segment", "refine"))
    arrays: dict[str, np.ndarray] = {}
    for k in range(0, len(files), 4):
        ctx = proc.pipeline.start([Job(f.read_bytes(), presets, RetouchOptions(), SpanRecorder())
                                   for f in files[k:k + 4]])
        proc.pipeline.run_lane(ctx, "decode")
        run_lane(ctx, [segment], "device")
        run_lane(ctx, [refine], refine.lane)
        for i in range(len(ctx.jobs)):
            arrays[f"img{k + i}"] = np.asarray(ctx.images[i])
            arrays[f"mask{k + i}"] = np.asarray(ctx.masks[i])
    proc.close()
    np.savez(path, **arrays)  # type: ignore[arg-type]


def child(inputs: Path, repeats: int) -> dict[str, float]:
    """Thread CPU ms per image of each stage in the tree on ``sys.path`` (min over ``repeats``)."""
    from gpu_kernels.backends import RetouchOptions
    from gpu_kernels.pipeline import BatchContext, Job, JobResult
    from gpu_kernels.presets import load_presets
    from gpu_kernels.retouch import CpuRetoucher
    from gpu_kernels.spans import SpanRecorder
    from gpu_kernels.stages.base import run_lane
    from gpu_kernels.stages.correct import CorrectStage
    from gpu_kernels.stages.render import RenderStage

    data = np.load(inputs)
    n = sum(1 for k in data.files if k.startswith("img"))
    book = load_presets(None)
    presets = [book[p] for p in PRESETS]
    retoucher = CpuRetoucher()
    stages = {"correct": CorrectStage(retoucher), "render": RenderStage(retoucher)}
    ctxs = []
    for k in range(0, n, 4):
        idx = list(range(k, min(n, k + 4)))
        jobs = [Job(b"", presets, RetouchOptions(), SpanRecorder()) for _ in idx]
        ctx = BatchContext(jobs, [JobResult() for _ in jobs], time.monotonic_ns)
        for j, i in enumerate(idx):
            ctx.images[j], ctx.masks[j] = data[f"img{i}"], data[f"mask{i}"]
        ctxs.append(ctx)
    best = {name: float("inf") for name in stages}
    for _ in range(repeats):
        spent = dict.fromkeys(stages, 0.0)
        for ctx in ctxs:
            ctx.corrected.clear()
            ctx.rendered.clear()
            ctx.memo.clear()
            for name, stage in stages.items():
                c0 = time.thread_time()
                run_lane(ctx, [stage], stage.lane)
                spent[name] += time.thread_time() - c0
            if not all(r.ok for r in ctx.results):
                raise SystemExit(f"a stage failed: {[r.error for r in ctx.results if not r.ok]}")
        best = {name: min(best[name], spent[name] / n * 1000) for name in stages}
    return best


def run_tree(tree: Path, inputs: Path, repeats: int) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child", str(inputs),
                          "--repeats", str(repeats)], cwd=tree, env=env, capture_output=True, text=True, check=True)
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", type=Path, default=None, help="another checkout to compare with")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=2, help="passes per round (the least is kept)")
    ap.add_argument("--n", type=int, default=20)
    ap.add_argument("--child", type=Path, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child is not None:
        print(json.dumps(child(args.child, args.repeats)))
        return 0
    here = Path(__file__).resolve().parents[1]
    inputs = Path(tempfile.mkdtemp(prefix="lightbox-stage-cpu-")) / "inputs.npz"
    save_inputs(inputs, args.n)
    trees = {"after": here} if args.before is None else {"before": args.before.resolve(), "after": here}
    rows: dict[str, list[dict[str, float]]] = {k: [] for k in trees}
    for r in range(args.rounds):
        order = list(trees) if r % 2 == 0 else list(reversed(trees))  # alternate who goes first
        for name in order:
            rows[name].append(run_tree(trees[name], inputs, args.repeats))
            print(f"round {r + 1} {name:6s} " + "  ".join(f"{k} {v:6.1f}" for k, v in rows[name][-1].items()),
                  flush=True)
    print("thread CPU ms per image, median over rounds:")
    for name, vals in rows.items():
        print(f"  {name:6s} ({trees[name]}): " + "  ".join(
            f"{k} {statistics.median(v[k] for v in vals):6.1f}" for k in vals[0]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
