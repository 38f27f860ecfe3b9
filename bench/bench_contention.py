"""How much one CPU worker's lanes slow each other down: the device lane alone, next to a second
thread running the same pipeline, and next to a second *process* running it.

Why: in ``bench_backfill.py`` the device thread took 25-30 ms per image inside a worker with a
core idle, against about 12 ms on its own. This bench separates the two usual suspects. A second
thread shares the interpreter lock (GIL) with the measured one; a second process shares only the
cores. If the thread slows the device lane down much more than the process does, the lanes of
one worker process are bound by the GIL, not by the cores, and more threads in one worker cannot
take the spare CPU. A fourth mode, ``idle``, runs one tenant process per core in the kernel's idle
scheduling class (Linux ``SCHED_IDLE``, as ``LIGHTBOX_BACKFILL_PROCESS`` runs the backfill): every
core is busy, and the measured thread must take one back from a tenant.

Setup: the classical segmenter and the CPU retoucher and encoder (as ``bench_backfill.py``),
24 sample images at ``--side`` pixels, preset thumb_webp. Measured: wall ms per image of the
device lane (segment + correct) and the output lane (render + encode + quality) in the main
thread, batches of 1 and 4, median over ``--rounds`` passes. The three modes alternate within
each round, so the machine's drift hits all alike; the report gives each mode's ratio to alone.

Usage: ``PYTHONPATH=. python bench/bench_contention.py [--rounds 5] [--out out/bench_contention]``
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # as the lightbox command sets it

sys.path.insert(0, str(Path(__file__).resolve().parent))

MODES = ("alone", "thread", "process", "idle")


def pipeline() -> Any:
    from gpu_kernels.codec import make_decoder
    from gpu_kernels.codec.encode import CpuEncoder
    from gpu_kernels.pipeline import RetouchPipeline
    from gpu_kernels.retouch import CpuRetoucher
    from gpu_kernels.segment import make_segmenter

    return RetouchPipeline(make_decoder("cpu"), CpuRetoucher(), CpuEncoder(), None, make_segmenter("classical"))


def jobs(files: list[Path]) -> list[Any]:
    from gpu_kernels.backends import RetouchOptions
    from gpu_kernels.pipeline import Job
    from gpu_kernels.presets import load_presets
    from gpu_kernels.spans import SpanRecorder

    presets = [load_presets()["thumb_webp"]]
    return [Job(f.read_bytes(), presets, RetouchOptions(), SpanRecorder()) for f in files]


def lanes_ms(pipe: Any, files: list[Path], batch: int) -> tuple[float, float]:
    """Wall ms per image of the device and the output lane over ``files`` in batches of ``batch``."""
    dev = out = 0.0
    for k in range(0, len(files), batch):
        ctx = pipe.start(jobs(files[k:k + batch]))
        pipe.run_lane(ctx, "decode")
        t0 = time.perf_counter()
        pipe.run_lane(ctx, "device")
        t1 = time.perf_counter()
        pipe.run_lane(ctx, "output")
        dev, out = dev + t1 - t0, out + time.perf_counter() - t1
        if not all(r.ok for r in ctx.finalize()):
            raise RuntimeError("an image failed in the pipeline")
    return dev / len(files) * 1000, out / len(files) * 1000


def churn(files: list[Path], stop: Any, idle: bool = False) -> None:
    """The competing tenant: the whole pipeline over ``files``, batches of 4, until ``stop`` is set
    (``idle``: in the kernel's idle scheduling class, as a backfill process runs)."""
    if idle:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    pipe = pipeline()
    while not stop.is_set():
        lanes_ms(pipe, files, 4)


def measure(mode: str, pipe: Any, files: list[Path], batch: int) -> tuple[float, float]:
    if mode == "alone":
        return lanes_ms(pipe, files, batch)
    stop: Any = threading.Event() if mode == "thread" else mp.get_context("spawn").Event()
    if mode == "thread":
        tenants: list[Any] = [threading.Thread(target=churn, args=(files, stop), daemon=True)]
    else:  # idle: one per core, so that the measured thread must take a core from one of them
        tenants = [mp.get_context("spawn").Process(target=churn, args=(files, stop, mode == "idle"), daemon=True)
                   for _ in range(1 if mode == "process" else os.cpu_count() or 1)]
    for tenant in tenants:
        tenant.start()
    try:
        time.sleep(0.3 if mode == "thread" else 2.0)  # a process imports and warms up first
        return lanes_ms(pipe, files, batch)
    finally:
        stop.set()
        for tenant in tenants:
            tenant.join(30)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--side", type=int, default=320)
    ap.add_argument("--out", type=Path, default=Path("out/bench_contention"))
    args = ap.parse_args()
    from bench_backfill import small_images

    args.out.mkdir(parents=True, exist_ok=True)
    files = small_images(args.out / "images", args.side)
    pipe = pipeline()
    lanes_ms(pipe, files[:4], 4)  # warm-up
    samples: dict[str, dict[str, list[float]]] = {f"{m}/{b}": {"device": [], "output": []}
                                                  for m in MODES for b in (1, 4)}
    for r in range(args.rounds):
        for mode in MODES if r % 2 == 0 else MODES[::-1]:
            for batch in (1, 4):
                dev, out = measure(mode, pipe, files, batch)
                samples[f"{mode}/{batch}"]["device"].append(dev)
                samples[f"{mode}/{batch}"]["output"].append(out)
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
    med = {k: {lane: statistics.median(v) for lane, v in d.items()} for k, d in samples.items()}
    ratios = {k: {lane: v / med[f"alone/{k.split('/')[1]}"][lane] for lane, v in d.items()} for k, d in med.items()}
    result = {"settings": {"rounds": args.rounds, "side": args.side, "images": len(files),
                           "cores": os.cpu_count()},
              "ms_per_image": med, "ratio_to_alone": ratios}
    (args.out / "bench_contention.json").write_text(json.dumps(result, indent=1))
    print(f"{'mode/batch':14s} {'device ms':>10s} {'× alone':>8s} {'output ms':>10s} {'× alone':>8s}")
    for k in med:
        print(f"{k:14s} {med[k]['device']:10.1f} {ratios[k]['device']:8.2f} "
              f"{med[k]['output']:10.1f} {ratios[k]['output']:8.2f}")


if __name__ == "__main__":
    main()
