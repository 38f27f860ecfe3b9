"""The batched device refinement and edge colours on CuPy against the per-image device code
(skipped without CuPy + a device). Over NumPy they are equal bit for bit
(test_postprocess_batch.py, test_matting_device.py); on a GPU the batched products may round
differently from single ones (cuBLAS picks its kernels by shape), so: alphas within a level
almost everywhere, the same cut-out outline; edge colours within a level."""

from __future__ import annotations

import numpy as np
import pytest

from bench.gpu.host_work import synth
from gpu_kernels.retouch.matting_device import decontaminate_batch, decontaminate_device
from gpu_kernels.segment.ops import cupy_ops
from gpu_kernels.segment.postprocess import MaskPostprocess, alpha_from_probability
from gpu_kernels.segment.postprocess_batch import alpha_batch
from tests.gpu import cupy_or_skip

pytestmark = pytest.mark.gpu

cupy = cupy_or_skip()


def _photos(size: int) -> list[tuple[np.ndarray, np.ndarray]]:
    out = [synth(k, size) for k in range(6)]
    img, prob = synth(6, size)
    island = prob.copy()
    island[4:4 + size // 12, 4:4 + size // 12] = 1.0  # refined on its own
    out.append((img, island))
    return out


def test_batched_refinement_on_the_device_matches_the_per_image_one() -> None:
    ops = cupy_ops()
    cfg = MaskPostprocess()
    photos = _photos(600)
    probs = [cupy.asarray(p) for _, p in photos]
    images = [cupy.asarray(i) for i, _ in photos]
    got = alpha_batch(probs, images, cfg, ops)
    for p, i, g in zip(probs, images, got, strict=True):
        want = cupy.asnumpy(alpha_from_probability(p, cfg, ops, i)).astype(np.int16)
        have = cupy.asnumpy(g).astype(np.int16)
        assert np.mean(np.abs(want - have) > 1) < 1e-3
        assert np.mean((want >= 128) != (have >= 128)) < 1e-4


def test_batched_edge_colours_on_the_device_match_the_per_image_ones() -> None:
    ops = cupy_ops()
    photos = _photos(600)
    images = [cupy.asarray(i) for i, _ in photos]
    alphas = [alpha_from_probability(cupy.asarray(p), MaskPostprocess(), ops, im) for (_, p), im in zip(photos, images,
                                                                                                       strict=True)]
    got = decontaminate_batch(cupy, images, alphas)
    for im, a, g in zip(images, alphas, got, strict=True):
        want = cupy.asnumpy(decontaminate_device(cupy, im, a)).astype(np.int16)
        assert int(np.abs(want - cupy.asnumpy(g)).max()) <= 1
