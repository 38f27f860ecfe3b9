"""From a foreground probability map to the alpha mask composites use, without a halo.

    hard  = prob >= threshold, small islands dropped
    core  = hard eroded by ``erode_px``       (the edge pixels, mixed with background, go)
    alpha = min(blur(core, feather_px), hard) (a feathered edge that only fades *inward*)

So alpha is exactly 0 wherever the thresholded mask is background (no background colour can
bleed into a composite as a fringe), exactly 255 deep inside the subject, and ramps over a
few pixels just inside the subject's outline. Written once over :class:`ArrayOps`, so the CPU
(OpenCV) and GPU (CuPy) backends run the same steps.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpu_kernels.segment.ops import ArrayOps

__all__ = ["MaskPostprocess", "alpha_from_probability"]

Array = Any


@dataclass(frozen=True, slots=True)
class MaskPostprocess:
    """Mask post-processing settings; pixel sizes are at the image's full resolution."""

    threshold: float = 0.5  # probability at or above which a pixel is subject
    erode_px: int = 1  # how far the soft edge is pulled inside the thresholded outline
    feather_px: float = 1.0  # Gaussian sigma of the edge ramp; 0 gives a hard 0/255 mask
    min_component: float = 0.05  # drop islands smaller than this share of the largest; 0 keeps all

    def __post_init__(self) -> None:
        if not 0.0 < self.threshold < 1.0:
            raise ValueError(f"mask postprocess: threshold must be in (0, 1), got {self.threshold}")
        if self.erode_px < 0 or self.feather_px < 0:
            raise ValueError(
                f"mask postprocess: erode_px and feather_px must be >= 0, got {self.erode_px}, {self.feather_px}"
            )
        if not 0.0 <= self.min_component <= 1.0:
            raise ValueError(f"mask postprocess: min_component must be in [0, 1], got {self.min_component}")


def alpha_from_probability(prob: Array, cfg: MaskPostprocess, ops: ArrayOps) -> Array:
    """``(H, W)`` float32 probability in [0, 1] -> ``(H, W)`` uint8 alpha (0 bg, 255 subject)."""
    xp = ops.xp
    hard = prob >= cfg.threshold
    if cfg.min_component > 0:
        hard = ops.keep_large_components(hard, cfg.min_component)
    if cfg.feather_px <= 0:
        return ops.erode(hard, cfg.erode_px).astype(xp.uint8) * xp.uint8(255)
    core = ops.erode(hard, cfg.erode_px).astype(xp.float32)
    soft = xp.minimum(ops.blur(core, cfg.feather_px), hard.astype(xp.float32))
    return xp.rint(soft * 255.0).astype(xp.uint8)
