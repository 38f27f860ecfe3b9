"""White balance and exposure/gamma: parameter estimation and the per-pixel maths.

Estimation runs on a strided sample of the image (``image[::s, ::s]``, at most
``sample_side`` pixels along the longer side) in float64, with array-module-generic code
(``xp`` is ``numpy`` or ``cupy``): no Python branch depends on a device value, so on the GPU it
never synchronises and its results stay on the device.

Working values ("levels") are float32 on the 0..255 scale. The per-pixel maths:

* white balance: ``v_c = x_c * wb_c`` (one gain per channel);
* exposure + gamma + highlight protection: one monotone tone curve ``f`` applied to every
  channel, tabulated as a float32 look-up table of ``lut_size`` entries over ``[0, v_max]`` and
  read with linear interpolation: ``t = v * scale``, ``i = min(int(t), n - 2)``,
  ``y = lut[i] + (t - i) * (lut[i + 1] - lut[i])``. The GPU kernel does exactly these float32
  operations in this order, so both backends agree to rounding.

The curve maps the subject's luminance percentiles ``(p_low, p_mid, p_high)`` to
``(target_low, target_mid, target_high)``: levels ``t = (v - lo) / (hi - lo)``, gamma on
``[0, 1]`` (``target_low + (target_high - target_low) * t ** gamma``), a linear toe from
``(0, 0)`` to ``(lo, target_low)`` below, and above ``hi`` an exponential shoulder that keeps
the slope at ``hi`` and approaches 255 without clipping (highlight protection). Stretch and
gamma are clipped to the config's limits, so the targets are met only within those limits.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

__all__ = [
    "LUMA",
    "ExposureConfig",
    "WhiteBalanceConfig",
    "apply_tone_lut",
    "estimate_tone",
    "estimate_white_balance",
    "luma",
    "masked_percentiles",
    "sample_stride",
    "tone_lut",
]

Array = Any
LUMA = (0.299, 0.587, 0.114)  # Rec. 601 luma weights on gamma-encoded RGB (the JPEG convention)


@dataclass(frozen=True, slots=True)
class WhiteBalanceConfig:
    """White balance gains: background mean → neutral, or gray-world without a background.

    A pixel counts as background where alpha <= ``background_max_alpha``; pixels with a channel
    >= ``saturated`` or all channels <= ``dark`` are ignored. With at least ``min_share`` of the
    sample (and 16 pixels) as background, the background's channel means are equalised (gains
    clipped to ``[1/max_gain, max_gain]``); otherwise gray-world over all valid pixels with the
    tighter ``gray_world_max_gain``. Gains keep the mean level (their weighted mean is 1).
    """

    background_max_alpha: int = 16
    min_share: float = 0.01
    saturated: int = 250
    dark: int = 8
    max_gain: float = 2.0
    gray_world_max_gain: float = 1.25

    def __post_init__(self) -> None:
        if not (self.max_gain >= 1.0 and self.gray_world_max_gain >= 1.0):
            raise ValueError(f"white balance gain limits must be >= 1; got {self}")
        if not 0.0 <= self.min_share <= 1.0:
            raise ValueError(f"white balance min_share must be within [0, 1]; got {self.min_share}")


@dataclass(frozen=True, slots=True)
class ExposureConfig:
    """Exposure and gamma from luminance percentiles (subject pixels when there is a mask).

    Percentiles in percent, targets as fractions of 255. ``max_black``: the black point never
    moves above this fraction; ``max_stretch``/``min_stretch`` bound the levels' slope
    ``(target_high - target_low) * 255 / (hi - lo)``; ``gamma_min``/``gamma_max`` bound gamma.
    ``subject_min_alpha``: alpha at or above which a pixel is subject. ``lut_size``: entries of
    the tone table.
    """

    low_pct: float = 1.0
    mid_pct: float = 50.0
    high_pct: float = 99.0
    target_low: float = 0.02
    target_mid: float = 0.45
    target_high: float = 0.96
    max_black: float = 0.12
    max_stretch: float = 2.5
    min_stretch: float = 0.6
    gamma_min: float = 0.5
    gamma_max: float = 2.0
    subject_min_alpha: int = 128
    lut_size: int = 1024

    def __post_init__(self) -> None:
        if not 0.0 <= self.low_pct < self.mid_pct < self.high_pct <= 100.0:
            raise ValueError(f"exposure percentiles must rise within [0, 100]; got {self}")
        if not 0.0 < self.target_low < self.target_mid < self.target_high < 1.0:
            raise ValueError(f"exposure targets must rise within (0, 1); got {self}")
        stretch_ok = 0 < self.min_stretch <= 1 <= self.max_stretch
        if not (stretch_ok and 0 < self.gamma_min <= 1 <= self.gamma_max):
            raise ValueError(f"exposure stretch/gamma limits must bracket 1; got {self}")
        if self.lut_size < 16:
            raise ValueError(f"exposure lut_size must be >= 16; got {self.lut_size}")


def sample_stride(height: int, width: int, side: int) -> int:
    """Stride ``s`` such that ``image[::s, ::s]`` has at most ``side`` pixels along each axis."""
    return max(1, math.ceil(max(height, width) / max(1, side)))


def luma(xp: Any, rgb: Array) -> Array:
    """Luma of ``(..., 3)`` values (any float dtype), same scale; Rec. 601 weights."""
    return rgb[..., 0] * LUMA[0] + rgb[..., 1] * LUMA[1] + rgb[..., 2] * LUMA[2]


def masked_percentiles(xp: Any, values: Array, select: Array, qs: tuple[float, ...]) -> Array:
    """Percentiles (NumPy's "linear" method) of ``values[select]`` without boolean indexing.

    ``values``: ``(n,)`` float64; ``select``: ``(n,)`` bool with at least one True (the caller
    guarantees it). Returns ``(len(qs),)`` float64 on the same device.
    """
    ordered = xp.sort(xp.where(select, values, xp.inf))
    last = xp.maximum(xp.sum(select) - 1, 0).astype(xp.float64)
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


def estimate_white_balance(
    xp: Any, rgb: Array, alpha: Array | None, cfg: WhiteBalanceConfig
) -> Array:
    """Per-channel gains ``(3,)`` float32 from a sample.

    ``rgb``: ``(n, 3)`` float64 levels; ``alpha``: ``(n,)`` float64 in 0..255 or None.
    """
    mx = rgb.max(axis=1)
    valid = (mx < cfg.saturated) & (mx > cfg.dark)
    n = rgb.shape[0]
    if alpha is not None:
        bg = valid & (alpha <= cfg.background_max_alpha)
        use_bg = xp.sum(bg) >= max(16.0, cfg.min_share * n)
        weights = xp.where(use_bg, bg, valid)
        limit = xp.where(use_bg, xp.asarray(cfg.max_gain), xp.asarray(cfg.gray_world_max_gain))
    else:
        weights = valid
        limit = xp.asarray(cfg.gray_world_max_gain)
    count = xp.sum(weights)
    means = (rgb * weights[:, None]).sum(axis=0) / xp.maximum(count, 1)
    gains = means.mean() / xp.maximum(means, 1e-6)
    gains = xp.minimum(xp.maximum(gains, 1.0 / limit), limit)
    gains = xp.where(count > 0, gains, xp.ones_like(gains))
    return gains.astype(xp.float32)


def estimate_tone(xp: Any, lum: Array, alpha: Array | None, cfg: ExposureConfig) -> Array:
    """Tone parameters ``(4,)`` float64 ``[lo, mid, hi, gamma]`` (levels, levels, levels, -).

    ``lum``: ``(n,)`` float64 luma of the white-balanced (and illumination-corrected) sample;
    ``alpha``: ``(n,)`` 0..255 or None. Subject pixels are used when there are at least 16 of
    them (and 0.5 % of the sample), else all pixels.
    """
    everything = xp.ones(lum.shape, dtype=bool)
    if alpha is not None:
        subject = alpha >= cfg.subject_min_alpha
        enough = xp.sum(subject) >= max(16.0, 0.005 * lum.shape[0])
        select = xp.where(enough, subject, everything)
    else:
        select = everything
    p = masked_percentiles(xp, lum, select, (cfg.low_pct, cfg.mid_pct, cfg.high_pct))
    t_lo, t_mid, t_hi = cfg.target_low, cfg.target_mid, cfg.target_high
    span = (t_hi - t_lo) * 255.0
    lo = xp.minimum(p[0], cfg.max_black * 255.0)
    hi = xp.minimum(xp.maximum(p[2], lo + span / cfg.max_stretch), lo + span / cfg.min_stretch)
    t_m = xp.minimum(xp.maximum((p[1] - lo) / (hi - lo), 0.02), 0.98)
    tau = (t_mid - t_lo) / (t_hi - t_lo)
    gamma = xp.minimum(xp.maximum(math.log(tau) / xp.log(t_m), cfg.gamma_min), cfg.gamma_max)
    return xp.stack([lo, p[1], hi, gamma])


def tone_lut(xp: Any, tone: Array, v_max: Array, cfg: ExposureConfig) -> tuple[Array, Array]:
    """The tone curve as ``(lut (lut_size,) float32, scale (1,) float32)``.

    ``lut[i] = f(i * v_max / (n - 1))`` in levels, ``scale = (n - 1) / v_max``. ``tone`` is
    :func:`estimate_tone`'s output, ``v_max`` a float64 scalar array (largest possible input).
    """
    n = cfg.lut_size
    t_lo, t_hi = cfg.target_low, cfg.target_high
    lo, hi, gamma = tone[0], tone[2], tone[3]
    v = xp.arange(n, dtype=xp.float64) * (v_max / (n - 1))
    t = (v - lo) / (hi - lo)
    body = t_lo + (t_hi - t_lo) * xp.power(xp.minimum(xp.maximum(t, 0.0), 1.0), gamma)
    slope = (t_hi - t_lo) * gamma  # d out / d t at t = 1
    above = xp.maximum(t - 1.0, 0.0)
    shoulder = t_hi + (1.0 - t_hi) * (1.0 - xp.exp(-slope * above / (1.0 - t_hi)))
    toe = t_lo * xp.maximum(v / xp.maximum(lo, 1e-6), 0.0)
    out = xp.where(t > 1.0, shoulder, xp.where(v < lo, toe, body))
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

