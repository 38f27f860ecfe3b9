"""Retinex-style local illumination correction (multi-scale Gaussian surround on luminance).

The gain is computed on the estimation sample (see :mod:`.color`) and upsampled bilinearly per
pixel inside the fused pass. For a sample luma ``Y`` and subject weights ``w`` (alpha / 255, or
1 without a mask), each scale ``σ_k = scale_k * max(h, w)`` gives a normalised-convolution
surround ``S_k = G_k*(w Y) / G_k*w`` (so a bright background does not darken the subject's
edges); with ``log S = mean_k log(1 + S_k)`` and its subject-weighted mean ``log Ī``,

    gain = clip(exp(strength * (log Ī - log S)), min_gain, max_gain)

i.e. ``Y → Y * (Ī / S) ** strength``: Retinex (``Y / S``) blended with the input by
``strength``, normalised so that the subject's mean log-gain is 0 (the global level is left to
the exposure stage). Where the surround has (almost) no support (far from any subject pixel),
the gain is 1. Gaussian blurs are matrix products with precomputed ``(n, n)`` matrices (reflect
borders), identical on NumPy and CuPy.
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
    "MapGrid",
    "RetinexConfig",
    "gain_columns",
    "gain_rows",
    "gaussian_matrix",
    "illumination_gain",
    "map_positions",
]

MatrixFn = Callable[[int, float], Array]


@dataclass(frozen=True, slots=True)
class MapGrid:
    """Where the cells of a low-resolution map (the statistics sample, the Retinex gain map) sit
    in the image: image pixel ``(y, x)`` reads the map at ``((y - origin_y) / step_y,
    (x - origin_x) / step_x)``, clipped into the map, with bilinear interpolation.

    A strided sample (``image[::s, ::s]``) has ``step = s``, ``origin = 0``; an area-averaged one
    of ``f × f`` blocks starting at ``(oy, ox)`` has ``step = f`` and ``origin = o + (f - 1) / 2``
    (the block centres). :meth:`shifted` gives the grid seen from a crop that starts at ``(dy, dx)``.
    """

    step_y: float
    step_x: float
    origin_y: float = 0.0
    origin_x: float = 0.0

    def shifted(self, dy: int, dx: int) -> MapGrid:
        return MapGrid(self.step_y, self.step_x, self.origin_y - dy, self.origin_x - dx)


@dataclass(frozen=True, slots=True)
class RetinexConfig:
    """``strength`` in [0, 1] (0 disables the stage); ``scales``: Gaussian sigmas as fractions
    of the sample's longer side; the gain is clipped to ``[min_gain, max_gain]``; ``min_support``:
    the least blurred subject weight for which the surround is trusted."""

    strength: float = 0.5
    scales: tuple[float, ...] = (0.05, 0.15, 0.4)
    min_gain: float = 0.6
    max_gain: float = 2.0
    min_support: float = 1e-3

    def __post_init__(self) -> None:
        if not 0.0 <= self.strength <= 1.0:
            raise ValueError(f"retinex strength must be within [0, 1]; got {self.strength}")
        if not self.scales or any(s <= 0 for s in self.scales):
            raise ValueError(f"retinex scales must be positive; got {self.scales}")
        if not 0 < self.min_gain <= 1.0 <= self.max_gain:
            raise ValueError(
                f"retinex gain limits must bracket 1; got {self.min_gain}, {self.max_gain}")


@lru_cache(maxsize=64)
def gaussian_matrix(n: int, sigma: float) -> np.ndarray:
    """``(n, n)`` float32 ``G`` with ``G @ x`` = ``x`` blurred by a Gaussian of ``sigma``.

    Truncated at 3 sigma, normalised, borders reflected (``d c b a | a b c d | d c b a``), so
    every row sums to 1. Read-only (cached).
    """
    radius = max(1, math.ceil(3.0 * sigma))
    offsets = np.arange(-radius, radius + 1)
    taps = np.exp(-0.5 * (offsets / max(sigma, 1e-6)) ** 2)
    taps /= taps.sum()
    rows = np.repeat(np.arange(n), offsets.size)
    cols = (np.arange(n)[:, None] + offsets[None, :]).ravel() % (2 * n)
    cols = np.where(cols < n, cols, 2 * n - 1 - cols)
    g = np.zeros((n, n), np.float64)
    np.add.at(g, (rows, cols), np.tile(taps, n))
    g32 = g.astype(np.float32)
    g32.flags.writeable = False
    return g32


@lru_cache(maxsize=32)
def _blurred_ones(h: int, w: int, sigma: float, matrix: MatrixFn) -> np.ndarray:
    """The weight plane of :func:`illumination_gain` for weights 1 everywhere (no mask), blurred
    at ``sigma``: the same for every ``(h, w)`` sample, so computed once per process (NumPy; the
    same matrix products as on a stack of planes, so the same bits). Read-only."""
    ones = np.ones((1, h, w), np.float32)
    plane: np.ndarray = (matrix(h, sigma) @ ones @ matrix(w, sigma).T).astype(np.float64)[0]
    plane.flags.writeable = False
    return plane


@lru_cache(maxsize=32)
def _ones_planes(h: int, w: int, sigmas: tuple[float, ...], min_support: float,
                 matrix: MatrixFn) -> tuple[tuple[np.ndarray, ...], np.ndarray | None]:
    """What :func:`illumination_gain` derives from the blurred weight planes of an unmasked
    ``(h, w)`` sample, once per process: ``max(plane, 1e-12)`` per sigma (the surround's
    denominators) and the mask ``support >= min_support`` of the largest plane, None where it
    holds everywhere (the gain is then kept as it is). Read-only."""
    planes = [_blurred_ones(h, w, sigma, matrix) for sigma in sigmas]
    floors = tuple(np.maximum(p, 1e-12) for p in planes)
    support = planes[0].copy()
    for p in planes[1:]:
        np.maximum(support, p, out=support)
    keep: np.ndarray | None = support >= min_support
    for f in floors:
        f.flags.writeable = False
    if keep is not None and bool(keep.all()):
        keep = None
    elif keep is not None:
        keep.flags.writeable = False
    return floors, keep


def illumination_gain(
    xp: Any, lum: Array, weight: Array | None, cfg: RetinexConfig, matrix: MatrixFn
) -> Array:
    """Gain map ``(h, w)`` float32 (values in ``[min_gain, max_gain]``) for a sample.

    ``lum``: ``(h, w)`` float64 luma in levels; ``weight``: ``(h, w)`` float64 in [0, 1], or None
    for 1 everywhere (no mask: on NumPy its blurred planes come from a per-process table);
    ``matrix(n, sigma)`` returns :func:`gaussian_matrix` on the array's device.
    """
    h, w = lum.shape
    tabled = weight is None and xp is np
    if weight is None and not tabled:
        weight = xp.ones((h, w), xp.float64)
    # with the table: the luma plane alone (lum * 1.0 == lum), the weight plane from the table
    stack = lum.astype(xp.float32)[None] if tabled else xp.stack([lum * weight, weight]).astype(xp.float32)
    side = max(h, w)
    log_surround = None
    support = None
    sigmas = tuple(frac * side for frac in cfg.scales)
    floors, keep = _ones_planes(h, w, sigmas, cfg.min_support, matrix) if tabled else ((), None)
    # each per-pixel step in place (one temporary per scale, not one per operation); the same
    # float64 operations on the same operands in the same order, so the same bits
    for k, sigma in enumerate(sigmas):
        blurred = (matrix(h, sigma) @ stack @ matrix(w, sigma).T).astype(xp.float64)
        if tabled:  # the denominator and the support from the per-process table
            term = blurred[0]
            xp.divide(term, floors[k], out=term)  # the local surround
        else:
            den = blurred[1]
            term = xp.maximum(den, 1e-12)
            xp.divide(blurred[0], term, out=term)  # the local surround
        xp.maximum(term, 0.0, out=term)
        xp.log1p(term, out=term)
        if log_surround is None:
            log_surround = term
        else:
            log_surround += term
        if not tabled:
            if support is None:
                support = den.copy()
            else:
                xp.maximum(support, den, out=support)
    assert log_surround is not None
    log_surround /= len(cfg.scales)
    if weight is None:  # sums of ones are exact: h * w, and weight * x == x
        total = xp.float64(h * w)
        log_mean = xp.sum(log_surround) / xp.maximum(total, 1e-12)
    else:
        total = xp.sum(weight)
        log_mean = xp.sum(weight * log_surround) / xp.maximum(total, 1e-12)
    gain = xp.subtract(log_mean, log_surround, out=log_surround)
    gain *= cfg.strength
    xp.exp(gain, out=gain)
    xp.maximum(gain, cfg.min_gain, out=gain)
    xp.minimum(gain, cfg.max_gain, out=gain)
    if not tabled:
        assert support is not None
        gain = xp.where((support >= cfg.min_support) & (total > 0), gain, 1.0)
    elif keep is not None:  # total = h * w > 0
        gain = xp.where(keep, gain, 1.0)
    return gain.astype(xp.float32)


def map_positions(xp: Any, start: int, stop: int, step: float, origin: float, n: int) -> Array:
    """Map coordinates ``clip((p - origin) / step, 0, n - 1)`` of image positions ``[start, stop)``
    as float32 (for ``origin == 0``: ``p / step``, as the GPU kernel computes it)."""
    p = xp.arange(start, stop, dtype=xp.float32)
    if origin != 0.0:
        p = p - xp.float32(origin)
    g = p / xp.float32(step)
    return xp.minimum(xp.maximum(g, xp.float32(0)), xp.float32(n - 1))


def gain_columns(xp: Any, gain_map: Array, width: int, grid: MapGrid) -> Array:
    """The gain map interpolated along x at every image column: ``(gh, width)`` float32."""
    gw = gain_map.shape[1]
    if grid.step_x == 1 and grid.origin_x == 0 and width <= gw:
        # a map column per image column: weight 1 on its own column and 0 on the next, and
        # c * 1 + d * 0 == c for the finite gains of a map (a copy: callers may write to it)
        return gain_map[:, :width].copy()
    gx = map_positions(xp, 0, width, grid.step_x, grid.origin_x, gw)
    x0 = gx.astype(xp.int32)
    x1 = xp.minimum(x0 + 1, gw - 1)
    fx = gx - x0.astype(xp.float32)
    return gain_map[:, x0] * (xp.float32(1) - fx) + gain_map[:, x1] * fx


def gain_rows(xp: Any, columns: Array, y_start: int, y_stop: int, grid: MapGrid) -> Array:
    """Bilinear gain for image rows ``[y_start, y_stop)``: ``(rows, width)`` float32."""
    gh = columns.shape[0]
    gy = map_positions(xp, y_start, y_stop, grid.step_y, grid.origin_y, gh)
    y0 = gy.astype(xp.int32)
    y1 = xp.minimum(y0 + 1, gh - 1)
    fy = (gy - y0.astype(xp.float32))[:, None]
    return columns[y0] * (xp.float32(1) - fy) + columns[y1] * fy
