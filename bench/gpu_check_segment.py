"""GPU check for the segment stage: u2netp on ONNX Runtime's CUDA provider, batch 1 to 64.

Prepared to run on the GPU machine (Python 3.12, CuPy, OpenCV, numpy; onnxruntime-gpu from
the carried wheels, ``PYTHONPATH=/tmp/site``). Needs no scikit-image: test images are
synthesised (or read from ``--images DIR`` of PNGs). Writes ``$OUT/gpu_check_segment.json``
(or ``--out``) and prints a summary.

Measures
- raw model, batch 1, 2, 4, ..., 64: ``run_with_iobinding`` with a CuPy input and the output
  left on the device vs plain ``session.run`` with NumPy in and out (host copies both ways);
  ms per batch and images/s;
- TensorRT provider, the same grid, when onnxruntime lists it (it needs TensorRT libraries);
- the project's ``OnnxSegmenter(device="gpu")`` end to end on 1000x1000 CuPy images
  (pre-processing, inference, mask resize and post-processing on the GPU), IO binding on/off;
- parity: GPU masks vs the CPU ``OnnxSegmenter`` masks (IoU of alpha >= 128).

Usage: ``python3 bench/gpu_check_segment.py MODEL.onnx [--images DIR] [--out FILE]``, with
MODEL the batched u2netp (``python -m gpu_kernels.segment.fetch_model`` prints its path).
On a lent GPU (docs/development.md, "GPU validation run"): here, the device tooling's ``pack-wheels.sh ort`` and
``mkdir -p .gpumodel && cp <batched model> .gpumodel/`` (``/.gpumodel/`` in .git/info/exclude)
and ``python bench/gpu_check_segment.py x --export-composites .gpumodel/images``;
one ``run`` per wheel part; then carry ``[".gpuwheels/SHA256SUMS", ".gpuwheels/unpack-wheels.sh",
".gpumodel"]`` and run ``bash .gpuwheels/unpack-wheels.sh && PYTHONPATH=/tmp/site python3
bench/gpu_check_segment.py .gpumodel/u2netp.batched.onnx --images .gpumodel/images`` (a few
minutes; timeout_s=420 leaves room for one rerun).

``--dry-run-cpu`` runs every code path it can on the CPU provider (batches 1 and 2, NumPy
in place of CuPy) so the script can be checked on a machine without a GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
import traceback
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import onnxruntime as ort

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

BATCHES = (1, 2, 4, 8, 16, 32, 64)
E2E_BATCHES = (1, 8, 32, 64)


def synth_product(h: int, w: int, seed: int) -> np.ndarray:
    """``(h, w, 3)`` uint8: a textured, shaded object on a near-white backdrop."""
    rng = np.random.default_rng(seed)
    img = np.full((h, w, 3), 240, np.uint8)
    field = cv2.resize(rng.integers(0, 256, (5, 5, 3), dtype=np.uint8), (w, h), interpolation=cv2.INTER_CUBIC)
    mask = np.zeros((h, w), np.uint8)
    cv2.ellipse(mask, (w // 2, h // 2), (int(w * 0.3), int(h * 0.38)), float(seed * 17), 0, 360, 1, -1)
    cv2.rectangle(mask, (int(w * 0.42), int(h * 0.05)), (int(w * 0.58), int(h * 0.2)), 1, -1)
    noise = rng.normal(0, 6, (h, w, 3))
    obj = np.clip(field.astype(np.float32) * 0.8 + noise, 0, 255).astype(np.uint8)
    img[mask > 0] = obj[mask > 0]
    return img


def export_composites(folder: Path) -> None:
    """Here (scikit-image needed): write composites ``NN.png`` and true masks ``NN.mask.png``."""
    from gpu_kernels.segment.samples import BACKGROUNDS, OBJECTS, SHAPES, make_composite

    folder.mkdir(parents=True, exist_ok=True)
    for k, obj in enumerate(OBJECTS):
        c = make_composite(obj, SHAPES[k], BACKGROUNDS[k])
        cv2.imwrite(str(folder / f"{k:02d}.png"), np.ascontiguousarray(c.image[..., ::-1]))
        cv2.imwrite(str(folder / f"{k:02d}.mask.png"), c.mask.astype(np.uint8) * 255)


def load_images(folder: Path | None, n: int, size: int) -> tuple[list[np.ndarray], list[np.ndarray | None]]:
    """Images (RGB) and their true masks where a ``NN.mask.png`` exists; else synthetic ones."""
    if folder is not None:
        files = [f for f in sorted(folder.glob("*.png")) if not f.name.endswith(".mask.png")][:n]
        imgs, truth = [], []
        for f in files:
            img = cv2.imread(str(f))
            if img is None:
                continue
            imgs.append(np.ascontiguousarray(img[..., ::-1]))
            mask = cv2.imread(str(f.with_suffix(".mask.png")), cv2.IMREAD_GRAYSCALE)
            truth.append(None if mask is None else mask >= 128)
        if imgs:
            return imgs, truth
    return [synth_product(size, size, k) for k in range(n)], [None] * n


def timed(fn: Callable[[], object], budget_s: float, warmup: int = 3, max_iters: int = 50) -> float:
    """Median seconds per call after ``warmup`` calls, iterating for about ``budget_s``."""
    for _ in range(warmup):
        fn()
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < max_iters and (time.perf_counter() - start < budget_s or len(times) < 3):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def bound_call(sess: ort.InferenceSession, inp: str, out: str, host: np.ndarray, gpu: bool) -> Callable[[], None]:
    """One IO-bound run: CuPy input and device output on the GPU, NumPy buffers on the CPU."""
    if not gpu:

        def cpu_bound() -> None:
            binding = sess.io_binding()
            binding.bind_cpu_input(inp, host)
            binding.bind_output(out, "cpu")
            sess.run_with_iobinding(binding)

        return cpu_bound
    import cupy

    dev = cupy.asarray(host)

    def gpu_bound() -> None:
        binding = sess.io_binding()
        binding.bind_input(inp, "cuda", 0, np.float32, tuple(dev.shape), dev.data.ptr)
        binding.bind_output(out, "cuda", 0)
        sess.run_with_iobinding(binding)
        binding.synchronize_outputs()

    return gpu_bound


def segment_call(seg: Any, images: list[np.ndarray], gpu: bool) -> Callable[[], None]:
    """One ``segment_batch`` call; on the GPU the images live on the device and it syncs."""
    if not gpu:
        return partial(seg.segment_batch, images)
    import cupy

    on_device = [cupy.asarray(i) for i in images]

    def call() -> None:
        seg.segment_batch(on_device)
        cupy.cuda.get_current_stream().synchronize()

    return call


def raw_model_grid(
    model: Path, providers: list[Any], batches: tuple[int, ...], gpu: bool, budget_s: float
) -> dict[str, Any]:
    sess = ort.InferenceSession(str(model), providers=providers)
    inp, out = sess.get_inputs()[0].name, sess.get_outputs()[0].name
    result: dict[str, Any] = {"session_providers": sess.get_providers(), "rows": []}
    for b in batches:
        host = np.random.default_rng(b).standard_normal((b, 3, 320, 320)).astype(np.float32)
        row: dict[str, Any] = {"batch": b}
        try:
            bound = bound_call(sess, inp, out, host, gpu)
            t_bound = timed(bound, budget_s)
            t_plain = timed(partial(sess.run, [out], {inp: host}), budget_s)
            row |= {
                "io_binding_ms": round(t_bound * 1e3, 3),
                "io_binding_img_s": round(b / t_bound, 1),
                "plain_ms": round(t_plain * 1e3, 3),
                "plain_img_s": round(b / t_plain, 1),
            }
        except Exception as exc:  # report and go on with the next batch size
            row["error"] = f"{type(exc).__name__}: {exc}"[:400]
        result["rows"].append(row)
        print(f"  batch {b:>3}: {row}", flush=True)
    return result


def end_to_end(
    model: Path, images: list[np.ndarray], batches: tuple[int, ...], gpu: bool, budget_s: float
) -> list[dict[str, Any]]:
    from gpu_kernels.segment import OnnxSegmenter

    rows = []
    for b in batches:
        for binding in (True, False):
            row: dict[str, Any] = {"batch": b, "io_binding": binding}
            try:
                seg = OnnxSegmenter(
                    model,
                    device="gpu" if gpu else "cpu",
                    max_batch=b,
                    use_tensorrt=False,
                    io_binding=binding,
                    warmup=True,
                )
                call = segment_call(seg, [images[k % len(images)] for k in range(b)], gpu)
                t = timed(call, budget_s, warmup=1)
                seg.close()
                row |= {"ms": round(t * 1e3, 2), "img_s": round(b / t, 1)}
            except Exception as exc:
                row["error"] = f"{type(exc).__name__}: {exc}"[:400]
            rows.append(row)
            print(f"  e2e {row}", flush=True)
    return rows


def iou(a: np.ndarray, b: np.ndarray) -> float:
    return float((a & b).sum() / max(int((a | b).sum()), 1))


def parity(model: Path, images: list[np.ndarray], truth: list[np.ndarray | None], gpu: bool) -> dict[str, Any]:
    from gpu_kernels.segment import OnnxSegmenter

    cpu_masks = OnnxSegmenter(model).segment_batch(images)
    if gpu:
        import cupy

        seg = OnnxSegmenter(model, device="gpu", max_batch=4, use_tensorrt=False)
        other = [cupy.asnumpy(m) for m in seg.segment_batch([cupy.asarray(i) for i in images])]
    else:
        from gpu_kernels.segment.ops import numpy_xp_ops

        other = OnnxSegmenter(model, max_batch=4, ops=numpy_xp_ops()).segment_batch(images)
    pairs = list(zip(cpu_masks, other, strict=True))
    result: dict[str, Any] = {
        "iou_gpu_vs_cpu": [round(iou(c >= 128, g >= 128), 4) for c, g in pairs],
        "mean_abs_alpha_diff": round(float(np.mean([np.abs(c.astype(int) - g).mean() for c, g in pairs])), 3),
    }
    known = [t for t in truth if t is not None]
    if len(known) == len(pairs):
        result["iou_vs_truth_gpu"] = [round(iou(g >= 128, t), 4) for (_, g), t in zip(pairs, known, strict=True)]
        result["iou_vs_truth_cpu"] = [round(iou(c >= 128, t), 4) for (c, _), t in zip(pairs, known, strict=True)]
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="GPU check for the segment stage (u2netp).")
    parser.add_argument("model", type=Path, help="u2netp with a symbolic batch dimension")
    parser.add_argument("--images", type=Path, default=None, help="folder of PNGs for parity/e2e")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--budget", type=float, default=1.0, help="seconds per timed configuration")
    parser.add_argument("--dry-run-cpu", action="store_true")
    parser.add_argument(
        "--export-composites",
        type=Path,
        default=None,
        help="write composites with true masks to this folder and exit",
    )
    args = parser.parse_args(argv)
    if args.export_composites is not None:
        export_composites(args.export_composites)
        return 0
    out = args.out or Path(os.environ.get("OUT", ".")) / "gpu_check_segment.json"
    report: dict[str, Any] = {
        "python": platform.python_version(),
        "onnxruntime": ort.__version__,
        "dry_run_cpu": args.dry_run_cpu,
    }
    gpu = not args.dry_run_cpu
    try:
        if gpu:
            if hasattr(ort, "preload_dlls"):
                try:
                    ort.preload_dlls()
                except Exception as exc:
                    report["preload_dlls_error"] = str(exc)[:300]
            import cupy

            report["device"] = cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()
        available = ort.get_available_providers()
        report["available_providers"] = available
        batches = BATCHES if gpu else (1, 2)
        e2e_batches = E2E_BATCHES if gpu else (1, 2)
        images, truth = load_images(args.images, 8, 1000 if gpu else 300)

        grids: dict[str, list[Any]] = (
            {"cuda": [("CUDAExecutionProvider", {"device_id": 0}), "CPUExecutionProvider"]}
            if gpu
            else {"cpu": ["CPUExecutionProvider"]}
        )
        if gpu and "TensorrtExecutionProvider" in available:
            grids["tensorrt"] = [
                (
                    "TensorrtExecutionProvider",
                    {
                        "device_id": 0,
                        "trt_fp16_enable": True,
                        "trt_profile_min_shapes": "input.1:1x3x320x320",
                        "trt_profile_max_shapes": "input.1:64x3x320x320",
                        "trt_profile_opt_shapes": "input.1:32x3x320x320",
                    },
                ),
                "CUDAExecutionProvider",
            ]
        for name, providers in grids.items():
            print(f"raw model, {name}:", flush=True)
            try:
                report[f"raw_{name}"] = raw_model_grid(args.model, providers, batches, gpu, args.budget)
            except Exception as exc:
                report[f"raw_{name}"] = {"error": f"{type(exc).__name__}: {exc}"[:600]}
        print("end to end (OnnxSegmenter):", flush=True)
        report["end_to_end"] = end_to_end(args.model, images, e2e_batches, gpu, args.budget)
        print("parity:", flush=True)
        report["parity"] = parity(args.model, images[:4], truth[:4], gpu)
        print(f"  {report['parity']}", flush=True)
        report["status"] = "ok"
    except Exception:
        report["status"] = "failed"
        report["error"] = traceback.format_exc()[-2000:]
        print(report["error"], file=sys.stderr)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    print(f"wrote {out}")
    return 0 if report["status"] == "ok" else 1


if __name__ == "__main__":
    raise SystemExit(main())
