"""Segment stage throughput on this CPU: images/s at batch 1, 4 and 8.

For each batch size B, ``segment_batch`` is called on B composites (600x800, real photo
content, ``gpu_kernels.segment.samples``) and timed end to end (pre-processing, inference,
resizing the mask back, post-processing):

- ``model b1``: u2netp, session buckets up to 1 (the CPU default: one inference per image);
- ``model bB``: u2netp with buckets up to B (one batched inference per call);
- ``model-only``: the bare ``session.run`` on a prepared (B, 3, 320, 320) input;
- ``classical``: the border-colour fallback.

Usage: ``PYTHONPATH=. python bench/bench_segment.py [--threads 2] [--repeats 2] [--json out.json]``
(about a minute on 2 cores; the model is fetched to the cache on first use; best of
``--repeats`` timed calls after one warm-up call).

``bench_segment.py runtimes``: u2netp under every CPU model runtime of the table side by side
(see :data:`RUNTIMES_DOC`).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpu_kernels.segment import ClassicalSegmenter, OnnxSegmenter, ensure_u2netp
from gpu_kernels.segment.samples import BACKGROUNDS, OBJECTS, SHAPES, make_composite

BATCHES = (1, 4, 8)


def images(n: int) -> list[np.ndarray]:
    out = []
    for k in range(n):
        obj, bg = OBJECTS[k % len(OBJECTS)], BACKGROUNDS[(k // len(OBJECTS)) % len(BACKGROUNDS)]
        out.append(make_composite(obj, SHAPES[k % len(SHAPES)], bg).image)
    return out


def best_rate(fn: Callable[[], object], n_images: int, repeats: int) -> tuple[float, float]:
    """(images/s, CPU seconds per image) of the best of ``repeats`` timed calls, after one
    untimed warm-up call. CPU time (all threads of this process) is what the work costs
    when the machine is shared; wall-clock images/s is what a worker would see alone."""
    fn()
    best, cpu = float("inf"), float("inf")
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        best = min(best, time.perf_counter() - t0)
        cpu = min(cpu, time.process_time() - c0)
    return n_images / best, cpu / n_images


def run(threads: int, repeats: int, batches: Sequence[int]) -> dict[str, object]:
    model = ensure_u2netp().batched
    imgs = images(max(batches))
    classical = ClassicalSegmenter()
    per_image = OnnxSegmenter(model, threads=threads)
    rows: list[dict[str, object]] = []
    for b in batches:
        batch = imgs[:b]
        batched = OnnxSegmenter(model, threads=threads, max_batch=b)
        x = np.zeros((b, 3, 320, 320), np.float32)
        sess = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"], sess_options=_opts(threads))
        name = sess.get_inputs()[0].name
        rates = {
            "model b1": best_rate(partial(per_image.segment_batch, batch), b, repeats),
            f"model b{b}": best_rate(partial(batched.segment_batch, batch), b, repeats),
            "model-only": best_rate(partial(sess.run, None, {name: x}), b, repeats),
            "classical": best_rate(partial(classical.segment_batch, batch), b, repeats),
        }
        for kind, (rate, cpu_s) in rates.items():
            rows.append(
                {
                    "batch": b,
                    "kind": kind,
                    "images_per_s": round(rate, 2),
                    "ms_per_image": round(1000.0 / rate, 1),
                    "cpu_ms_per_image": round(1000.0 * cpu_s, 1),
                }
            )
        batched.close()
    return {
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "onnxruntime": ort.__version__,
            "threads": threads,
        },
        "image": "600x800 RGB composites",
        "rows": rows,
    }


def _opts(threads: int) -> ort.SessionOptions:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    return opts


# --- runtimes ------------------------------------------------------------------------------------

RUNTIMES_DOC = """u2netp on this CPU, every model runtime side by side: speed at batch 1 and 4, and gate scores.

Runtimes: every CPU runtime of the table (``schemas/segment_runtimes.py``) this machine has:
ONNX Runtime fp32 (the baseline) and INT8, OpenVINO f32 / bf16 / checked bf16, PyTorch fp32 /
bf16 / fp16 where oneDNN has them; each timed on the same prepared ``(B, 3, 320, 320)`` batch (the model call
alone: pre/post-processing is the same code for all), in interleaved rounds: each round runs
every runtime once per batch size, in a rotated order, so a machine shared with other work
disturbs them alike. Reported: median wall ms per image and median CPU ms per image (this
process, all threads), and the ratio to ONNX Runtime fp32 of the same rounds.

Then each runtime's fidelity gate against ONNX Runtime fp32 masks (``runtime.run_gate`` on the
gate set: mean and worst IoU) and what ``auto`` picks (``make_model_segmenter``, verdicts from
``--cache-dir``); the goal: auto's pick at least as fast as ONNX Runtime fp32 at batch 1 and 4.

    PYTHONPATH=. python bench/bench_segment.py runtimes [--rounds 5] [--threads 2] [--out FILE.json]

Needs the ``[torch]`` extra for the torch rows (they are left out without it, and say so).
"""

RUNTIME_BATCHES = (1, 4)


def build(model: Path, threads: int, max_batch: int, compile_torch: bool, cache_dir: Path | None) -> dict[str, Any]:
    """Every CPU runtime of the table (schemas/segment_runtimes.py) this machine has, as the
    runtime choice builds it; with ``compile_torch`` also torch.compile'd torch fp32 / bf16."""
    from gpu_kernels.segment import machine
    from gpu_kernels.segment.fetch_model import model_cache_dir
    from gpu_kernels.segment.model import U2NETP
    from gpu_kernels.segment.runtime import BuildContext
    from gpu_kernels.segment.runtime import build as build_runtime
    from schemas.segment_runtimes import RUNTIMES

    ctx = BuildContext(model, U2NETP, "cpu", threads, max_batch, False, (cache_dir or model_cache_dir()) / "variants",
                       {})
    segs: dict[str, Any] = {row.name: build_runtime(row, ctx) for row in RUNTIMES if machine.available(row, "cpu")}
    for precision in ("fp32", "bf16") if compile_torch else ():
        if machine.torch_cpu_supports(precision):
            from gpu_kernels.segment.torch_runner import TorchSegmenter

            segs[f"torch-{precision}+compile"] = TorchSegmenter(model, precision=precision, threads=threads,
                                                               max_batch=max_batch, compile=True)
    return segs


def timed_rounds(segs: dict[str, Any], rounds: int) -> dict[tuple[str, int], list[tuple[float, float]]]:
    from gpu_kernels.segment.model import U2NETP, preprocess
    from gpu_kernels.segment.ops import CpuOps
    from gpu_kernels.segment.runtime import gate_images

    imgs = gate_images()
    xs = {b: preprocess(imgs[:b], U2NETP, b, CpuOps()) for b in RUNTIME_BATCHES}
    for seg in segs.values():  # warm-up: plans each shape (and compiles, where asked)
        for x in xs.values():
            seg._infer(x)
    times: dict[tuple[str, int], list[tuple[float, float]]] = {(n, b): [] for n in segs for b in RUNTIME_BATCHES}
    names = list(segs)
    for r in range(rounds):
        order = names[r % len(names):] + names[: r % len(names)]
        for b in RUNTIME_BATCHES:
            for name in order:
                w0, c0 = time.perf_counter(), time.process_time()
                segs[name]._infer(xs[b])
                times[(name, b)].append(((time.perf_counter() - w0) * 1000 / b, (time.process_time() - c0) * 1000 / b))
    return times


def runtimes_main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bench_segment.py runtimes", description=RUNTIMES_DOC,
                                 formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=None, help="model threads (default: the usable cores)")
    ap.add_argument("--gate-n", type=int, default=16, help="gate images per runtime (16: the whole gate set)")
    ap.add_argument("--compile", action="store_true", help="also time torch.compile'd torch (slow to compile)")
    ap.add_argument("--cache-dir", type=Path, default=None, help="gate verdicts for auto (default: the model cache)")
    ap.add_argument("--out", type=Path, default=Path("out/bench_runtimes.json"))
    args = ap.parse_args(argv)

    from gpu_kernels.segment import ensure_u2netp
    from gpu_kernels.segment.machine import torch_available, usable_cores
    from gpu_kernels.segment.runtime import gate_images, make_model_segmenter, run_gate

    threads = args.threads or usable_cores()
    model = ensure_u2netp().batched
    segs = build(model, threads, max(RUNTIME_BATCHES), args.compile, args.cache_dir)
    print(f"runtimes: {', '.join(segs)}; threads {threads}; {args.rounds} interleaved rounds", flush=True)
    times = timed_rounds(segs, args.rounds)
    rows = []
    for b in RUNTIME_BATCHES:
        base_w = float(np.median([w for w, _ in times[("fp32", b)]]))
        base_c = float(np.median([c for _, c in times[("fp32", b)]]))
        for name in segs:
            w = float(np.median([t[0] for t in times[(name, b)]]))
            c = float(np.median([t[1] for t in times[(name, b)]]))
            rows.append({"runtime": name, "batch": b, "wall_ms_per_img": round(w, 1), "cpu_ms_per_img": round(c, 1),
                         "speed_vs_ort_fp32_wall": round(base_w / w, 2), "speed_vs_ort_fp32_cpu": round(base_c / c, 2)})
    gates: dict[str, Any] = {}
    imgs = gate_images()[: args.gate_n]
    ref = segs["fp32"]
    for name, seg in segs.items():
        if name != "fp32":
            gates[name] = asdict(run_gate(name, seg, ref, imgs))
    for seg in segs.values():
        seg.close()
    t0 = time.perf_counter()
    auto_seg, choice = make_model_segmenter(model, runtime="auto", threads=threads, cache_dir=args.cache_dir)
    auto_seg.close()
    picked = {choice.runtime}
    goal = {}
    for b in RUNTIME_BATCHES:
        row = next((r for r in rows if r["batch"] == b and r["runtime"] in picked), None)
        goal[f"batch_{b}"] = {"auto": choice.runtime, "speed_vs_ort_fp32_cpu": row and row["speed_vs_ort_fp32_cpu"],
                              "speed_vs_ort_fp32_wall": row and row["speed_vs_ort_fp32_wall"],
                              "met": bool(row and row["speed_vs_ort_fp32_cpu"] >= 1.0)}
    result = {"machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                          "threads": threads, "load_avg": os.getloadavg()},
              "rounds": args.rounds, "torch_installed": torch_available(), "rows": rows, "gates": gates,
              "auto": {**choice.as_dict(), "seconds": round(time.perf_counter() - t0, 1)}, "goal": goal}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"{'runtime':22s} {'batch':>5s} {'wall ms/img':>11s} {'cpu ms/img':>10s} {'x ORT(cpu)':>10s} "
          f"{'gate mean/worst':>16s}")
    for r in rows:
        g = gates.get(r["runtime"])
        gate = f"{g['mean_iou']:.3f}/{g['worst_iou']:.3f}{'' if g['passed'] else ' FAIL'}" if g else "reference"
        print(f"{r['runtime']:22s} {r['batch']:5d} {r['wall_ms_per_img']:11.1f} {r['cpu_ms_per_img']:10.1f} "
              f"{r['speed_vs_ort_fp32_cpu']:10.2f} {gate:>16s}")
    print(f"auto picks {choice.runtime} ({choice.reason}); goal {json.dumps(goal)}")
    print(f"load average {os.getloadavg()}; wrote {args.out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["runtimes"]:
        return runtimes_main(argv[1:])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--batches", type=int, nargs="+", default=list(BATCHES))
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    result = run(args.threads, args.repeats, args.batches)
    print(f"{'batch':>5}  {'kind':<11} {'img/s':>7} {'ms/img':>7} {'cpu ms/img':>10}")
    for r in result["rows"]:  # type: ignore[attr-defined]
        print(
            f"{r['batch']:>5}  {r['kind']:<11} {r['images_per_s']:>7} {r['ms_per_image']:>7}"
            f" {r['cpu_ms_per_image']:>10}"
        )
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
