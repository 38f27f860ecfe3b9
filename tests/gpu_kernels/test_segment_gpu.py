"""GPU twins of the segment stage against their CPU versions (skipped without CuPy + a device).

The ONNX tests also need onnxruntime-gpu (the CUDA execution provider); they skip with that
reason otherwise. Tolerances: resizes within 1 grey level (uint8 rounding on the CPU side),
masks IoU >= 0.97 (float32 matrix resizes vs OpenCV's fixed point, TF32/cuDNN kernels).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import onnxruntime as ort
import pytest

from gpu_kernels.segment import (
    ClassicalSegmenter,
    MaskPostprocess,
    ModelFiles,
    OnnxSegmenter,
    alpha_from_probability,
)
from gpu_kernels.segment.ops import CpuOps, XpOps, cupy_ops
from gpu_kernels.segment.samples import make_composite
from tests.gpu import cupy_or_skip

pytestmark = pytest.mark.gpu

cupy = cupy_or_skip()

needs_ort_gpu = pytest.mark.skipif(
    "CUDAExecutionProvider" not in ort.get_available_providers(),
    reason="onnxruntime-gpu (CUDAExecutionProvider) is not installed",
)


def iou(a: np.ndarray, b: np.ndarray) -> float:
    return float((a & b).sum() / max(int((a | b).sum()), 1))


CASES = [
    make_composite("coffee", "ellipse", "plain"),
    make_composite("chelsea", "star", "gradient"),
    make_composite("astronaut", "hexagon", "brick"),
    make_composite("rocket", "bottle", "grass", size=(480, 720)),
    make_composite("coffee", "hexagon", "gradient", size=(1200, 1600)),
]


@pytest.fixture(scope="module")
def gpu_seg(u2netp: ModelFiles) -> Iterator[OnnxSegmenter]:
    seg = OnnxSegmenter(u2netp.batched, device="gpu", max_batch=4, use_tensorrt=False, warmup=True)
    yield seg
    seg.close()


def test_cupy_ops_match_opencv() -> None:
    gpu, cpu = cupy_ops(), CpuOps()
    img = CASES[1].image
    for h, w in [(320, 320), (91, 130), (900, 1200)]:
        a = cpu.resize_image(img, h, w)
        b = cupy.asnumpy(gpu.resize_image(cupy.asarray(img), h, w))
        assert np.abs(a - b).max() <= 1.0
    prob = np.random.default_rng(1).random((64, 80)).astype(np.float32)
    assert np.allclose(
        cpu.resize_map(prob, 300, 420),
        cupy.asnumpy(gpu.resize_map(cupy.asarray(prob), 300, 420)),
        atol=1e-4,
    )
    mask = CASES[0].mask
    assert np.array_equal(cpu.erode(mask, 2), cupy.asnumpy(gpu.erode(cupy.asarray(mask), 2)))
    speckled = mask.copy()
    speckled[:4, :4] = True
    assert np.array_equal(
        cpu.keep_large_components(speckled, 0.05),
        cupy.asnumpy(gpu.keep_large_components(cupy.asarray(speckled), 0.05)),
    )


def test_cupy_postprocess_matches_cpu() -> None:
    yy, xx = np.mgrid[0:300, 0:400]
    prob = np.clip(1.5 - np.hypot((yy - 150) / 90, (xx - 200) / 120), 0, 1).astype(np.float32)
    cfg = MaskPostprocess()
    a = alpha_from_probability(prob, cfg, CpuOps())
    b = cupy.asnumpy(alpha_from_probability(cupy.asarray(prob), cfg, cupy_ops()))
    assert np.abs(a.astype(int) - b).max() <= 2
    assert not b[prob < cfg.threshold].any()


@needs_ort_gpu
def test_onnx_gpu_matches_cpu_and_stays_on_device(u2netp: ModelFiles, gpu_seg: OnnxSegmenter) -> None:
    assert gpu_seg.device == "gpu" and gpu_seg.io_binding
    assert "CUDAExecutionProvider" in gpu_seg.providers
    images = [cupy.asarray(c.image) for c in CASES]  # 5 images: buckets 4 + 1
    before = [cupy.asnumpy(x) for x in images]
    masks = gpu_seg.segment_batch(images)
    cpu = OnnxSegmenter(u2netp.batched).segment_batch([c.image for c in CASES])
    for c, g, m, x, b in zip(CASES, masks, cpu, images, before, strict=True):
        assert isinstance(g, cupy.ndarray) and g.dtype == cupy.uint8 and g.shape == c.mask.shape
        assert iou(cupy.asnumpy(g) >= 128, m >= 128) >= 0.97, c.name
        assert np.array_equal(cupy.asnumpy(x), b)


def test_classical_gpu_matches_cpu() -> None:
    gpu, cpu = ClassicalSegmenter(device="gpu"), ClassicalSegmenter()
    for c in CASES[:2] + CASES[4:]:
        g = gpu.segment_batch([cupy.asarray(c.image)])[0]
        assert isinstance(g, cupy.ndarray) and g.shape == c.mask.shape
        assert iou(cupy.asnumpy(g) >= 128, cpu.segment_batch([c.image])[0] >= 128) >= 0.98, c.name


def test_xp_ops_is_the_gpu_backend() -> None:
    ops = cupy_ops()
    assert isinstance(ops, XpOps) and ops.device == "gpu" and ops.xp is cupy


def test_cupy_mask_cleanup_matches_cpu() -> None:
    """Guided edge, hole filling and island dropping with the photo: CuPy vs OpenCV."""
    from tests.gpu_kernels.test_segment import _holed_scene

    image, prob = _holed_scene()
    import cv2

    blurred = cv2.GaussianBlur(prob, (0, 0), 2.0)
    cfg = MaskPostprocess()
    a = alpha_from_probability(blurred, cfg, CpuOps(), image)
    b = cupy.asnumpy(alpha_from_probability(cupy.asarray(blurred), cfg, cupy_ops(), cupy.asarray(image)))
    assert (np.abs(a.astype(int) - b) > 2).mean() < 0.001
