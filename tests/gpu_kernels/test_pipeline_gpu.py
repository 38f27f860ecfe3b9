"""The whole pipeline on the GPU backend vs the CPU twin, on the sample catalog.

Skipped without CuPy or a CUDA device. Decoders differ (nvJPEG vs libjpeg-turbo IDCT) and the
model runs on another provider, so outputs are compared by size, format and closeness, not bytes.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from tests.gpu import cupy_or_skip

pytestmark = pytest.mark.gpu

cupy_or_skip()

from agents.wiring import build_pipeline  # noqa: E402
from gpu_kernels.backends import RetouchOptions  # noqa: E402
from gpu_kernels.pipeline import Job  # noqa: E402
from gpu_kernels.presets import load_presets  # noqa: E402
from gpu_kernels.spans import SpanRecorder  # noqa: E402
from streams.settings import Settings  # noqa: E402


def run(device: str, files: list[Path]) -> list[Any]:
    pipe, _ = build_pipeline(Settings(device=device, segmenter="classical"), device)
    presets = load_presets().resolve(["jd_main", "thumb_webp", "transparent_png"])
    jobs = [Job(f.read_bytes(), presets, RetouchOptions(), SpanRecorder()) for f in files]
    try:
        return pipe.run_batch(jobs)
    finally:
        pipe.close()


def test_gpu_pipeline_matches_the_cpu_twin(catalog: list[Path]) -> None:
    files = catalog[:8]
    gpu, cpu = run("gpu", files), run("cpu", files)
    for g, c in zip(gpu, cpu, strict=True):
        assert g.ok and c.ok, (g.error, c.error)
        for vg, vc in zip(g.variants, c.variants, strict=True):
            assert (vg.preset, vg.width, vg.height, vg.format) == (vc.preset, vc.width, vc.height, vc.format)
            ig = np.asarray(Image.open(io.BytesIO(vg.data)).convert("RGBA"), dtype=np.int16)
            ic = np.asarray(Image.open(io.BytesIO(vc.data)).convert("RGBA"), dtype=np.int16)
            assert ig.shape == ic.shape
            assert np.abs(ig - ic).mean() < 4.0, vg.preset  # decoder IDCT + lossy encode differences
