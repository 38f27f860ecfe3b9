"""From a foreground probability map to the alpha mask composites use, without a halo.

    prob  = guided(prob, image) where the model is unsure   (the edge follows the photo's edges)
    hard  = prob >= threshold
            - islands small beside the largest, or far from it and not large, dropped
            + holes enclosed by the subject filled: specks always, larger ones up to a share of
              the subject unless they look like the background (a mug's handle stays open)
    core  = hard eroded by ``erode_px``       (the edge pixels, mixed with background, go)
    alpha = min(blur(core, feather_px), hard) (a feathered edge that only fades *inward*)

The model's probability comes from a small input (320 px for u2netp) upsampled to the photo, so
its edge is soft and a few pixels off; a guided filter (He et al., grey guide, Gaussian windows)
at full resolution snaps it to the photo's edges, only where the model is unsure (``guide_band``)
so thin parts the model is sure of are never blurred away. So alpha is exactly 0 wherever the
refined mask is background (no background colour can bleed into a composite as a fringe),
exactly 255 deep inside the subject, and ramps over a few pixels just inside the outline.
Written once over :class:`ArrayOps`, so the CPU (OpenCV) and GPU (CuPy) backends run the same
steps; the image-dependent steps need the image (``image=None`` skips them).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from gpu_kernels.retouch.color import srgb_to_lab
from gpu_kernels.segment.ops import ArrayOps

__all__ = ["MaskPostprocess", "alpha_from_probability", "drop_islands", "fill_holes", "guided_probability"]

Array = Any


@dataclass(frozen=True, slots=True)
class MaskPostprocess:
    """Mask post-processing settings; pixel sizes are at the image's full resolution.

    Islands: a component is kept when it is at least ``min_component`` of the largest and either
    within ``near`` (a share of the image diagonal) of the largest or at least ``far_component``
    of it. Holes (background components that do not touch the frame): filled when at most
    ``speck_hole`` of the subject's area, or at most ``max_hole`` of it and their mean colour is
    more than ``hole_delta_e`` (CIELAB ΔE) from the background just around the subject
    (``ring`` share of the diagonal). Guided filter: Gaussian window ``guide_sigma`` px (0: off),
    regulariser ``guide_eps`` (on a 0..1 grey guide), applied where ``|prob - 0.5| < guide_band``.
    """

    threshold: float = 0.5  # probability at or above which a pixel is subject
    erode_px: int = 0  # how far the soft edge is pulled inside the outline (1 without the guided edge)
    feather_px: float = 1.0  # Gaussian sigma of the edge ramp; 0 gives a hard 0/255 mask
    min_component: float = 0.05  # drop islands smaller than this share of the largest; 0 keeps all
    far_component: float = 0.1
    near: float = 0.06
    speck_hole: float = 0.002
    max_hole: float = 0.15
    hole_delta_e: float = 15.0
    ring: float = 0.02
    guide_sigma: float = 3.0
    guide_eps: float = 1e-3
    guide_band: float = 0.45

    def __post_init__(self) -> None:
        if not 0.0 < self.threshold < 1.0:
            raise ValueError(f"mask postprocess: threshold must be in (0, 1), got {self.threshold}")
        if self.erode_px < 0 or self.feather_px < 0:
            raise ValueError(
                f"mask postprocess: erode_px and feather_px must be >= 0, got {self.erode_px}, {self.feather_px}"
            )
        shares = (self.min_component, self.far_component, self.near, self.speck_hole, self.max_hole, self.ring)
        if not all(0.0 <= v <= 1.0 for v in shares):
            raise ValueError(f"mask postprocess: shares must be in [0, 1], got {self}")
        if self.guide_sigma < 0 or self.guide_eps <= 0 or not 0 <= self.guide_band <= 0.5:
            raise ValueError(f"mask postprocess: bad guided-filter settings in {self}")


def guided_probability(prob: Array, image: Array, cfg: MaskPostprocess, ops: ArrayOps) -> Array:
    """``prob`` refined by a guided filter on ``image``'s grey levels where the model is unsure."""
    xp = ops.xp
    rgb = image[..., :3].astype(xp.float32) if image.shape[-1] >= 3 else image.astype(xp.float32)
    grey = (rgb[..., 0] * 0.299 + rgb[..., 1] * 0.587 + rgb[..., 2] * 0.114) / 255.0 if rgb.ndim == 3 else rgb / 255.0
    p = prob.astype(xp.float32)
    s = cfg.guide_sigma
    mean_i, mean_p = ops.blur(grey, s), ops.blur(p, s)
    cov = ops.blur(grey * p, s) - mean_i * mean_p
    var = ops.blur(grey * grey, s) - mean_i * mean_i
    a = cov / (var + xp.float32(cfg.guide_eps))
    b = mean_p - a * mean_i
    q = ops.blur(a, s) * grey + ops.blur(b, s)
    unsure = xp.abs(p - xp.float32(0.5)) < xp.float32(cfg.guide_band)
    return xp.where(unsure, xp.clip(q, 0.0, 1.0), p).astype(xp.float32)


def drop_islands(hard: Array, cfg: MaskPostprocess, ops: ArrayOps) -> Array:
    """Keep the components of ``hard`` that are large beside the largest, or near it."""
    xp = ops.xp
    labels, n = ops.label(hard, 8)
    if n <= 1:
        return hard
    areas = xp.bincount(labels.ravel(), minlength=n + 1).astype(xp.float64)
    areas[0] = 0
    main = xp.argmax(areas)
    radius = cfg.near * math.hypot(*hard.shape[:2])
    near_main = (ops.distance_to(labels == main) <= radius).astype(xp.float64)
    touches = xp.bincount(labels.ravel(), weights=near_main.ravel(), minlength=n + 1) > 0
    big = areas.max()
    keep = (areas >= cfg.min_component * big) & (touches | (areas >= cfg.far_component * big))
    keep[0] = False
    return keep[labels]


def fill_holes(hard: Array, image: Array | None, cfg: MaskPostprocess, ops: ArrayOps) -> Array:
    """``hard`` with its enclosed holes filled (see :class:`MaskPostprocess`)."""
    xp = ops.xp
    labels, n = ops.label(~hard, 4)
    if n == 0:
        return hard
    flat = labels.ravel()
    areas = xp.bincount(flat, minlength=n + 1).astype(xp.float64)
    frame = xp.concatenate([labels[0], labels[-1], labels[:, 0], labels[:, -1]])
    outside = xp.zeros(n + 1, dtype=bool)
    outside[frame] = True
    outside[0] = True  # label 0 is the subject itself
    subject = xp.maximum(xp.sum(hard).astype(xp.float64), 1.0)
    fill = ~outside & (areas <= cfg.speck_hole * subject)
    if image is not None and cfg.max_hole > 0:
        rgb = image[..., :3].astype(xp.float64) if image.ndim == 3 else image[..., None].astype(xp.float64)
        if rgb.shape[-1] == 1:
            rgb = xp.repeat(rgb, 3, axis=2)
        sums = xp.stack([xp.bincount(flat, weights=rgb[..., c].ravel(), minlength=n + 1) for c in range(3)], axis=1)
        means = sums / xp.maximum(areas, 1.0)[:, None]
        radius = max(1.0, cfg.ring * math.hypot(*hard.shape[:2]))
        ring = (~hard) & (ops.distance_to(hard) <= radius) & outside[labels]
        ring_n = xp.maximum(xp.sum(ring), 1)
        ring_mean = xp.stack([xp.sum(xp.where(ring, rgb[..., c], 0.0)) for c in range(3)]) / ring_n
        lab = srgb_to_lab(xp, means)
        ring_lab = srgb_to_lab(xp, ring_mean)
        delta = xp.sqrt(((lab - ring_lab[None, :]) ** 2).sum(axis=1))
        unlike_bg = (delta > cfg.hole_delta_e) | (xp.sum(ring) == 0)
        fill = fill | (~outside & (areas <= cfg.max_hole * subject) & unlike_bg)
    fill[0] = False
    return hard | fill[labels]


def alpha_from_probability(prob: Array, cfg: MaskPostprocess, ops: ArrayOps, image: Array | None = None) -> Array:
    """``(H, W)`` float32 probability in [0, 1] -> ``(H, W)`` uint8 alpha (0 bg, 255 subject).

    ``image``: the photo ``(H, W, 3|4)`` uint8 (same device) for the guided edge and the hole
    colours; without it those steps are skipped.
    """
    xp = ops.xp
    if image is not None and cfg.guide_sigma > 0:
        prob = guided_probability(prob, image, cfg, ops)
    hard = prob >= cfg.threshold
    if cfg.min_component > 0:
        hard = drop_islands(hard, cfg, ops) if cfg.far_component > 0 else ops.keep_large_components(
            hard, cfg.min_component)
    if cfg.speck_hole > 0 or (cfg.max_hole > 0 and image is not None):
        hard = fill_holes(hard, image, cfg, ops)
    if cfg.feather_px <= 0:
        return ops.erode(hard, cfg.erode_px).astype(xp.uint8) * xp.uint8(255)
    core = ops.erode(hard, cfg.erode_px).astype(xp.float32)
    soft = xp.minimum(ops.blur(core, cfg.feather_px), hard.astype(xp.float32))
    return xp.rint(soft * 255.0).astype(xp.uint8)
