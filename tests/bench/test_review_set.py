"""The real-photo review set's kept judgement covers every image, and its framing tools map and
compare masks as the review table reads them (no photo is loaded: the set's wheels are fetched
only by the bench)."""

from __future__ import annotations

import numpy as np

from bench.bench_quality import JUDGEMENT, fingerprint, fingerprint_iou, framing_consistency, load_judgement
from bench.review.review_set import FRAMINGS, PHOTOS, ReviewItem, to_photo


def test_every_review_image_has_a_verdict_with_a_reason_for_each_tool() -> None:
    kept = load_judgement(JUDGEMENT)
    names = {f"{p.name}-{f}" for p in PHOTOS for f in FRAMINGS}
    assert set(kept) == names and len(names) >= 40
    for name, v in kept.items():
        assert v["class"] in {p.cls for p in PHOTOS}, name
        for who in ("lightbox", "rembg"):
            assert v[who] in ("accept", "reject") and v[f"{who}_why"].strip(), (name, who)
        assert len(bytes.fromhex(v["fingerprint"])) == 24 * 24 // 8


def test_fingerprints_tell_a_moved_mask_from_the_same_one() -> None:
    a = np.zeros((300, 400), np.uint8)
    a[50:250, 100:300] = 255
    b = a.copy()
    b[50:150, 100:300] = 0  # half the subject gone
    assert fingerprint_iou(fingerprint(a), fingerprint(a)) == 1.0
    assert fingerprint_iou(fingerprint(a), fingerprint(b)) < 0.6


def _item(photo_shape: tuple[int, int], box: tuple[int, int, int, int], scale: float) -> ReviewItem:
    x0, y0, x1, y1 = box
    size = (round((y1 - y0) * scale), round((x1 - x0) * scale))
    return ReviewItem(f"p-{box}", PHOTOS[0], "crop", box, np.zeros((*size, 3), np.uint8))


def test_framings_of_one_photo_are_compared_where_they_overlap() -> None:
    """A subject cut the same in two framings (each resized differently) scores ~1; one framing
    that drops half of it scores low; pixels outside a framing never count against it."""
    shape = (300, 400)
    truth = np.zeros(shape, np.uint8)
    truth[100:200, 120:280] = 255
    left, right = _item(shape, (0, 0, 300, 300), 2.0), _item(shape, (100, 0, 400, 300), 1.5)

    def framed(item: ReviewItem, mask: np.ndarray) -> np.ndarray:
        import cv2

        x0, y0, x1, y1 = item.box
        h, w = item.image.shape[:2]
        return cv2.resize(mask[y0:y1, x0:x1], (w, h), interpolation=cv2.INTER_NEAREST)

    same = framing_consistency([left, right], {left.name: framed(left, truth), right.name: framed(right, truth)})
    assert same[PHOTOS[0].name] > 0.95
    broken = truth.copy()
    broken[100:200, 200:280] = 0
    worse = framing_consistency([left, right], {left.name: framed(left, truth), right.name: framed(right, broken)})
    assert max(worse.values()) < 0.7
    mapped, covered = to_photo(left, framed(left, truth), shape)
    assert covered[:, :300].all() and not covered[:, 300:].any() and not mapped[:, 300:].any()
