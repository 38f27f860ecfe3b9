"""ONNX Runtime on a CPU with and without memory patterns: what a new batch size costs.

    PYTHONPATH=. .venv/bin/python bench/bench_ort_patterns.py [--threads 2] [--sizes 3,5,6,7,12]
        [--closed-loop ROUNDS] [--out bench/results]

For each setting (``patterns``: ``enable_mem_pattern`` on, as lightbox's CPU session had it;
``no-patterns``: lightbox's :func:`~gpu_kernels.segment.onnx_runner.cpu_session_options`), in a
process of its own: an ONNX Runtime session on u2netp (the cached batched file, ``--threads``
intra-op threads) is warmed up at the buckets 1, 2, 4, 8 and 16, as ``OnnxSegmenter`` does, then
runs each of ``--sizes`` twice in a row (random inputs). Per run: milliseconds per image, the
process's system seconds and MB of minor page faults; per setting: the seconds for all runs and
the peak resident memory. With patterns, the second run of each size allocates a block of its own
and faults it in; without, the arena the warm-up grew serves every size. A benchmark, not a test:
it asserts nothing. Writes ``<out>/bench_ort_patterns.json``.

``--closed-loop ROUNDS``: also the Triton bench's closed-loop capacity (its lightbox side,
``bench_vs_triton.run_lightbox``: 64 requests at once, an ``OnnxSegmenter`` with buckets up to 16,
two output threads refining), twice per process, a process per setting and round, the settings'
order alternating: requests per second, the process's system seconds, its peak memory.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
WARM_UP = (1, 2, 4, 8, 16)
SETTINGS = ("patterns", "no-patterns")


def _with_setting(opts: Any, setting: str) -> Any:
    """``opts`` (lightbox's CPU session options) with memory patterns as ``setting`` says."""
    opts.enable_mem_pattern = setting == "patterns"
    return opts


def _peak_gb() -> float:
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2)


def child(setting: str, threads: int, sizes: list[int]) -> dict[str, Any]:
    """One setting's runs, in this process."""
    import numpy as np
    import onnxruntime as ort

    from gpu_kernels.segment.fetch_model import ensure_u2netp
    from gpu_kernels.segment.onnx_runner import cpu_session_options

    opts = _with_setting(cpu_session_options(threads), setting)
    session = ort.InferenceSession(str(ensure_u2netp().batched), opts, providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    for b in WARM_UP:
        session.run(None, {name: np.zeros((b, 3, 320, 320), np.float32)})
    rng = np.random.default_rng(0)
    page_mb = resource.getpagesize() / 2**20
    runs = []
    start = time.perf_counter()
    for size in [s for s in sizes for _ in range(2)]:
        x = rng.random((size, 3, 320, 320), dtype=np.float32)
        before, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        session.run(None, {name: x})
        seconds, after = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF)
        runs.append({"batch": size, "ms_per_image": round(seconds / size * 1000, 1),
                     "system_s": round(after.ru_stime - before.ru_stime, 2),
                     "faulted_mb": round((after.ru_minflt - before.ru_minflt) * page_mb)})
    return {"setting": setting, "runs": runs, "seconds": round(time.perf_counter() - start, 2),
            "images": 2 * sum(sizes), "peak_rss_gb": _peak_gb()}


def closed_loop(setting: str, threads: int) -> dict[str, Any]:
    """Two closed-loop capacity runs of the Triton bench's lightbox side, in this process."""
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np

    from bench.bench_vs_triton import OUTPUT_THREADS, photos, run_lightbox
    from gpu_kernels.segment import onnx_runner
    from gpu_kernels.segment.fetch_model import ensure_u2netp

    plain = onnx_runner.cpu_session_options  # the segmenter builds its session from it
    onnx_runner.cpu_session_options = lambda n=None: _with_setting(plain(n), setting)
    images = photos()
    runs = []
    with onnx_runner.OnnxSegmenter(ensure_u2netp().batched, max_batch=16, threads=threads, warmup=True) as seg, \
            ThreadPoolExecutor(OUTPUT_THREADS) as refiners:
        for _ in range(2):
            sys_s = resource.getrusage(resource.RUSAGE_SELF).ru_stime
            t0 = time.monotonic()
            done, sizes = run_lightbox(seg, images, np.zeros(64), 16, t0, refiners)
            runs.append({"req_s": round(64 / max(done), 2), "largest_batch": max(sizes),
                         "system_s": round(resource.getrusage(resource.RUSAGE_SELF).ru_stime - sys_s, 1)})
    return {"setting": setting, "runs": runs, "peak_rss_gb": _peak_gb()}


def _in_child(flag: str, setting: str, threads: int, *extra: str) -> dict[str, Any]:
    """This script run with ``flag setting`` in a process of its own: its JSON line."""
    cmd = [sys.executable, str(Path(__file__).resolve()), flag, setting, "--threads", str(threads), *extra]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=True)
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--sizes", default="3,5,6,7,12", help="batch sizes the warm-up did not run (each run twice)")
    ap.add_argument("--closed-loop", type=int, default=0, metavar="ROUNDS",
                    help="also the Triton bench's closed-loop capacity, ROUNDS processes per setting")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    ap.add_argument("--child", choices=SETTINGS, help=argparse.SUPPRESS)
    ap.add_argument("--loop-child", choices=SETTINGS, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    sizes = [int(v) for v in args.sizes.split(",")]
    if args.child:
        print(json.dumps(child(args.child, args.threads, sizes)))
        return
    if args.loop_child:
        print(json.dumps(closed_loop(args.loop_child, args.threads)))
        return
    results = []
    for setting in SETTINGS:
        result = _in_child("--child", setting, args.threads, "--sizes", args.sizes)
        results.append(result)
        runs = "  ".join(f"{r['batch']}: {r['ms_per_image']:.0f} ms/img {r['system_s']:.2f} s sys {r['faulted_mb']} MB"
                         for r in result["runs"])
        print(f"{setting:12s} {result['seconds']:6.1f} s for {result['images']} images, "
              f"peak {result['peak_rss_gb']} GB")
        print(f"             {runs}", flush=True)
    loops: list[dict[str, Any]] = []
    for k in range(args.closed_loop):
        for setting in SETTINGS if k % 2 == 0 else SETTINGS[::-1]:
            loops.append(_in_child("--loop-child", setting, args.threads))
            print(f"closed loop, round {k + 1}, {setting:12s} " + "  ".join(
                f"{r['req_s']:.2f} req/s (largest batch {r['largest_batch']}, {r['system_s']:.1f} s sys)"
                for r in loops[-1]["runs"]) + f", peak {loops[-1]['peak_rss_gb']} GB", flush=True)
    summary = {s: statistics.mean(r["req_s"] for loop in loops if loop["setting"] == s for r in loop["runs"])
               for s in SETTINGS} if loops else {}
    if summary:
        print("closed loop, mean req/s: " + ", ".join(f"{s} {v:.2f}" for s, v in summary.items()))
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "bench_ort_patterns.json"
    path.write_text(json.dumps({"threads": args.threads, "warm_up": WARM_UP, "results": results,
                                "closed_loop": loops, "closed_loop_mean_req_s": summary}, indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
