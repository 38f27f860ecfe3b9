"""The per-image floor of the CPU stages: work sized by the image, not by fixed grids or
per-call tables. Each change here must leave every output bit as it was."""

from __future__ import annotations

import types

import numpy as np
import pytest
import skimage.data

from gpu_kernels.retouch import RetinexConfig, RetouchConfig, render
from gpu_kernels.retouch.checks import alpha_source
from gpu_kernels.retouch.color import (
    ExposureConfig,
    WhiteBalanceConfig,
    _clamp,
    _neutral_cluster,
    estimate_tone,
    masked_percentiles,
    srgb_to_lab,
)
from gpu_kernels.retouch.correction import _band_gain, correct_fused_cpu, correct_reference, plan_correction
from gpu_kernels.retouch.cpu import effective_background
from gpu_kernels.retouch.geometry import axis_taps
from gpu_kernels.retouch.illumination import MapGrid, gain_columns, gaussian_matrix, illumination_gain, map_positions
from gpu_kernels.retouch.render import render_fused_cpu, render_reference
from tests.gpu_kernels.test_retouch import product_shot, soft_mask


def _crop(h: int, w: int) -> np.ndarray:
    return np.ascontiguousarray(skimage.data.astronaut()[100:100 + h, 150:150 + w])


@pytest.mark.parametrize("background", ["white", "transparent", "keep"])
@pytest.mark.parametrize("shape", [(64, 64), (200, 90), (37, 700)])
def test_bands_sized_by_pixels_give_the_same_bits(background: str, shape: tuple[int, int]) -> None:
    shot, hard = product_shot()
    h, w = shape
    image = np.ascontiguousarray(shot[:h, :w]) if shot.shape[0] >= h and shot.shape[1] >= w else _crop(h, w)
    mask = soft_mask(hard)[:h, :w] if image.shape[:2] == shot[:h, :w].shape[:2] else None
    cfg = RetouchConfig(retinex=RetinexConfig(strength=0.5))
    alpha, _ = alpha_source(mask, image, stage="test")
    plan = plan_correction(np, image, alpha, "auto", cfg, gaussian_matrix)
    assert plan.gain_map is not None  # the banded path with a gain map per band
    bg = effective_background(background, alpha)  # type: ignore[arg-type]
    default = correct_fused_cpu(image, alpha, plan, bg)  # one band for these widths
    sixteen = correct_fused_cpu(image, alpha, plan, bg, band_rows=16)
    assert np.array_equal(default, sixteen)
    assert np.array_equal(default, np.asarray(correct_reference(np, image, alpha, plan, bg)))


def test_taps_are_kept_read_only_and_equal_to_a_fresh_table() -> None:
    coeffs = RetouchConfig().geometry.cubic_coefficients()
    a = axis_taps(2.5, -3.25, 64, 160, coeffs)
    b = axis_taps(2.5, -3.25, 64, 160, coeffs)
    assert a[0] is b[0] and a[1] is b[1]  # one table per process for the same placement
    with pytest.raises(ValueError):
        a[1][0, 0] = 1.0
    up = axis_taps(0.5, 1.0, 64, 40, coeffs)  # enlarging: 4 cubic taps, weights sum to 1 inside
    assert up[0].shape == (64, 4) and np.allclose(up[1][5:-5].sum(axis=1), 1.0, atol=1e-5)
    other = axis_taps(2.5, -3.0, 64, 160, coeffs)
    assert not np.array_equal(other[1], a[1]) or not np.array_equal(other[0], a[0])


def test_lab_from_the_level_table_equals_the_per_pixel_curve() -> None:
    rng = np.random.default_rng(3)
    levels = np.concatenate([np.repeat(np.arange(256, dtype=np.uint8)[:, None], 3, axis=1),
                             rng.integers(0, 256, (4000, 3), dtype=np.uint8)])
    direct = srgb_to_lab(np, levels.astype(np.float64))
    tabled = srgb_to_lab(np, levels.astype(np.float64), levels=levels)
    assert np.array_equal(direct, tabled)
    assert direct[255, 0] == pytest.approx(100.0, abs=1e-4) and direct[0, 0] == 0.0  # white, black


def _tone_by_axis_reductions(levels: np.ndarray, alpha: np.ndarray | None, cfg: ExposureConfig) -> float:
    """estimate_tone written the plain way: NumPy's axis reductions and np.percentile."""
    mean, peak = levels.mean(axis=1), levels.max(axis=1)
    refs = np.array([np.percentile(mean, cfg.high_pct), np.percentile(peak, cfg.peak_pct)])
    if alpha is not None:
        subject = alpha >= cfg.subject_min_alpha
        if subject.sum() >= max(16.0, 0.005 * levels.shape[0]):
            refs = np.maximum(refs, [np.percentile(mean[subject], cfg.high_pct),
                                     np.percentile(peak[subject], cfg.peak_pct)])
    refs = np.maximum(refs, 1e-6)
    gain = min(max(min(cfg.target_high * 255 / refs[0], cfg.ceiling * 255 / refs[1]), 1.0), cfg.max_gain)
    black = np.percentile(mean, cfg.low_pct) / 255
    veil = max(np.clip((cfg.veil_none - black) / (cfg.veil_none - cfg.veil_full), 0, 1),
               np.clip((cfg.veil_bright - refs[0] / 255) / 0.1, 0, 1))
    return float(1 + (gain - 1) * veil)


@pytest.mark.parametrize("scene", ["dark", "veiled", "bright", "masked_dark"])
def test_tone_by_columns_and_shared_sorts_equals_the_plain_reductions(scene: str) -> None:
    rng = np.random.default_rng(7)
    n = 4096
    base = {"dark": (10, 140), "veiled": (110, 200), "bright": (30, 256), "masked_dark": (5, 120)}[scene]
    levels = rng.integers(base[0], base[1], (n, 3)).astype(np.float64)
    levels[:, 1] += rng.random(n)  # fractions too (an area sample): the sums' order matters then
    alpha = rng.integers(0, 256, n).astype(np.float64) if scene == "masked_dark" else None
    cfg = ExposureConfig()
    tone = float(estimate_tone(np, levels, alpha, cfg)[0])
    assert tone == pytest.approx(_tone_by_axis_reductions(levels, alpha, cfg), rel=1e-12)
    assert (tone > 1.0) == (scene != "bright")  # the scenes reach the branches they are named for
    c0, c1, c2 = levels[:, 0], levels[:, 1], levels[:, 2]
    assert np.array_equal((c0 + c1 + c2) / 3.0, levels.mean(axis=1))  # the column sum is NumPy's


def _lab_plain(rgb: np.ndarray) -> np.ndarray:
    """CIELAB of float64 sRGB levels, one temporary per operation (the textbook formula)."""
    c = rgb / 255.0
    lin = np.where(c <= 0.04045, c / 12.92, np.power((np.maximum(c, 0.04045) + 0.055) / 1.055, 2.4))
    r, g, b = lin[..., 0], lin[..., 1], lin[..., 2]
    x = (0.4124564 * r + 0.3575761 * g + 0.1804375 * b) / 0.95047
    y = 0.2126729 * r + 0.7151522 * g + 0.0721750 * b
    z = (0.0193339 * r + 0.1191920 * g + 0.9503041 * b) / 1.08883
    eps, kappa = 216.0 / 24389.0, 24389.0 / 27.0
    fx, fy, fz = (np.where(t > eps, np.cbrt(np.maximum(t, eps)), (kappa * t + 16.0) / 116.0) for t in (x, y, z))
    return np.stack([116.0 * fy - 16.0, 500.0 * (fx - fy), 200.0 * (fy - fz)], axis=-1)


@pytest.mark.parametrize("shape", [(3,), (5, 3), (7, 9, 3), (20_000, 3)])
def test_lab_in_place_equals_the_textbook_formula_bit_for_bit(shape: tuple[int, ...]) -> None:
    rng = np.random.default_rng(11)
    rgb = rng.random(shape) * 255.0
    flat = rgb.reshape(-1)
    flat[:3] = [0.0, 10.31, 255.0]  # both branches of both curves (dark: linear; white: the power/cbrt)
    assert np.array_equal(srgb_to_lab(np, rgb), _lab_plain(rgb))


def test_the_neutral_cluster_search_in_place_equals_the_plain_loop() -> None:
    rng = np.random.default_rng(5)
    n = 4096
    flat = np.clip(rng.normal(170, 40, (n, 3)), 0, 255)
    flat[: n // 3] = np.clip(rng.normal(200, 4, (n // 3, 3)) + np.array([6.0, 0.0, -8.0]), 0, 255)  # a warm near-white
    lab = srgb_to_lab(np, flat)
    light, ab = lab[:, 0], lab[:, 1:]
    valid = light > 20
    cfg = WhiteBalanceConfig()
    centre, kernel, confidence = _neutral_cluster(np, flat, light, ab, valid, cfg)
    # the plain loop: one temporary per operation
    top = np.percentile(light[valid], cfg.bright_pct)
    weight = np.where(valid, np.clip((light - (top - cfg.bright_span)) / (0.5 * cfg.bright_span), 0, 1), 0.0)
    c = np.zeros(2)
    for sigma in cfg.sigmas:
        d2 = (ab[:, 0] - c[0]) ** 2 + (ab[:, 1] - c[1]) ** 2
        k = weight * np.exp(-0.5 * d2 / (sigma * sigma))
        c = (k @ ab) / k.sum()
    assert np.allclose(centre, c, rtol=1e-12, atol=1e-12) and np.allclose(kernel, k, rtol=1e-12, atol=0)
    assert centre[1] > 1.0 and float(confidence) > 0.5  # found the warm (yellow: b* > 0) cluster, with trust


@pytest.mark.parametrize("transparent", [False, True])
@pytest.mark.parametrize(("src", "canvas"), [((64, 64), (64, 64)), ((48, 90), (40, 40)), ((300, 200), (800, 600))])
def test_render_bands_sized_by_pixels_give_the_same_bits(
    transparent: bool, src: tuple[int, int], canvas: tuple[int, int]
) -> None:
    """A small canvas is one band and one horizontal chunk now; the 32-row bands and 16-row
    chunks it had before give the same bits, and so does the unfused reference."""
    rng = np.random.default_rng(9)
    pixels = rng.integers(0, 256, (*src, 4 if transparent else 3), dtype=np.uint8)
    if transparent:
        pixels[..., 3] = 0
        pixels[src[0] // 4: 3 * src[0] // 4, src[1] // 4: 3 * src[1] // 4, 3] = 255
    coeffs = RetouchConfig().geometry.cubic_coefficients()
    w, h = canvas
    k = max(src[1] / w, src[0] / h) * 1.1  # source pixels per canvas pixel, with a margin
    params = np.array([k, (src[1] - k * w) / 2, (src[0] - k * h) / 2], np.float32)
    default = render_fused_cpu(pixels, params, w, h, transparent, 0.3, coeffs)
    assert default.shape == (h, w, 4 if transparent else 3)
    old = render.BAND_PIXELS
    try:
        render.BAND_PIXELS = 1  # the least rows everywhere: 32-row bands, 16-row chunks
        banded = render_fused_cpu(pixels, params, w, h, transparent, 0.3, coeffs)
    finally:
        render.BAND_PIXELS = old
    assert np.array_equal(default, banded)
    reference = np.asarray(render_reference(np, pixels, params, w, h, transparent, 0.3, coeffs))
    assert np.array_equal(default, reference)
    assert len(np.unique(default[..., 0])) > 10  # a picture, not a constant canvas


def test_clamp_is_numpys_clip_bit_for_bit() -> None:
    values = np.array([np.nan, -0.0, 0.0, 1.0, -1.0, 2.0, 0.5, -np.inf, np.inf, 1e-300])
    for lo, hi in ((0.0, 1.0), (-0.0, 1.0), (-2.0, 0.5)):
        for x in (values, *values):  # the array and each 0-d value (the estimation's scalars)
            want, got = np.clip(x, lo, hi), _clamp(np, x, lo, hi)
            assert np.array_equal(want, got, equal_nan=True)
            assert np.array_equal(np.signbit(want), np.signbit(got))  # a tie gives the bound's zero


def _gain_plain(lum: np.ndarray, weight: np.ndarray, cfg: RetinexConfig) -> np.ndarray:
    """The Retinex gain with one temporary per operation."""
    h, w = lum.shape
    stack = np.stack([lum * weight, weight]).astype(np.float32)
    terms, dens = [], []
    for frac in cfg.scales:
        sigma = frac * max(h, w)
        blurred = (gaussian_matrix(h, sigma) @ stack @ gaussian_matrix(w, sigma).T).astype(np.float64)
        terms.append(np.log1p(np.maximum(blurred[0] / np.maximum(blurred[1], 1e-12), 0.0)))
        dens.append(blurred[1])
    log_surround = terms[0]
    for t in terms[1:]:
        log_surround = log_surround + t
    support = dens[0]
    for d in dens[1:]:
        support = np.maximum(support, d)
    log_surround = log_surround / len(cfg.scales)
    total = np.sum(weight)
    log_mean = np.sum(weight * log_surround) / np.maximum(total, 1e-12)
    gain = np.clip(np.exp(cfg.strength * (log_mean - log_surround)), cfg.min_gain, cfg.max_gain)
    return np.where((support >= cfg.min_support) & (total > 0), gain, 1.0).astype(np.float32)


@pytest.mark.parametrize("shape", [(64, 64), (17, 160), (120, 90)])
def test_the_retinex_gain_in_place_equals_the_plain_formula(shape: tuple[int, int]) -> None:
    rng = np.random.default_rng(2)
    xx = np.mgrid[0:shape[0], 0:shape[1]][1]
    lum = 40.0 + 180.0 * xx / shape[1] + rng.normal(0, 5, shape)  # lit from the right
    weight = np.zeros(shape)
    weight[:, shape[1] // 5:] = 1.0  # a subject with no support on its left
    cfg = RetinexConfig(strength=0.5)
    gain = illumination_gain(np, lum, weight, cfg, gaussian_matrix)
    assert np.array_equal(gain, _gain_plain(lum, weight, cfg))
    assert gain[:, -1].mean() < 1.0 < gain[:, shape[1] // 4].mean()  # bright side down, dark side up


def test_a_stride_one_gain_map_is_read_as_the_interpolation_reads_it() -> None:
    """Gain per image pixel from a map with a cell per pixel (the sample of a small image): the
    shortcut (the map itself) equals the bilinear read, weights 1 and 0, bit for bit."""
    rng = np.random.default_rng(4)
    gain_map = rng.uniform(0.6, 2.0, (40, 56)).astype(np.float32)
    grid = MapGrid(1, 1)

    def bilinear(n: int, size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        g = map_positions(np, 0, size, 1, 0.0, n)
        i0 = g.astype(np.int32)
        return i0, np.minimum(i0 + 1, n - 1), g - i0.astype(np.float32)

    x0, x1, fx = bilinear(56, 56)
    cols = gain_map[:, x0] * (np.float32(1) - fx) + gain_map[:, x1] * fx
    assert np.array_equal(gain_columns(np, gain_map, 56, grid), cols)
    cols3 = np.repeat(cols, 3, axis=1)
    y0, y1, fy = bilinear(40, 40)
    rows = cols3[y0] * (np.float32(1) - fy[:, None]) + cols3[y1] * fy[:, None]
    assert np.array_equal(_band_gain(cols3, (0, 40), grid), rows)
    assert np.array_equal(_band_gain(cols3, (13, 29), grid), rows[13:29])
    shifted = grid.shifted(3, 5)  # a window's grid takes the interpolating path, reading the same cells
    assert np.array_equal(gain_columns(np, gain_map, 40, shifted)[:, :30], cols[:, 5:35])


def test_the_render_axis_plan_is_kept_per_placement_and_read_only() -> None:
    coeffs = RetouchConfig().geometry.cubic_coefficients()
    a = render._axis_plan(2.5, -3.25, 64, 160, coeffs)
    assert render._axis_plan(2.5, -3.25, 64, 160, coeffs) is a  # one derivation per process and placement
    with pytest.raises(ValueError):
        a.rel_all[0] = 1
    idx, weight = axis_taps(2.5, -3.25, 64, 160, coeffs)
    used = idx[weight != 0]
    assert (a.s0, a.s1) == (int(used.min()), int(used.max()) + 1)
    live_rows = np.flatnonzero((weight != 0).any(axis=1))
    assert (a.lo, a.hi) == (int(live_rows[0]), int(live_rows[-1]) + 1)
    assert a.taps == tuple(t for t in range(weight.shape[1]) if (weight[:, t] != 0).any())
    assert render._axis_plan(2.5, -3.0, 64, 160, coeffs) is not a


def _array_module_twin() -> types.ModuleType:
    """NumPy under another name: the estimation takes its array-module-generic path (the one the
    GPU runs), not the host shortcuts it takes when ``xp is numpy``."""
    twin = types.ModuleType("numpy_twin")
    twin.__dict__.update(np.__dict__)
    return twin


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("shape", [(64, 64), (90, 50), (300, 200), (17, 33)])
def test_the_host_estimate_equals_the_array_module_path_bit_for_bit(masked: bool, shape: tuple[int, int]) -> None:
    """Partial sorts for the percentiles, the mean-shift on weighted pixels only and the Retinex
    weight plane of an unmasked sample from a table give the generic path's plan, bit for bit."""
    shot, hard = product_shot()
    h, w = shape
    image = np.ascontiguousarray(shot[40:40 + h, 60:60 + w]) if masked else _crop(h, w)
    alpha = np.ascontiguousarray(soft_mask(hard)[40:40 + h, 60:60 + w]) if masked else None
    cfg = RetouchConfig(retinex=RetinexConfig(strength=0.5))
    for _ in range(2):  # the second time the weight planes come from the table
        host = plan_correction(np, image, alpha, "auto", cfg, gaussian_matrix)
        generic = plan_correction(_array_module_twin(), image, alpha, "auto", cfg, gaussian_matrix)
        for a, b in [(host.wb, generic.wb), (host.gain_map, generic.gain_map), (host.lut, generic.lut),
                     (host.lut_scale, generic.lut_scale)]:
            assert a is not None and b is not None and np.array_equal(a, b)
    assert not np.array_equal(host.wb, np.ones(3, np.float32))  # the estimate moved the colour


@pytest.mark.parametrize("share", [1.0, 0.5, 1 / 4096])
def test_percentiles_by_partial_sort_equal_the_full_sort(share: float) -> None:
    rng = np.random.default_rng(9)
    values = np.round(rng.normal(50, 20, 4096), 1)  # ties too
    select = rng.random(4096) < share
    select[17] = True
    qs = (99.5, 1.0, 95.0, 50.0, 0.0, 100.0)
    got = masked_percentiles(np, values, select, qs)
    want = masked_percentiles(_array_module_twin(), values, select, qs)
    assert np.array_equal(got, want)
    if share == 1.0:
        assert np.allclose(got, np.percentile(values, qs), rtol=1e-12, atol=0)


def test_the_retinex_gain_without_a_mask_equals_weights_of_one() -> None:
    rng = np.random.default_rng(4)
    lum = rng.uniform(20, 230, (40, 64))
    cfg = RetinexConfig(strength=0.5)
    ones = illumination_gain(np, lum, np.ones(lum.shape), cfg, gaussian_matrix)
    assert np.array_equal(illumination_gain(np, lum, None, cfg, gaussian_matrix), ones)
    assert np.array_equal(illumination_gain(np, lum, None, cfg, gaussian_matrix), ones)  # from the table
    assert np.array_equal(illumination_gain(_array_module_twin(), lum, None, cfg, gaussian_matrix), ones)


@pytest.mark.parametrize("scene", ["dark", "veiled", "bright", "masked_dark", "masked_few"])
def test_the_host_tone_equals_the_array_module_path_bit_for_bit(scene: str) -> None:
    rng = np.random.default_rng(8)
    n = 4096
    lo, hi = {"dark": (10, 140), "veiled": (110, 200), "bright": (30, 256)}.get(scene, (5, 120))
    levels = rng.integers(lo, hi, (n, 3)).astype(np.float64)
    levels[:, 2] += rng.random(n)
    alpha = None
    if scene.startswith("masked"):
        alpha = np.where(rng.random(n) < (0.4 if scene == "masked_dark" else 0.002), 255.0, 0.0)
    cfg = ExposureConfig()
    host = estimate_tone(np, levels, alpha, cfg)
    assert host.dtype == np.float64 and host.shape == (1,)
    assert np.array_equal(host, estimate_tone(_array_module_twin(), levels, alpha, cfg))


@pytest.mark.parametrize("scene", ["dark", "veiled", "bright", "masked_dark", "masked_few", "one_pixel", "clipped"])
def test_the_tone_from_level_histograms_equals_the_partial_sorts_bit_for_bit(scene: str) -> None:
    """Integer levels (a strided sample): the percentiles read from histograms of the channel
    sums and maxima give the gain of the partial sorts and of the array-module path, bit for bit."""
    rng = np.random.default_rng(12)
    n = 1 if scene == "one_pixel" else 4096
    lo, hi = {"dark": (10, 140), "veiled": (110, 200), "bright": (30, 256), "clipped": (200, 256)}.get(scene, (5, 120))
    codes = rng.integers(lo, hi, (n, 3)).astype(np.uint8)
    alpha = None
    if scene.startswith("masked"):
        alpha = np.where(rng.random(n) < (0.4 if scene == "masked_dark" else 0.002), 255.0, 0.0)
        codes[alpha > 0] += 40  # a subject brighter than its backdrop: its references count
    levels = codes.astype(np.float64)
    cfg = ExposureConfig()
    by_histogram = estimate_tone(np, levels, alpha, cfg, codes=codes)
    by_sort = estimate_tone(np, levels, alpha, cfg)
    assert by_histogram.dtype == np.float64 and by_histogram.shape == (1,)
    assert by_histogram.tobytes() == by_sort.tobytes()
    assert by_histogram.tobytes() == estimate_tone(_array_module_twin(), levels, alpha, cfg, codes=codes).tobytes()
    assert (float(by_histogram[0]) > 1.0) == (scene not in ("bright", "clipped"))
    if scene == "masked_dark":  # the subject's histograms moved the gain
        assert by_histogram.tobytes() != estimate_tone(np, levels, None, cfg, codes=codes).tobytes()


@pytest.mark.parametrize(("src", "canvas", "offset"), [
    ((64, 64), (64, 64), (0.0, 0.0)),  # a 64x64 photo to a 64x64 preset at fill 1: the whole canvas
    ((48, 90), (40, 40), (7.0, 3.0)),  # a window of a larger photo
    ((30, 20), (40, 40), (-6.0, -4.0)),  # a smaller photo: a white border around it
])
def test_render_at_scale_one_copies_the_pixels_as_the_reference_resamples_them(
    src: tuple[int, int], canvas: tuple[int, int], offset: tuple[float, float]
) -> None:
    """Scale 1 on whole pixels without sharpening is a copy (the fast path), bit for bit the
    reference's resampling; a fractional offset or sharpening still resamples."""
    rng = np.random.default_rng(11)
    pixels = rng.integers(0, 256, (*src, 3), dtype=np.uint8)
    coeffs = RetouchConfig().geometry.cubic_coefficients()
    w, h = canvas
    params = np.array([1.0, *offset], np.float32)
    plan = render._axis_plan(1.0, offset[0], w, src[1], coeffs)
    assert plan.copy  # the fast path is taken
    fast = render_fused_cpu(pixels, params, w, h, False, 0.0, coeffs)
    reference = np.asarray(render_reference(np, pixels, params, w, h, False, 0.0, coeffs))
    assert np.array_equal(fast, reference)
    assert not render._axis_plan(1.0, offset[0] + 0.5, w, src[1], coeffs).copy  # half a pixel: resampled
    for amount, shift in ((0.3, 0.0), (0.0, 0.5)):
        moved = np.array([1.0, offset[0] + shift, offset[1]], np.float32)
        got = render_fused_cpu(pixels, moved, w, h, False, amount, coeffs)
        assert np.array_equal(got, np.asarray(render_reference(np, pixels, moved, w, h, False, amount, coeffs)))


def test_white_balance_reading_ab_only_where_weighed_keeps_every_bit(monkeypatch: pytest.MonkeyPatch) -> None:
    """On NumPy a*b* are computed only for the pixels the clusters weigh and the background: the
    white balance gains, and with them the whole plan, are bit for bit those of the full CIELAB
    conversion, on the quality set with its true alpha and without one."""
    from gpu_kernels.retouch import color
    from lightbox.datasets.quality_set import quality_set

    full = color.srgb_to_lab
    kept: list[float] = []

    def spy(xp: object, rgb: np.ndarray, *, levels: np.ndarray | None = None, ab_where: object = None) -> np.ndarray:
        def rows(light: np.ndarray) -> np.ndarray:
            got = ab_where(light)  # type: ignore[operator]
            kept.append(float(got.mean()))
            return got
        return full(xp, rgb, levels=levels, ab_where=None if ab_where is None else rows)

    cfg = RetouchConfig()
    items = quality_set((120, 160))
    for item in items:
        for mask in (None, np.round(item.alpha * 255).astype(np.uint8)):
            alpha, _ = alpha_source(mask, item.image, stage="test")
            with monkeypatch.context() as m:
                m.setattr(color, "srgb_to_lab", spy)
                fast = plan_correction(np, item.image, alpha, "auto", cfg, gaussian_matrix)
            with monkeypatch.context() as m:
                m.setattr(color, "srgb_to_lab",
                          lambda xp, rgb, *, levels=None, ab_where=None: full(xp, rgb, levels=levels))
                plain = plan_correction(np, item.image, alpha, "auto", cfg, gaussian_matrix)
            assert fast.wb.tobytes() == plain.wb.tobytes(), item.name
            assert fast.lut is not None and plain.lut is not None and fast.lut.tobytes() == plain.lut.tobytes()
            assert fast.gain_map is not None and plain.gain_map is not None
            assert fast.gain_map.tobytes() == plain.gain_map.tobytes()
    assert len(kept) == 2 * len(items)
    assert min(kept) < 0.9  # some pixels' a*b* were left out
    assert len({round(k, 3) for k in kept}) > 5  # and the set follows the image
