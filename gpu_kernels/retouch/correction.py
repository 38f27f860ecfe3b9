"""Pass (a): white balance + local illumination + exposure/gamma + composite.

:func:`plan_correction` estimates everything the pass needs from a strided sample (array-module
generic, no device sync); the pass itself is per pixel, in float32, in this order::

    v_c = (x_c * wb_c) * g(x, y)        # white balance, then the bilinear Retinex gain (if any)
    y_c = tone_lut(v_c)                 # exposure + gamma + highlight shoulder (if lighting)
    out = composite(y, alpha)           # white / transparent / keep, rounded to uint8

:func:`correct_reference` runs these as separate full-image stages (float32 intermediates) and
works on NumPy or CuPy; :func:`correct_fused_cpu` is the CPU twin of the GPU kernel: the same
operations per band of rows, with nothing but the output materialised at full size. The two are
bit-identical (tested); the GPU kernel agrees within 1 LSB.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from gpu_kernels.retouch.color import (
    apply_tone_lut,
    estimate_tone,
    estimate_white_balance,
    luma,
    sample_stride,
    tone_lut,
)
from gpu_kernels.retouch.composite import Background, composite
from gpu_kernels.retouch.config import RetouchConfig
from gpu_kernels.retouch.illumination import MatrixFn, gain_columns, gain_rows, illumination_gain

__all__ = [
    "ColorPlan",
    "correct_fused_cpu",
    "correct_reference",
    "illumination_stage",
    "plan_correction",
    "tone_stage",
    "white_balance_stage",
]

Array = Any


@dataclass(frozen=True, slots=True)
class ColorPlan:
    """Per-image parameters of pass (a), on the image's device.

    ``wb``: ``(3,)`` float32 gains; ``gain_map``: ``(gh, gw)`` float32 Retinex gain at the
    sample grid (pixel ``(y, x)`` reads it at ``(y / stride, x / stride)``) or None;
    ``lut``/``lut_scale``: the tone table ``(n,)`` and ``(1,)`` float32, or None (no tone curve).
    """

    wb: Array
    gain_map: Array | None
    stride: int
    lut: Array | None
    lut_scale: Array | None


def plan_correction(
    xp: Any, pixels: Array, alpha: Array | None, lighting: Literal["auto", "off"],
    cfg: RetouchConfig, matrix: MatrixFn,
) -> ColorPlan:
    """Estimate pass (a)'s parameters. ``pixels``: ``(H, W, 1|3|4)`` uint8; ``alpha``: ``(H, W)``
    uint8 or None. ``lighting="off"`` gives the identity (composite only)."""
    h, w, c = pixels.shape
    if lighting == "off":
        return ColorPlan(xp.ones(3, xp.float32), None, 1, None, None)
    s = sample_stride(h, w, cfg.sample_side)
    rgb = pixels[::s, ::s, :3].astype(xp.float64)
    if c == 1:
        rgb = xp.repeat(rgb, 3, axis=2)
    gh, gw = rgb.shape[:2]
    a = None if alpha is None else alpha[::s, ::s].astype(xp.float64)
    flat_a = None if a is None else a.reshape(-1)
    wb = estimate_white_balance(xp, rgb.reshape(-1, 3), flat_a, cfg.white_balance)
    lum = luma(xp, rgb * wb.astype(xp.float64))
    gain_map = None
    v_max = 255.0 * xp.max(wb).astype(xp.float64) * 1.001
    if cfg.retinex.strength > 0:
        weight = xp.ones((gh, gw), xp.float64) if a is None else a / 255.0
        gain_map = illumination_gain(xp, lum, weight, cfg.retinex, matrix)
        lum = lum * gain_map.astype(xp.float64)
        v_max = v_max * xp.max(gain_map).astype(xp.float64)
    tone = estimate_tone(xp, lum.reshape(-1), flat_a, cfg.exposure)
    lut, scale = tone_lut(xp, tone, v_max, cfg.exposure)
    return ColorPlan(wb, gain_map, s, lut, scale)


def white_balance_stage(xp: Any, pixels: Array, wb: Array) -> Array:
    """``(H, W, 1|3|4)`` uint8 → ``(H, W, 3)`` float32 ``x * wb`` (gray broadcast, no alpha)."""
    x = pixels[..., :3] if pixels.shape[2] == 4 else pixels
    return x.astype(xp.float32) * wb


def illumination_stage(xp: Any, v: Array, plan: ColorPlan, y_start: int = 0) -> Array:
    """``v * g`` with the bilinear Retinex gain for rows ``[y_start, y_start + len(v))``."""
    if plan.gain_map is None:
        return v
    cols = gain_columns(xp, plan.gain_map, v.shape[1], plan.stride)
    g = gain_rows(xp, cols, y_start, y_start + v.shape[0], plan.stride)
    return v * g[..., None]


def tone_stage(xp: Any, v: Array, plan: ColorPlan) -> Array:
    """Exposure + gamma + highlight shoulder through the tone table (identity without one)."""
    if plan.lut is None or plan.lut_scale is None:
        return v
    return apply_tone_lut(xp, v, plan.lut, plan.lut_scale)


def correct_reference(
    xp: Any, pixels: Array, alpha: Array | None, plan: ColorPlan, background: Background,
    on_stage: Callable[[str], None] | None = None,
) -> Array:
    """The unfused chain: each stage a full-image pass with float32 intermediates.
    ``on_stage(name)`` (benchmarks) is called after each stage."""
    mark = on_stage or (lambda name: None)
    v = white_balance_stage(xp, pixels, plan.wb)
    mark("white_balance")
    v = illumination_stage(xp, v, plan)
    mark("illumination")
    y = tone_stage(xp, v, plan)
    mark("exposure_gamma")
    out = composite(xp, y, alpha, background)
    mark("composite")
    return out


def correct_fused_cpu(
    pixels: np.ndarray, alpha: np.ndarray | None, plan: ColorPlan, background: Background,
    band_rows: int = 128,
) -> np.ndarray:
    """Pass (a) on the CPU: all stages per band of ``band_rows`` rows (cache-sized temporaries).

    Returns ``(H, W, 3)`` uint8, or ``(H, W, 4)`` for a transparent background.
    """
    h, w = pixels.shape[:2]
    out = np.empty((h, w, 4 if background == "transparent" else 3), np.uint8)
    cols = None if plan.gain_map is None else gain_columns(np, plan.gain_map, w, plan.stride)
    for y0 in range(0, h, band_rows):
        y1 = min(h, y0 + band_rows)
        v = white_balance_stage(np, pixels[y0:y1], plan.wb)
        if cols is not None:
            v *= gain_rows(np, cols, y0, y1, plan.stride)[..., None]
        y = tone_stage(np, v, plan)
        out[y0:y1] = composite(np, y, None if alpha is None else alpha[y0:y1], background)
    return out
