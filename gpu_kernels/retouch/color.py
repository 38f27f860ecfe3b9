"""White balance and exposure: parameter estimation and the per-pixel maths.

Estimation runs on a strided sample of the image (``image[::s, ::s]``, at most
``sample_side`` pixels along the longer side) in float64, with array-module-generic code
(``xp`` is ``numpy`` or ``cupy``): no Python branch depends on a device value, so on the GPU it
never synchronises and its results stay on the device.

Working values ("levels") are float32 on the 0..255 scale. The per-pixel maths:

* white balance: ``v_c = min(x_c * wb_c, 255 * min(wb))`` (one gain per channel; the clip makes
  every channel saturate together, so a highlight clipped in the input stays neutral instead of
  taking the colour of the gains);
* exposure + highlight protection: one monotone tone curve ``f`` applied to every
  channel, tabulated as a float32 look-up table of ``lut_size`` entries over ``[0, v_max]`` and
  read with linear interpolation: ``t = v * scale``, ``i = min(int(t), n - 2)``,
  ``y = lut[i] + (t - i) * (lut[i + 1] - lut[i])``. The GPU kernel does exactly these float32
  operations in this order, so both backends agree to rounding.

The curve is an exposure gain ``g >= 1`` (:func:`estimate_tone`: from the frame's highlights, so
that a dark or saturated product on a white backdrop keeps its colour and only an underexposed
photo is raised), linear up to ``knee * 255``, then an exponential shoulder that keeps the slope
at the knee and approaches ``ceiling * 255`` without clipping (highlight protection; a ceiling
under 255 keeps a product's highlights apart from a pure-white background).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from gpu_kernels.array import Array

__all__ = [
    "LUMA",
    "ExposureConfig",
    "WhiteBalanceConfig",
    "apply_tone_lut",
    "area_sample",
    "estimate_tone",
    "estimate_white_balance",
    "luma",
    "masked_percentiles",
    "sample_stride",
    "srgb_to_lab",
    "tone_lut",
]

LUMA = (0.299, 0.587, 0.114)  # Rec. 601 luma weights on gamma-encoded RGB (the JPEG convention)


@dataclass(frozen=True, slots=True)
class WhiteBalanceConfig:
    """White balance from neutral evidence (see :func:`estimate_white_balance`).

    Pixels with a channel >= ``saturated`` or an L* below ``min_lightness`` carry no evidence.
    ``sigmas``: the a*b* kernel widths of the mean-shift search for the neutral cluster, from
    wide to narrow. A cluster centre is a plausible illuminant inside the ellipse of half-axes
    ``max_cast_a``, ``max_cast_b`` (lights vary along blue-yellow far more than green-magenta);
    trust fades to 0 at 1.25 times the ellipse. ``min_evidence``: the (lightness-weighted) share
    of the sample in the cluster needed for full confidence; less scales the correction down,
    none leaves the colour alone. The background (alpha <= ``background_max_alpha``) is trusted as
    a backdrop when it covers ``backdrop_min_share`` of the sample, its mean colour is a plausible
    illuminant and its texture (mean ``|grad L*|`` per sample pixel) is at most
    ``backdrop_max_texture`` (fading to 0 at twice that). Gains are clipped to
    ``[1 / max_gain, max_gain]``; they keep the mean level.

    The subject as reference (with a mask): the subject's own near-neutral cluster (alpha >=
    ``subject_min_alpha``, found alike) is the white reference when it is at least as light as
    the backdrop less ``subject_darker`` L* (none at 1.5 times that below it: a white product in
    the shade of a bright cream sweep is still the white reference). A subject's cluster tinted
    less than ``tint_free`` (a*b* distance from neutral) is its own colour (a cream product is
    cream): a backdrop of another colour (more than ``agree`` from it, fully at twice) is then a
    colour, not a cast, and the gains are the subject's; from ``tint_full`` on (a real cast, or
    a strongly coloured subject) the search over the whole frame decides as without a mask.
    """

    background_max_alpha: int = 16
    saturated: int = 250
    min_lightness: float = 20.0
    sigmas: tuple[float, ...] = (16.0, 10.0, 6.0, 4.0)
    max_cast_a: float = 10.0
    max_cast_b: float = 36.0
    bright_pct: float = 99.0
    bright_span: float = 30.0
    min_evidence: float = 0.02
    agree: float = 6.0
    backdrop_min_share: float = 0.05
    backdrop_max_texture: float = 2.5
    max_gain: float = 1.6
    subject_min_alpha: int = 128
    subject_darker: float = 15.0
    tint_free: float = 8.0
    tint_full: float = 14.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.tint_free < self.tint_full or self.subject_darker <= 0:
            raise ValueError(f"white balance needs 0 <= tint_free < tint_full, subject_darker > 0; got {self}")
        if self.max_gain < 1.0:
            raise ValueError(f"white balance max_gain must be >= 1; got {self.max_gain}")
        if not self.sigmas or min(self.sigmas) <= 0:
            raise ValueError(f"white balance sigmas must be positive; got {self.sigmas}")
        if min(self.max_cast_a, self.max_cast_b, self.min_evidence, self.backdrop_max_texture) <= 0:
            raise ValueError(f"white balance limits must be positive; got {self}")
        if not 0.0 <= self.backdrop_min_share <= 1.0:
            raise ValueError(f"white balance backdrop_min_share must be within [0, 1]; got {self.backdrop_min_share}")


@dataclass(frozen=True, slots=True)
class ExposureConfig:
    """Exposure from the frame's highlights (see :func:`estimate_tone`).

    ``high_pct``: the percentile (in percent) of the per-pixel channel mean (and max channel)
    taken as the bright reference, over the whole frame and over the subject (the larger wins).
    ``target_high``: the level (fraction of 255) a bright reference below it is raised to (the
    bright max channel is raised to ``ceiling`` at most, its ``peak_pct`` percentile); ``max_gain``
    bounds that gain. ``low_pct``: the percentile of the frame's channel mean taken as its black
    level; a black level at ``veil_full`` or below allows the whole gain, at ``veil_none`` or above
    none (a washed-out, veiled photo has no shadows left: raising it would wash it out more),
    unless the bright reference is below ``veil_bright`` (fully below it minus 0.1): a photo that
    dark is underexposed whatever its black level (a white product on a white backdrop, dim).
    ``knee``: where the linear part ends and the highlight shoulder starts (fraction of 255,
    output); the shoulder approaches ``ceiling * 255`` without reaching it.
    ``subject_min_alpha``: alpha at or above which a pixel is subject. ``lut_size``: entries of
    the tone table.
    """

    high_pct: float = 99.5
    peak_pct: float = 95.0
    low_pct: float = 1.0
    veil_full: float = 0.25
    veil_none: float = 0.40
    veil_bright: float = 0.75
    target_high: float = 1.0
    max_gain: float = 3.0
    knee: float = 0.95
    ceiling: float = 0.985
    subject_min_alpha: int = 128
    lut_size: int = 1024

    def __post_init__(self) -> None:
        if not 0.0 < self.high_pct <= 100.0:
            raise ValueError(f"exposure high_pct must be within (0, 100]; got {self.high_pct}")
        if not (0.5 <= self.target_high <= 1.0 and 0.0 < self.knee < self.ceiling <= 1.0):
            raise ValueError(f"exposure target_high must lie within [0.5, 1], knee < ceiling within (0, 1]; got {self}")
        if not (0.0 <= self.low_pct < self.high_pct and 0.0 < self.peak_pct <= 100.0):
            raise ValueError(f"exposure percentiles must lie within [0, 100], low below high; got {self}")
        if not (0.0 <= self.veil_full < self.veil_none <= 1.0 and 0.0 <= self.veil_bright <= 1.0):
            raise ValueError(f"exposure veil_full < veil_none and veil_bright must lie within [0, 1]; got {self}")
        if self.max_gain < 1.0:
            raise ValueError(f"exposure max_gain must be >= 1; got {self.max_gain}")
        if self.lut_size < 16:
            raise ValueError(f"exposure lut_size must be >= 16; got {self.lut_size}")


def _clamp(xp: Any, x: Array, lo: float, hi: float) -> Array:
    """``xp.clip(x, lo, hi)``, bit for bit (NaN and the sign of a zero included: the bound wins a
    tie, as in NumPy's clip), in two ufunc calls: ``np.clip``'s Python layers cost ~8 us a call,
    more than the arithmetic on the scalars and small samples of the estimation."""
    return xp.minimum(hi, xp.maximum(lo, x))


def sample_stride(height: int, width: int, side: int) -> int:
    """Stride ``s`` such that ``image[::s, ::s]`` has at most ``side`` pixels along each axis."""
    return max(1, math.ceil(max(height, width) / max(1, side)))


def area_sample(xp: Any, plane: Array, side: int) -> tuple[Array, tuple[int, int], tuple[int, int]]:
    """Block means of ``plane`` ``(H, W)`` or ``(H, W, C)`` uint8: ``(mean float64 (gh, gw[, C]),
    (fy, fx), (oy, ox))``.

    Blocks are ``f × f`` with ``f = sample_stride(H, W, side)`` (``min(f, H)`` rows and
    ``min(f, W)`` columns for an image thinner than a block), so the longer side of the result is
    at most ``side``; the ``H mod fy`` rows and ``W mod fx`` columns left over are split between
    both borders (the blocks start at ``(oy, ox)``). Every pixel of the tiled area counts once: an
    area average, representative where a strided sample would pick one pixel per block. Sums are
    exact integers (``uint16`` down the rows while they cannot overflow, then ``uint32``), the same
    on NumPy and CuPy.
    """
    h, w = plane.shape[:2]
    f = sample_stride(h, w, side)
    fy, fx = min(f, h), min(f, w)
    gh, gw = h // fy, w // fx
    oy, ox = (h - gh * fy) // 2, (w - gw * fx) // 2
    if fy == 1 and fx == 1:
        return plane[oy:oy + gh, ox:ox + gw].astype(xp.float64), (1, 1), (oy, ox)
    tail = plane.shape[2:]
    c = tail[0] if tail else 1
    acc = xp.uint16 if fy * 255 < 65536 else xp.uint32
    # rows first over the full width (a contiguous band: no copy of the image), then columns
    rows = plane[oy:oy + gh * fy].reshape((gh, fy, w * c)).sum(axis=1, dtype=acc)
    rows = rows.reshape((gh, w, c))[:, ox:ox + gw * fx]
    blocks = rows.reshape((gh, gw, fx, *tail)).sum(axis=2, dtype=xp.uint32)
    return blocks.astype(xp.float64) / float(fy * fx), (fy, fx), (oy, ox)


def luma(xp: Any, rgb: Array) -> Array:
    """Luma of ``(..., 3)`` values (any float dtype), same scale; Rec. 601 weights."""
    return rgb[..., 0] * LUMA[0] + rgb[..., 1] * LUMA[1] + rgb[..., 2] * LUMA[2]


def masked_percentiles(xp: Any, values: Array, select: Array, qs: tuple[float, ...]) -> Array:
    """Percentiles (NumPy's "linear" method) of ``values[select]`` without boolean indexing.

    ``values``: ``(n,)`` float64; ``select``: ``(n,)`` bool with at least one True (the caller
    guarantees it). Returns ``(len(qs),)`` float64 on the same device.

    On NumPy (host values: reading the count costs no device sync) only the order statistics
    the percentiles read are placed (``np.partition`` at those ranks, not a full sort) and the
    interpolation runs on Python floats: the same float64 operations, so the same values.
    """
    if xp is np:
        return _host_percentiles(values, select, qs)
    ordered = xp.sort(xp.where(select, values, xp.inf))
    last = xp.maximum(xp.count_nonzero(select) - 1, 0).astype(xp.float64)  # count_nonzero: no int cast
    out = []
    for q in qs:
        pos = last * (q / 100.0)
        lo = xp.floor(pos)
        hi = xp.minimum(lo + 1.0, last)
        frac = pos - lo
        a = xp.take(ordered, lo.astype(xp.int64))
        b = xp.take(ordered, hi.astype(xp.int64))
        out.append(a + (b - a) * frac)
    return xp.stack(out)


def _host_percentiles(values: np.ndarray, select: np.ndarray, qs: tuple[float, ...]) -> np.ndarray:
    """:func:`masked_percentiles` on NumPy: the ranks it reads, from one partial sort."""
    count = int(np.count_nonzero(select))
    last = float(max(count - 1, 0))
    ranks = []
    for q in qs:
        pos = last * (q / 100.0)
        floor = float(math.floor(pos))
        ranks.append((pos, floor, min(floor + 1.0, last)))
    # unselected values go past the end (+inf, as the full sort puts them); all selected: no copy
    pool = values if count == values.shape[0] else np.where(select, values, np.inf)
    kth = sorted({int(r) for _, lo, hi in ranks for r in (lo, hi)})
    ordered = np.partition(pool, kth)
    out = np.empty(len(qs), np.float64)
    for k, (pos, lo, hi) in enumerate(ranks):
        a, b = float(ordered[int(lo)]), float(ordered[int(hi)])
        out[k] = a + (b - a) * (pos - lo)
    return out


def _srgb_linear(xp: Any, rgb: Array) -> Array:
    """Linear-light sRGB of levels 0..255 (float64, any shape): the sRGB transfer curve inverted."""
    c = rgb / 255.0
    return xp.where(c <= 0.04045, c / 12.92, xp.power((xp.maximum(c, 0.04045) + 0.055) / 1.055, 2.4))


@lru_cache(maxsize=4)
def _srgb_linear_table(xp: Any) -> Array:
    """:func:`_srgb_linear` of the 256 integer levels (``(256,)`` float64, on ``xp``'s device)."""
    return _srgb_linear(xp, xp.arange(256, dtype=xp.float64))


def srgb_to_lab(xp: Any, rgb: Array, *, levels: Array | None = None,
                ab_where: Callable[[Array], Array] | None = None) -> Array:
    """CIELAB (D65) of ``(..., 3)`` sRGB levels 0..255 (float64): ``(..., 3)`` L*, a*, b*.

    ``levels``: the same values as uint8 when ``rgb`` holds integer levels (a strided sample of
    an image): the transfer curve is then read from a 256-entry table (the same float64 values
    as computed per pixel) instead of a ``power`` per channel value. The planes are combined in
    place (a handful of temporaries instead of one per operation: a 160-pixel sample's planes
    outgrow the caches), each value by the same float64 operations in the same order.

    ``ab_where`` (NumPy): given L* ``(n,)`` of the flattened pixels, the ``(n,)`` bool rows whose
    a*, b* the caller reads; a*, b* are computed there alone (the same operations on the same
    values, so the same bits) and are 0 elsewhere. A cube root per value is most of the cost, and
    a* and b* take two of the three."""
    shape = rgb.shape[:-1]
    if levels is not None:
        table = _srgb_linear_table(xp)
        flat = levels.reshape(-1, 3)
        r, g, b = (xp.take(table, flat[:, k]) for k in range(3))
    else:
        lin = _srgb_linear(xp, rgb.reshape(-1, 3))
        r, g, b = lin[:, 0], lin[:, 1], lin[:, 2]
    eps, kappa = 216.0 / 24389.0, 24389.0 / 27.0

    def mix(rgb3: tuple[Array, Array, Array], k: tuple[float, float, float], tmp: Array) -> Array:
        out = xp.multiply(rgb3[0], k[0])  # k0 r + k1 g + k2 b
        out += xp.multiply(rgb3[1], k[1], out=tmp)
        out += xp.multiply(rgb3[2], k[2], out=tmp)
        return out

    def f(t: Array, tmp: Array, above: Array) -> Array:
        # where(t > eps, cbrt(max(t, eps)), (kappa t + 16) / 116), into t
        xp.greater(t, eps, out=above)
        xp.maximum(t, eps, out=tmp)
        xp.cbrt(tmp, out=tmp)
        t *= kappa
        t += 16.0
        t /= 116.0
        xp.copyto(t, tmp, where=above)
        return t

    n = r.shape[0]
    tmp, above = xp.empty(n, xp.float64), xp.empty(n, bool)
    fy = f(mix((r, g, b), (0.2126729, 0.7151522, 0.0721750), tmp), tmp, above)
    out = xp.empty((n, 3), xp.float64)
    xp.multiply(fy, 116.0, out=out[:, 0])
    out[:, 0] -= 16.0
    rows = None if ab_where is None else xp.flatnonzero(ab_where(out[:, 0]))
    if rows is not None and rows.shape[0] < n:
        part = (r[rows], g[rows], b[rows])
        fy_rows = fy[rows]
        tmp, above = xp.empty(rows.shape[0], xp.float64), xp.empty(rows.shape[0], bool)
    else:
        rows, part, fy_rows = None, (r, g, b), fy
    x = mix(part, (0.4124564, 0.3575761, 0.1804375), tmp)
    x /= 0.95047
    fx = f(x, tmp, above)
    z = mix(part, (0.0193339, 0.1191920, 0.9503041), tmp)
    z /= 1.08883
    fz = f(z, tmp, above)
    if rows is None:
        xp.subtract(fx, fy, out=out[:, 1])
        out[:, 1] *= 500.0
        xp.subtract(fy, fz, out=out[:, 2])
        out[:, 2] *= 200.0
    else:
        out[:, 1:] = 0.0
        fx -= fy_rows
        fx *= 500.0
        out[rows, 1] = fx
        xp.subtract(fy_rows, fz, out=fz)
        fz *= 200.0
        out[rows, 2] = fz
    return out.reshape(*shape, 3)


LOCUS_SLOPE = 0.3  # a* per b* of a white under lights along the daylight/Planckian locus (warm: +a*)


def _plausible(xp: Any, a: Array, b: Array, cfg: WhiteBalanceConfig) -> Array:
    """1 inside the illuminant ellipse (around the locus ``a* = 0.3 b*``), fading to 0 at 1.25
    times it."""
    norm = math.sqrt(1.0 + LOCUS_SLOPE * LOCUS_SLOPE)
    along = (b + LOCUS_SLOPE * a) / norm
    across = (a - LOCUS_SLOPE * b) / norm
    r = xp.sqrt((across / cfg.max_cast_a) ** 2 + (along / cfg.max_cast_b) ** 2)
    return _clamp(xp, (1.25 - r) / 0.25, 0.0, 1.0)


def _host_plausible(a: float, b: float, cfg: WhiteBalanceConfig) -> float:
    """:func:`_plausible` on Python floats: the same operations (``x ** 2`` as ``x * x``, both
    the rounded square; the clamp's bounds win a tie, as in :func:`_clamp`)."""
    norm = math.sqrt(1.0 + LOCUS_SLOPE * LOCUS_SLOPE)
    along = (b + LOCUS_SLOPE * a) / norm
    across = (a - LOCUS_SLOPE * b) / norm
    u, v = across / cfg.max_cast_a, along / cfg.max_cast_b
    r = math.sqrt(u * u + v * v)
    return min(1.0, max(0.0, (1.25 - r) / 0.25))


def _balancing_gains(xp: Any, illuminant: Array) -> Array:
    """Gains that make ``illuminant`` (3,) levels neutral and keep its mean level."""
    return illuminant.mean() / xp.maximum(illuminant, 1e-6)


def _gaussian_kernel(xp: Any, a: Array, b: Array, centre: Array, sigma: float, weight: Array, db: Array) -> Array:
    """``weight * exp(-0.5 * d2 / sigma^2)``, ``d2 = (a - centre[0])^2 + (b - centre[1])^2``: a new
    array, made in place by the same float64 operations on NumPy and CuPy (``db``: scratch of ``b``'s shape)."""
    k = xp.subtract(a, centre[0])
    k *= k
    xp.subtract(b, centre[1], out=db)
    db *= db
    k += db
    k *= -0.5
    k /= sigma * sigma
    xp.exp(k, out=k)
    k *= weight
    return k


def _host_mean_shift(ab: np.ndarray, weight: np.ndarray, sigmas: tuple[float, ...]) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_neutral_cluster`'s mean-shift on NumPy: ``(kernel (n,), centre (2,))``.

    The per-pixel kernel runs on the pixels of non-zero weight alone (the others' is
    ``exp(.) * 0 == +0.0``, which a zero-filled kernel holds already): each value by the same
    float64 operations, and the sums over the full-length kernel, so the same bits."""
    live = np.flatnonzero(weight > 0)
    la, lb, lw = ab[live, 0], ab[live, 1], weight[live]
    db = np.empty_like(la)
    centre = np.zeros(2, np.float64)
    # one zero-filled kernel for every sigma: each overwrites the same live rows
    kernel = np.zeros(weight.shape[0], np.float64)
    for sigma in sigmas:
        kernel[live] = _gaussian_kernel(np, la, lb, centre, sigma, lw, db)
        mass = kernel.sum()
        if mass > 1e-12:  # else the centre stays; max(mass, 1e-12) == mass here
            centre = (kernel @ ab) / mass
    return kernel, centre


def _cluster_weight(xp: Any, light: Array, valid: Array, cfg: WhiteBalanceConfig) -> Array:
    """:func:`_neutral_cluster`'s pixel weights ``(n,)`` float64: the ``valid`` pixels' lightness
    near their top (white-patch), 0 for the others; the mean-shift reads a*b* where they are > 0."""
    # valid | ~any(valid): on NumPy without the array operations (valid, or every pixel)
    host = xp is np
    select = (valid if valid.any() else np.ones_like(valid)) if host else valid | ~xp.any(valid)
    top = masked_percentiles(xp, light, select, (cfg.bright_pct,))[0]
    bright = _clamp(xp, (light - (top - cfg.bright_span)) / (0.5 * cfg.bright_span), 0.0, 1.0)
    return xp.where(valid, bright, 0.0)


def _neutral_cluster(
    xp: Any, flat: Array, light: Array, ab: Array, valid: Array, cfg: WhiteBalanceConfig,
    weight: Array | None = None,
) -> tuple[Array, Array, Array]:
    """The near-neutral cluster of the ``valid`` pixels: ``(centre (2,) a*b*, kernel (n,) weights,
    confidence)``. Pixels are weighted by their lightness near the ``valid`` pixels' top
    (white-patch, :func:`_cluster_weight`; ``weight``: those weights, already computed); a
    mean-shift in a*b* that starts at neutral and narrows finds the cluster."""
    if weight is None:
        weight = _cluster_weight(xp, light, valid, cfg)
    if xp is np:  # the same float64 operations on Python floats (a few microseconds each as 0-d arrays)
        kernel, centre = _host_mean_shift(ab, weight, cfg.sigmas)
        mass = float(kernel.sum())
        if not mass > 1e-12:
            return centre, kernel, np.float64(0.0)
        share = mass / float(max(int(np.count_nonzero(valid)), 1)) / cfg.min_evidence
        plausible = _host_plausible(float(centre[0]), float(centre[1]), cfg)
        return centre, kernel, np.float64(min(1.0, max(0.0, share)) * plausible)
    total = xp.maximum(xp.count_nonzero(valid), 1.0)
    centre = xp.zeros(2, xp.float64)
    kernel = weight
    ca, cb = xp.ascontiguousarray(ab[:, 0]), xp.ascontiguousarray(ab[:, 1])
    db = xp.empty_like(ca)
    for sigma in cfg.sigmas:  # weighted sums as matrix products (one pass each, no (n, k) temporaries)
        kernel = _gaussian_kernel(xp, ca, cb, centre, sigma, weight, db)
        mass = kernel.sum()
        centre = xp.where(mass > 1e-12, (kernel @ ab) / xp.maximum(mass, 1e-12), centre)
    mass = kernel.sum()
    confidence = _clamp(xp, mass / total / cfg.min_evidence, 0.0, 1.0) * _plausible(xp, centre[0], centre[1], cfg)
    confidence = xp.where(mass > 1e-12, confidence, 0.0)
    return centre, kernel, confidence


def estimate_white_balance(
    xp: Any, rgb: Array, alpha: Array | None, cfg: WhiteBalanceConfig, *, levels: Array | None = None
) -> Array:
    """Per-channel gains ``(3,)`` float32 from neutral evidence in a sample.

    ``rgb``: ``(h, w, 3)`` float64 levels (the strided sample, its neighbours are neighbours);
    ``alpha``: ``(h, w)`` float64 in 0..255 or None; ``levels``: ``rgb`` as uint8 when it holds
    integer levels (see :func:`srgb_to_lab`; the same result, cheaper).

    1. Neutral evidence: pixels (not clipped, not dark) weighted by ``(L*/100)^2`` (bright
       pixels are the better witnesses: white-patch), and a mean-shift in a*b* that starts at
       neutral and narrows (``cfg.sigmas``) finds the cluster of near-neutral pixels nearest to
       neutral: a white or grey object, a specular highlight, a grey backdrop, under whatever
       plausible cast. A saturated surface (wood, green cloth, blue paper) lies far from it and
       weighs (almost) nothing. The illuminant is the cluster's mean colour; confidence grows with
       its share of the sample and fades when its centre is no plausible light.
    2. Backdrop: a background that covers enough of the sample, is of plausible colour and of
       low texture (a studio sweep, paper, a grey table) is itself the neutral reference.
    3. Gains ``(illuminant mean / illuminant) ** confidence`` (blended, in log space, with the
       backdrop's by its trust), clipped to ``max_gain``. No evidence: gains 1.
    4. The subject as reference (see :class:`WhiteBalanceConfig`): a white product on a cream or
       beige backdrop stays white, a cream one stays cream; a cast both share is still removed.
    """
    n = rgb.shape[0] * rgb.shape[1]
    flat = rgb.reshape(-1, 3)
    peak = xp.maximum(xp.maximum(flat[:, 0], flat[:, 1]), flat[:, 2])  # max over channels, without a reduce
    a_flat = None if alpha is None else alpha.reshape(-1)
    weights: list[Array] = []  # on NumPy: the clusters' weights, computed once L* is known
    seen: list[Array] = []  # and the valid pixels

    def ab_rows(light: Array) -> Array:
        """The pixels whose a*b* are read: the clusters' (weight > 0) and the background's."""
        valid = (peak < cfg.saturated) & (light >= cfg.min_lightness)
        seen.append(valid)  # L* is final here: the same mask as below
        weights.append(_cluster_weight(xp, light, valid, cfg))
        rows = weights[0] > 0
        if a_flat is not None:
            weights.append(_cluster_weight(xp, light, valid & (a_flat >= cfg.subject_min_alpha), cfg))
            rows |= weights[1] > 0
            rows |= valid & (a_flat <= cfg.background_max_alpha)
        return rows

    lab = srgb_to_lab(xp, flat, levels=None if levels is None else levels.reshape(-1, 3),
                      ab_where=ab_rows if xp is np else None)
    light, ab = lab[:, 0], lab[:, 1:]
    valid = seen[0] if seen else (peak < cfg.saturated) & (light >= cfg.min_lightness)
    centre, kernel, confidence = _neutral_cluster(xp, flat, light, ab, valid, cfg,
                                                  weights[0] if weights else None)
    mass = kernel.sum()
    illuminant = xp.maximum((kernel @ flat) / xp.maximum(mass, 1e-12), 1.0)
    log_gain = confidence * xp.log(_balancing_gains(xp, illuminant))
    if alpha is not None:
        bg = valid & (alpha.reshape(-1) <= cfg.background_max_alpha)
        count = bg.sum()
        bgw = bg.astype(xp.float64)
        bg_rgb = (bgw @ flat) / xp.maximum(count, 1)
        bg_ab = (bgw @ ab) / xp.maximum(count, 1)
        plane = light.reshape(rgb.shape[:2])
        gx = xp.abs(plane[:, 1:] - plane[:, :-1])
        gy = xp.abs(plane[1:, :] - plane[:-1, :])
        mask2 = bgw.reshape(rgb.shape[:2])
        both_x = mask2[:, 1:] * mask2[:, :-1]
        both_y = mask2[1:, :] * mask2[:-1, :]
        pairs = both_x.sum() + both_y.sum()
        texture = ((gx * both_x).sum() + (gy * both_y).sum()) / xp.maximum(pairs, 1.0)
        t_max = cfg.backdrop_max_texture
        disagree = xp.sqrt(((bg_ab - centre) ** 2).sum())
        trust = (
            _clamp(xp, count / (cfg.backdrop_min_share * n), 0.0, 1.0)
            * _plausible(xp, bg_ab[0], bg_ab[1], cfg)
            * _clamp(xp, (2.0 * t_max - texture) / t_max, 0.0, 1.0)
            * (pairs > 0)
            * (1.0 - confidence * _clamp(xp, (disagree - cfg.agree) / cfg.agree, 0.0, 1.0))
        )
        log_bg = xp.log(_balancing_gains(xp, xp.maximum(bg_rgb, 1.0)))
        log_gain = trust * log_bg + (1.0 - trust) * log_gain
        # the subject as reference: its own near-neutral cluster, when it is as light as the backdrop
        subject = valid & (alpha.reshape(-1) >= cfg.subject_min_alpha)
        s_centre, s_kernel, s_conf = _neutral_cluster(xp, flat, light, ab, subject, cfg,
                                                      weights[1] if weights else None)
        s_mass = xp.maximum(s_kernel.sum(), 1e-12)
        s_light = (s_kernel @ light) / s_mass
        bg_light = (bgw @ light) / xp.maximum(count, 1)
        lighter = _clamp(xp, (s_light - bg_light + 1.5 * cfg.subject_darker) / (0.5 * cfg.subject_darker), 0.0, 1.0)
        own = s_conf * lighter * (count > 0)
        tint = xp.sqrt((s_centre ** 2).sum())
        cast = _clamp(xp, (tint - cfg.tint_free) / (cfg.tint_full - cfg.tint_free), 0.0, 1.0)
        s_illuminant = xp.maximum((s_kernel @ flat) / s_mass, 1.0)
        log_own = cast * xp.log(_balancing_gains(xp, s_illuminant))
        apart = _clamp(xp, (xp.sqrt(((bg_ab - s_centre) ** 2).sum()) - cfg.agree) / cfg.agree, 0.0, 1.0)
        # a backdrop of another colour than the subject's near-white: a colour, not a cast (a
        # strongly tinted subject, an orange cat, is no white reference: the search above decides)
        override = own * apart * (1.0 - cast)
        log_gain = override * log_own + (1.0 - override) * log_gain
        log_gain = log_gain * (1.0 - own * (1.0 - cast))  # a pale tint of the reference is its colour
    limit = math.log(cfg.max_gain)
    gains = xp.exp(_clamp(xp, log_gain, -limit, limit))
    return gains.astype(xp.float32)


def estimate_tone(xp: Any, levels: Array, alpha: Array | None, cfg: ExposureConfig, *,
                  codes: Array | None = None) -> Array:
    """Exposure gain ``(1,)`` float64 (>= 1) from the frame's highlights.

    ``levels``: ``(n, 3)`` float64 levels of the input sample (the camera's exposure: before white
    balance, whose gains keep the mean level but move clipped highlights); ``alpha``: ``(n,)``
    0..255 or None; ``codes``: ``levels`` as uint8 when they are integer levels (a strided sample
    of an RGB(A) image): on NumPy the percentiles are then read from histograms of the channel
    sums and maxima (exact integers: the same order statistics, so the same value).

    Two bright references, each over the whole frame, or over the subject when that is higher
    (at least 16 subject pixels and 0.5 % of the sample): the ``high_pct`` percentile of the
    channel mean (the level of a white backdrop, of a product's highlights, of a scene's
    brightest parts) and the ``peak_pct`` percentile of the max channel. A photo is
    underexposed when even its bright mean is below ``target_high``: the gain raises it there, but
    never lifts the bright max channel above ``ceiling`` (a saturated colour keeps its channels
    apart), never exceeds ``max_gain``, and fades out when the frame's black level is high while
    its highlights are bright (a veiled, washed-out photo). Nothing else moves: a dark, saturated or light product on a
    well-exposed backdrop keeps its levels, hue and saturation (the subject's median is no target:
    a navy dress is not a mid-grey one), and a photo bright enough is not darkened (an over-exposed
    one has lost the information to do so). One gain for all channels: hue is kept wherever the
    curve is linear (below the knee).
    """
    if xp is np and codes is not None:
        return _host_tone_levels(codes, alpha, cfg)
    c0, c1, c2 = levels[:, 0], levels[:, 1], levels[:, 2]
    # the channel mean and max column by column: levels.mean(axis=1) / levels.max(axis=1) are
    # the same sums and maxima, but NumPy's reductions over a length-3 axis cost ~10x as much
    stats = ((c0 + c1 + c2) / 3.0, xp.maximum(xp.maximum(c0, c1), c2))
    if xp is np:
        return _host_tone(stats, alpha, cfg)
    everything = xp.ones(levels.shape[0], dtype=bool)
    qs = (cfg.high_pct, cfg.peak_pct)
    high_low = masked_percentiles(xp, stats[0], everything, (cfg.high_pct, cfg.low_pct))  # one sort
    refs = xp.stack([high_low[0], masked_percentiles(xp, stats[1], everything, (cfg.peak_pct,))[0]])
    if alpha is not None:
        subject = alpha >= cfg.subject_min_alpha
        enough = xp.sum(subject) >= max(16.0, 0.005 * levels.shape[0])
        select = xp.where(enough, subject, everything)
        own = xp.stack([masked_percentiles(xp, v, select, (q,))[0] for v, q in zip(stats, qs, strict=True)])
        refs = xp.maximum(refs, own)
    refs = xp.maximum(refs, 1e-6)
    gain = xp.minimum(cfg.target_high * 255.0 / refs[0], cfg.ceiling * 255.0 / refs[1])
    gain = xp.minimum(xp.maximum(gain, 1.0), cfg.max_gain)
    black = high_low[1] / 255.0
    veil = _clamp(xp, (cfg.veil_none - black) / (cfg.veil_none - cfg.veil_full), 0.0, 1.0)
    dim = _clamp(xp, (cfg.veil_bright - refs[0] / 255.0) / 0.1, 0.0, 1.0)  # too dark to be veiled
    veil = xp.maximum(veil, dim)
    return (1.0 + (gain - 1.0) * veil).reshape(1)


def _host_tone(stats: tuple[np.ndarray, np.ndarray], alpha: np.ndarray | None, cfg: ExposureConfig) -> np.ndarray:
    """:func:`estimate_tone` on NumPy from its ``(channel mean, max channel)`` columns: the same
    float64 operations on Python floats instead of 0-d arrays (a few microseconds each)."""
    mean, peak = stats
    everything = np.ones(mean.shape[0], dtype=bool)
    high, low = (float(v) for v in _host_percentiles(mean, everything, (cfg.high_pct, cfg.low_pct)))
    ref0, ref1 = high, float(_host_percentiles(peak, everything, (cfg.peak_pct,))[0])
    if alpha is not None:
        subject = alpha >= cfg.subject_min_alpha
        select = subject if np.sum(subject) >= max(16.0, 0.005 * mean.shape[0]) else everything
        ref0 = max(ref0, float(_host_percentiles(mean, select, (cfg.high_pct,))[0]))
        ref1 = max(ref1, float(_host_percentiles(peak, select, (cfg.peak_pct,))[0]))
    return _tone_gain(ref0, ref1, low, cfg)


def _level_percentiles(counts: np.ndarray, qs: tuple[float, ...], divisor: float) -> list[float]:
    """:func:`_host_percentiles` of values ``k / divisor`` given by their histogram ``counts``
    (``counts[k]``: how many values are ``k / divisor``, ``k`` an integer; at least one value):
    the order statistic at rank ``r`` is the least ``k`` whose cumulative count exceeds ``r``,
    and the interpolation runs on the same Python floats, so the same value."""
    cum = np.cumsum(counts)
    last = float(max(int(cum[-1]) - 1, 0))
    ranks = []
    for q in qs:
        pos = last * (q / 100.0)
        floor = float(math.floor(pos))
        ranks.append((pos, floor, min(floor + 1.0, last)))
    at = np.searchsorted(cum, [r for _, lo, hi in ranks for r in (lo, hi)], side="right").tolist()
    out = []
    for k, (pos, lo, _) in enumerate(ranks):
        a, b = at[2 * k] / divisor, at[2 * k + 1] / divisor
        out.append(a + (b - a) * (pos - lo))
    return out


def _host_tone_levels(codes: np.ndarray, alpha: np.ndarray | None, cfg: ExposureConfig) -> np.ndarray:
    """:func:`_host_tone` for integer levels ``codes`` ``(n, 3)`` uint8: the channel mean of a
    pixel is ``(c0 + c1 + c2) / 3.0`` of an exact integer sum, its max channel an integer, so
    each percentile is read from a histogram (766 and 256 bins) instead of a partial sort."""
    c0, c1, c2 = codes[:, 0], codes[:, 1], codes[:, 2]
    sums = c0.astype(np.intp)
    sums += c1
    sums += c2
    peak = np.maximum(np.maximum(c0, c1), c2)
    hist_sum, hist_peak = np.bincount(sums, minlength=766), np.bincount(peak, minlength=256)
    high, low = _level_percentiles(hist_sum, (cfg.high_pct, cfg.low_pct), 3.0)
    ref0, ref1 = high, _level_percentiles(hist_peak, (cfg.peak_pct,), 1.0)[0]
    if alpha is not None:
        subject = alpha >= cfg.subject_min_alpha
        if np.sum(subject) >= max(16.0, 0.005 * codes.shape[0]):
            ref0 = max(ref0, _level_percentiles(np.bincount(sums[subject], minlength=766), (cfg.high_pct,), 3.0)[0])
            ref1 = max(ref1, _level_percentiles(np.bincount(peak[subject], minlength=256), (cfg.peak_pct,), 1.0)[0])
    return _tone_gain(ref0, ref1, low, cfg)


def _tone_gain(ref0: float, ref1: float, low: float, cfg: ExposureConfig) -> np.ndarray:
    """:func:`_host_tone`'s gain from its bright references and black level (Python floats)."""
    ref0, ref1 = max(ref0, 1e-6), max(ref1, 1e-6)
    gain = min(cfg.target_high * 255.0 / ref0, cfg.ceiling * 255.0 / ref1)
    gain = min(max(gain, 1.0), cfg.max_gain)
    black = low / 255.0
    veil = min(1.0, max(0.0, (cfg.veil_none - black) / (cfg.veil_none - cfg.veil_full)))
    dim = min(1.0, max(0.0, (cfg.veil_bright - ref0 / 255.0) / 0.1))  # too dark to be veiled
    return np.array([1.0 + (gain - 1.0) * max(veil, dim)], np.float64)


def tone_lut(xp: Any, tone: Array, v_max: Array, cfg: ExposureConfig) -> tuple[Array, Array]:
    """The tone curve as ``(lut (lut_size,) float32, scale (1,) float32)``.

    ``lut[i] = f(i * v_max / (n - 1))`` in levels, ``scale = (n - 1) / v_max``; ``f(v) = g v``
    up to the knee ``k = knee * 255``, then a shoulder with the same slope at the knee that
    approaches ``c = ceiling * 255``: ``k + (c - k) (1 - exp(-(g v - k) / (c - k)))`` (highlight
    protection). ``tone`` is :func:`estimate_tone`'s gain ``g``, ``v_max`` a float64 scalar array
    (largest possible input).
    """
    n = cfg.lut_size
    gain = tone[0]
    v = xp.arange(n, dtype=xp.float64) * (v_max / (n - 1))
    lin = gain * v / 255.0
    knee, top = cfg.knee, cfg.ceiling
    shoulder = knee + (top - knee) * (1.0 - xp.exp(-xp.maximum(lin - knee, 0.0) / (top - knee)))
    out = xp.where(lin > knee, shoulder, lin)
    lut = (out * 255.0).astype(xp.float32)
    scale = ((n - 1) / v_max).astype(xp.float32).reshape(1)
    return lut, scale


def apply_tone_lut(xp: Any, v: Array, lut: Array, scale: Array) -> Array:
    """``f(v)`` by linear interpolation in ``lut``; ``v`` float32 levels >= 0, any shape.

    Computes ``lo + (t - i) * (lut[i + 1] - lo)`` with ``lo = lut[i]``, ``t = v * scale``,
    ``i = min(int(t), n - 2)``; the differences are taken from a table (same float32 values).
    """
    t = v * scale[0]
    i = t.astype(xp.int32)
    xp.minimum(i, lut.shape[0] - 2, out=i)
    f = i.astype(xp.float32)
    xp.subtract(t, f, out=f)
    xp.multiply(f, xp.take(lut[1:] - lut[:-1], i), out=f)
    y = xp.take(lut, i)
    y += f
    return y

