"""GPU check of the retouch kernels: parity with the CPU twin, throughput, bandwidth.

    PYTHONPATH=. python bench/gpu_check_retouch.py        # writes $OUT/gpu_check_retouch.json

Needs only NumPy and CuPy (synthetic images; no scikit-image, no OpenCV). Without CuPy or a
CUDA device it writes ``{"status": "skipped", ...}`` and exits 0. Reports:

* ``parity``: max |GPU - CPU| (uint8 LSB) of pass (a) and (b) over modes and odd shapes, and
  of the fused kernels vs the unfused CuPy chains (goal: <= 1);
* ``colour_pass``: per-stage MP/s of the unfused CuPy chain, the fused kernel's MP/s and
  achieved bandwidth (7 bytes per pixel: RGB in, mask in, RGB out) against a measured
  device-to-device copy (goal: >= 50 %), parameter estimation time;
* ``geometry_pass``: per preset, one batched launch over N images vs the unfused CuPy chain
  image by image (goal: >= 3x), and the chain's per-stage times.

Timings are CUDA-event times, best of ``--repeat`` after a warm-up.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np

from bench.gpu_rows import append as append_row

REPORT_NAME = "gpu_check_retouch.json"


def emit(report: dict[str, Any]) -> None:
    text = json.dumps(report, indent=2, default=str)
    print(text)
    out_dir = Path(os.environ.get("OUT") or ".")
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / REPORT_NAME).write_text(text + "\n")


def synthetic(h: int, w: int, seed: int, channels: int = 3) -> tuple[np.ndarray, np.ndarray]:
    """A product-like photo: textured subject (ellipse) on a tinted, unevenly lit backdrop,
    and its feathered mask. ``channels`` 1, 3 or 4 (4: the mask as alpha)."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    u, v = xx / max(w - 1, 1), yy / max(h - 1, 1)
    r = np.sqrt(((u - 0.55) / 0.32) ** 2 + ((v - 0.5) / 0.38) ** 2)
    alpha = np.clip((1.0 - r) * 12.0, 0.0, 1.0)
    texture = 0.5 + 0.25 * np.sin(xx / 7.0 + 3 * np.sin(yy / 23.0)) * np.cos(yy / 11.0)
    subject = np.stack([texture * 200, texture * 120 + 40, 90 - texture * 60], axis=-1)
    backdrop = np.full((h, w, 3), 200.0, np.float32) * np.array([1.1, 1.0, 0.85], np.float32)
    light = (0.55 + 0.45 * u)[..., None]
    img = (alpha[..., None] * subject + (1 - alpha[..., None]) * backdrop) * light
    img += rng.normal(0.0, 3.0, img.shape)
    rgb = np.clip(img, 0, 255).astype(np.uint8)
    mask = (alpha * 255 + 0.5).astype(np.uint8)
    if channels == 1:
        return np.ascontiguousarray(rgb[..., 1]), mask
    if channels == 4:
        return np.dstack([rgb, mask]), mask
    return rgb, mask


class Timer:
    """CUDA-event timing of a callable, and of the stages of a chain."""

    def __init__(self, cp: Any, repeat: int) -> None:
        self.cp, self.repeat = cp, repeat

    def best(self, fn: Callable[[], Any]) -> float:
        cp = self.cp
        fn()
        cp.cuda.Device().synchronize()
        start, end = cp.cuda.Event(), cp.cuda.Event()
        times = []
        for _ in range(self.repeat):
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(float(cp.cuda.get_elapsed_time(start, end)) / 1e3)
        return min(times)

    def stages(self, fn: Callable[[Callable[[str], None]], Any]) -> dict[str, float]:
        """Best seconds per stage of ``fn(mark)``; ``mark(name)`` ends a stage."""
        cp = self.cp
        best: dict[str, float] = {}
        fn(lambda name: None)
        cp.cuda.Device().synchronize()
        for _ in range(self.repeat):
            events: list[tuple[str, Any]] = [("", cp.cuda.Event())]
            events[0][1].record()

            def mark(name: str, events: list[tuple[str, Any]] = events) -> None:
                ev = cp.cuda.Event()
                ev.record()
                events.append((name, ev))

            fn(mark)
            events[-1][1].synchronize()
            for (_, a), (name, b) in itertools.pairwise(events):
                t = cp.cuda.get_elapsed_time(a, b) / 1e3
                best[name] = min(best.get(name, float("inf")), t)
        return best


def max_diff(cp: Any, a: Any, b: Any) -> int:
    a, b = cp.asnumpy(a), cp.asnumpy(b)
    if a.shape != b.shape:
        return 999
    return int(np.abs(a.astype(np.int16) - b.astype(np.int16)).max())


def check_parity(cp: Any) -> dict[str, Any]:
    from gpu_kernels.backends import RetouchOptions
    from gpu_kernels.presets import Preset, load_presets
    from gpu_kernels.retouch import CpuRetoucher, CupyRetoucher

    cpu, gpu, book = CpuRetoucher(), CupyRetoucher(), load_presets()
    cases = {
        "rgb+mask": synthetic(480, 640, 1),
        "rgba": (synthetic(400, 300, 2, channels=4)[0], None),
        "gray+mask": synthetic(333, 517, 3, channels=1),
        "rgb": (synthetic(256, 256, 4)[0], None),
        "1x1": (np.full((1, 1, 3), 77, np.uint8), None),
        "10000x10": (synthetic(10000, 10, 5)[0], None),
    }
    presets = [book["taobao_main"], book["amazon_main"], book["transparent_png"],
               Preset("tiny", 37, 53, format="png", background="transparent", fill=0.5)]
    out: dict[str, Any] = {"correct": {}, "render": {}, "correct_fused_vs_unfused": {},
                           "render_fused_vs_unfused": {}}
    for name, (image, mask) in cases.items():
        dev_image = cp.asarray(image)
        dev_mask = None if mask is None else cp.asarray(mask)
        worst = worst_chain = 0
        for bg in ("white", "transparent", "keep"):
            for lighting in ("auto", "off"):
                options = RetouchOptions(bg, lighting)
                g = gpu.correct([dev_image], [dev_mask], options)[0]
                c = cpu.correct([image], [mask], options)[0]
                worst = max(worst, max_diff(cp, g, c))
                worst_chain = max(worst_chain, max_diff(cp, g, gpu.correct_unfused(
                    dev_image, dev_mask, options)))
        out["correct"][name] = worst
        out["correct_fused_vs_unfused"][name] = worst_chain
        worst = worst_chain = 0
        for preset in presets:
            g = gpu.render(dev_image, dev_mask, preset)
            worst = max(worst, max_diff(cp, g, cpu.render(image, mask, preset)))
            worst_chain = max(worst_chain, max_diff(cp, g, gpu.render_unfused(
                dev_image, dev_mask, preset)))
        out["render"][name] = worst
        out["render_fused_vs_unfused"][name] = worst_chain
    items = [(cp.asarray(i), None if m is None else cp.asarray(m)) for i, m in cases.values()]
    batch = gpu.render_batch([i for i, _ in items], [m for _, m in items], presets[0])
    out["render_batch_vs_single"] = max(max_diff(cp, b, gpu.render(i, m, presets[0]))
                                        for b, (i, m) in zip(batch, items, strict=True))
    values = [v for k, d in out.items() if isinstance(d, dict) for v in d.values()]
    out["max_lsb"] = max([*values, out["render_batch_vs_single"]])
    out["ok"] = out["max_lsb"] <= 1
    return out


def copy_bandwidth(cp: Any, timer: Timer, nbytes: int) -> dict[str, float]:
    src = cp.arange(nbytes, dtype=cp.uint8)
    dst = cp.empty_like(src)
    memcpy = timer.best(lambda: dst.data.copy_from_device(src.data, nbytes))
    kernel = timer.best(lambda: cp.copyto(dst, src))
    return {"bytes": nbytes, "memcpy_gbps": 2 * nbytes / memcpy / 1e9,
            "copy_kernel_gbps": 2 * nbytes / kernel / 1e9}


def colour_pass(cp: Any, timer: Timer, h: int, w: int, copy_gbps: float) -> dict[str, Any]:
    from gpu_kernels.backends import RetouchOptions
    from gpu_kernels.retouch import CupyRetoucher

    gpu = CupyRetoucher()
    image, mask = synthetic(h, w, 11)
    dev_image, dev_mask = cp.asarray(image), cp.asarray(mask)
    mp = h * w / 1e6
    out: dict[str, Any] = {"image": f"{w}x{h} RGB + mask", "megapixels": mp}
    modes = (RetouchOptions("white", "auto"), RetouchOptions("transparent", "auto"),
             RetouchOptions("keep", "off"))
    for options in modes:
        bg, lighting = options.background, options.lighting
        out[f"{bg}/{lighting}"] = colour_mode(cp, timer, gpu, dev_image, dev_mask, options,
                                              copy_gbps)
    out["goal_fused_vs_copy"] = 0.5
    return out


def colour_mode(cp: Any, timer: Timer, gpu: Any, image: Any, mask: Any, options: Any,
                copy_gbps: float) -> dict[str, Any]:
    """Fused kernel (given its plan) vs plan estimation vs the unfused CuPy chain."""
    from gpu_kernels.retouch.correction import correct_reference

    h, w = image.shape[:2]
    mp = h * w / 1e6
    plan = gpu.plan(image, mask, options)

    def fused() -> Any:
        return gpu.launch_correct(image, mask, False, plan, options.background)

    def estimate() -> Any:
        return gpu.plan(image, mask, options)

    def end_to_end() -> Any:
        return gpu.correct([image], [mask], options)

    def chain(mark: Callable[[str], None]) -> Any:
        return correct_reference(cp, image, mask, plan, options.background, mark)

    t_fused = timer.best(fused)
    bytes_per_px = 3 + 1 + (4 if options.background == "transparent" else 3)
    gbps = bytes_per_px * h * w / t_fused / 1e9
    entry: dict[str, Any] = {
        "fused_mps": mp / t_fused, "fused_gbps": gbps, "fused_vs_copy": gbps / copy_gbps,
        "plan_ms": timer.best(estimate) * 1e3, "end_to_end_mps": mp / timer.best(end_to_end),
    }
    if options.lighting == "auto":
        stages = timer.stages(chain)
        total = sum(stages.values())
        entry.update(unfused_stage_mps={k: mp / v for k, v in stages.items()},
                     unfused_mps=mp / total, fused_vs_unfused=total / t_fused)
    return entry


def geometry_pass(cp: Any, timer: Timer, n: int, h: int, w: int) -> dict[str, Any]:
    from gpu_kernels.backends import RetouchOptions
    from gpu_kernels.presets import load_presets
    from gpu_kernels.retouch import CupyRetoucher

    gpu, book = CupyRetoucher(), load_presets()
    sources = [synthetic(h, w, 100 + i) for i in range(n)]
    masks = [cp.asarray(m) for _, m in sources]
    white = [gpu.correct([cp.asarray(i)], [m], RetouchOptions("white"))[0]
             for (i, _), m in zip(sources, masks, strict=True)]
    clear = [gpu.correct([cp.asarray(i)], [m], RetouchOptions("transparent"))[0]
             for (i, _), m in zip(sources, masks, strict=True)]
    out: dict[str, Any] = {"batch": n, "source": f"{w}x{h}", "goal_fused_vs_unfused": 3.0}
    for name in ("taobao_main", "amazon_main", "transparent_png"):
        preset = book[name]
        images = clear if preset.background == "transparent" else white
        out[name] = render_preset(cp, timer, gpu, preset, images, masks)
    return out


def render_preset(cp: Any, timer: Timer, gpu: Any, preset: Any, images: list[Any],
                  masks: list[Any]) -> dict[str, Any]:
    """Batched fused launch vs the unfused CuPy chain, image by image, for one preset."""
    from gpu_kernels.retouch.gpu import render_launch
    from gpu_kernels.retouch.render import render_reference

    out_mp = len(images) * preset.width * preset.height / 1e6
    coeffs = gpu.config.geometry.cubic_coefficients()
    params = [gpu.placement(i, m, preset) for i, m in zip(images, masks, strict=True)]
    host = [cp.asnumpy(q) for q in params]

    def fused() -> Any:
        return gpu.render_batch(images, masks, preset)

    def kernel_only() -> None:
        launch = render_launch(cp, list(zip(images, params, strict=True)), preset, gpu._coeffs,
                               gpu._pointer)
        gpu._render_kernel(*launch[:3])

    def unfused() -> Any:
        return [gpu.render_unfused(i, m, preset) for i, m in zip(images, masks, strict=True)]

    def chain(mark: Callable[[str], None]) -> Any:
        return [render_reference(cp, i, q, preset.width, preset.height,
                                 preset.background == "transparent", preset.sharpen, coeffs, mark)
                for i, q in zip(images, host, strict=True)]

    t_fused, t_kernel, t_unfused = timer.best(fused), timer.best(kernel_only), timer.best(unfused)
    return {
        "canvas": f"{preset.width}x{preset.height}",
        "fused_batch_ms": t_fused * 1e3, "fused_kernel_ms": t_kernel * 1e3,
        "fused_out_mps": out_mp / t_fused, "unfused_ms": t_unfused * 1e3,
        "unfused_out_mps": out_mp / t_unfused, "fused_vs_unfused": t_unfused / t_fused,
        "unfused_stage_ms_per_image": {k: v * 1e3 for k, v in timer.stages(chain).items()},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--colour-size", default="4000x3000", help="WxH of the colour-pass image")
    parser.add_argument("--batch", type=int, default=16, help="images per render batch")
    parser.add_argument("--source-size", default="3000x2000", help="WxH of the render sources")
    parser.add_argument("--copy-mib", type=int, default=1024)
    args = parser.parse_args(argv)
    report: dict[str, Any] = {"script": "bench/gpu_check_retouch.py", "status": "skipped"}
    try:
        import cupy as cp
    except ImportError as exc:
        report["reason"] = f"CuPy is not installed ({exc}); nothing to check on this machine"
        append_row({"skipped": report["reason"]}, kind="skipped")
        emit(report)
        return 0
    try:
        devices = cp.cuda.runtime.getDeviceCount()
    except Exception as exc:  # no driver: CUDARuntimeError
        devices, report["reason"] = 0, f"no CUDA device ({type(exc).__name__}: {exc})"
    if devices == 0:
        report.setdefault("reason", "no CUDA device")
        append_row({"skipped": report["reason"]}, kind="skipped")
        emit(report)
        return 0
    t0 = time.perf_counter()
    props = cp.cuda.runtime.getDeviceProperties(0)
    report.update(status="running", device=props["name"].decode(errors="replace"),
                  cupy=cp.__version__, numpy=np.__version__)
    timer = Timer(cp, args.repeat)
    sections: list[tuple[str, Callable[[], Any]]] = [
        ("parity", lambda: check_parity(cp)),
        ("copy", lambda: copy_bandwidth(cp, timer, args.copy_mib << 20)),
    ]
    cw, ch = (int(v) for v in args.colour_size.split("x"))
    sw, sh = (int(v) for v in args.source_size.split("x"))
    for name, fn in sections:
        try:
            report[name] = fn()
        except Exception:
            report[name] = {"error": traceback.format_exc()}
        append_row({"part": name, "value": report[name]}, kind=name)
    copy_gbps = float(report.get("copy", {}).get("memcpy_gbps", float("nan")))
    passes: list[tuple[str, Callable[[], Any]]] = [
        ("colour_pass", lambda: colour_pass(cp, timer, ch, cw, copy_gbps)),
        ("geometry_pass", lambda: geometry_pass(cp, timer, args.batch, sh, sw)),
    ]
    for name, fn in passes:
        try:
            report[name] = fn()
        except Exception:
            report[name] = {"error": traceback.format_exc()}
        append_row({"part": name, "value": report[name]}, kind=name)
        cp.get_default_memory_pool().free_all_blocks()
    errors = [k for k, v in report.items() if isinstance(v, dict) and "error" in v]
    report["status"] = "error" if errors else "ok"
    report["seconds"] = time.perf_counter() - t0
    emit(report)
    return 1 if errors else 0


if __name__ == "__main__":
    raise SystemExit(main())
