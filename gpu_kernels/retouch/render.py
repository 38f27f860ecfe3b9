"""Pass (b): crop + pad + antialiased resize + unsharp mask, per preset.

All in float32 on premultiplied RGBA (an RGB source is opaque; outside the image is
``(0, 0, 0, 0)``), in this order for every output pixel (geometry: :mod:`.geometry`):

1. resample: for each source row tap ``u``: ``row = Σ_t wx_t * p(iy_u, ix_t)``, then
   ``acc = Σ_u wy_u * row`` (``p`` premultiplied: ``c * (a / 255)``, coverage ``a / 255``);
2. pad / composite: ``A = clip(acc_a, 0, 1)``; white output from ``R = acc_c + 255 * (1 -
   acc_a)`` (the unclipped coverage, as resampling a white-composited source would give, so a
   cubic lobe at the source's frame edge prints no grey line through the white canvas):
   ``S = 254 if R >= 254.5 and |R - 255| > 0.01 else min(R, 255)`` (only the background, where
   every tap is 255, resamples to 255 up to float rounding; a product's highlight that a cubic
   lobe lifts to 255 stays 254); transparent output ``S = acc_c`` (still premultiplied);
3. sharpen: ``S' = S + amount * (S - blur(S))``, blur = ``[1 2 1]ᵀ[1 2 1] / 16`` with
   replicated canvas borders (rows first summed horizontally, then vertically); on a white
   canvas ``S' = min(S', 254)`` where ``S < 254.5``: sharpening never turns a product's pixel
   into background white (no white specks inside a product);
4. finalize: white → ``round(S')``; transparent → alpha ``round(255 A)`` and colour
   ``round(S' / A)`` (0 where alpha rounds to 0). ``round(v) = clip(floor(v + 0.5), 0, 255)``.

So on a white canvas every pixel whose footprint (and its 3x3 neighbourhood) holds no subject
is exactly 255. :func:`render_reference` runs the chain as separate full-canvas stages (crop →
resize → pad → sharpen → finalize) on NumPy or CuPy; :func:`render_fused_cpu` is the CPU twin
of the GPU kernel: bands of output rows, no crop materialised, gathering straight from the
uint8 source. They are bit-identical (tested); the GPU kernel agrees within 1 LSB.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from gpu_kernels.array import Array
from gpu_kernels.retouch.composite import round_levels
from gpu_kernels.retouch.geometry import axis_taps

__all__ = ["render_fused_cpu", "render_reference"]

F32 = np.float32


def _span(flags: Array) -> tuple[int, int]:
    """``[first, last + 1)`` of the true entries of a 1-D bool array; ``(0, 0)`` when none."""
    if not bool(flags.any()):
        return 0, 0
    return int(flags.argmax()), int(flags.shape[0] - flags[::-1].argmax())


def _live(weights: Array) -> tuple[int, int]:
    """The range of output positions with any non-zero tap (contiguous: the image is an
    interval); outside it every sum is exactly 0, so skipping it changes no bit."""
    return _span((weights != 0).any(axis=1))


def _horizontal(xp: Any, rows: Array, ix: Array, wx: Array) -> Array:
    """``(r, w, c)`` uint8 rows → ``(r, n, 4)`` float32 premultiplied ``[c0, c1, c2, a]``."""
    r, _, c = rows.shape
    n, taps = ix.shape
    out = xp.zeros((r, n, 4), xp.float32)
    x0, x1 = _live(wx)
    ix, wx = ix[x0:x1], wx[x0:x1]
    shape = (r, x1 - x0, 1 if c == 1 else 3)
    col = xp.zeros(shape, xp.float32)
    cov = xp.zeros((r, x1 - x0) if c == 4 else (x1 - x0,), xp.float32)
    gathered = xp.empty((r, x1 - x0, c), xp.uint8)
    term = xp.empty(shape, xp.float32)
    for t in range(taps):
        xp.take(rows, ix[:, t], axis=1, out=gathered)
        wt = wx[:, t]
        if c == 4:
            af = gathered[..., 3].astype(xp.float32) / F32(255)
            xp.multiply(gathered[..., :3], af[..., None], out=term)
            term *= wt[:, None]                 # w * (c * a), as in the kernel
            col += term
            af *= wt
            cov += af
        else:
            xp.multiply(gathered, wt[:, None], out=term)
            col += term
            cov += wt
    out[:, x0:x1, :3] = col
    out[:, x0:x1, 3] = cov
    return out


def _vertical(xp: Any, hrows: Array, row0: int, iy: Array, wy: Array) -> Array:
    """Rows ``hrows`` (source rows from ``row0``) → ``(len(iy), n, 4)`` float32."""
    acc = xp.zeros((iy.shape[0], *hrows.shape[1:]), xp.float32)
    y0, y1 = _live(wy)
    term = xp.empty((y1 - y0, *hrows.shape[1:]), xp.float32)
    for u in range(iy.shape[1]):
        xp.take(hrows, iy[y0:y1, u] - row0, axis=0, out=term)
        term *= wy[y0:y1, u, None, None]
        acc[y0:y1] += term
    return acc


def _pad(xp: Any, acc: Array, transparent: bool) -> tuple[Array, Array]:
    """Resampled ``(.., 4)`` → (values to sharpen ``(.., 3)``, coverage ``A`` in [0, 1])."""
    cover = xp.clip(acc[..., 3], 0, 1)
    if transparent:
        return acc[..., :3], cover
    raw = acc[..., :3] + F32(255) * (F32(1) - acc[..., 3])[..., None]
    product = (raw >= F32(254.5)) & (xp.abs(raw - F32(255)) > F32(0.01))
    return xp.where(product, F32(254), xp.minimum(raw, F32(255))), cover


def _sharpen(xp: Any, s_ext: Array, amount: float) -> Array:
    """Unsharp mask of rows ``s_ext[1:-1]``; ``s_ext`` holds one halo row above and below."""
    p = xp.concatenate([s_ext[:, :1], s_ext, s_ext[:, -1:]], axis=1)
    h = p[:, :-2] + F32(2) * p[:, 1:-1] + p[:, 2:]
    blur = (h[:-2] + F32(2) * h[1:-1] + h[2:]) * F32(0.0625)
    s = s_ext[1:-1]
    return s + F32(amount) * (s - blur)


def _finalize(xp: Any, v: Array, cover: Array, transparent: bool) -> Array:
    if not transparent:
        return round_levels(xp, v)
    a8 = round_levels(xp, cover * F32(255))
    colour = xp.where((a8 > 0)[..., None], v / xp.maximum(cover, F32(1e-12))[..., None], F32(0))
    out = xp.empty((*v.shape[:-1], 4), xp.uint8)
    out[..., :3] = round_levels(xp, colour)
    out[..., 3] = a8
    return out


def _taps(params: np.ndarray, out_w: int, out_h: int, h: int, w: int,
          coeffs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    inv_k, ox, oy = (float(v) for v in params)
    ix, wx = axis_taps(inv_k, ox, out_w, w, coeffs)
    iy, wy = axis_taps(inv_k, oy, out_h, h, coeffs)
    return ix, wx, iy, wy


def render_reference(
    xp: Any, pixels: Array, params: np.ndarray, out_w: int, out_h: int, transparent: bool,
    amount: float, coeffs: np.ndarray, on_stage: Callable[[str], None] | None = None,
) -> Array:
    """The unfused chain. ``pixels``: ``(h, w, 1|3|4)`` uint8; ``params``: host ``(3,)``
    float32 ``[inv_k, ox, oy]``. Returns ``(out_h, out_w, 3|4)`` uint8. ``on_stage(name)``
    (benchmarks) is called after each stage."""
    mark = on_stage or (lambda name: None)
    h, w = pixels.shape[:2]
    ix, wx, iy, wy = (xp.asarray(a) for a in _taps(params, out_w, out_h, h, w, coeffs))
    x0, x1 = int(ix.min()), int(ix.max()) + 1
    y0, y1 = int(iy.min()), int(iy.max()) + 1
    mark("plan")
    crop = xp.ascontiguousarray(pixels[y0:y1, x0:x1])
    mark("crop")
    resized = _vertical(xp, _horizontal(xp, crop, ix - x0, wx), y0, iy, wy)
    mark("resize")
    s, cover = _pad(xp, resized, transparent)
    mark("pad")
    v = _sharpen(xp, xp.concatenate([s[:1], s, s[-1:]], axis=0), amount)
    if not transparent:
        v = xp.where(s < F32(254.5), xp.minimum(v, F32(254)), v)
    mark("sharpen")
    out = _finalize(xp, v, cover, transparent)
    mark("finalize")
    return out


def _premultiplied(src: np.ndarray, f: np.ndarray) -> None:
    """uint8 ``(r, w, 1|3|4)`` → float32 ``f`` ``(r, w, 4)`` ``[c0, c1, c2, coverage]`` as the
    kernel reads a pixel: RGB ``[r, g, b, 1]``, gray ``[g, g, g, 1]``, RGBA ``[c * af, af]``
    with ``af = a / 255`` (so ``w * term`` is the kernel's ``wx * ((float)q * af)`` / ``wx``).
    For 1 or 3 channels, ``f[..., 3]`` must already hold 1."""
    c = src.shape[2]
    if c == 4:  # channel by channel: far faster than one copy into a 3-of-4 strided view
        af = src[..., 3].astype(np.float32) / F32(255)
        for k in range(3):
            np.multiply(src[..., k], af, out=f[..., k])
        f[..., 3] = af
    else:
        for k in range(3):
            np.copyto(f[..., k], src[..., k if c == 3 else 0], casting="unsafe")


@dataclass(frozen=True, slots=True)
class _AxisPlan:
    """What the fused CPU render reads along one axis, derived from :func:`.geometry.axis_taps`
    once per placement (kept per process, as the taps are): the live output range ``[lo, hi)``
    (:func:`_live`), the source range ``[s0, s1)`` its non-zero taps read, the tap columns with
    any non-zero weight, and for those, over the live outputs, the source indices relative to
    ``s0`` (intp) and the weights repeated for 4 interleaved channels; ``rel_all``: every
    output's indices relative to ``s0`` (intp), clipped into ``[0, s1 - s0)`` (the taps
    outside have weight 0); ``reach``: per output, the least and the
    greatest source index (relative to ``s0``) its non-zero taps read (``(n_out, 2)`` intp;
    ``[n_src, -1]`` where it reads none); ``copy``: every live output reads one source pixel
    with weight exactly 1 (``s0 + o - lo``) and nothing else (a placement at scale 1 on whole
    pixels: the axis is a shifted copy). All read-only."""

    idx: np.ndarray
    weight: np.ndarray
    lo: int
    hi: int
    s0: int
    s1: int
    taps: tuple[int, ...]
    rel_idx: tuple[np.ndarray, ...]
    weight4: tuple[np.ndarray, ...]
    rel_all: np.ndarray
    reach: np.ndarray
    copy: bool


_PLANS: dict[tuple[float, float, int, int, bytes], _AxisPlan] = {}
_PLANS_MAX = 512


def _axis_plan(inv_k: float, origin: float, n_out: int, n_src: int, coeffs: np.ndarray) -> _AxisPlan:
    key = (float(F32(inv_k)), float(F32(origin)), n_out, n_src, np.asarray(coeffs, F32).tobytes())
    hit = _PLANS.get(key)
    if hit is not None:
        return hit
    idx, weight = axis_taps(inv_k, origin, n_out, n_src, coeffs)
    lo, hi = _live(weight)
    s0 = s1 = 0
    if hi > lo:
        used = idx[lo:hi][weight[lo:hi] != 0]
        s0, s1 = int(used.min()), int(used.max()) + 1
    taps = tuple(t for t in range(weight.shape[1]) if bool((weight[:, t] != 0).any()))
    rel_idx = tuple((idx[lo:hi, t] - s0).astype(np.intp) for t in taps)
    weight4 = tuple(np.repeat(weight[lo:hi, t], 4).reshape(hi - lo, 4) for t in taps)
    rel_all = np.clip(idx - s0, 0, max(s1 - s0 - 1, 0)).astype(np.intp)  # a tap outside reads 0 weight
    live = weight != 0
    reach = np.stack([np.where(live, rel_all, n_src).min(axis=1), np.where(live, rel_all, -1).max(axis=1)], axis=1)
    for a in (*rel_idx, *weight4, rel_all, reach):
        a.flags.writeable = False
    copy = (hi > lo and len(taps) == 1 and s1 - s0 == hi - lo
            and bool((weight[lo:hi, taps[0]] == 1).all())
            and bool((rel_idx[0] == np.arange(hi - lo)).all()))
    plan = _AxisPlan(idx, weight, lo, hi, s0, s1, taps, rel_idx, weight4, rel_all, reach, copy)
    if len(_PLANS) >= _PLANS_MAX:
        _PLANS.clear()
    _PLANS[key] = plan
    return plan


def _horizontal_planar(rows: np.ndarray, plan: _AxisPlan, part: tuple[int, int],
                       chunk: int | None = None) -> np.ndarray:
    """:func:`_horizontal` for the live columns ``part`` = ``[a, b)`` of ``plan`` (counted from
    ``plan.lo``): ``(r, w, c)`` uint8 (the source columns ``[plan.s0, plan.s1)``; only those the
    taps of ``part`` read are converted) → ``(r, 4, b - a)`` float32 planar ``[c0, c1, c2, a]``
    per row, the same products summed in tap order (16-byte gathers of interleaved pixels, then
    one transpose per chunk of rows). The running sum starts from the first product instead of
    ``0 + product``: that differs only in the sign of a zero, which no later step turns into a
    different uint8."""
    a, b = part
    w4, idx = tuple(wk[a:b] for wk in plan.weight4), tuple(k[a:b] for k in plan.rel_idx)
    # zero-weight taps may point outside: np.take's clip keeps them in, their product is 0
    c0 = max(0, min(int(k.min()) for k in idx))
    c1 = min(rows.shape[1], max(int(k.max()) for k in idx) + 1)
    rows, idx = rows[:, c0:c1], tuple(k - c0 for k in idx)
    r, w = rows.shape[:2]
    n = idx[0].shape[0]
    chunk = chunk or _rows_per_band(max(w, n), 16)
    out = np.empty((r, 4, n), np.float32)
    f_buf = np.empty((chunk, w, 4), np.float32)
    f_buf[..., 3] = 1
    g_buf = np.empty((chunk, n, 4), np.float32)
    acc_buf = np.empty((chunk, n, 4), np.float32)
    for a in range(0, r, chunk):
        b = min(r, a + chunk)
        f, g, acc = f_buf[:b - a], g_buf[:b - a], acc_buf[:b - a]
        _premultiplied(rows[a:b], f)
        for j, (k, wk) in enumerate(zip(idx, w4, strict=True)):
            if j == 0:
                np.take(f, k, axis=1, out=acc, mode="clip")
                acc *= wk
                continue
            np.take(f, k, axis=1, out=g, mode="clip")
            g *= wk
            acc += g
        out[a:b] = acc.transpose(0, 2, 1)
    return out


BAND_PIXELS = 8_192  # pixels per band of render_fused_cpu (32 rows of a 256-px-wide canvas)


def _rows_per_band(width: int, least: int) -> int:
    """Rows per band: about :data:`BAND_PIXELS` pixels, at least ``least`` rows (a small canvas
    is one band, its cost not a fixed number of NumPy calls per ``least`` rows)."""
    return max(least, BAND_PIXELS // max(width, 1))


TILE_ROWS, TILE_COLS = 8, 32  # the blank map's tiles (source pixels)
MAP_MIN_PIXELS = 128 * 128  # canvas and source both at most this: no blank map (fixed cost ~0.1 ms)


def _reduce_runs(a: np.ndarray, size: int, axis: int, op: np.ufunc) -> np.ndarray:
    """``op`` over consecutive runs of ``size`` along ``axis`` (0 or 1) of a 2-D array (the last
    run may be shorter); views and one reduction per part, no copy of ``a``."""
    n = a.shape[axis]
    full = n - n % size
    parts = []
    if full:
        body = a[:full] if axis == 0 else a[:, :full]
        shape = (full // size, size, a.shape[1]) if axis == 0 else (a.shape[0], full // size, size)
        parts.append(op.reduce(body.reshape(shape), axis=axis + 1))
    if full < n:
        parts.append(op.reduce(a[full:] if axis == 0 else a[:, full:], axis=axis, keepdims=True))
    return parts[0] if len(parts) == 1 else np.concatenate(parts, axis=axis)


def _subject_columns(src: np.ndarray, transparent: bool) -> tuple[np.ndarray, np.ndarray] | None:
    """Where on ``src`` (``(h, w, c)`` uint8) the canvas can differ from its fill, per run of
    :data:`TILE_ROWS` rows: the first and the last column of the :data:`TILE_COLS`-wide tiles
    holding any pixel that is not blank (``w`` and -1 for a run with none), or None when no
    pixel can be blank. Blank: on a white canvas, every byte 255 (white, or opaque white); on a
    transparent one, a 4-channel pixel with every byte 0 (alpha 0). Every tap that reads only
    blank pixels resamples to the fill up to float rounding, which the pad and the rounding
    turn into the fill exactly (module docstring), so a canvas pixel whose 3x3 neighbourhood
    reads only blank pixels is the fill."""
    h, w, c = src.shape
    if transparent and c != 4:
        return None  # an opaque source: nothing on the canvas is transparent
    blank = 0 if transparent else 255
    op = np.maximum if transparent else np.minimum
    runs = _reduce_runs(src.reshape(h, w * c), TILE_ROWS, 0, op)
    tiles = _reduce_runs(runs, TILE_COLS * c, 1, op) != blank
    seen = tiles.any(axis=1)
    n = tiles.shape[1]
    first = np.where(seen, tiles.argmax(axis=1) * TILE_COLS, w)
    last = np.where(seen, np.minimum((n - tiles[:, ::-1].argmax(axis=1)) * TILE_COLS, w) - 1, -1)
    return first, last


def _needed_columns(reach_y: np.ndarray, reach_x: np.ndarray, spans: tuple[np.ndarray, np.ndarray] | None,
                    out_w: int) -> tuple[int, int]:
    """The canvas columns ``[n0, n1)`` of one band that can differ from the fill: those whose
    own column or a neighbour's reads a source column in the subject's span over the source
    rows the band (halo rows included) reads (``reach_y``: the band's rows' reach). ``(0, 0)``
    when none; every column without ``spans``."""
    if spans is None:
        return 0, out_w
    ra, rb = int(reach_y[:, 0].min()), int(reach_y[:, 1].max())
    if rb < ra:
        return 0, 0
    first, last = spans
    cmin = int(first[ra // TILE_ROWS: rb // TILE_ROWS + 1].min())
    cmax = int(last[ra // TILE_ROWS: rb // TILE_ROWS + 1].max())
    if cmax < cmin:
        return 0, 0
    a, b = _span((reach_x[:, 1] >= cmin) & (reach_x[:, 0] <= cmax))
    return (max(a - 1, 0), min(b + 1, out_w)) if b > a else (0, 0)


class _Band(NamedTuple):
    """One band of canvas rows ``[b0, b1)`` (``rows``: with a replicated halo row either side):
    the columns ``[n0, n1)`` that can differ from the fill are sharpened from the resampled
    values of ``[c0, c1)``, of which the live ones ``[l0, l1)`` are resampled and the others
    are the fill. ``n1 <= n0``: the whole band is the fill."""

    b0: int
    b1: int
    rows: np.ndarray
    n0: int
    n1: int
    c0: int
    c1: int
    l0: int
    l1: int


def render_fused_cpu(
    pixels: np.ndarray, params: np.ndarray, out_w: int, out_h: int, transparent: bool,
    amount: float, coeffs: np.ndarray, band_rows: int | None = None,
) -> np.ndarray:
    """The CPU twin of the fused kernel, one band of output rows at a time (same arguments and
    result as :func:`render_reference`, bit for bit).

    Only the live part of the canvas is resampled (outside it every sum is exactly 0, and a
    band whose rows and halo are all outside is the constant pad), and of each band only the
    columns that can differ from the fill: those near the subject's span on the source rows the
    band reads (:func:`_subject_columns`; on a white canvas the composited backdrop is blank, so
    55-95 % of a product photo's canvas is filled, not computed); the horizontal pass runs once
    per source row, the rest works on planar float32 channels in cache-sized bands with
    buffers reused from band to band (``band_rows``: default about :data:`BAND_PIXELS` pixels,
    at least 32 rows).
    """
    h, w = pixels.shape[:2]
    band_rows = min(band_rows or _rows_per_band(out_w, 32), out_h)  # buffers no taller than the canvas
    inv_k, ox, oy = (float(v) for v in params)
    px, py = _axis_plan(inv_k, ox, out_w, w, coeffs), _axis_plan(inv_k, oy, out_h, h, coeffs)
    wy = py.weight
    out = np.empty((out_h, out_w, 4 if transparent else 3), np.uint8)
    fill = 0 if transparent else 255
    x0, x1 = px.lo, px.hi
    y0, y1 = py.lo, py.hi
    if x1 <= x0 or y1 <= y0:
        out[...] = fill
        return out
    if px.copy and py.copy and amount == 0 and not transparent and pixels.shape[2] == 3:
        # scale 1 on whole pixels, no sharpening, an opaque RGB source: each live canvas pixel is
        # its source pixel (x * 1 summed with exact zeros, padded with 255 * 0, rounded back to
        # the same integer) and every other one the fill
        out[...] = fill
        out[y0:y1, x0:x1] = pixels[py.s0:py.s1, px.s0:px.s1]
        return out
    r0 = py.s0
    src = pixels[r0:py.s1, px.s0:px.s1]
    # a small canvas from a small source: mapping the blank pixels would cost more than they save
    small = out_w * out_h <= MAP_MIN_PIXELS and src.shape[0] * src.shape[1] <= MAP_MIN_PIXELS
    spans = None if small else _subject_columns(src, transparent)
    taps_y, rel_iy = py.taps, py.rel_all
    # every band's columns first: the horizontal pass then runs only over the source rows and
    # the canvas columns that some band resamples
    bands = []
    for b0 in range(0, out_h, band_rows):
        b1 = min(out_h, b0 + band_rows)
        rows = np.minimum(np.maximum(np.arange(b0 - 1, b1 + 1), 0), out_h - 1)  # replicated halo rows
        n0, n1 = (0, 0) if int(rows[-1]) < y0 or int(rows[0]) >= y1 else \
            _needed_columns(py.reach[rows], px.reach, spans, out_w)
        c0, c1 = max(n0 - 1, 0), min(n1 + 1, out_w)
        bands.append(_Band(b0, b1, rows, n0, n1, c0, c1, max(c0, x0), min(c1, x1)))
    busy = [band for band in bands if band.n1 > band.n0]
    if not busy:
        out[...] = fill
        return out
    u0, u1 = min(band.l0 for band in busy), max(band.l1 for band in busy)
    s_lo = min(int(rel_iy[band.rows].min()) for band in busy)
    s_hi = max(int(rel_iy[band.rows].max()) for band in busy) + 1
    hp = _horizontal_planar(src[s_lo:s_hi], px, (u0 - x0, u1 - x0))
    acc_buf = np.empty((band_rows + 2) * 4 * (u1 - u0), np.float32)
    term_buf = np.empty_like(acc_buf)
    pad_buf = np.full((3, band_rows + 2, out_w + 2), F32(fill), np.float32)
    for b0, b1, rows, n0, n1, c0, c1, l0, l1 in bands:
        if n1 <= n0:  # the band and its halo read no subject: the fill
            out[b0:b1] = fill
            continue
        nb, m = rows.shape[0], l1 - l0
        acc = acc_buf[:nb * 4 * m].reshape(nb, 4, m)
        term = term_buf[:nb * 4 * m].reshape(nb, 4, m)
        cols = hp[:, :, l0 - u0:l1 - u0]
        for j, u in enumerate(taps_y):  # indexing, not np.take: take is ~50x slower from a strided view
            np.multiply(cols[rel_iy[rows, u] - s_lo], wy[rows, u][:, None, None], out=acc if j == 0 else term)
            if j:
                acc += term
        padded = pad_buf[:, :nb]
        padded[:, :, 1 + c0:1 + l0] = fill  # the buffer is reused: columns live in an earlier band
        padded[:, :, 1 + l1:1 + c1] = fill
        live = padded[:, :, 1 + l0:1 + l1]
        if transparent:
            live[...] = acc[:, :3].transpose(1, 0, 2)
        else:
            bg = F32(255) * (F32(1) - acc[:, 3])
            np.add(acc[:, :3].transpose(1, 0, 2), bg[None], out=live)
            over = (live >= F32(254.5)) & (np.abs(live - F32(255)) > F32(0.01))
            np.minimum(live, F32(255), out=live)
            live[over] = F32(254)
        if n0 == 0:
            padded[:, :, 0] = padded[:, :, 1]
        if n1 == out_w:
            padded[:, :, -1] = padded[:, :, -2]
        window = padded[:, :, n0:n1 + 2]
        v = _sharpen_planar(window, amount)
        out[b0:b1, :n0] = fill
        out[b0:b1, n1:] = fill
        if transparent:
            cover = np.zeros((nb - 2, n1 - n0), np.float32)
            a, b = max(l0, n0), min(l1, n1)
            cover[:, a - n0:b - n0] = np.clip(acc[1:-1, 3, a - l0:b - l0], F32(0), F32(1))
            _finalize_planar(out[b0:b1, n0:n1], v, cover)
        else:
            np.putmask(v, (window[:, 1:-1, 1:-1] < F32(254.5)) & (v > F32(254)), F32(254))
            _round_planar(out[b0:b1, n0:n1], v)
    return out


def _sharpen_planar(p: np.ndarray, amount: float) -> np.ndarray:
    """:func:`_sharpen` on ``(3, rows + 2, w + 2)`` (halo rows and replicated columns):
    ``(3, rows, w)``, the same float32 operations in the same order."""
    if amount == 0:  # s + 0 * (s - blur) == s up to the sign of a zero
        return p[:, 1:-1, 1:-1].copy()
    h = F32(2) * p[:, :, 1:-1]
    h += p[:, :, :-2]
    h += p[:, :, 2:]
    blur = F32(2) * h[:, 1:-1]
    blur += h[:, :-2]
    blur += h[:, 2:]
    blur *= F32(0.0625)
    s = p[:, 1:-1, 1:-1]
    np.subtract(s, blur, out=blur)
    blur *= F32(amount)
    blur += s
    return blur


def _round_planar(dst: np.ndarray, v: np.ndarray) -> None:
    """``dst (rows, w, C)[..., c] = round_levels(v[c])`` for planar float32 ``v`` (clobbered):
    ``clip(v + 0.5, 0, 255)`` truncated equals ``clip(floor(v + 0.5), 0, 255)``."""
    v += F32(0.5)
    np.clip(v, F32(0), F32(255), out=v)
    for c in range(v.shape[0]):
        np.copyto(dst[..., c], v[c], casting="unsafe")


def _finalize_planar(dst: np.ndarray, v: np.ndarray, cover: np.ndarray) -> None:
    """:func:`_finalize` for a transparent canvas, planar ``v`` ``(3, rows, w)``."""
    a8 = cover * F32(255)
    a8 += F32(0.5)
    np.clip(a8, F32(0), F32(255), out=a8)
    alpha = a8.astype(np.uint8)
    colour = v / np.maximum(cover, F32(1e-12))[None]
    colour = np.where((alpha > 0)[None], colour, F32(0))
    _round_planar(dst[..., :3], colour)
    dst[..., 3] = alpha
