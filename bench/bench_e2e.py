"""End to end on this CPU: lightbox's offline pipeline against a naive per-image script, same run.

Photos: 20 real photographs (scikit-image) written as supplier files of 0.1 to 11 MP: baseline
and progressive JPEG, PNG, WebP, CMYK JPEG, greyscale PNG, one upscaled to 3840x2880
(``photo_set``). Presets: taobao_main (800x800 JPEG), xiaohongshu_cover (1080x1440 JPEG),
thumb_webp (400x400 WebP).

- ``naive``: per image, Pillow decode; u2netp on ONNX Runtime (default session) at batch 1;
  mask resized back with Pillow; then per preset: Pillow decode again, float composite on white,
  crop to the largest contour of the mask (OpenCV), Lanczos resize onto the canvas, encode with
  Pillow. No colour work.
- ``naive lean``: the same, but the float composite is made once per image and shared by the
  presets (a kinder baseline: bounds how much the per-preset composite alone is worth).
- ``lightbox``: ``lightbox.offline.process_files`` (fetch, decode once at the size the presets
  need, segment, colour correction, composite, render, encode), batch 4, with lighting on and
  off, the model runtime chosen by ``--runtime`` (auto: the fidelity-gated choice).
- ``lightbox lighting on, previous colour path`` (``--legacy-colour``): the same processor with
  ``RetouchConfig.legacy()`` (statistics on a strided 256-px sample, per-pixel white balance, the
  whole image coloured), to compare the two colour paths in the same run.

Non-model stages: everything but the model. For the naive script, its wall time minus the time in
its ``mask`` (resize to 320, normalise, ``session.run``, mask back to full size); for lightbox,
its wall time minus the ``segment`` and ``refine`` spans (preprocess, inference, mask back to full size), both
summed over the photos; likewise in CPU time (this process, all threads: less disturbed by other
tenants), the model's share measured around ``mask`` and the segmenters' ``segment_batch`` (a CPU
model's ``infer_batch`` and ``refine``).
Reported as seconds per round and as the ratio naive / lightbox; the
per-stage table (ms per image, each stage's batch time divided by its batch size) is printed for
every lightbox configuration side by side.

Configurations alternate within each round (the machine is shared: a slow spell hits all of
them); each is reported as images/s (wall) and CPU seconds per image (this process, all
threads: less disturbed by other tenants), median over rounds, and the ratio lightbox / naive
per round. Writes ``--json`` (default ``out/bench_e2e.json``).

Usage: ``python bench/bench_e2e.py [--rounds 3] [--runtime auto] [--n 20] [--legacy-colour]``
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # as the lightbox command sets it

import cv2
import numpy as np
import onnxruntime as ort
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agents.wiring import build_processor
from gpu_kernels.backends import RetouchOptions
from gpu_kernels.pipeline import Job
from gpu_kernels.presets import Preset, load_presets
from gpu_kernels.retouch import RetouchConfig
from gpu_kernels.segment import ensure_u2netp
from gpu_kernels.spans import SpanRecorder
from gpu_kernels.stages.base import run_lane
from lightbox.offline import process_files
from lightbox.samples import make_catalog
from streams.settings import Settings

PRESETS = ("taobao_main", "xiaohongshu_cover", "thumb_webp")


# ---------------------------------------------------------------------------------- photos
def photo_set(folder: Path, n: int = 20) -> list[Path]:
    """``n`` supplier-like files (see the module docstring); deterministic."""
    import skimage.data as data

    folder.mkdir(parents=True, exist_ok=True)
    skimage = {name: getattr(data, name)() for name in ("coffee", "chelsea", "astronaut", "camera", "rocket")}
    files = make_catalog(folder, max(0, n - 6))
    coffee = Image.fromarray(skimage["coffee"])
    extras: list[tuple[str, Image.Image, str, dict[str, Any]]] = [
        ("small-coffee.jpg", coffee.resize((400, 300)), "JPEG", {"quality": 90}),
        ("cmyk-chelsea.jpg", Image.fromarray(skimage["chelsea"]).convert("CMYK"), "JPEG", {"quality": 90}),
        ("big-astronaut.jpg", Image.fromarray(skimage["astronaut"]).resize((3840, 2880), Image.Resampling.LANCZOS),
         "JPEG", {"quality": 92}),
        ("grey-camera.png", Image.fromarray(skimage["camera"]), "PNG", {}),
        ("prog-rocket.jpg", Image.fromarray(skimage["rocket"]).resize((1600, 1068)), "JPEG",
         {"quality": 85, "progressive": True}),
        ("upscaled-coffee.jpg", coffee.resize((2400, 1600), Image.Resampling.BICUBIC), "JPEG", {"quality": 90}),
    ]
    for name, img, fmt, opts in extras[: n - len(files)]:
        path = folder / name
        img.save(path, format=fmt, **opts)
        files.append(path)
    return files


def megapixels(files: Sequence[Path]) -> list[float]:
    out = []
    for f in files:
        with Image.open(f) as im:
            out.append(im.width * im.height / 1e6)
    return out


# ---------------------------------------------------------------------------------- naive script
class Naive:
    """The per-image script of the module docstring."""

    def __init__(self, model: Path, presets: Sequence[Preset], *, composite_once: bool = False) -> None:
        self.session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
        self.input = self.session.get_inputs()[0].name
        self.presets = presets
        self.composite_once = composite_once
        self.model_seconds = 0.0  # wall time spent in mask(), accumulated
        self.model_cpu = 0.0  # CPU time of this process (all threads) spent in mask()

    def mask(self, img: Image.Image) -> np.ndarray:
        t0, c0 = time.perf_counter(), time.process_time()
        try:
            return self._mask(img)
        finally:
            self.model_seconds += time.perf_counter() - t0
            self.model_cpu += time.process_time() - c0

    def _mask(self, img: Image.Image) -> np.ndarray:
        small = np.asarray(img.resize((320, 320), Image.Resampling.LANCZOS), np.float32) / 255.0
        x = ((small - (0.485, 0.456, 0.406)) / (0.229, 0.224, 0.225)).transpose(2, 0, 1)[None].astype(np.float32)
        pred = self.session.run(None, {self.input: x})[0][0, 0]
        pred = (pred - pred.min()) / max(float(pred.max() - pred.min()), 1e-6)
        m = Image.fromarray((pred * 255).astype(np.uint8)).resize(img.size, Image.Resampling.BILINEAR)
        return np.asarray(m, np.float32) / 255.0

    def one(self, path: Path) -> list[bytes]:
        with Image.open(path) as im:
            rgb_once = im.convert("RGB")
            alpha = self.mask(rgb_once)
        a = alpha[..., None]
        shared = np.asarray(rgb_once, np.float32) * a + 255.0 * (1.0 - a) if self.composite_once else None
        out = []
        for p in self.presets:
            if shared is None:
                with Image.open(path) as im:  # decoded again for every preset
                    rgb = np.asarray(im.convert("RGB"), np.float32)
                comp = rgb * a + 255.0 * (1.0 - a)
            else:
                comp = shared
            x, y, w, h = self.crop_box(alpha)
            cut = Image.fromarray(np.clip(comp[y:y + h, x:x + w], 0, 255).astype(np.uint8))
            scale = min(p.width * p.fill / w, p.height * p.fill / h)
            size = (max(1, round(w * scale)), max(1, round(h * scale)))
            canvas = Image.new("RGB", (p.width, p.height), (255, 255, 255))
            canvas.paste(cut.resize(size, Image.Resampling.LANCZOS),
                         ((p.width - size[0]) // 2, (p.height - size[1]) // 2))
            buf = io.BytesIO()
            canvas.save(buf, format=p.format.upper(), quality=p.quality)
            out.append(buf.getvalue())
        return out

    @staticmethod
    def crop_box(alpha: np.ndarray) -> tuple[int, int, int, int]:
        """Bounding box of the largest contour of the saturated mask (the whole image if none)."""
        binary = (alpha > 0.5).astype(np.uint8)
        contours, _ = cv2.findContours(binary, cv2.RETR_EXTERNAL, cv2.CHAIN_APPROX_SIMPLE)
        if not contours:
            return 0, 0, alpha.shape[1], alpha.shape[0]
        x, y, w, h = cv2.boundingRect(max(contours, key=cv2.contourArea))
        return int(x), int(y), int(w), int(h)

    def run(self, files: Sequence[Path]) -> int:
        return sum(len(self.one(f)) for f in files)


# ---------------------------------------------------------------------------------- runs
def stage_cpu(processor: Any, files: Sequence[Path], presets: Sequence[Preset], configs: dict[str, RetouchConfig],
              rounds: int, batch: int) -> dict[str, dict[str, float]]:
    """CPU time (this thread) of the correct and render stages per image, for each colour config,
    on the same decoded images and masks (decode and segment run once), configs alternating within
    each round; median over rounds. Thread CPU time is what the stage costs, whatever the other
    tenants of the machine do."""
    pipe = processor.pipeline
    by_name = {s.name: s for s in pipe.stages}
    segment, refine, correct, render = by_name["segment"], by_name["refine"], by_name["correct"], by_name["preset"]
    ctxs = []
    for k in range(0, len(files), batch):
        jobs = [Job(f.read_bytes(), presets, RetouchOptions(), SpanRecorder()) for f in files[k:k + batch]]
        ctx = pipe.start(jobs)
        pipe.run_lane(ctx, "decode")
        run_lane(ctx, [segment], "device")
        run_lane(ctx, [refine], refine.lane)
        ctxs.append(ctx)
    samples: dict[str, dict[str, list[float]]] = {n: {"correct": [], "render": []} for n in configs}
    for r in range(rounds):
        order = list(configs) if r % 2 == 0 else list(reversed(configs))
        for name in order:
            pipe.retoucher.config = configs[name]
            spent = {"correct": 0.0, "render": 0.0}
            for ctx in ctxs:
                ctx.corrected.clear()
                ctx.rendered.clear()
                ctx.memo.clear()
                for stage in (correct, render):
                    c0 = time.thread_time()
                    run_lane(ctx, [stage], stage.lane)
                    spent[stage.name if stage is correct else "render"] += time.thread_time() - c0
            for key, v in spent.items():
                samples[name][key].append(v / len(files) * 1000)
    return {n: {k: round(statistics.median(v), 1) for k, v in d.items()} for n, d in samples.items()}


def timed(fn: Callable[[], object]) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process) of one call."""
    w, c = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - w, time.process_time() - c


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--n", type=int, default=20, help="photos")
    ap.add_argument("--runtime", default="auto", help="lightbox's segment runtime: auto, fp32, openvino, int8")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--json", type=Path, default=Path("out/bench_e2e.json"))
    ap.add_argument("--stage-cpu-rounds", type=int, default=0,
                    help="also time the correct and render stages in thread CPU time, new vs previous colour path")
    ap.add_argument("--legacy-colour", action="store_true",
                    help="also run lighting on with the previous colour path (RetouchConfig.legacy())")
    args = ap.parse_args(argv)

    tmp = Path(tempfile.mkdtemp(prefix="lightbox-bench-e2e-"))
    files = photo_set(tmp / "photos", args.n)
    mp = megapixels(files)
    book = load_presets(None)
    presets = [book[p] for p in PRESETS]
    model = ensure_u2netp().original
    naive = Naive(model, presets)
    lean = Naive(model, presets, composite_once=True)
    t0 = time.perf_counter()
    processor = build_processor(Settings(segmenter="model", device="cpu", segment_runtime=args.runtime))
    print(f"{len(files)} photos, {min(mp):.2f}-{max(mp):.1f} MP; presets {', '.join(PRESETS)}; "
          f"lightbox model {processor.model_version} (built in {time.perf_counter() - t0:.1f} s)", flush=True)

    stage_ms: dict[str, list[dict[str, float]]] = {}  # per config, per round: stage -> ms per image
    model_s: dict[str, list[float]] = {}  # per config, per round: seconds in the model
    model_cpu: dict[str, list[float]] = {}  # per config, per round: CPU seconds in the model
    seg_cpu = [0.0]

    def cpu_timed(fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapped(*a: Any, **k: Any) -> Any:
            c0 = time.process_time()
            try:
                return fn(*a, **k)
            finally:
                seg_cpu[0] += time.process_time() - c0
        return wrapped

    for seg in (processor.pipeline.segmenter, processor.pipeline.classical):
        if seg is None:
            continue
        # a CPU model's pipeline calls infer_batch, then refine per image (the refine stage)
        for method in (("infer_batch", "refine") if hasattr(seg, "infer_batch") else ("segment_batch",)):
            setattr(seg, method, cpu_timed(getattr(seg, method)))

    def lightbox(name: str, lighting: str, colour: RetouchConfig) -> Callable[[], object]:
        def run() -> object:
            processor.pipeline.retoucher.config = colour  # type: ignore[attr-defined]
            seg_cpu[0] = 0.0
            summary = process_files(files, processor, tmp / f"out-{name.replace(' ', '-')}", presets=PRESETS,
                                    batch_size=args.batch, lighting=lighting)
            per: dict[str, float] = {}
            for res in summary.results:
                for stage, ms in res.line.get("stages_ms_per_image", {}).items():
                    per[stage] = per.get(stage, 0.0) + ms / len(files)
            stage_ms.setdefault(name, []).append(per)
            model_s.setdefault(name, []).append((per.get("segment", 0.0) + per.get("refine", 0.0)) * len(files) / 1000)
            model_cpu.setdefault(name, []).append(seg_cpu[0])
            return summary
        return run

    def naive_run(script: Naive, name: str) -> Callable[[], object]:
        def run() -> object:
            script.model_seconds = script.model_cpu = 0.0
            out = script.run(files)
            model_s.setdefault(name, []).append(script.model_seconds)
            model_cpu.setdefault(name, []).append(script.model_cpu)
            return out
        return run

    new, legacy = RetouchConfig(), RetouchConfig.legacy()
    configs: dict[str, Callable[[], object]] = {"naive": naive_run(naive, "naive"),
                                                "naive lean": naive_run(lean, "naive lean"),
                                                "lightbox lighting on": lightbox("lightbox lighting on", "auto", new),
                                                "lightbox lighting off": lightbox("lightbox lighting off", "off", new)}
    if args.legacy_colour:
        configs["lightbox lighting on, previous colour path"] = lightbox(
            "lightbox lighting on, previous colour path", "auto", legacy)
    naive.run(files[:2])  # warm-up, untimed
    lightbox("warm-up", "auto", new)()
    stage_ms.clear()
    model_s.clear()
    model_cpu.clear()
    rows: dict[str, list[tuple[float, float]]] = {k: [] for k in configs}
    for r in range(args.rounds):
        order = list(configs) if r % 2 == 0 else list(reversed(configs))  # alternate who goes first
        for name in order:
            wall, cpu = timed(configs[name])
            rows[name].append((wall, cpu))
            print(f"round {r + 1} {name:42s} {len(files) / wall:5.2f} img/s  {cpu / len(files) * 1000:6.0f} CPU-ms/img"
                  f"  non-model {wall - model_s[name][-1]:5.2f} s, {cpu - model_cpu[name][-1]:5.2f} CPU-s", flush=True)
    n = len(files)
    result: dict[str, Any] = {
        "photos": n, "megapixels": [round(x, 2) for x in mp], "presets": PRESETS, "rounds": args.rounds,
        "runtime": args.runtime, "model_version": processor.model_version, "batch": args.batch,
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "load_avg": os.getloadavg()},
        "configs": {}, "ratios": {}, "non_model_ratios": {}, "stage_ms_per_image": {},
    }
    for name, vals in rows.items():
        result["configs"][name] = {
            "img_per_s": [round(n / w, 3) for w, _ in vals],
            "cpu_ms_per_img": [round(c / n * 1000, 1) for _, c in vals],
            "median_img_per_s": round(statistics.median(n / w for w, _ in vals), 3),
            "median_cpu_ms_per_img": round(statistics.median(c / n * 1000 for _, c in vals), 1),
            "non_model_s": [round(w - m, 3) for (w, _), m in zip(vals, model_s[name], strict=True)],
            "model_s": [round(m, 3) for m in model_s[name]],
            "non_model_cpu_s": [round(c - m, 3) for (_, c), m in zip(vals, model_cpu[name], strict=True)],
            "model_cpu_s": [round(m, 3) for m in model_cpu[name]]}
    lightboxes = [k for k in configs if k.startswith("lightbox")]
    for base in ("naive", "naive lean"):
        for name in lightboxes:
            per_round = [nw / lw for (nw, _), (lw, _) in zip(rows[base], rows[name], strict=True)]
            per_round_cpu = [nc / lc for (_, nc), (_, lc) in zip(rows[base], rows[name], strict=True)]
            result["ratios"][f"{name} / {base}"] = {
                "wall_per_round": [round(x, 3) for x in per_round],
                "wall_median": round(statistics.median(per_round), 3),
                "cpu_per_round": [round(x, 3) for x in per_round_cpu],
                "cpu_median": round(statistics.median(per_round_cpu), 3)}
            print(f"{name} / {base}: wall {statistics.median(per_round):.2f}x (rounds "
                  f"{', '.join(f'{x:.2f}' for x in per_round)}), CPU time {statistics.median(per_round_cpu):.2f}x")
    for name in lightboxes:
        for key, unit in (("non_model_s", "s wall"), ("non_model_cpu_s", "CPU-s")):
            base_nm = result["configs"]["naive"][key]
            nm = result["configs"][name][key]
            per_round = [b / max(x, 1e-9) for b, x in zip(base_nm, nm, strict=True)]
            result["non_model_ratios"][f"{name} / naive ({unit})"] = {
                "per_round": [round(x, 3) for x in per_round], "median": round(statistics.median(per_round), 3)}
            print(f"non-model stages ({unit}), naive / {name}: {statistics.median(per_round):.2f}x (rounds "
                  f"{', '.join(f'{x:.2f}' for x in per_round)}; naive {statistics.median(base_nm):.2f}, "
                  f"lightbox {statistics.median(nm):.2f} per round)")
    stages = list(dict.fromkeys(s for name in lightboxes for per in stage_ms[name] for s in per))
    table = {name: {s: round(statistics.median(per.get(s, 0.0) for per in stage_ms[name]), 1) for s in stages}
             for name in lightboxes}
    result["stage_ms_per_image"] = table
    width = max(len(s) for s in stages)
    print("\nms per image (median over rounds; a batch's span divided by its size):")
    print(" " * width + "".join(f"  {name.replace('lightbox ', ''):>34s}" for name in lightboxes))
    for s in stages:
        print(f"{s:{width}s}" + "".join(f"  {table[name][s]:34.1f}" for name in lightboxes))
    if args.stage_cpu_rounds:
        cpu_table = stage_cpu(processor, files, presets, {"new": new, "previous colour path": legacy},
                              args.stage_cpu_rounds, args.batch)
        result["stage_cpu_ms_per_image"] = cpu_table
        print(f"\ncorrect and render, thread CPU ms per image (lighting on, white, {args.stage_cpu_rounds} "
              "alternating rounds, median):")
        for name, row in cpu_table.items():
            print(f"  {name:22s} correct {row['correct']:6.1f}  render {row['render']:6.1f}")
    processor.close()
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1))
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
