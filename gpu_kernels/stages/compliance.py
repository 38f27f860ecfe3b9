"""Marketplace compliance per variant (span ``compliance``, output lane).

Measured on the rendered canvas before encode, as a marketplace's checker would see the pixels:

* ``white_border``: share of the canvas' border pixels (outermost rows and columns) that are
  exactly (255, 255, 255) — or fully transparent on an RGBA canvas;
* ``fill``: the subject's box on the canvas, ``max(box_w / width, box_h / height)`` (the preset's
  ``fill`` is the same quantity, so a correct render measures about ``fill``). The subject is
  every non-white pixel (alpha > 0 on RGBA), taken before a contact shadow darkened the floor;
* ``cut_off``: the subject reaches the canvas' edge, or at least ``CUT_SHARE`` of one edge of the
  source photo is subject in the mask (the product was cut by the photo's frame). Subject in the
  mask means alpha >= ``VISIBLE_ALPHA`` (it shows), the same definition the render's subject box
  uses, so what the crop keeps and what is checked here are the same pixels;
* ``min_side_ok``: both sides of the variant are at least the preset's ``min_side``.

``compliant`` checks these against the preset's rules (``pure_white``, ``min_fill``,
``allow_cut``, ``min_side``), with ``FILL_TOLERANCE`` for the resampled box edge.

The stage takes its counts from :func:`gpu_kernels.stages.measure.batch_counts`: on the host
item by item for host canvases, on the device for the whole batch for device canvases (a few
integers per variant copied back, shared with the quality stage), the same integers either way.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from gpu_kernels.backends import Array
from gpu_kernels.presets import Preset
from gpu_kernels.retouch.geometry import VISIBLE_ALPHA
from gpu_kernels.stages.base import BatchContext, Compliance, Lane, Stage, to_host
from gpu_kernels.stages.measure import CanvasCounts, MaskCounts, batch_counts, host_canvas, host_mask
from schemas.errors import per_item

__all__ = ["CUT_SHARE", "FILL_TOLERANCE", "ComplianceStage", "border_white_share", "compliance_from",
           "measure_compliance", "source_cut"]

CUT_SHARE = 0.01       # of one source edge's pixels being subject → cut by the photo's frame
FILL_TOLERANCE = 0.005  # the box edge moves by about a pixel through resampling and thresholds


def border_white_share(canvas: np.ndarray) -> float:
    """Share of border pixels that are pure white (RGB) or fully transparent (RGBA)."""
    h, w = canvas.shape[:2]
    if h < 2 or w < 2:
        clean = (canvas[..., 3] == 0) if canvas.shape[2] == 4 else (canvas == 255).all(axis=2)
        return float(clean.mean())
    edges = [canvas[0], canvas[-1], canvas[1:-1, 0], canvas[1:-1, -1]]
    px = np.concatenate(edges)
    clean = px[:, 3] == 0 if canvas.shape[2] == 4 else (px == 255).all(axis=1)
    return float(clean.mean())


def source_cut(mask: Array | None, threshold: int = VISIBLE_ALPHA) -> bool:
    """Whether at least ``CUT_SHARE`` of one edge of the source mask is subject (alpha >= ``threshold``)."""
    if mask is None:
        return False
    m = to_host(mask)
    edges = (m[0], m[-1], m[:, 0], m[:, -1])
    return any(float((e >= threshold).mean()) >= CUT_SHARE for e in edges)


def compliance_from(canvas: CanvasCounts, preset: Preset, mask: MaskCounts | None,
                    box: tuple[int, int, int, int] | None = None) -> Compliance:
    """One variant's measures and verdict from its counts (``box``: the subject's canvas box
    before a shadow, when known; else the one counted on the canvas)."""
    h, w = canvas.height, canvas.width
    white = canvas.clean / canvas.border
    box = box if box is not None else canvas.box
    if box is None:
        fill, touches = 0.0, False
    else:
        x0, y0, x1, y1 = box
        fill = max((x1 - x0) / w, (y1 - y0) / h)
        touches = x0 == 0 or y0 == 0 or x1 == w or y1 == h
    cut = touches or (mask is not None and any(
        n / length >= CUT_SHARE for n, length in zip(mask.edge_subject, mask.edge_len, strict=True)))
    sides = min(w, h) >= preset.min_side
    ok = ((not preset.pure_white or white == 1.0) and fill >= preset.min_fill - FILL_TOLERANCE
          and (preset.allow_cut or not cut) and sides)
    return Compliance(white_border=float(white), fill=float(fill), cut_off=bool(cut), min_side_ok=sides,
                      compliant=ok)


def measure_compliance(canvas: Array, preset: Preset, mask: Array | None = None,
                       box: tuple[int, int, int, int] | None = None) -> Compliance:
    """One variant's measures and verdict (on host copies). ``box`` is the subject's canvas box
    when known (before a shadow), else measured here; ``mask`` the source's subject mask (None:
    no cut check on it)."""
    return compliance_from(host_canvas(to_host(canvas), box), preset,
                           None if mask is None else host_mask(to_host(mask)))


class ComplianceStage(Stage):
    """Every variant of every live item, in one step over the batch. ``xp``: the array module of
    the device path (default: the canvases' own, CuPy)."""

    name = "compliance"
    lane: Lane = "output"
    device = "cpu"

    def __init__(self, xp: Any = None) -> None:
        self.xp = xp

    def apply(self, ctx: BatchContext, idx: list[int]) -> Sequence[object]:
        counts = batch_counts(ctx, idx, self.xp)

        def one(i: int) -> dict[str, Compliance]:
            c = counts[i]
            return {p.name: compliance_from(cv, p, c.mask, ctx.memo.get(("canvas_box", i, p.name)))
                    for p, cv in zip(ctx.jobs[i].presets, c.canvases, strict=True)}

        return per_item(one, idx)

    def keep(self, ctx: BatchContext, i: int, value: Any) -> None:
        for name, c in value.items():
            ctx.compliance[i, name] = c
