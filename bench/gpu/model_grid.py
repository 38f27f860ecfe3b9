"""Model throughput by batch on the GPU: fp32 / fp16, CUDA graphs off / on, TensorRT when present.

For each precision (fp32; fp16 = the ``make_fp16`` copy) and each mode (plain IO binding,
CUDA graphs: one captured graph per bucket), ``OnnxSegmenter._infer`` on a prepared
``(B, 3, 320, 320)`` CuPy batch, B = 1, 2, 4, ..., 64: median ms per batch and images/s
(CUDA-synchronised). With TensorRT in onnxruntime, a TensorRT row too. Then the FP16 fidelity
gate on this GPU: fp16 masks vs fp32 masks on the gate images (``--gate-images`` DIR of PNGs
written here by ``--export-gate-images DIR``, as scikit-image is not on the GPU machine).

    python3 bench/gpu/model_grid.py MODEL.onnx [--gate-images DIR] [--out FILE]
    python3 bench/gpu/model_grid.py MODEL.onnx --dry-run-cpu     # the code paths on the CPU
    python3 bench/gpu/model_grid.py MODEL.onnx --torch [--dry-run-cpu]   # the PyTorch runtime

``--torch``: the same grid with ``TorchSegmenter`` (needs only torch's CUDA build and CuPy, no
onnxruntime-gpu): fp16 / bf16 / fp32 (autocast), eager and with CUDA graphs per bucket, then
fp16 + ``torch.compile`` + CUDA graphs while time is left (``--deadline``), and the torch-fp16
gate against ONNX Runtime fp32 masks (the CPU provider when onnxruntime has no CUDA).

Without CuPy and a CUDA device (and without ``--dry-run-cpu``) it writes
``{"status": "skipped", "reason": ...}`` and exits 0. ``--dry-run-cpu`` runs fp32 and fp16 on
ONNX Runtime's CPU provider at batch 1 and 2; CUDA graphs and TensorRT are reported skipped.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cv2
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.gpu.rows import append as append_row

BATCHES = (1, 2, 4, 8, 16, 32, 64)


def gpu_count() -> tuple[int, str]:
    try:
        import cupy

        return int(cupy.cuda.runtime.getDeviceCount()), ""
    except Exception as exc:  # no CuPy, no driver, no device
        return 0, f"{type(exc).__name__}: {exc}"


def median_s(fn: Callable[[], object], sync: Callable[[], None], budget_s: float, max_iters: int = 40) -> float:
    for _ in range(min(2, max_iters)):
        fn()
    sync()
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < max_iters and (time.perf_counter() - start < budget_s or len(times) < 3):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def export_gate_images(folder: Path) -> None:
    """Here (scikit-image needed): the gate set as PNGs."""
    from gpu_kernels.segment.runtime import gate_images

    folder.mkdir(parents=True, exist_ok=True)
    for k, img in enumerate(gate_images()):
        cv2.imwrite(str(folder / f"gate-{k:02d}.png"), np.ascontiguousarray(img[..., ::-1]))


def load_gate_images(folder: Path | None) -> list[np.ndarray]:
    if folder is None:
        try:
            from gpu_kernels.segment.runtime import gate_images

            return gate_images()
        except ImportError:
            return []
    out = []
    for f in sorted(folder.glob("gate-*.png")):
        img = cv2.imread(str(f))
        if img is not None:
            out.append(np.ascontiguousarray(img[..., ::-1]))
    return out


def _array_module(gpu: bool) -> tuple[Any, Callable[[], None]]:
    """(CuPy and a device synchronize) on a GPU, else (NumPy and a no-op)."""
    if gpu:
        import cupy

        return cupy, lambda: cupy.cuda.Device().synchronize()
    return np, lambda: None


def batch_rows(seg: Any, batches: tuple[int, ...], xp: Any, sync: Callable[[], None], budget_s: float,
               base: dict[str, Any], deadline: float | None = None, max_iters: int = 40) -> list[dict[str, Any]]:
    """One row per batch size: ``seg._infer``'s median ms per batch and images/s (or the error),
    each printed as it lands; stops at ``deadline`` (a perf_counter time) when given."""
    rows: list[dict[str, Any]] = []
    for b in batches:
        if deadline is not None and time.perf_counter() > deadline:
            break
        x = xp.asarray(np.random.default_rng(b).random((b, 3, 320, 320), dtype=np.float32))
        row: dict[str, Any] = {**base, "batch": b}
        try:
            s = median_s(lambda x=x: seg._infer(x), sync, budget_s, max_iters)
            row |= {"ms_per_batch": round(s * 1000, 3), "img_per_s": round(b / s, 1)}
        except Exception as exc:
            row["error"] = f"{type(exc).__name__}: {exc}"[:400]
        rows.append(row)
        append_row(row)
        print(json.dumps(row), flush=True)
    return rows


def tensorrt_active(providers: list[str]) -> bool:
    """Whether the session really runs on TensorRT: ONNX Runtime drops a provider it cannot start
    and rebuilds the session on the next one (CUDA), so asking for TensorRT proves nothing."""
    return "TensorrtExecutionProvider" in providers


def fp16_copy(model: Path) -> Path:
    """The fp16 copy of ``model`` (converted once, cached in the temp folder); raises what the
    conversion raises (onnxconverter-common missing, an op it cannot convert)."""
    from gpu_kernels.segment.variants import derived_path, make_fp16

    fp16 = derived_path(model, "fp16", Path(tempfile.gettempdir()) / "lightbox-variants")
    if not fp16.is_file():
        make_fp16(model, fp16)
    return fp16


def grid(model: Path, gpu: bool, batches: tuple[int, ...], budget_s: float) -> list[dict[str, Any]]:
    """fp32 then fp16 by mode; the fp16 rows say why when the fp16 copy cannot be made."""
    from gpu_kernels.segment import OnnxSegmenter

    rows: list[dict[str, Any]] = []
    paths: list[tuple[str, Path | None, str]] = [("fp32", model, "")]
    try:
        paths.append(("fp16", fp16_copy(model), ""))
    except Exception as exc:
        paths.append(("fp16", None, f"fp16 copy failed: {type(exc).__name__}: {exc}"[:400]))
    xp, sync = _array_module(gpu)
    modes = [("plain", {"cuda_graphs": False, "use_tensorrt": False})]
    if gpu:
        modes.append(("cuda_graphs", {"cuda_graphs": True, "use_tensorrt": False}))
        import onnxruntime as ort

        if "TensorrtExecutionProvider" in ort.get_available_providers():
            modes.append(("tensorrt", {"cuda_graphs": False, "use_tensorrt": True}))
    # TensorRT last: its engine build may take minutes, and it builds its own fp16 engine from fp32
    order = [(p, m) for m in modes if m[0] != "tensorrt" for p in paths] + \
        [(paths[0], m) for m in modes if m[0] == "tensorrt"]
    for (precision, path, why), (mode, opts) in order:
        if path is None:
            rows.append(_noted({"precision": precision, "mode": mode, "error": why}))
            continue
        t0 = time.perf_counter()
        try:
            seg = OnnxSegmenter(path, device="gpu" if gpu else "cpu", max_batch=max(batches), **opts) \
                if gpu else OnnxSegmenter(path, max_batch=max(batches), threads=2)
        except Exception as exc:
            rows.append(_noted({"precision": precision, "mode": mode,
                                "error": f"{type(exc).__name__}: {exc}"[:400]}))
            continue
        setup = time.perf_counter() - t0
        if mode == "tensorrt" and not tensorrt_active(seg.providers):
            rows.append(_noted({"precision": precision, "mode": mode, "providers": seg.providers,
                                "skipped": "TensorRT did not start (the session runs on CUDA): no tensorrt row"}))
            seg.close()
            continue
        rows += batch_rows(seg, batches, xp, sync, budget_s, {"precision": precision, "mode": mode},
                           max_iters=40 if gpu else 1)
        extra = {"precision": precision, "mode": mode, "setup_s": round(setup, 2), "providers": seg.providers}
        if mode == "cuda_graphs":
            extra |= {"graph_buckets": list(seg.cuda_graph_buckets), "graph_errors": seg.cuda_graph_errors}
        rows.append(_noted(extra, "setup"))
        seg.close()
    return rows


def _noted(row: dict[str, Any], kind: str = "row") -> dict[str, Any]:
    append_row(row, kind=kind)
    return row


def torch_grid(model: Path, gpu: bool, batches: tuple[int, ...], budget_s: float,
               deadline: float) -> list[dict[str, Any]]:
    """TorchSegmenter._infer by batch: precision x (eager, CUDA graphs), then compiled fp16 while
    ``deadline`` (a perf_counter time) allows."""
    from gpu_kernels.segment.torch_runner import TorchSegmenter

    xp, sync = _array_module(gpu)
    configs: list[tuple[str, str, dict[str, Any]]] = [("fp16", "eager", {}), ("fp16", "cuda_graphs", {})]
    if gpu:
        configs += [("bf16", "eager", {}), ("bf16", "cuda_graphs", {}), ("fp32", "eager", {}),
                    ("fp32", "cuda_graphs", {}), ("fp16", "compile+cuda_graphs", {"compile": True})]
    else:
        configs = [("fp32", "eager", {})]
    rows: list[dict[str, Any]] = []
    for precision, mode, opts in configs:
        if time.perf_counter() > deadline:
            rows.append({"runtime": "torch", "precision": precision, "mode": mode, "skipped": "out of time"})
            continue
        t0 = time.perf_counter()
        try:
            seg = TorchSegmenter(model, device="gpu" if gpu else "cpu", precision=precision, max_batch=max(batches),
                                 cuda_graphs="cuda_graphs" in mode, threads=None if gpu else 2, **opts)
        except Exception as exc:
            rows.append({"runtime": "torch", "precision": precision, "mode": mode,
                         "error": f"{type(exc).__name__}: {exc}"[:400]})
            continue
        rows += batch_rows(seg, batches, xp, sync, budget_s,
                           {"runtime": "torch", "precision": f"torch-{precision}", "mode": mode}, deadline,
                           max_iters=40 if gpu else 1)
        rows.append(_noted({"runtime": "torch", "precision": f"torch-{precision}", "mode": mode,
                            "setup_and_run_s": round(time.perf_counter() - t0, 2), "providers": seg.providers,
                            "graph_buckets": list(seg.cuda_graph_buckets), "graph_errors": seg.cuda_graph_errors,
                            "compile_error": seg.compile_error}, "setup"))
        seg.close()
    return rows


def torch_gate(model: Path, gpu: bool, images: list[np.ndarray]) -> dict[str, Any]:
    """torch fp16 (GPU; fp32 on a CPU dry run) masks against ONNX Runtime fp32 masks."""
    from dataclasses import asdict

    import onnxruntime as ort

    from gpu_kernels.segment import OnnxSegmenter
    from gpu_kernels.segment.runtime import run_gate
    from gpu_kernels.segment.torch_runner import TorchSegmenter

    if not images:
        return {"status": "skipped", "reason": "no gate images (pass --gate-images DIR)"}
    ort_gpu = gpu and "CUDAExecutionProvider" in ort.get_available_providers()
    ref = OnnxSegmenter(model, device="gpu", use_tensorrt=False) if ort_gpu else OnnxSegmenter(model)
    imgs: list[Any] = list(images if gpu else images[:3])
    if ort_gpu:
        import cupy

        imgs = [cupy.asarray(i) for i in imgs]
    cand = TorchSegmenter(model, device="gpu", precision="fp16") if gpu else TorchSegmenter(model, threads=2)
    result = asdict(run_gate("torch-fp16" if gpu else "torch-fp32", cand, ref, imgs))
    result["reference"] = "onnxruntime fp32 on the " + ("GPU" if ort_gpu else "CPU")
    result["device"] = "gpu" if gpu else "cpu (dry run, 3 images)"
    return result


def fp16_gate(model: Path, fp16: Path, gpu: bool, images: list[np.ndarray]) -> dict[str, Any]:
    from dataclasses import asdict

    from gpu_kernels.segment import OnnxSegmenter
    from gpu_kernels.segment.runtime import run_gate

    if not images:
        return {"status": "skipped", "reason": "no gate images (pass --gate-images DIR)"}
    if gpu:
        import cupy

        imgs: list[Any] = [cupy.asarray(i) for i in images]
        ref = OnnxSegmenter(model, device="gpu", max_batch=1, use_tensorrt=False)
        cand = OnnxSegmenter(fp16, device="gpu", max_batch=1, use_tensorrt=False)
    else:
        imgs = list(images[:1])
        ref, cand = OnnxSegmenter(model, threads=2), OnnxSegmenter(fp16, threads=2)
    result = asdict(run_gate("fp16", cand, ref, imgs))
    result["device"] = "gpu" if gpu else "cpu (dry run, 1 image)"
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("model", type=Path, nargs="?", help="u2netp with a symbolic batch dimension")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")) / "gpu_model_grid.json")
    ap.add_argument("--gate-images", type=Path, default=None)
    ap.add_argument("--export-gate-images", type=Path, default=None, help="write the gate PNGs here and exit")
    ap.add_argument("--budget", type=float, default=0.6, help="timed seconds per configuration")
    ap.add_argument("--dry-run-cpu", action="store_true")
    ap.add_argument("--torch", action="store_true", help="the PyTorch runtime's grid and gate instead")
    ap.add_argument("--deadline", type=float, default=70.0, help="--torch: seconds before no new row starts")
    args = ap.parse_args(argv)
    if args.export_gate_images:
        export_gate_images(args.export_gate_images)
        print(f"wrote the gate images to {args.export_gate_images}")
        return 0
    if args.model is None:
        ap.error("MODEL is required")
    n, why = gpu_count()
    gpu = n > 0 and not args.dry_run_cpu
    result: dict[str, Any] = {"status": "ok", "device": "gpu" if gpu else "cpu", "errors": {}}
    if not gpu and not args.dry_run_cpu:
        result |= {"status": "skipped", "reason": f"no CUDA device ({why or '0 devices'})"}
        _write(args.out, result)
        print(result["reason"])
        return 0
    if args.torch:
        return _torch_main(args, gpu, result)
    if not gpu:
        result["skipped"] = "CPU dry run: CUDA graphs and TensorRT need a GPU; batch 1, one timed run"
    steps: list[tuple[str, Callable[[], Any]]] = [
        ("grid", lambda: grid(args.model, gpu, BATCHES if gpu else (1,), args.budget if gpu else 0.0)),
        ("fp16_gate", lambda: fp16_gate(args.model, fp16_copy(args.model), gpu, load_gate_images(args.gate_images))),
    ]
    return _run_steps(steps, args.out, result)


def _torch_main(args: argparse.Namespace, gpu: bool, result: dict[str, Any]) -> int:
    from gpu_kernels.segment.machine import torch_available, torch_cuda_available

    deadline = time.perf_counter() + args.deadline
    result["runtime"] = "torch"
    if not torch_available() or (gpu and not torch_cuda_available()):
        result |= {"status": "skipped", "reason": "torch (with CUDA on a GPU) is not installed here"}
        _write(args.out, result)
        print(result["reason"])
        return 0
    if not gpu:
        result["skipped"] = "CPU dry run: torch fp32 eager at batches 1 and 2; CUDA graphs and compile need a GPU"
    from gpu_kernels.segment.onnx_torch import import_torch

    result["torch"] = import_torch().__version__
    steps: list[tuple[str, Callable[[], Any]]] = [
        ("grid", lambda: torch_grid(args.model, gpu, BATCHES if gpu else (1, 2), args.budget if gpu else 0.05,
                                    deadline)),
        ("gate", lambda: torch_gate(args.model, gpu, load_gate_images(args.gate_images))),
    ]
    return _run_steps(steps, args.out, result)


def _run_steps(steps: list[tuple[str, Callable[[], Any]]], out: Path, result: dict[str, Any]) -> int:
    """Each step in turn, its result (or its traceback) written to ``out`` as soon as it ends; the
    exit code: 0 when every step ran."""
    for name, step in steps:
        try:
            result[name] = step()
            if name != "grid":
                append_row({"part": name, **result[name]} if isinstance(result[name], dict) else {"part": name},
                           kind=name)
        except Exception:
            result["errors"][name] = traceback.format_exc(limit=6)
            append_row({"part": name, "error": result["errors"][name][-600:]}, kind="error")
            print(f"[{name}] FAILED\n{result['errors'][name]}", flush=True)
        _write(out, result)
    if result["errors"]:
        result["status"] = "partial"
    _write(out, result)
    print(f"status {result['status']}; wrote {out}")
    return 0 if result["status"] == "ok" else 1


def _write(path: Path, result: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    raise SystemExit(main())
