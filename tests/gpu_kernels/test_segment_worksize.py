"""The model segmenters refine masks of large photos at a working size of at most
``mask_work_pixels`` and hand back the alpha at the photo's size, matching a refinement at full
size closely (u2netp on scikit-image photographs enlarged to several megapixels)."""

from __future__ import annotations

from typing import Any

import cv2
import numpy as np
import pytest

from gpu_kernels.segment import bucketed
from gpu_kernels.segment.bucketed import MASK_WORK_PIXELS, mask_work_size
from gpu_kernels.segment.onnx_runner import OnnxSegmenter
from gpu_kernels.segment.runtime import mask_iou


def test_work_size_keeps_small_images_and_shrinks_large_ones() -> None:
    assert mask_work_size(480, 640, 1_000_000) == (480, 640)
    assert mask_work_size(3000, 4000, None) == (3000, 4000)
    h, w = mask_work_size(3000, 4000, 1_000_000)
    assert h * w <= 1_000_000 and h * w > 0.99 * 1_000_000
    assert abs(w / h - 4 / 3) < 0.01
    assert mask_work_size(1, 100_000, 1000) == (1, 1000)


def _photo(name: str, scale: float) -> np.ndarray:
    import skimage.data

    img = getattr(skimage.data, name)()
    h, w = img.shape[:2]
    return np.ascontiguousarray(cv2.resize(img, (round(w * scale), round(h * scale)), interpolation=cv2.INTER_CUBIC))


@pytest.mark.parametrize("name", ["coffee", "astronaut"])
def test_large_photo_refined_at_working_size_matches_full_size(u2netp: Any, name: str,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    img = _photo(name, 4.0)  # 3-4 MP
    seen: list[tuple[int, int]] = []
    real = bucketed.alpha_batch

    def spy(probs: Any, images: Any, cfg: Any, ops: Any) -> Any:
        seen.extend(p.shape[:2] for p in probs)
        return real(probs, images, cfg, ops)

    monkeypatch.setattr(bucketed, "alpha_batch", spy)
    seg = OnnxSegmenter(u2netp.original)
    fast = seg.segment_batch([img])[0]
    seg.mask_work_pixels = None
    full = seg.segment_batch([img])[0]
    assert fast.shape == full.shape == img.shape[:2] and fast.dtype == np.uint8
    assert seen[0][0] * seen[0][1] <= MASK_WORK_PIXELS  # refined at the working size
    assert seen[1] == img.shape[:2]  # and at full size when asked
    assert mask_iou(fast, full) >= 0.98
    assert fast.min() == 0 and fast.max() == 255


def test_small_photo_is_refined_at_its_own_size(u2netp: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    img = _photo("coffee", 1.0)
    seen: list[tuple[int, int]] = []
    real = bucketed.alpha_batch
    monkeypatch.setattr(bucketed, "alpha_batch",
                        lambda probs, images, cfg, ops: seen.extend(p.shape[:2] for p in probs) or real(
                            probs, images, cfg, ops))
    OnnxSegmenter(u2netp.original).segment_batch([img])
    assert seen == [img.shape[:2]]


def test_output_work_pixels_is_the_finest_canvas_scale_with_a_margin() -> None:
    """A subject filling the middle half of a 3000x4000 photo, on an 800² canvas at fill 0.8:
    640 canvas pixels along its limiting side for 2000 source pixels, so the refinement needs
    (1.5 * 0.32)² of the photo's pixels; a finer canvas raises that; a canvas that enlarges the
    subject, no canvas, or no subject in the map leaves the limit off; never below the floor."""
    prob = np.zeros((320, 320), np.float32)
    prob[80:240, 80:240] = 0.9
    out = bucketed.output_work_pixels(prob, 3000, 4000, [(800, 800, 0.8)])
    scale = 1.5 * 0.8 * min(800 / 2000, 800 / 1500)
    assert out is not None and abs(out - scale**2 * 12e6) <= 1
    finer = bucketed.output_work_pixels(prob, 3000, 4000, [(800, 800, 0.8), (1080, 1440, 0.8)])
    assert finer is not None and finer > out
    assert bucketed.output_work_pixels(prob, 3000, 4000, [(4000, 4000, 0.9)]) is None
    assert bucketed.output_work_pixels(prob, 3000, 4000, []) is None
    assert bucketed.output_work_pixels(np.zeros((320, 320), np.float32), 3000, 4000, [(800, 800, 0.8)]) is None
    assert bucketed.output_work_pixels(prob, 3000, 4000, [(64, 64, 0.8)]) == bucketed.WORK_FLOOR_PIXELS


def test_the_pipeline_refines_at_the_resolution_its_presets_reach(u2netp: Any,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Through the pipeline's refine stage: a 3-4 MP photo asked only for a 400² thumbnail is
    refined at the few pixels that canvas reaches (far under ``mask_work_pixels``), its alpha
    still at the photo's size and close to the full refinement's; asked also for Shopify's 2048²
    canvas, at the working size the segmenter allows."""
    from agents.wiring import build_processor
    from gpu_kernels.backends import RetouchOptions
    from gpu_kernels.pipeline import Job
    from gpu_kernels.spans import SpanRecorder
    from gpu_kernels.stages.base import run_lane
    from streams.settings import Settings

    img = _photo("astronaut", 4.0)  # 2048 x 2048
    data = cv2.imencode(".png", cv2.cvtColor(img, cv2.COLOR_RGB2BGR))[1].tobytes()
    seen: list[tuple[int, int]] = []
    real = bucketed.alpha_batch
    monkeypatch.setattr(bucketed, "alpha_batch",
                        lambda probs, images, cfg, ops: seen.extend(p.shape[:2] for p in probs) or real(
                            probs, images, cfg, ops))
    proc = build_processor(Settings(segmenter="model", device="cpu", segment_runtime="fp32"))
    try:
        book = proc.presets
        alphas = []
        for names in (["thumb_webp"], ["thumb_webp", "shopify"]):
            ctx = proc.pipeline.start([Job(data, [book[n] for n in names], RetouchOptions(), SpanRecorder())])
            for stage in proc.pipeline.stages:
                if stage.name in ("decode", "segment", "refine"):
                    run_lane(ctx, [stage], stage.lane)
            alphas.append(np.asarray(ctx.masks[0]))
    finally:
        proc.close()
    thumb, fine = seen
    assert thumb[0] * thumb[1] < 0.25 * img.shape[0] * img.shape[1]
    assert fine[0] * fine[1] > 0.9 * min(MASK_WORK_PIXELS, img.shape[0] * img.shape[1])
    assert alphas[0].shape == alphas[1].shape == img.shape[:2]
    assert mask_iou(alphas[0], alphas[1]) >= 0.97
