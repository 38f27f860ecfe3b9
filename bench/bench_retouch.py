"""CPU throughput of the retouch passes: each stage of the unfused chain and the fused pass.

    PYTHONPATH=. .venv/bin/python bench/bench_retouch.py [--width 2000 --height 1500]
        [--repeat 3] [--out bench_retouch.json]

Prints JSON: megapixels per second per stage (unfused chain, one full-image pass per stage
with float32 intermediates) and for the fused pass, plus ``fused_vs_unfused`` = unfused chain
time / fused time. Pass (a) MP/s are of the input image; pass (b) per preset, of the canvas
(``out_mps``) and of the source (``in_mps``). Best of ``--repeat`` runs; a short run by design
(the benchmark is not a test and asserts nothing).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import cv2
import numpy as np
import skimage.data

from gpu_kernels.backends import RetouchOptions
from gpu_kernels.presets import load_presets
from gpu_kernels.retouch import CpuRetoucher
from gpu_kernels.retouch.correction import (
    correct_fused_cpu,
    correct_reference,
    plan_correction,
)
from gpu_kernels.retouch.illumination import gaussian_matrix
from gpu_kernels.retouch.render import render_fused_cpu, render_reference

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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=2000)
    parser.add_argument("--height", type=int, default=1500)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
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
