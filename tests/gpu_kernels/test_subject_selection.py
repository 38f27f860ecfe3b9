"""Subject selection in mask post-processing: every part of the product kept, edge clutter dropped."""

from __future__ import annotations

import cv2
import numpy as np

from gpu_kernels.segment import MaskPostprocess, alpha_from_probability
from gpu_kernels.segment.ops import CpuOps

BACKDROP = (242, 232, 210)  # cream paper


def scene() -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """A white box (the product) with a red lid beside it, a red flag and a white card cut by the
    frame's edges, on cream; ``(image, probability, parts)``."""
    h, w = 400, 600
    image = np.zeros((h, w, 3), np.uint8)
    image[...] = BACKDROP
    parts = {k: np.zeros((h, w), np.uint8) for k in ("box", "lid", "flag", "card")}
    cv2.rectangle(parts["box"], (220, 100), (380, 330), 1, -1)
    cv2.rectangle(parts["lid"], (400, 280), (470, 330), 1, -1)
    cv2.fillPoly(parts["flag"], [np.array([[0, 20], [110, 40], [100, 150], [0, 140]], np.int32)], 1)
    cv2.rectangle(parts["card"], (530, 150), (599, 260), 1, -1)
    colours = {"box": (246, 246, 244), "lid": (190, 40, 40), "flag": (180, 30, 40), "card": (240, 240, 238)}
    prob = np.zeros((h, w), np.float32)
    for k, m in parts.items():
        image[m.astype(bool)] = colours[k]
        prob[m.astype(bool)] = 0.97
    return image, prob, {k: m.astype(bool) for k, m in parts.items()}


def test_an_unlike_object_at_the_frame_s_edge_goes_and_every_part_of_the_product_stays() -> None:
    image, prob, parts = scene()
    alpha = alpha_from_probability(prob, MaskPostprocess(), CpuOps(), image) >= 128
    assert alpha[parts["box"]].mean() > 0.97
    assert alpha[parts["lid"]].mean() > 0.97  # another colour, but not cut by the frame: a part
    assert alpha[parts["card"]].mean() > 0.97  # at the edge, but like the product: kept
    assert alpha[parts["flag"]].mean() < 0.01  # at the edge and unlike the product: dropped


def test_edge_clutter_removal_can_be_switched_off() -> None:
    image, prob, parts = scene()
    alpha = alpha_from_probability(prob, MaskPostprocess(clutter_delta_e=0.0), CpuOps(), image) >= 128
    assert alpha[parts["flag"]].mean() > 0.97


def test_in_a_spread_of_items_the_ones_cut_by_the_frame_stay() -> None:
    """With two separate items inside the frame besides the box (the lid and a blue sweet), the
    red piece cut by the frame is one more item, not clutter; with one (the lid) it is clutter,
    and ``clutter_items=0`` asks for the rule whatever the count."""
    image, prob, parts = scene()
    sweet = np.zeros(prob.shape, np.uint8)
    cv2.circle(sweet, (150, 300), 30, 1, -1)
    image[sweet.astype(bool)] = (40, 60, 200)
    prob[sweet.astype(bool)] = 0.97
    alpha = alpha_from_probability(prob, MaskPostprocess(), CpuOps(), image) >= 128
    assert alpha[parts["flag"]].mean() > 0.97 and alpha[sweet.astype(bool)].mean() > 0.97
    strict = alpha_from_probability(prob, MaskPostprocess(clutter_items=0), CpuOps(), image) >= 128
    assert strict[parts["flag"]].mean() < 0.01 and strict[parts["box"]].mean() > 0.97


def test_islands_keep_the_large_and_the_near_ones_and_only_mid_sized_ones_ask_how_near() -> None:
    """``drop_islands`` against the rule written out: a component stays when it is at least
    ``min_component`` of the largest and either at least ``far_component`` of it or within ``near``
    of it. The distance transform it needs only for the mid-sized ones is skipped when there are
    none, with the same masks."""
    from gpu_kernels.segment.postprocess import drop_islands

    cfg, ops = MaskPostprocess(), CpuOps()
    calls = []

    class Counting(CpuOps):
        def distance_to(self, mask: np.ndarray) -> np.ndarray:
            calls.append(mask.shape)
            return super().distance_to(mask)

    def by_rule(hard: np.ndarray) -> np.ndarray:
        labels, n = ops.label(hard, 8)
        areas = np.bincount(labels.ravel(), minlength=n + 1).astype(float)
        areas[0] = 0
        main, big = int(np.argmax(areas)), areas.max()
        dist = cv2.distanceTransform((labels != main).astype(np.uint8), cv2.DIST_L2, cv2.DIST_MASK_PRECISE)
        radius = cfg.near * np.hypot(*hard.shape)
        out = np.zeros_like(hard)
        for k in range(1, n + 1):
            near = bool((dist[labels == k] <= radius).any())
            if areas[k] >= cfg.min_component * big and (areas[k] >= cfg.far_component * big or near):
                out |= labels == k
        return out

    rng = np.random.default_rng(7)
    asked = []
    for case in range(40):
        hard = np.zeros((300, 400), bool)
        hard[100:220, 120:260] = True  # the product: 16,800 px
        for _ in range(rng.integers(0, 6)):  # specks, mid-sized parts and large ones, near and far
            side = int(rng.choice([3, 8, 35, 45, 70]))
            y, x = int(rng.integers(0, 300 - side)), int(rng.integers(0, 400 - side))
            hard[y:y + side, x:x + side] = True
        calls.clear()
        got = drop_islands(hard, cfg, Counting())
        assert np.array_equal(got, by_rule(hard)), case
        asked.append(bool(calls))
    assert any(asked) and not all(asked)  # some cases needed the distances, some did not


def tray(h: int = 480, w: int = 640) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """A multi-item shot: a large pale box and seven small pale discs spread over a dark grey
    backdrop, and a patch of that backdrop between the box and the disc beside it that the model
    half believes in (probability 0.7), as u2netp does between a tray's coins;
    ``(image, probability, parts)``."""
    rng = np.random.default_rng(7)
    xx = np.mgrid[0:h, 0:w][1]
    image = np.repeat((60 + 20 * xx / w + rng.normal(0, 2, (h, w)))[..., None], 3, axis=2)
    parts = {"box": np.zeros((h, w), np.uint8), "patch": np.zeros((h, w), np.uint8)}
    cv2.rectangle(parts["box"], (220, 160), (420, 310), 1, -1)
    cv2.ellipse(parts["patch"], (475, 235), (65, 45), 0, 0, 360, 1, -1)
    discs = ((60, 60), (580, 60), (60, 420), (580, 420), (320, 440), (320, 40), (545, 235))
    for k, (cx, cy) in enumerate(discs):
        parts[f"disc{k}"] = np.zeros((h, w), np.uint8)
        cv2.circle(parts[f"disc{k}"], (cx, cy), 19, 1, -1)
        parts["patch"] &= 1 - parts[f"disc{k}"]
    parts["patch"] &= 1 - parts["box"]
    prob = np.zeros((h, w), np.float32)
    for k, m in parts.items():
        if k != "patch":
            image[m.astype(bool)] = 200 + rng.normal(0, 3, (int(m.sum()), 3))
        prob = np.maximum(prob, m.astype(np.float32) * (0.7 if k == "patch" else 0.98))
    prob = cv2.GaussianBlur(prob, (0, 0), 1.5)
    return np.clip(image, 0, 255).astype(np.uint8), prob, {k: m.astype(bool) for k, m in parts.items()}


def test_every_item_of_a_multi_item_shot_stays_and_the_backdrop_between_them_goes() -> None:
    image, prob, parts = tray()
    alpha = alpha_from_probability(prob, MaskPostprocess(), CpuOps(), image) >= 128
    for k, m in parts.items():
        if k != "patch":
            assert alpha[m].mean() > 0.9, k  # small and far from the box, but an item
    assert alpha[parts["patch"]].mean() < 0.05  # the backdrop's colour: not product


def test_a_crop_of_a_multi_item_shot_gets_the_same_cut_out_where_the_framings_overlap() -> None:
    """Framing consistency: the same photo cut to another frame (here: without the box, the
    largest item) keeps and drops the same things in the region both framings show."""
    image, prob, _ = tray()
    cfg, ops = MaskPostprocess(), CpuOps()
    whole = alpha_from_probability(prob, cfg, ops, image) >= 128
    for y0, y1, x0, x1 in ((0, 150, 0, 640), (0, 480, 0, 200), (20, 460, 430, 640)):
        crop = alpha_from_probability(np.ascontiguousarray(prob[y0:y1, x0:x1]), cfg, ops,
                                      np.ascontiguousarray(image[y0:y1, x0:x1])) >= 128
        shared = whole[y0:y1, x0:x1]
        assert (crop & shared).sum() / max(1, (crop | shared).sum()) > 0.97, (y0, y1, x0, x1)


def test_backdrop_and_item_rules_can_be_switched_off() -> None:
    image, prob, parts = tray()
    cfg = MaskPostprocess(backdrop_delta_e=0.0, item_prob=1.0)
    alpha = alpha_from_probability(prob, cfg, CpuOps(), image) >= 128
    assert alpha[parts["patch"]].mean() > 0.9  # the model's word is taken
    assert alpha[parts["disc0"]].mean() < 0.05  # the island rule alone drops the far small discs


def test_a_backdrop_coloured_part_held_by_one_sure_part_stays() -> None:
    """The same patch touching the box alone (a grey camera body against a grey sky, held by
    one hand): not backdrop between items, so the model's word is kept."""
    image, prob, parts = tray()
    gone = parts["disc6"]
    image[gone] = image[5, 500]  # the disc beside the patch becomes backdrop
    prob[gone] = 0.0
    alpha = alpha_from_probability(cv2.GaussianBlur(prob, (0, 0), 0.5), MaskPostprocess(), CpuOps(), image) >= 128
    beside = cv2.dilate(gone.astype(np.uint8), np.ones((9, 9), np.uint8)).astype(bool)
    assert alpha[parts["patch"] & ~beside].mean() > 0.9


def wedged_tray() -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """:func:`tray` with a wedge in the patch: a small piece of the same backdrop, between the box
    and the disc beside it, that the model is sure of (0.98), as u2netp is of the backdrop where
    two coins nearly touch."""
    image, prob, parts = tray()
    wedge = np.zeros(prob.shape, np.uint8)
    cv2.circle(wedge, (520, 235), 10, 1, -1)  # against the disc (545, 235; radius 19)
    parts["wedge"] = wedge.astype(bool) & parts["patch"]
    prob[cv2.dilate(wedge, np.ones((3, 3), np.uint8)).astype(bool)] = 0.98
    return image, prob, parts


def test_a_wedge_of_backdrop_the_model_is_sure_of_goes_with_the_backdrop_beside_it() -> None:
    image, prob, parts = wedged_tray()
    assert float(prob[parts["wedge"]].min()) >= MaskPostprocess().backdrop_unsure  # the model is sure
    alpha = alpha_from_probability(prob, MaskPostprocess(), CpuOps(), image) >= 128
    assert alpha[parts["wedge"]].mean() < 0.05
    assert alpha[parts["patch"]].mean() < 0.05
    for k in ("box", "disc6"):
        assert alpha[parts[k]].mean() > 0.9, k
    off = alpha_from_probability(prob, MaskPostprocess(backdrop_wedge=0.0), CpuOps(), image) >= 128
    assert off[parts["wedge"]].mean() > 0.9  # without the wedge share the model's word is kept
    assert off[parts["patch"] & ~parts["wedge"]].mean() < 0.05


def test_a_sure_backdrop_coloured_part_larger_than_a_wedge_stays() -> None:
    """Sure pixels of the backdrop's colour next to the dropped patch that are more than a tenth
    of it (the box, painted like the backdrop: a subject's own colour near the backdrop's, such as
    a cat's cheek against a wall of its shade) keep the model's word."""
    image, prob, parts = wedged_tray()
    box = parts["box"]
    image[box] = image[box.nonzero()[0].min() - 8, box.nonzero()[1]].mean(axis=0).astype(np.uint8)
    alpha = alpha_from_probability(prob, MaskPostprocess(), CpuOps(), image) >= 128
    assert alpha[box].mean() > 0.9
    assert alpha[parts["wedge"]].mean() < 0.05  # the wedge still goes


def toy(h: int = 400, w: int = 400) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """An orange wheel the model is sure of in its upper half (0.95) and half sees in its lower
    half (0.35); beside it a patch of the pale backdrop (0.35) and a dark-blue cloth it half sees
    (0.35), both against the wheel, on a pale grey backdrop; ``(image, probability, parts)``."""
    image = np.full((h, w, 3), 214, np.uint8)
    parts = {k: np.zeros((h, w), np.uint8) for k in ("sure", "half", "haze", "cloth")}
    wheel = np.zeros((h, w), np.uint8)
    cv2.circle(wheel, (200, 200), 90, 1, -1)
    parts["sure"][:200] = wheel[:200]
    parts["half"][200:] = wheel[200:]
    cv2.rectangle(parts["haze"], (285, 60), (390, 180), 1, -1)
    cv2.rectangle(parts["cloth"], (10, 40), (120, 190), 1, -1)
    for k in ("haze", "cloth"):
        parts[k] &= 1 - wheel
    colours = {"sure": (235, 120, 40), "half": (228, 115, 45), "haze": (208, 210, 212), "cloth": (30, 40, 110)}
    prob = np.zeros((h, w), np.float32)
    for k, m in parts.items():
        image[m.astype(bool)] = colours[k]
        prob[m.astype(bool)] = 0.95 if k == "sure" else 0.35
    return image, cv2.GaussianBlur(prob, (0, 0), 1.0), {k: m.astype(bool) for k, m in parts.items()}


def test_the_half_seen_rest_of_an_item_joins_the_mask() -> None:
    """The wheel's lower half (0.35, like its upper half, unlike the backdrop) is kept; the patch
    of backdrop colour (0.35) and the cloth of another colour (0.35) beside the wheel stay out;
    with the rule off the lower half goes too."""
    image, prob, parts = toy()
    alpha = alpha_from_probability(prob, MaskPostprocess(), CpuOps(), image) >= 128
    assert alpha[parts["sure"]].mean() > 0.97
    assert alpha[parts["half"]].mean() > 0.9
    assert alpha[parts["haze"]].mean() < 0.01
    assert alpha[parts["cloth"]].mean() < 0.01
    off = alpha_from_probability(prob, MaskPostprocess(grow_prob=0.5), CpuOps(), image) >= 128
    assert off[parts["half"]].mean() < 0.05 and off[parts["sure"]].mean() > 0.97
    unlike = alpha_from_probability(prob, MaskPostprocess(grow_like_e=1e3), CpuOps(), image) >= 128
    assert unlike[parts["cloth"]].mean() > 0.9  # without the likeness test the cloth would join


def test_a_half_seen_part_apart_from_the_mask_or_below_the_floor_is_not_grown() -> None:
    image, prob, parts = toy()
    apart = prob.copy()
    apart[200:230] = 0.0  # a gap between the two halves
    alpha = alpha_from_probability(apart, MaskPostprocess(), CpuOps(), image) >= 128
    assert alpha[parts["half"] & (np.arange(400) >= 230)[:, None]].mean() < 0.05
    faint = np.where(parts["half"], np.float32(0.2), prob)
    alpha = alpha_from_probability(faint, MaskPostprocess(), CpuOps(), image) >= 128
    assert alpha[parts["half"]].mean() < 0.05
