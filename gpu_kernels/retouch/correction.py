"""Pass (a): white balance + local illumination + exposure/gamma + composite.

:func:`plan_correction` estimates everything the pass needs from a strided sample (array-module
generic, no device sync); the pass itself is per pixel, in float32, in this order::

    v_c = min(x_c * wb_c, 255 min(wb)) * g(x, y)   # white balance, then the Retinex gain (if any)
    y_c = tone_lut(v_c)                 # exposure gain + highlight shoulder (if lighting)
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

from gpu_kernels.array import Array
from gpu_kernels.retouch.color import (
    apply_tone_lut,
    area_sample,
    estimate_tone,
    estimate_white_balance,
    luma,
    sample_stride,
    tone_lut,
)
from gpu_kernels.retouch.composite import Background, composite
from gpu_kernels.retouch.config import RetouchConfig
from gpu_kernels.retouch.illumination import (
    MapGrid,
    MatrixFn,
    gain_columns,
    gain_rows,
    illumination_gain,
    map_positions,
)

__all__ = [
    "ColorPlan",
    "correct_fused_cpu",
    "correct_reference",
    "illumination_stage",
    "plan_correction",
    "tone_stage",
    "white_balance_stage",
]

BAND_PIXELS = 16_384  # pixels per band of correct_fused_cpu (16 rows of a 1024-px-wide image)


@dataclass(frozen=True, slots=True)
class ColorPlan:
    """Per-image parameters of pass (a), on the image's device.

    ``wb``: ``(3,)`` float32 gains; ``gain_map``: ``(gh, gw)`` float32 Retinex gain on the
    sample's grid (``grid``: where its cells sit in the image) or None; ``lut``/``lut_scale``:
    the tone table ``(n,)`` and ``(1,)`` float32, or None (no tone curve).
    """

    wb: Array
    gain_map: Array | None
    grid: MapGrid
    lut: Array | None
    lut_scale: Array | None

    def shifted(self, dy: int, dx: int) -> ColorPlan:
        """The same plan for a crop of the image that starts at row ``dy``, column ``dx``."""
        return ColorPlan(self.wb, self.gain_map, self.grid.shifted(dy, dx), self.lut, self.lut_scale)


def plan_correction(
    xp: Any, pixels: Array, alpha: Array | None, lighting: Literal["auto", "off"],
    cfg: RetouchConfig, matrix: MatrixFn,
) -> ColorPlan:
    """Estimate pass (a)'s parameters. ``pixels``: ``(H, W, 1|3|4)`` uint8; ``alpha``: ``(H, W)``
    uint8 or None. ``lighting="off"`` gives the identity (composite only)."""
    if lighting == "off":
        return ColorPlan(xp.ones(3, xp.float32), None, MapGrid(1, 1), None, None)
    rgb, a, grid = statistics_sample(xp, pixels, alpha, cfg)
    flat_a = None if a is None else a.reshape(-1)
    levels = None  # the sample as uint8 when it is a strided pick of an RGB(A) image
    if cfg.sample == "strided" and pixels.shape[2] >= 3:
        s = int(grid.step_y)  # the stride statistics_sample picked (a strided grid: step_y == step_x)
        levels = pixels[::s, ::s, :3]
    wb = estimate_white_balance(xp, rgb, a, cfg.white_balance, levels=levels)
    lum = luma(xp, rgb * wb.astype(xp.float64))
    gain_map = None
    v_max = 255.0 * xp.max(wb).astype(xp.float64) * 1.001
    if cfg.retinex.strength > 0:
        weight = None if a is None else a / 255.0  # None: 1 everywhere
        gain_map = illumination_gain(xp, lum, weight, cfg.retinex, matrix)
        v_max = v_max * xp.max(gain_map).astype(xp.float64)
    tone = estimate_tone(xp, rgb.reshape(-1, 3), flat_a, cfg.exposure,  # the camera's exposure
                         codes=None if levels is None else levels.reshape(-1, 3))
    lut, scale = tone_lut(xp, tone, v_max, cfg.exposure)
    return ColorPlan(wb, gain_map, grid, lut, scale)


def statistics_sample(
    xp: Any, pixels: Array, alpha: Array | None, cfg: RetouchConfig
) -> tuple[Array, Array | None, MapGrid]:
    """The low-resolution copy the colour statistics run on: ``(rgb (gh, gw, 3) float64 levels,
    alpha (gh, gw) float64 or None, its grid)``, at most ``cfg.sample_side`` along the longer side
    (see :class:`~gpu_kernels.retouch.config.RetouchConfig`: area means or a strided pick)."""
    h, w, c = pixels.shape
    if cfg.sample == "strided":
        s = sample_stride(h, w, cfg.sample_side)
        rgb = pixels[::s, ::s, :3].astype(xp.float64)
        a = None if alpha is None else alpha[::s, ::s].astype(xp.float64)
        grid = MapGrid(s, s)
    else:
        rgb, (fy, fx), (oy, ox) = area_sample(xp, pixels if c < 4 else pixels[..., :3], cfg.sample_side)
        a = None if alpha is None else area_sample(xp, alpha, cfg.sample_side)[0]
        grid = MapGrid(fy, fx, oy + (fy - 1) / 2, ox + (fx - 1) / 2)
    if c == 1:
        rgb = xp.repeat(rgb, 3, axis=2)
    return rgb, a, grid


def white_balance_stage(xp: Any, pixels: Array, wb: Array) -> Array:
    """``(H, W, 1|3|4)`` uint8 → ``(H, W, 3)`` float32 ``min(x * wb, 255 * min(wb))`` (gray
    broadcast, no alpha): a channel clipped at 255 in the input may have been brighter, so every
    channel is clipped where the least-gained one saturates and clipped highlights stay neutral."""
    x = pixels[..., :3] if pixels.shape[2] == 4 else pixels
    v = x.astype(xp.float32) * wb
    return xp.minimum(v, xp.float32(255) * xp.min(wb))


def illumination_stage(xp: Any, v: Array, plan: ColorPlan, y_start: int = 0) -> Array:
    """``v * g`` with the bilinear Retinex gain for rows ``[y_start, y_start + len(v))``."""
    if plan.gain_map is None:
        return v
    cols = gain_columns(xp, plan.gain_map, v.shape[1], plan.grid)
    g = gain_rows(xp, cols, y_start, y_start + v.shape[0], plan.grid)
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


def _band_gain(cols3: np.ndarray, band: tuple[int, int], grid: MapGrid) -> np.ndarray:
    """:func:`gain_rows` for rows ``[band[0], band[1])`` on the gain columns repeated per channel:
    ``(rows, 3 * width)`` float32, the same float32 operations on the same values, element by
    element. Each row reads its own two gain rows, so a band may span several of them: a small
    image (sample stride 1: a gain row per image row) still runs in ``band_rows``-row bands
    instead of one band per row (64 numpy passes for a 64×64 image)."""
    y_start, y_stop = band
    gh = cols3.shape[0]
    if grid.step_y == 1 and grid.origin_y == 0 and y_stop <= gh:
        # a gain row per image row (a stride-1 sample: an image of at most sample_side pixels):
        # each row reads its own gain row with weight 1 and the next with 0, c * 1 + d * 0 == c
        # for the finite gains of a map
        return cols3[y_start:y_stop]
    gy = map_positions(np, y_start, y_stop, grid.step_y, grid.origin_y, gh)
    j0 = gy.astype(np.int32)
    j1 = np.minimum(j0 + 1, gh - 1)
    fy = (gy - j0.astype(np.float32))[:, None]
    g: np.ndarray = cols3[j0] * (np.float32(1) - fy)
    g += cols3[j1] * fy
    return g


def _tone_pairs(plan: ColorPlan) -> np.ndarray | None:
    """The tone table as ``(n - 1,)`` float64 *bit containers* of ``(lut[i], lut[i+1] - lut[i])``
    float32 pairs, so one 8-byte gather fetches both (same float32 values as
    :func:`apply_tone_lut`)."""
    if plan.lut is None:
        return None
    lut = np.asarray(plan.lut, np.float32)
    pairs = np.empty((lut.shape[0] - 1, 2), np.float32)
    pairs[:, 0] = lut[:-1]
    pairs[:, 1] = lut[1:] - lut[:-1]
    return pairs.view(np.float64).reshape(-1)


def white_balance_table(wb: Array) -> np.ndarray:
    """``(1, 256, 3)`` float32 ``min(x * wb_c, 255 * min(wb))`` for every level ``x``: the white
    balance stage as a per-channel table (the same float32 operations, so the same values)."""
    wb32 = np.asarray(wb, np.float32)
    table = np.arange(256, dtype=np.float32)[:, None] * wb32[None, :]
    np.minimum(table, np.float32(255) * wb32.min(), out=table)
    return np.ascontiguousarray(table.reshape(1, 256, 3))


def _levels(src: np.ndarray, plan: ColorPlan, wb3: np.ndarray, cols3: np.ndarray | None,
            pairs: np.ndarray | None, band: tuple[int, int], wtab: np.ndarray | None = None) -> np.ndarray:
    """Colour-corrected float32 levels ``(rows, 3 * width)`` of uint8 ``src`` ``(rows, width,
    1|3|4)``: the float32 operations of :func:`white_balance_stage`, :func:`illumination_stage`
    and :func:`tone_stage`, in the same order (flattened channels, no broadcast on the last axis).
    ``wtab`` (:func:`white_balance_table`, RGB input only): white balance by table look-up.
    """
    rows, width, c = src.shape
    if wtab is not None and c == 3:
        import cv2  # lazily: the package imports NumPy only (the GPU check machine)

        v = cv2.LUT(src, wtab).reshape(rows, width * 3)
    else:
        if c == 3:
            v = src.reshape(rows, width * 3).astype(np.float32)
        else:
            v = np.empty((rows, width, 3), np.float32)
            v[...] = src[..., :1] if c == 1 else src[..., :3]
            v = v.reshape(rows, width * 3)
        v *= wb3
        np.minimum(v, np.float32(255) * wb3[:3].min(), out=v)
    if cols3 is not None:
        v *= _band_gain(cols3, band, plan.grid)
    if pairs is None or plan.lut_scale is None:
        return v
    t = v
    t *= np.asarray(plan.lut_scale, np.float32)[0]
    # i = min(int(t), n - 2) (t >= 0; truncation commutes with the min against an integer)
    # (as intp, the index type take reads: the same integers, small enough for float32 exactly)
    i = np.minimum(t, np.float32(pairs.shape[0] - 1)).astype(np.intp)
    f = i.astype(np.float32)
    np.subtract(t, f, out=f)
    lo_d = np.take(pairs, i, mode="clip").view(np.float32).reshape(rows, -1, 2)
    f *= lo_d[..., 1]
    f += lo_d[..., 0]
    return f


def _round_into(dst: np.ndarray, v: np.ndarray) -> None:
    """``dst[...] = round_levels(v)`` for float32 ``v`` (clobbered): ``clip(v + 0.5, 0, 255)``
    truncated equals ``clip(floor(v + 0.5), 0, 255)`` for every float (NaN included)."""
    v += np.float32(0.5)
    np.maximum(v, np.float32(0), out=v)  # np.clip's bounds as two ufunc calls (NaN kept alike)
    np.minimum(v, np.float32(255), out=v)
    np.copyto(dst, v.reshape(dst.shape), casting="unsafe")


def _white_where_clear(dst: np.ndarray, alpha: np.ndarray) -> None:
    """``dst[alpha == 0] = 255`` in place (``dst`` ``(rows, w, 3)`` uint8, a view is fine), by
    OpenCV's masked OR: a pass, where NumPy's boolean assignment gathers."""
    import cv2  # lazily: the package imports NumPy only (the GPU check machine)

    if alpha.size <= 16:  # OpenCV takes arrays of up to 4 values for scalars and refuses a 1x1
        dst[alpha == 0] = 255  # (-209/-215: a one-row band with one live column, a 1x1 image)
        return
    zero = cv2.compare(alpha, 0, cv2.CMP_EQ)  # type: ignore[call-overload]
    cv2.bitwise_or(dst, (255, 255, 255, 0), dst=dst, mask=zero)  # type: ignore[call-overload]


def _edge_pixels(alpha: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.nonzero((alpha != 0) & (alpha != 255))`` (row-major order), through OpenCV."""
    import cv2  # lazily, as above

    points = cv2.findNonZero(cv2.inRange(alpha, 1, 254))  # [x, y] per point, or None
    if points is None:
        empty = np.zeros(0, np.intp)
        return empty, empty
    points = points.reshape(-1, 2)
    return points[:, 1], points[:, 0]


def _live_columns(alpha: np.ndarray) -> tuple[int, int]:
    """``[c0, c1)``: the columns of ``alpha`` ``(rows, width)`` holding any non-zero value."""
    cols: np.ndarray = np.asarray(alpha.any(axis=0))
    if not bool(cols.any()):
        return 0, 0
    return int(cols.argmax()), int(cols.shape[0] - cols[::-1].argmax())


def correct_fused_cpu(
    pixels: np.ndarray, alpha: np.ndarray | None, plan: ColorPlan, background: Background,
    band_rows: int | None = None, tables: bool = False,
) -> np.ndarray:
    """Pass (a) on the CPU: all stages per band of ``band_rows`` rows (cache-sized temporaries;
    default: about 16K pixels a band, at least 16 rows, so a small image is one band and its cost
    is not a fixed number of NumPy calls per 16 rows).

    ``tables`` (RGB input): white balance through :func:`white_balance_table`, and without a
    Retinex gain map the whole chain through per-channel tables (:func:`_correct_by_table`); the
    same float32 operations per level, so the same output.

    Returns ``(H, W, 3)`` uint8, or ``(H, W, 4)`` for a transparent background; bit-identical
    to :func:`correct_reference`. A white composite computes the colour only where it shows:
    alpha 0 gives exactly 255 (``y * 0 + 255 * 1``, ``y`` finite) and alpha 255 gives
    ``round(y)`` (``y * 1 + 255 * 0``), so the blend runs on the soft edge pixels alone and
    columns without any alpha in a band are filled with 255.
    """
    h, w = pixels.shape[:2]
    band_rows = band_rows or max(16, BAND_PIXELS // max(w, 1))
    transparent = background == "transparent"
    white = background == "white" and alpha is not None
    tables = tables and pixels.shape[2] == 3
    if tables and plan.gain_map is None:
        return _correct_by_table(pixels, alpha, plan, transparent, white)
    wtab = white_balance_table(plan.wb) if tables else None
    out = np.empty((h, w, 4 if transparent else 3), np.uint8)
    wb = np.asarray(plan.wb, np.float32)
    wb3 = wb if wtab is not None else np.tile(wb, w)  # per-pixel gains only without the table
    cols3 = None if plan.gain_map is None else np.repeat(
        gain_columns(np, plan.gain_map, w, plan.grid), 3, axis=1)
    pairs = _tone_pairs(plan)
    bands = [(y, min(h, y + band_rows)) for y in range(0, h, band_rows)]
    for band in bands:
        y0, y1 = band
        if not white:
            y = _levels(pixels[y0:y1], plan, wb3, cols3, pairs, band, wtab)
            if transparent:
                rgb = np.empty((y1 - y0, w, 3), np.uint8)
                _round_into(rgb, y)
                out[y0:y1, :, :3] = rgb
                out[y0:y1, :, 3] = 255 if alpha is None else alpha[y0:y1]
            else:
                _round_into(out[y0:y1], y)
            continue
        assert alpha is not None
        a = alpha[y0:y1]
        c0, c1 = _live_columns(a)
        out[y0:y1, :c0] = 255
        out[y0:y1, c1:] = 255
        if c1 <= c0:
            continue
        a = a[:, c0:c1]
        dst = out[y0:y1, c0:c1]
        sub = pixels[y0:y1, c0:c1]
        y = _levels(sub, plan, wb3[: 3 * (c1 - c0)],
                    None if cols3 is None else cols3[:, 3 * c0:3 * c1], pairs, band, wtab)
        ey, ex = _edge_pixels(a)
        if ey.size:
            ae = a[ey, ex].astype(np.float32) / np.float32(255)
            ye = y.reshape(y1 - y0, c1 - c0, 3)[ey, ex]
            blend = ye * ae[:, None] + np.float32(255) * (np.float32(1) - ae)[:, None]
        _round_into(dst, y)
        _white_where_clear(dst, a)
        if ey.size:
            rounded = np.empty(blend.shape, np.uint8)
            _round_into(rounded, blend)
            dst[ey, ex] = rounded
    return out


def _correct_by_table(pixels: np.ndarray, alpha: np.ndarray | None, plan: ColorPlan, transparent: bool,
                      white: bool) -> np.ndarray:
    """Pass (a) without a Retinex map on ``(H, W, 3)`` uint8: each output channel is a function of
    the same input channel alone, so :func:`_levels` runs once over the 256 levels (the same
    float32 operations) and the image goes through the rounded table (``cv2.LUT``); a white
    composite blends the soft edge pixels from the float table, as the banded path does."""
    import cv2  # lazily, as in _levels

    h, w = pixels.shape[:2]
    ramp = np.repeat(np.arange(256, dtype=np.uint8)[None, :, None], 3, axis=2)
    wb3 = np.tile(np.asarray(plan.wb, np.float32), 256)
    levels = _levels(ramp, plan, wb3, None, _tone_pairs(plan), (0, 1)).reshape(256, 3)
    table = np.empty((1, 256, 3), np.uint8)
    _round_into(table, levels.copy())
    rgb = cv2.LUT(pixels, table)
    if transparent:
        out = np.empty((h, w, 4), np.uint8)
        out[..., :3] = rgb
        out[..., 3] = 255 if alpha is None else alpha
        return out
    if not white:
        return np.asarray(rgb)
    assert alpha is not None
    _white_where_clear(rgb, alpha)
    ey, ex = _edge_pixels(alpha)
    if ey.size:
        ae = alpha[ey, ex].astype(np.float32) / np.float32(255)
        ye = levels[pixels[ey, ex], np.arange(3)[None, :]]
        blend = ye * ae[:, None] + np.float32(255) * (np.float32(1) - ae)[:, None]
        rounded = np.empty(blend.shape, np.uint8)
        _round_into(rounded, blend)
        rgb[ey, ex] = rounded
    return np.asarray(rgb)
