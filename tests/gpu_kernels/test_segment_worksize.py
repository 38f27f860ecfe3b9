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
    real = bucketed.alpha_from_probability

    def spy(prob: Any, cfg: Any, ops: Any, image: Any = None) -> Any:
        seen.append(prob.shape[:2])
        return real(prob, cfg, ops, image)

    monkeypatch.setattr(bucketed, "alpha_from_probability", spy)
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
    real = bucketed.alpha_from_probability
    monkeypatch.setattr(bucketed, "alpha_from_probability",
                        lambda prob, cfg, ops, image=None: seen.append(prob.shape[:2]) or real(prob, cfg, ops, image))
    OnnxSegmenter(u2netp.original).segment_batch([img])
    assert seen == [img.shape[:2]]
