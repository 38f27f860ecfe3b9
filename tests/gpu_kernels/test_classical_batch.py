"""The classical segmenter on the device branch refines a batch together (``alpha_batch``) and
sends the batch's working copies to the host and back in one copy each way: over NumPy (the
CuPy branch's calls, counted), the same alpha, bit for bit, as each image segmented alone, and
host reads per batch, not per image."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import scipy.ndimage as ndi

from gpu_kernels.segment import ClassicalSegmenter
from gpu_kernels.segment.ops import XpOps
from gpu_kernels.segment.samples import make_composite
from schemas.errors import LightboxError

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.gpu.host_work import TALLY, _AsCupyx, _wrap, counted_modules


def _images() -> list[np.ndarray]:
    """Plain and gradient backdrops, two sizes (one twice), a cut-out RGBA, and an empty frame."""
    a = make_composite("coffee", "ellipse", "plain", size=(240, 320)).image
    b = make_composite("chelsea", "hexagon", "gradient", size=(240, 320)).image
    c = make_composite("rocket", "bottle", "plain", size=(300, 220), offset=(40, 0)).image
    cut = make_composite("astronaut", "ellipse", "plain", size=(200, 200))
    rgba = np.dstack([cut.image, (cut.mask * 255).astype(np.uint8)])
    empty = np.full((240, 320, 3), 238, np.uint8)
    return [a, b, c, rgba, empty, a.copy()]


def _same(want: list[Any], got: list[Any]) -> None:
    assert len(want) == len(got)
    for k, (w, g) in enumerate(zip(want, got, strict=True)):
        w, g = np.asarray(w).view(np.ndarray), np.asarray(g).view(np.ndarray)
        assert w.dtype == g.dtype == np.uint8 and w.shape == g.shape, k
        assert np.array_equal(w, g), (k, int((w != g).sum()))


def test_the_batch_equals_each_image_alone_over_numpy() -> None:
    seg = ClassicalSegmenter(ops=XpOps(np, ndi, "gpu"))
    images = _images()
    want = [seg.segment_batch([img])[0] for img in images]
    _same(want, seg.segment_batch(images))
    _same([seg._segment_one(img) for img in images[:3]], want[:3])


def test_the_batch_equals_each_image_alone_on_the_counted_device_branch_with_fewer_host_reads() -> None:
    xp, cndi = counted_modules()
    with _AsCupyx(cndi):
        seg = ClassicalSegmenter(ops=XpOps(xp, cndi, "gpu"))
        images = [_wrap(img) for img in _images()]
        plain = [k for k, img in enumerate(images) if img.shape[2] == 3]
        TALLY.__init__()  # type: ignore[misc]
        alone = [seg._segment_one(images[k]) for k in plain]
        syncs_alone = TALLY.syncs
        TALLY.__init__()  # type: ignore[misc]
        together = seg.segment_batch([images[k] for k in plain])
        syncs_together = TALLY.syncs
    _same(alone, together)
    # the per-image path reads back at least once per image (its working copy) plus its
    # refinement's turns; the batch reads the working copies once and its flags a few times
    assert syncs_alone >= 2 * len(plain)
    assert syncs_together < syncs_alone / 2, (syncs_together, syncs_alone)


def test_a_bad_image_gets_its_error_and_its_batch_mates_their_alpha() -> None:
    seg = ClassicalSegmenter(ops=XpOps(np, ndi, "gpu"))
    images: list[Any] = _images()[:3]
    images.insert(1, np.zeros((40, 40, 3), np.float32))  # not uint8
    out = seg.segment_batch(images)
    assert isinstance(out[1], LightboxError)
    _same([seg.segment_batch([images[k]])[0] for k in (0, 2, 3)], [out[k] for k in (0, 2, 3)])


@pytest.mark.parametrize("device", ["cpu"])
def test_the_cpu_twin_is_unchanged_image_by_image(device: str) -> None:
    seg = ClassicalSegmenter(device=device)
    images = _images()
    _same([seg.segment_batch([img])[0] for img in images], seg.segment_batch(images))
