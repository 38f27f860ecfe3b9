"""Soft edges: an alpha matte in the mask's uncertain band, and edge colours without the backdrop.

Both are written once over an array module ``xp`` (NumPy or CuPy) and a separable blur, so the
CPU (OpenCV box/Gaussian filters) and the GPU (CuPy, ``cupyx.scipy.ndimage``) run the same steps;
they agree to float32 rounding (tested on a GPU).

* :func:`matte_band`: inside a trimap's unknown band (a few pixels either side of the hard
  mask's outline, and wherever the model was unsure), alpha is a colour-guided filter of the
  hard mask (He, Sun and Tang's guided filter with the RGB photo as guide, computed on a copy
  shrunk by ``s`` and applied at full resolution): locally ``alpha = A · I + b``, the linear
  model of closed-form matting, so the edge follows the photo's own edge and goes soft where
  the photo's edge is soft (fur, hair, a blurred rim, a translucent part). Outside the band the
  hard mask is kept (exactly 0 and 255).
* :func:`foreground_colour`: the subject's own colour ``F`` at pixels with ``0 < alpha < 1``
  (blur-fusion foreground estimation, Forte and Pitié 2021: ``F = F̄ + α (I - α F̄ - (1 - α) B̄)``
  with ``F̄``, ``B̄`` alpha-weighted local means of the subject and of the backdrop, twice, from a
  wide to a narrow window, evaluated at the edge pixels only), so compositing ``F`` over white or
  a transparent canvas shows no backdrop colour fringe. :func:`decontaminate` writes ``F`` into
  the edge pixels of a uint8 photo.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpu_kernels.array import Array

__all__ = ["MattingConfig", "box_blur", "box_means_at", "colour_line_alpha", "colour_line_planes", "decontaminate",
           "foreground_colour", "guided_coefficients", "matte_band", "matte_block"]

Blur = Callable[[Array, float], Array]


@dataclass(frozen=True, slots=True)
class MattingConfig:
    """``band``: half-width of the unknown band around the outline, as a share of the image
    diagonal (at least ``min_band_px``); ``eps``: the guided filter's regulariser (on a 0..1
    colour guide; smaller follows weaker edges); ``radii``: the blur-fusion windows (shares of
    the diagonal, wide to narrow, each at least 1 px)."""

    band: float = 0.004
    min_band_px: int = 2
    eps: float = 1e-3
    radii: tuple[float, ...] = (0.03, 0.004)

    def __post_init__(self) -> None:
        if self.band < 0 or self.min_band_px < 1 or self.eps <= 0 or not self.radii or min(self.radii) <= 0:
            raise ValueError(f"matting: bad settings {self}")

    def band_px(self, h: int, w: int) -> int:
        return max(self.min_band_px, round(self.band * math.hypot(h, w)))


def box_blur(xp: Any, a: Array, radius: int) -> Array:
    """Mean over a ``(2 r + 1)`` square window, borders reflected; ``(H, W)`` or ``(H, W, C)``
    float32. NumPy: OpenCV; CuPy: ``cupyx.scipy.ndimage.uniform_filter``."""
    if radius <= 0:
        return a
    if xp.__name__ == "numpy":
        import cv2

        k = 2 * radius + 1
        return cv2.blur(a, (k, k), borderType=cv2.BORDER_REFLECT)
    from cupyx.scipy import ndimage

    size = (2 * radius + 1, 2 * radius + 1) + ((1,) if a.ndim == 3 else ())
    return ndimage.uniform_filter(a, size=size, mode="reflect")  # = OpenCV BORDER_REFLECT


Region = Callable[[int, int, int, int], list[Array]]


def box_means_at(xp: Any, planes: list[Array] | Region, radius: int, ys: Array, xs: Array,
                 shape: tuple[int, int] | None = None, tile: int = 128) -> list[Array]:
    """:func:`box_blur` of each of ``planes`` (same ``(H, W)``, with or without channels), read at
    the points ``(ys, xs)`` only: the frame is cut into ``tile`` squares and only the squares
    holding a point are filtered, each with a ``radius`` halo (so each point sees its whole
    window, reflected at the frame's border as before). A thin outline in a large frame then
    costs its own area, not the frame's. ``planes`` may be a function ``(y0, y1, x0, x1)`` ->
    the planes' part (with ``shape`` the frame's), so only the parts read are ever made."""
    if callable(planes):
        part = planes
        assert shape is not None
        h, w = shape
    else:
        arrays = planes
        h, w = arrays[0].shape[:2]

        def part(y0: int, y1: int, x0: int, x1: int) -> list[Array]:
            return [p[y0:y1, x0:x1] for p in arrays]
    n = int(ys.size)
    if n == 0 or h * w <= 4 * tile * tile:
        return [box_blur(xp, xp.ascontiguousarray(p), radius)[ys, xs] for p in part(0, h, 0, w)]
    outs: list[Array] = []
    ntx = -(-w // tile)
    key = (ys // tile) * ntx + xs // tile
    order = xp.argsort(key, kind="stable")
    keys = key[order]
    # the sorted keys' runs are the tiles (no unique(): on NumPy it imports numpy.ma, ~8 ms, once)
    cuts = (xp.flatnonzero(keys[1:] != keys[:-1]) + 1).tolist()
    starts, stops = [0, *cuts], [*cuts, n]
    for k, i0, i1 in zip(keys[starts].tolist(), starts, stops, strict=True):
        ty, tx = divmod(int(k), ntx)
        y0, x0 = max(0, ty * tile - radius), max(0, tx * tile - radius)
        y1, x1 = min(h, (ty + 1) * tile + radius), min(w, (tx + 1) * tile + radius)
        idx = order[i0:i1]
        py, px = ys[idx] - y0, xs[idx] - x0
        for c, p in enumerate(part(y0, y1, x0, x1)):
            if len(outs) <= c:
                outs.append(xp.empty((n, *p.shape[2:]), dtype=xp.float32))
            outs[c][idx] = box_blur(xp, xp.ascontiguousarray(p), radius)[py, px]
    return outs


def _shrink(xp: Any, a: Array, s: int, scale: Any = 1.0) -> Array:
    """Block means ``s`` x ``s`` (the trailing rows/columns left over are dropped), float32,
    each value ``scale``d (the same as scaling first: each element is scaled, then averaged)."""
    if s == 1:
        return a.astype(xp.float32) * xp.float32(scale)
    h, w = (a.shape[0] // s) * s, (a.shape[1] // s) * s
    total = None
    for i in range(s):  # s*s strided slices summed: one pass, not a reduction over split axes
        for j in range(s):
            part = a[i:h:s, j:w:s].astype(xp.float32) * xp.float32(scale)
            total = part if total is None else total + part
    assert total is not None
    return (total / xp.float32(s * s)).astype(xp.float32)


def matte_block(radius: int) -> int:
    """The side of the blocks :func:`matte_band` (and the colour line beside it) filter on, for a
    band of ``radius`` pixels."""
    return max(1, min(4, radius // 2))


def matte_band(xp: Any, image: Array, hard: Array, unknown: Array, radius: int, eps: float,
               snap: float = 0.1) -> Array:
    """``(H, W)`` float32 alpha in [0, 1]: ``hard`` (bool) outside ``unknown`` (bool), the
    colour-guided filter of ``hard`` on ``image`` ``(H, W, 3)`` uint8 inside it (window
    ``radius`` px at full resolution), values below ``snap`` set to 0 and above ``1 - snap`` to 1."""
    s = matte_block(radius)
    r = max(1, round(radius / s))
    ys, xs = xp.nonzero(unknown)
    # the full-resolution guide is read at the band's pixels only: no float copy of the frame
    guide_at = image[ys, xs, :3].astype(xp.float32) * xp.float32(1 / 255)
    guide = _shrink(xp, image[..., :3], s, xp.float32(1 / 255))
    p = _shrink(xp, hard, s)

    def mean(a: Array) -> Array:
        return box_blur(xp, xp.ascontiguousarray(a), r)

    coef_s, b_s = guided_coefficients(xp, guide, p, mean, eps)
    # evaluated at the band's pixels only (the nearest-block enlargement, by index)
    by, bx = xp.minimum(ys // s, coef_s.shape[0] - 1), xp.minimum(xs // s, coef_s.shape[1] - 1)
    q = (coef_s[by, bx] * guide_at).sum(axis=-1) + b_s[by, bx]
    q = xp.clip(q, xp.float32(0), xp.float32(1)).astype(xp.float32)
    # near-0 and near-1 values are the guide's texture, not coverage: snapped (no speckled fringe)
    q = xp.where(q < xp.float32(snap), xp.float32(0), xp.where(q > xp.float32(1 - snap), xp.float32(1), q))
    out = hard.astype(xp.float32)
    out[ys, xs] = q
    return out


def colour_line_planes(xp: Any, image: Array, hard: Array, unknown: Array, s: int) -> list[Array]:
    """The planes :func:`colour_line_alpha` reads, on every ``s``-th row and column (the local
    means span several blocks of ``s``, so a pixel a block does as well as the block's mean, at
    ``1 / s²`` of the cost): whether a pixel is the subject's sure pixel (``hard`` outside
    ``unknown``) and its colour where it is (0 elsewhere), per channel, then the same for the
    backdrop's sure pixels. ``image`` ``(..., H, W, 3)`` uint8 with ``hard``/``unknown``
    ``(..., H, W)``: one image or a stack, the same values."""
    img = image[..., ::s, ::s, :].astype(xp.float32)
    h, u = hard[..., ::s, ::s], unknown[..., ::s, ::s]
    planes = []
    for sure in (h & ~u, ~h & ~u):
        w = sure.astype(xp.float32)
        planes += [w, *(img[..., c] * w for c in range(3))]
    return planes


def colour_line_alpha(xp: Any, pix: list[Array], means: list[Array], alpha: Array, min_sep: float, fit: float,
                      snap: float) -> Array:
    """``alpha`` where a pixel is not a mix of the subject's and the backdrop's local colours,
    else the share of the subject in it: with ``F``, ``B`` the means of the sure subject and sure
    backdrop pixels around it (``means``: the box means of :func:`colour_line_planes`, read at
    the pixels), the pixel's colour ``I`` (``pix``: three float32 levels arrays) gives
    ``a = (I - B)·(F - B) / |F - B|²`` in [0, 1] (the colour-line model of matting), taken where
    both kinds of sure pixels are near (a twentieth of the window each), ``F`` and ``B`` are at
    least ``min_sep`` levels apart and ``I`` lies within ``fit`` of that distance from the line
    between them; values within ``snap`` of 0 or 1 become 0 or 1 (JPEG noise on a hard edge).
    Elementwise on any shape, channel by channel, so a stack and one image's points give the
    same bits."""
    wf, f0, f1, f2, wb, b0, b1, b2 = means
    inv_f = xp.float32(1) / xp.maximum(wf, xp.float32(1e-6))
    inv_b = xp.float32(1) / xp.maximum(wb, xp.float32(1e-6))
    bm = (b0 * inv_b, b1 * inv_b, b2 * inv_b)
    d = (f0 * inv_f - bm[0], f1 * inv_f - bm[1], f2 * inv_f - bm[2])
    q = (pix[0] - bm[0], pix[1] - bm[1], pix[2] - bm[2])
    n2 = d[0] * d[0] + d[1] * d[1] + d[2] * d[2]
    a = xp.clip((q[0] * d[0] + q[1] * d[1] + q[2] * d[2]) / xp.maximum(n2, xp.float32(1e-6)),
                xp.float32(0), xp.float32(1))
    e = (q[0] - a * d[0], q[1] - a * d[1], q[2] - a * d[2])
    res2 = e[0] * e[0] + e[1] * e[1] + e[2] * e[2]
    ok = (wf > xp.float32(0.05)) & (wb > xp.float32(0.05)) & (n2 >= xp.float32(min_sep * min_sep))
    ok &= res2 <= xp.float32(fit * fit) * n2
    a = xp.where(a < xp.float32(snap), xp.float32(0), xp.where(a > xp.float32(1 - snap), xp.float32(1), a))
    return xp.where(ok, a, alpha)


def foreground_colour(xp: Any, image: Array, alpha: Array, radii_px: tuple[int, ...], where: Array) -> Array:
    """``(n, 3)`` float32 levels: the subject's colour at the ``n`` pixels ``where`` (``(H, W)``
    bool, typically ``0 < alpha < 1``). ``image`` ``(H, W, 3)`` uint8, ``alpha`` ``(H, W)``
    float32 [0, 1]. Elsewhere the estimate is the pixel itself (alpha 1) or irrelevant (alpha
    0), so only the local means are computed over the frame; a wide window's on a copy sampled
    every ``r // 8`` pixels (they vary slowly)."""
    img = image[..., :3]
    a = alpha.astype(xp.float32)
    h, w = a.shape[:2]
    ys, xs = xp.nonzero(where)
    a_e = a[ys, xs][:, None]
    i_e = img[ys, xs].astype(xp.float32)
    # f * a and b * (1 - a) with f = b = i, exact wherever alpha is 0 or 1; the edge pixels carry
    # the previous pass's estimates (found through ``at``, their index in the edge list)
    fa_e, bna_e = i_e * a_e, i_e - i_e * a_e
    at = xp.full((h, w), -1, dtype=xp.int32)
    at[ys, xs] = xp.arange(int(ys.size), dtype=xp.int32)
    f_e, b_e = i_e, i_e
    for k, r in enumerate(radii_px):
        st = max(1, r // 8)
        rs = max(1, round(r / st))
        if k > 0:
            fa_e, bna_e = f_e * a_e, b_e * (1.0 - a_e)

        def planes(y0: int, y1: int, x0: int, x1: int, st: int = st, fa_e: Array = fa_e,
                   bna_e: Array = bna_e) -> list[Array]:
            rows, cols = slice(y0 * st, y1 * st, st), slice(x0 * st, x1 * st, st)
            a_r = a[rows, cols]
            i_r = img[rows, cols].astype(xp.float32)
            # alpha stacked per channel: the same products as broadcasting a[..., None], at half
            # the cost (a broadcast last axis of 3 runs NumPy's loop three values at a time)
            fa_r = i_r * xp.stack([a_r, a_r, a_r], axis=-1)
            bna_r = i_r - fa_r
            # the edge pixels' running estimates, written through flat indices (one gather of
            # the tile's edge list instead of two boolean-mask reads and writes)
            e_r = at[rows, cols].reshape(-1)
            pos = xp.flatnonzero(e_r >= 0)
            idx = e_r[pos]
            fa_r.reshape(-1, 3)[pos] = fa_e[idx]
            bna_r.reshape(-1, 3)[pos] = bna_e[idx]
            return [a_r, 1.0 - a_r, fa_r, bna_r]

        hs, ws = -(-h // st), -(-w // st)
        fy, fx = xp.minimum(ys // st, hs - 1), xp.minimum(xs // st, ws - 1)
        wf, wb, fs, bs = box_means_at(xp, planes, rs, fy, fx, shape=(hs, ws))
        fm = fs / (wf + xp.float32(1e-5))[:, None]
        bm = bs / (wb + xp.float32(1e-5))[:, None]
        f_e = xp.clip(fm + a_e * (i_e - a_e * fm - (1.0 - a_e) * bm), xp.float32(0), xp.float32(255))
        b_e = bm
    return f_e.astype(xp.float32)


def decontaminate(xp: Any, pixels: Array, alpha: Array, cfg: MattingConfig | None = None) -> Array:
    """``pixels`` ``(H, W, 3)`` uint8 with its edge pixels (``0 < alpha < 255``) replaced by the
    subject's own colour (:func:`foreground_colour`, on the edge's bounding box plus the widest
    window); ``pixels`` itself when there is no edge (or it is not 3-channel)."""
    cfg = cfg or MattingConfig()
    if pixels.ndim != 3 or pixels.shape[2] != 3:
        return pixels
    edge = (alpha > 0) & (alpha < 255)
    rows, cols = xp.nonzero(edge.any(axis=1))[0], xp.nonzero(edge.any(axis=0))[0]
    if int(rows.size) == 0:
        return pixels
    h, w = alpha.shape
    diag = math.hypot(h, w)
    radii = tuple(max(1, round(r * diag)) for r in cfg.radii)
    m = max(radii)
    y0, y1 = max(0, int(rows[0]) - m), min(h, int(rows[-1]) + m + 1)
    x0, x1 = max(0, int(cols[0]) - m), min(w, int(cols[-1]) + m + 1)
    sub_a = alpha[y0:y1, x0:x1].astype(xp.float32) * xp.float32(1 / 255)
    sub_e = edge[y0:y1, x0:x1]
    f = foreground_colour(xp, xp.ascontiguousarray(pixels[y0:y1, x0:x1]), sub_a, radii, sub_e)
    out = pixels.copy()
    region = out[y0:y1, x0:x1]
    region[sub_e] = xp.clip(xp.floor(f + xp.float32(0.5)), 0, 255).astype(xp.uint8)
    return out


def guided_coefficients(xp: Any, guide: Array, p: Array, mean: Callable[[Array], Array],
                        eps: float) -> tuple[Array, Array]:
    """The guided filter's linear coefficients of ``p`` on the RGB ``guide`` (float32, the last
    axis the channel), box-averaged by ``mean``: ``(coef, b)``, each smoothed once more."""
    mi = mean(guide)
    mp = mean(p)
    cov_ip = mean(guide * p[..., None]) - mi * mp[..., None]
    var = {}
    for i in range(3):
        for j in range(i, 3):
            var[i, j] = mean(guide[..., i] * guide[..., j]) - mi[..., i] * mi[..., j]
    e = xp.float32(eps)
    a00, a01, a02 = var[0, 0] + e, var[0, 1], var[0, 2]
    a11, a12, a22 = var[1, 1] + e, var[1, 2], var[2, 2] + e
    # the symmetric 3x3 inverse by cofactors, per pixel
    c00 = a11 * a22 - a12 * a12
    c01 = a02 * a12 - a01 * a22
    c02 = a01 * a12 - a02 * a11
    c11 = a00 * a22 - a02 * a02
    c12 = a01 * a02 - a00 * a12
    c22 = a00 * a11 - a01 * a01
    det = a00 * c00 + a01 * c01 + a02 * c02
    det = xp.where(xp.abs(det) < 1e-20, xp.float32(1e-20), det)
    cx, cy, cz = cov_ip[..., 0], cov_ip[..., 1], cov_ip[..., 2]
    coef = xp.stack([(c00 * cx + c01 * cy + c02 * cz) / det,
                     (c01 * cx + c11 * cy + c12 * cz) / det,
                     (c02 * cx + c12 * cy + c22 * cz) / det], axis=-1).astype(xp.float32)
    b = mp - (coef * mi).sum(axis=-1)
    return mean(coef), mean(b)
