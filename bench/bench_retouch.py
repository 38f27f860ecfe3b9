"""CPU cost of the retouch passes: each stage of the unfused chain and the fused pass; with
``--stages``, the correct and render stages on a photo set against another tree.

    PYTHONPATH=. .venv/bin/python bench/bench_retouch.py [--width 2000 --height 1500]
        [--repeat 3] [--out bench_retouch.json]
    PYTHONPATH=. .venv/bin/python bench/bench_retouch.py --stages [--baseline main] [--rounds 3] [--n 20]

Prints JSON: megapixels per second per stage (unfused chain, one full-image pass per stage
with float32 intermediates) and for the fused pass, plus ``fused_vs_unfused`` = unfused chain
time / fused time. Pass (a) MP/s are of the input image; pass (b) per preset, of the canvas
(``out_mps``) and of the source (``in_mps``). Best of ``--repeat`` runs; a short run by design
(the benchmark is not a test and asserts nothing).

``--stages``: the photos of ``bench.harness.photo_set`` are decoded and segmented once (u2netp,
this tree) and saved; then the correct and render stages (``CorrectStage``, ``RenderStage`` with a
default ``CpuRetoucher``, white background, lighting on, presets taobao_main, xiaohongshu_cover,
thumb_webp, batches of 4) run over them in this tree and in the tree of ``--baseline REF`` (a
subprocess with ``PYTHONPATH`` at that tree; ``''`` for none), alternating, ``--rounds`` times.
Reported: the CPU time of the thread that ran each stage, per image, median over rounds; thread
CPU time is what the stage itself costs, whatever else the (shared) machine runs.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # the stages as a worker runs them (before NumPy)
if "--stage-child" not in sys.argv:  # a --stages child runs the tree its PYTHONPATH names
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import cv2
import numpy as np
import skimage.data

PRESETS = ("taobao_main", "amazon_main", "transparent_png")


def scene(width: int, height: int) -> tuple[np.ndarray, np.ndarray]:
    """skimage's chelsea scaled to ``width x height`` and a feathered elliptical mask."""
    image = cv2.resize(np.asarray(skimage.data.chelsea()), (width, height),
                       interpolation=cv2.INTER_CUBIC)
    mask = np.zeros((height, width), np.uint8)
    cv2.ellipse(mask, (width // 2, height // 2), (width * 3 // 8, height * 3 // 8), 0, 0, 360,
                255, -1)
    return image, cv2.GaussianBlur(mask, (0, 0), max(1.0, width / 400))


def best_of(repeat: int, fn: Callable[[], Any]) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def staged(repeat: int, fn: Callable[[Callable[[str], None]], Any]) -> dict[str, float]:
    """Best-of-``repeat`` seconds per stage; ``fn(mark)`` calls ``mark(name)`` after each."""
    best: dict[str, float] = {}
    last = [0.0]

    def mark(name: str) -> None:
        now = time.perf_counter()
        best[name] = min(best.get(name, float("inf")), now - last[0])
        last[0] = now

    for _ in range(repeat):
        last[0] = time.perf_counter()
        fn(mark)
    return best


def bench_correct(image: np.ndarray, mask: np.ndarray, repeat: int) -> dict[str, Any]:
    from gpu_kernels.backends import RetouchOptions
    from gpu_kernels.retouch import CpuRetoucher
    from gpu_kernels.retouch.correction import correct_fused_cpu, correct_reference, plan_correction
    from gpu_kernels.retouch.illumination import gaussian_matrix

    r = CpuRetoucher()
    mp = image.shape[0] * image.shape[1] / 1e6
    options = RetouchOptions("white", "auto")
    plan = plan_correction(np, image, mask, "auto", r.config, gaussian_matrix)
    plan_s = best_of(repeat, lambda: plan_correction(np, image, mask, "auto", r.config,
                                                     gaussian_matrix))
    stages = staged(repeat, lambda mark: correct_reference(np, image, mask, plan, "white", mark))
    unfused = sum(stages.values())
    fused = best_of(repeat, lambda: correct_fused_cpu(image, mask, plan, "white"))
    end_to_end = best_of(repeat, lambda: r.correct([image], [mask], options))
    return {
        "megapixels": round(mp, 3),
        "plan_ms": round(plan_s * 1e3, 2),
        "unfused_stage_mps": {k: round(mp / v, 1) for k, v in stages.items()},
        "unfused_mps": round(mp / unfused, 1),
        "fused_mps": round(mp / fused, 1),
        "fused_vs_unfused": round(unfused / fused, 2),
        "end_to_end_mps": round(mp / end_to_end, 1),
    }


def bench_render(image: np.ndarray, mask: np.ndarray, repeat: int) -> dict[str, Any]:
    from gpu_kernels.presets import load_presets
    from gpu_kernels.retouch import CpuRetoucher
    from gpu_kernels.retouch.render import render_fused_cpu, render_reference

    r = CpuRetoucher()
    coeffs = r.config.geometry.cubic_coefficients()
    book = load_presets()
    in_mp = image.shape[0] * image.shape[1] / 1e6
    out: dict[str, Any] = {}
    for name in PRESETS:
        preset = book[name]
        params = r.placement(image, mask, preset)
        transparent = preset.background == "transparent"
        out_mp = preset.width * preset.height / 1e6

        def unfused(mark: Callable[[str], None], p: Any = preset, q: Any = params,
                    t: bool = transparent) -> Any:
            return render_reference(np, image, q, p.width, p.height, t, p.sharpen, coeffs, mark)

        stages = staged(repeat, unfused)
        chain = sum(stages.values())
        fused = best_of(repeat, lambda p=preset, q=params, t=transparent: render_fused_cpu(
            image, q, p.width, p.height, t, p.sharpen, coeffs))
        out[name] = {
            "canvas": f"{preset.width}x{preset.height}",
            "scale": round(1.0 / float(params[0]), 4),
            "unfused_stage_ms": {k: round(v * 1e3, 2) for k, v in stages.items()},
            "unfused_out_mps": round(out_mp / chain, 2),
            "fused_out_mps": round(out_mp / fused, 2),
            "fused_in_mps": round(in_mp / fused, 2),
            "fused_vs_unfused": round(chain / fused, 2),
        }
    return out


# ---------------------------------------------------------------------------------- --stages
STAGE_PRESETS = ("taobao_main", "xiaohongshu_cover", "thumb_webp")


def save_inputs(path: Path, n: int) -> None:
    """Decode and segment the photo set once; images and masks to ``path`` (npz)."""
    from agents.wiring import build_processor
    from bench.harness import photo_set
    from gpu_kernels.backends import RetouchOptions
    from gpu_kernels.pipeline import Job
    from gpu_kernels.presets import load_presets
    from gpu_kernels.spans import SpanRecorder
    from gpu_kernels.stages.base import run_lane
    from streams.settings import Settings

    files = photo_set(path.parent / "photos", n)
    proc = build_processor(Settings(segmenter="model", device="cpu", segment_runtime="auto"))
    book = load_presets(None)
    presets = [book[p] for p in STAGE_PRESETS]
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


def stage_child(inputs: Path, repeats: int) -> dict[str, float]:
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
    presets = [book[p] for p in STAGE_PRESETS]
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


def stage_tree(tree: Path, inputs: Path, repeats: int) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--stage-child", str(inputs),
                          "--repeat", str(repeats)], cwd=tree, env=env, capture_output=True, text=True, check=True)
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def stages(args: argparse.Namespace) -> int:
    from bench.harness import baseline_tree, record

    here = Path(__file__).resolve().parents[1]
    inputs = Path(tempfile.mkdtemp(prefix="lightbox-stage-cpu-")) / "inputs.npz"
    save_inputs(inputs, args.n)
    base = baseline_tree(args.baseline)
    trees = {"after": here} if base is None else {"before": base, "after": here}
    rows: dict[str, list[dict[str, float]]] = {k: [] for k in trees}
    for r in range(args.rounds):
        order = list(trees) if r % 2 == 0 else list(reversed(trees))  # alternate who goes first
        for name in order:
            rows[name].append(stage_tree(trees[name], inputs, args.repeat))
            print(f"round {r + 1} {name:6s} " + "  ".join(f"{k} {v:6.1f}" for k, v in rows[name][-1].items()),
                  flush=True)
    print("thread CPU ms per image, median over rounds:")
    medians = {name: {k: statistics.median(v[k] for v in vals) for k in vals[0]} for name, vals in rows.items()}
    for name, med in medians.items():
        print(f"  {name:6s} ({trees[name]}): " + "  ".join(f"{k} {v:6.1f}" for k, v in med.items()))
    record("bench_retouch_stages", {"baseline": args.baseline, "n": args.n, "rounds": args.rounds,
                                     "thread_cpu_ms_per_image": medians})
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=2000)
    parser.add_argument("--height", type=int, default=1500)
    parser.add_argument("--repeat", type=int, default=3, help="passes (the least is kept)")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--stages", action="store_true", help="the correct and render stages on a photo set")
    parser.add_argument("--baseline", default="main", metavar="REF",
                        help="--stages: git ref of the tree to compare with ('' for none; bench.harness)")
    parser.add_argument("--rounds", type=int, default=3, help="--stages: rounds, the trees alternating")
    parser.add_argument("--n", type=int, default=20, help="--stages: photos")
    parser.add_argument("--stage-child", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.stage_child is not None:
        print(json.dumps(stage_child(args.stage_child, args.repeat)))
        return 0
    if args.stages:
        return stages(args)
    image, mask = scene(args.width, args.height)
    report = {
        "device": "cpu",
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "numpy": np.__version__, "arch": platform.machine()},
        "image": f"chelsea {args.width}x{args.height}, feathered elliptical mask",
        "repeat": args.repeat,
        "correct": bench_correct(image, mask, args.repeat),
        "render": bench_render(image, mask, args.repeat),
    }
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
