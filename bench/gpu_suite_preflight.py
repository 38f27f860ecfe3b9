"""Preflight of the GPU validation run: everything the run needs, checked in seconds.

    python3 bench/gpu_suite_preflight.py --model FOLDER/model/u2netp.batched.onnx [--mode auto|gpu|cpu]

Checks, in order, and stops at the first that fails with one line saying what to bring:
every module the run imports (lightbox's own and its dependencies: from the
run's folder where the machine lacks them); the model file; and on a GPU: a CUDA device,
the driver's CUDA version (13: driver 580+), a CuPy kernel compiled at run time (CUDA headers),
a GPU JPEG decoder (DALI or torchvision's nvJPEG) and a model runtime on the device (ONNX
Runtime's CUDA provider or torch with CUDA). Exit 0 prints one JSON line of what it found (the
run's mode: "gpu", or "cpu" where there is no device); exit 1 prints ``preflight: ...``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# What the run's steps import, at module level or inside the code paths they take.
MODULES = (
    "numpy", "cv2", "PIL", "onnxruntime", "streams.settings", "schemas.events", "agents.wiring", "lightbox.offline",
    "lightbox.report", "gpu_kernels.codec", "gpu_kernels.segment", "gpu_kernels.retouch", "gpu_kernels.pipeline",
    "simplejpeg", "onnx",
)


class Failed(Exception):
    pass


def check_imports() -> None:
    for name in MODULES:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            missing = exc.name or name
            raise Failed(f"Python module {missing!r} is missing (needed by {name}): put its wheel in the run's "
                         "folder (bench/gpu_suite_pack.py makes it)") from exc


def check_gpu() -> dict[str, Any]:
    found: dict[str, Any] = {}
    try:
        import cupy
    except ImportError as exc:
        raise Failed("a GPU run needs CuPy (cupy-cuda13x): put its wheel in the run's folder") from exc
    from gpu_kernels.device_probe import cupy_jit, driver_floor

    if (why := driver_floor(cupy)) is not None:
        raise Failed(why)
    if (why := cupy_jit(cupy)) is not None:
        raise Failed(why)
    props = cupy.cuda.runtime.getDeviceProperties(0)
    found["gpu"] = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    found["driver_cuda"] = int(cupy.cuda.runtime.driverGetVersion())
    from gpu_kernels.codec import gpu_decoder_choice

    decoder, why = gpu_decoder_choice()
    if decoder is None:
        raise Failed(why)
    found["decoder"] = decoder
    import onnxruntime as ort

    runtimes = ["onnxruntime-cuda"] if "CUDAExecutionProvider" in ort.get_available_providers() else []
    if not runtimes:  # torch only when needed: its import alone can take seconds of the 15
        from gpu_kernels.segment.machine import torch_cuda_available

        if torch_cuda_available():
            runtimes.append("torch-cuda")
    if not runtimes:
        raise Failed("no model runtime on the GPU: bring onnxruntime-gpu (CUDA 13 build) or torch with CUDA")
    found["model_runtimes"] = runtimes
    return found


def device_count() -> int:
    try:
        import cupy

        return int(cupy.cuda.runtime.getDeviceCount())
    except Exception:  # no CuPy, no driver
        return 0


def preflight(model: Path, mode: str) -> dict[str, Any]:
    check_imports()
    if not model.is_file() or model.stat().st_size < 1_000_000:
        raise Failed(f"no model at {model}: put u2netp.batched.onnx in the run's folder (model/)")
    gpus = device_count()
    if mode == "gpu" and gpus == 0:
        raise Failed("no CUDA device visible (nvidia-smi; in a container: --gpus 1)")
    found: dict[str, Any] = {"mode": "gpu" if gpus and mode != "cpu" else "cpu", "python": sys.version.split()[0],
                             "devices": gpus, "model": str(model)}
    if found["mode"] == "gpu":
        found |= check_gpu()
    import numpy as np
    import onnxruntime as ort

    found |= {"numpy": np.__version__, "onnxruntime": ort.__version__}
    return found


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--mode", choices=("auto", "gpu", "cpu"), default="auto")
    args = ap.parse_args(argv)
    try:
        found = preflight(args.model, args.mode)
    except Failed as exc:
        print(f"preflight: {exc}", flush=True)
        return 1
    from bench.gpu_rows import append

    append(found, kind="preflight")
    print(json.dumps(found), flush=True)
    mode_file = os.environ.get("GPU_SUITE_MODE_FILE")
    if mode_file:
        Path(mode_file).write_text(found["mode"] + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
