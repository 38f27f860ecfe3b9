"""Quality measures of retouch outputs, for tests, benchmarks and the quality report.

NumPy + OpenCV, on host arrays (these are measurements, not a pipeline stage):

* :func:`neutral_cast` — median a*, b* (CIELAB, D65) of pixels known to be neutral;
* :func:`bright_subject_cast` — median a*, b* of the brightest subject pixels (a white
  product's colour as a shopper sees it);
* :func:`mask_iou` and :func:`boundary_f` — region and outline agreement of a mask with the
  truth (the boundary F-measure of Martin et al.: outline pixels matched within ``tol`` px);
* :func:`enclosed_white_islands` — pure-white specks inside a product on a white canvas (holes
  in the mask, or highlights clipped to the background's 255): connected components of pure
  white that do not touch the canvas border.
"""

from __future__ import annotations

import cv2
import numpy as np

from gpu_kernels.retouch.color import srgb_to_lab

__all__ = [
    "boundary_f",
    "bright_subject_cast",
    "enclosed_white_islands",
    "lab",
    "mask_iou",
    "neutral_cast",
]


def lab(image: np.ndarray) -> np.ndarray:
    """``(H, W, 3)`` uint8 sRGB → ``(H, W, 3)`` float64 L*, a*, b*."""
    out: np.ndarray = srgb_to_lab(np, image[..., :3].astype(np.float64))
    return out


def neutral_cast(image: np.ndarray, region: np.ndarray) -> tuple[float, float]:
    """Median ``(a*, b*)`` of ``image`` over ``region`` (``(H, W)`` bool, non-empty)."""
    values = lab(image)[region]
    return float(np.median(values[:, 1])), float(np.median(values[:, 2]))


def bright_subject_cast(image: np.ndarray, subject: np.ndarray, top: float = 5.0) -> tuple[float, float]:
    """Median ``(a*, b*)`` of the ``top`` % brightest (L*) pixels of ``subject`` that are not pure
    white (255 carries no colour)."""
    values = lab(image)
    keep = subject & (image[..., :3].min(axis=2) < 255)
    light = values[..., 0][keep]
    chosen = values[keep][light >= np.percentile(light, 100.0 - top)]
    return float(np.median(chosen[:, 1])), float(np.median(chosen[:, 2]))


def mask_iou(pred: np.ndarray, truth: np.ndarray) -> float:
    """Intersection over union of two bool masks (1 when both are empty)."""
    union = int((pred | truth).sum())
    return float((pred & truth).sum() / union) if union else 1.0


def _outline(mask: np.ndarray) -> np.ndarray:
    m = mask.astype(np.uint8)
    return (m - cv2.erode(m, np.ones((3, 3), np.uint8), borderType=cv2.BORDER_REPLICATE)).astype(bool)


def boundary_f(pred: np.ndarray, truth: np.ndarray, tol: int = 2) -> float:
    """Boundary F-measure: harmonic mean of the share of ``pred``'s outline pixels within
    ``tol`` px of ``truth``'s outline (precision) and the converse (recall)."""
    bp, bt = _outline(pred), _outline(truth)
    if not bp.any() and not bt.any():
        return 1.0
    if not bp.any() or not bt.any():
        return 0.0
    disk = cv2.getStructuringElement(cv2.MORPH_ELLIPSE, (2 * tol + 1, 2 * tol + 1))
    near_t = cv2.dilate(bt.astype(np.uint8), disk).astype(bool)
    near_p = cv2.dilate(bp.astype(np.uint8), disk).astype(bool)
    precision = float((bp & near_t).sum() / bp.sum())
    recall = float((bt & near_p).sum() / bt.sum())
    return 0.0 if precision + recall == 0 else 2 * precision * recall / (precision + recall)


def enclosed_white_islands(image: np.ndarray, min_px: int = 1) -> int:
    """Connected components (8-connected) of pure-white (255, 255, 255) pixels of a composite on
    a white canvas that touch no canvas border, of at least ``min_px`` pixels."""
    white = (image[..., :3].min(axis=2) == 255).astype(np.uint8)
    n, labels, stats, _ = cv2.connectedComponentsWithStats(white, connectivity=8)
    border = np.unique(np.concatenate([labels[0], labels[-1], labels[:, 0], labels[:, -1]]))
    inside = np.ones(n, bool)
    inside[0] = False
    inside[border] = False
    return int(np.count_nonzero(inside & (stats[:, cv2.CC_STAT_AREA] >= min_px)))
