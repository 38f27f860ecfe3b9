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
