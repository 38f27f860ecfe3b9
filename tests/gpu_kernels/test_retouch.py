"""Retouch stages on the CPU: measurable effects on real photos, fused == unfused, the CUDA
kernel source (compiled for the CPU) == the NumPy twin, odd shapes, no in-place writes.

Tolerances stated per test. Fused vs unfused on the CPU: bit-exact. CUDA source compiled with
g++ (``-ffp-contract=off``, IEEE float32, the GPU build uses ``--fmad=false``) vs NumPy twin:
bit-exact; real GPU vs CPU (tests/gpu_kernels/test_retouch_gpu.py): <= 1 LSB.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
import skimage.data

import gpu_kernels.retouch as retouch
from gpu_kernels.backends import Retoucher, RetouchOptions
from gpu_kernels.presets import Preset, load_presets
from gpu_kernels.retouch import (
    CpuRetoucher,
    CupyRetoucher,
    ExposureConfig,
    GeometryConfig,
    RetinexConfig,
    RetouchConfig,
    WhiteBalanceConfig,
)
from gpu_kernels.retouch.checks import alpha_source, as_pixels
from gpu_kernels.retouch.color import luma
from gpu_kernels.retouch.composite import cutout_source
from gpu_kernels.retouch.cpu import effective_background
from gpu_kernels.retouch.gpu import KERNEL_SOURCE, correct_launch, render_launch
from schemas.errors import ErrorCode, LightboxError, ProcessingFailed

BOOK = load_presets()
NO_RETINEX = RetouchConfig(retinex=RetinexConfig(strength=0.0))
CAST = np.array([1.15, 1.0, 0.8])


def photo(name: str) -> np.ndarray:
    return np.asarray(getattr(skimage.data, name)())


def chroma(pixels: np.ndarray) -> float:
    """Spread of the channel means (levels): 0 for a neutral region."""
    means = pixels.reshape(-1, 3).astype(np.float64).mean(axis=0)
    return float(means.max() - means.min())


def product_shot(
    bg_level: int = 110, cast: np.ndarray | None = CAST
) -> tuple[np.ndarray, np.ndarray]:
    """skimage's chelsea on a plain gray backdrop (noise sigma 2), off-centre, and its mask;
    the whole scene multiplied by a colour cast."""
    cat = photo("chelsea").astype(np.float64)
    rng = np.random.default_rng(7)
    scene = np.full((600, 800, 3), float(bg_level)) + rng.normal(0.0, 2.0, (600, 800, 3))
    scene[120:120 + cat.shape[0], 250:250 + cat.shape[1]] = cat
    mask = np.zeros((600, 800), np.uint8)
    mask[120:120 + cat.shape[0], 250:250 + cat.shape[1]] = 255
    if cast is not None:
        scene = scene * cast
    return np.clip(scene, 0, 255).astype(np.uint8), mask


def horse_silhouette(pad: tuple[int, int, int, int] = (40, 300, 60, 20)) -> np.ndarray:
    """skimage's horse (a real silhouette) as a 0/255 mask, padded (top, bottom, left, right)."""
    subject = ~np.asarray(skimage.data.horse())  # type: ignore[no-untyped-call]
    top, bottom, left, right = pad
    return np.pad(subject, ((top, bottom), (left, right))).astype(np.uint8) * 255


def box_of(select: np.ndarray) -> tuple[int, int, int, int]:
    ys, xs = np.nonzero(select)
    return int(xs.min()), int(ys.min()), int(xs.max()) + 1, int(ys.max()) + 1


def luma_percentiles(pixels: np.ndarray) -> np.ndarray:
    return np.percentile(luma(np, pixels.astype(np.float64)), [1, 50, 99])


# -- the interface --------------------------------------------------------------------------------

def test_backends_satisfy_the_protocol() -> None:
    cpu = CpuRetoucher()
    assert isinstance(cpu, Retoucher)
    assert cpu.device == "cpu"
    assert CupyRetoucher.device == "gpu"


def test_exports_are_complete() -> None:
    assert set(retouch.__all__) == {n for n in dir(retouch) if n[0].isupper()}
    for name in retouch.__all__:
        assert getattr(retouch, name) is not None


def test_cupy_retoucher_without_cupy_says_what_is_missing() -> None:
    try:
        import cupy  # noqa: F401
    except ImportError:
        with pytest.raises(RuntimeError, match="CuPy"):
            CupyRetoucher()
    else:
        pytest.skip("CuPy is installed")


@pytest.mark.parametrize("bad", [
    lambda: RetinexConfig(strength=1.5),
    lambda: RetinexConfig(scales=()),
    lambda: RetinexConfig(min_gain=1.2),
    lambda: ExposureConfig(target_high=1.5),
    lambda: ExposureConfig(high_pct=0.0),
    lambda: ExposureConfig(max_gain=0.5),
    lambda: WhiteBalanceConfig(max_gain=0.5),
    lambda: GeometryConfig(mask_threshold=0),
    lambda: GeometryConfig(cubic_a=0.5),
    lambda: RetouchConfig(sample_side=2),
])
def test_configs_reject_bad_values(bad: Any) -> None:
    with pytest.raises(ValueError):
        bad()


# -- pass (a): each stage has its measurable effect -----------------------------------------------

def test_white_balance_removes_a_colour_cast_from_the_background() -> None:
    """Bound: mean background chroma <= 1 level after correction (>= 30 before)."""
    image, mask = product_shot()
    assert chroma(image[mask == 0]) >= 30
    for config in (RetouchConfig(), NO_RETINEX):
        out = CpuRetoucher(config).correct([image], [mask], RetouchOptions("keep"))[0]
        assert chroma(out[mask == 0]) <= 1.0
        assert 60 <= out[mask == 0].mean() <= 250  # not trivially neutral by clipping to 255


def test_white_balance_undoes_a_cast_on_a_photo_with_neutral_evidence() -> None:
    """Without a mask, skimage's astronaut (a white suit) under a cast: the output of the cast
    photo is within 2 levels (mean abs) of the output of the original, and < 30 % of the cast's
    own difference. (Photos without neutral evidence are left alone: tests/gpu_kernels/test_quality.py.)"""
    r = CpuRetoucher(NO_RETINEX)
    original = photo("astronaut")
    cast = np.clip(original * np.array([1.08, 1.0, 0.92]), 0, 255).astype(np.uint8)
    a = r.correct([original], [None], RetouchOptions("keep"))[0].astype(np.int16)
    b = r.correct([cast], [None], RetouchOptions("keep"))[0].astype(np.int16)
    before = np.abs(cast.astype(np.int16) - original).mean()
    after = np.abs(a - b).mean()
    assert after <= 2.0
    assert after < 0.3 * before


@pytest.mark.parametrize("name", ["astronaut", "coffee"])
def test_exposure_raises_a_dark_photo_back_to_the_original_s_output(name: str) -> None:
    """A photo darkened to 45 %: the output's median luma is within 6 levels of the output for
    the original photo, where the input's was >= 50 levels below. (Colour preservation and
    washed-out photos: tests/gpu_kernels/test_tone.py.)"""
    original = photo(name)
    dark = (original * 0.45).astype(np.uint8)
    r = CpuRetoucher(NO_RETINEX)
    reference = luma_percentiles(r.correct([original], [None], RetouchOptions("keep"))[0])[1]
    assert reference - luma_percentiles(dark)[1] >= 50
    out = r.correct([dark], [None], RetouchOptions("keep"))[0]
    assert abs(luma_percentiles(out)[1] - reference) <= 6, (luma_percentiles(out), reference)


def test_exposure_reads_the_subject_s_highlights_when_there_is_a_mask() -> None:
    """A product on a dark backdrop (the frame's highlights are the subject's), darkened to 45 %:
    the subject's mean level comes back within 6 levels of the undarkened shot's output."""
    image, mask = product_shot(bg_level=20, cast=None)
    r = CpuRetoucher(NO_RETINEX)
    reference = r.correct([image], [mask], RetouchOptions("keep"))[0][mask == 255].mean()
    dark = (image * 0.45).astype(np.uint8)
    assert reference - dark[mask == 255].mean() >= 50
    lifted = r.correct([dark], [mask], RetouchOptions("keep"))[0]
    assert abs(lifted[mask == 255].mean() - reference) <= 6


@pytest.mark.parametrize("name", ["coffee", "astronaut", "chelsea"])
def test_retinex_flattens_an_illumination_ramp(name: str) -> None:
    """A left-to-right light ramp (x0.35 → x1): the left/right mean-luma ratio of the output
    gets >= 0.04 closer to the unlit photo's with strength 0.5 than with strength 0."""
    original = photo(name).astype(np.float64)
    w = original.shape[1]
    lit = np.clip(original * np.linspace(0.35, 1.0, w)[None, :, None], 0, 255).astype(np.uint8)

    def ratio(img: np.ndarray) -> float:
        y = luma(np, img.astype(np.float64))
        return float(y[:, : w // 3].mean() / y[:, -(w // 3):].mean())

    target = ratio(original)
    outs = {s: CpuRetoucher(RetouchConfig(retinex=RetinexConfig(strength=s)))
            .correct([lit], [None], RetouchOptions("keep"))[0] for s in (0.0, 0.5)}
    assert abs(ratio(outs[0.5]) - target) <= abs(ratio(outs[0.0]) - target) - 0.04


def test_lighting_off_is_the_identity_plus_composite() -> None:
    image, mask = product_shot()
    r = CpuRetoucher()
    keep = r.correct([image], [mask], RetouchOptions("keep", "off"))[0]
    assert np.array_equal(keep, image)
    white = r.correct([image], [mask], RetouchOptions("white", "off"))[0]
    assert np.array_equal(white[mask == 255], image[mask == 255])
    assert np.all(white[mask == 0] == 255)


# -- composite ------------------------------------------------------------------------------------

def soft_mask(mask: np.ndarray) -> np.ndarray:
    """The mask with a feathered (blurred) edge, so alpha takes every value 0..255."""
    return cv2.GaussianBlur(mask, (0, 0), 4)


def test_white_composite_is_exactly_255_where_alpha_is_0() -> None:
    """The composite's maths (edge colours left as they are; their decontamination:
    tests/gpu_kernels/test_matting.py)."""
    image, hard = product_shot()
    mask = soft_mask(hard)
    assert np.count_nonzero((mask > 0) & (mask < 255)) > 0
    r = CpuRetoucher(RetouchConfig(decontaminate=False))
    white = r.correct([image], [mask], RetouchOptions("white"))[0]
    keep = r.correct([image], [mask], RetouchOptions("keep"))[0]
    assert white.shape == image.shape and white.dtype == np.uint8
    assert np.all(white[mask == 0] == 255)
    assert np.array_equal(white[mask == 255], keep[mask == 255])
    edge = (mask > 0) & (mask < 255)
    a = mask[edge][:, None] / 255.0
    expected = keep[edge] * a + 255 * (1 - a)
    assert np.abs(white[edge] - expected).max() <= 1.0


def test_transparent_output_keeps_the_alpha() -> None:
    image, hard = product_shot()
    mask = soft_mask(hard)
    r = CpuRetoucher(RetouchConfig(decontaminate=False))
    rgba = r.correct([image], [mask], RetouchOptions("transparent"))[0]
    keep = r.correct([image], [mask], RetouchOptions("keep"))[0]
    assert rgba.shape == (*image.shape[:2], 4)
    assert np.array_equal(rgba[..., 3], mask)
    assert np.array_equal(rgba[..., :3], keep)
    no_mask = r.correct([image], [None], RetouchOptions("transparent"))[0]
    assert np.all(no_mask[..., 3] == 255)


def test_white_without_a_mask_keeps_the_image() -> None:
    image = photo("coffee")
    r = CpuRetoucher()
    white = r.correct([image], [None], RetouchOptions("white"))[0]
    keep = r.correct([image], [None], RetouchOptions("keep"))[0]
    assert np.array_equal(white, keep)
    assert effective_background("white", None) == "keep"


def test_an_rgba_image_without_a_mask_composites_with_its_own_alpha() -> None:
    image, hard = product_shot()
    mask = soft_mask(hard)
    rgba = np.dstack([image, mask])
    own = CpuRetoucher().correct([rgba], [None], RetouchOptions("white"))[0]
    # a cut-out's own edge colours are its subject's: not decontaminated, as a mask's photo is
    given = CpuRetoucher(RetouchConfig(decontaminate=False)).correct([image], [mask], RetouchOptions("white"))[0]
    assert np.array_equal(own, given)


# -- pass (a): fused == unfused -------------------------------------------------------------------

def variants() -> list[tuple[str, np.ndarray, np.ndarray | None]]:
    image, hard = product_shot()
    mask = soft_mask(hard)
    return [
        ("rgb+mask", image, mask),
        ("rgb", photo("astronaut"), None),
        ("rgba", np.dstack([image, mask]), None),
        ("gray+mask", image[..., 1].copy(), mask),
        ("odd", photo("rocket")[7:300, 3:333], None),
        # sample stride 1: a gain row per image row, so a band of rows spans many of them
        ("small", cv2.resize(photo("astronaut"), (64, 64), interpolation=cv2.INTER_AREA), None),
        ("small+mask", image[::6, ::6].copy(), mask[::6, ::6].copy()),
    ]


@pytest.mark.parametrize("background", ["white", "transparent", "keep"])
@pytest.mark.parametrize("lighting", ["auto", "off"])
def test_correct_fused_equals_unfused_bit_exactly(background: str, lighting: str) -> None:
    r = CpuRetoucher()
    options = RetouchOptions(background, lighting)  # type: ignore[arg-type]
    for name, image, mask in variants():
        fused = r.correct([image], [mask], options)[0]
        unfused = r.correct_unfused(image, mask, options)
        assert np.array_equal(fused, unfused), name


# -- pass (b): geometry ---------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["amazon_main", "xiaohongshu_cover", "thumb_webp",
                                  "transparent_png", "instagram_portrait"])
def test_subject_fills_the_preset_share(name: str) -> None:
    """A real silhouette (skimage's horse), off-centre in its frame: the rendered subject's box
    fills ``preset.fill`` ±2 % along its limiting axis and is centred (±1 % of the canvas)."""
    preset = BOOK[name]
    mask = horse_silhouette()
    image = np.repeat((255 - mask)[..., None], 3, axis=2)  # black subject on white
    r = CpuRetoucher()
    if preset.background == "transparent":
        out = r.render(np.dstack([image, mask]), None, preset)
        x0, y0, x1, y1 = box_of(out[..., 3] >= 128)
    else:
        out = r.render(image, mask, preset)
        x0, y0, x1, y1 = box_of(out.min(axis=2) < 128)
    channels = 4 if preset.background == "transparent" else 3
    assert out.shape == (preset.height, preset.width, channels)
    share = max((x1 - x0) / preset.width, (y1 - y0) / preset.height)
    assert abs(share - preset.fill) <= 0.02, share
    assert abs((x0 + x1) / 2 - preset.width / 2) <= 0.01 * preset.width
    assert abs((y0 + y1) / 2 - preset.height / 2) <= 0.01 * preset.height


def test_render_of_a_photo_on_white_is_pure_white_away_from_the_subject() -> None:
    """After a white composite, every canvas pixel more than 3 px outside the subject's
    rendered box is exactly 255 (the pad, and no sharpening halo beyond 1 px)."""
    image, mask = product_shot()
    r = CpuRetoucher()
    white = r.correct([image], [mask], RetouchOptions("white"))[0]
    preset = BOOK["amazon_main"]
    out = r.render(white, mask, preset)
    probe = r.render(np.repeat((255 - mask)[..., None], 3, axis=2), mask, preset)
    x0, y0, x1, y1 = box_of(probe.min(axis=2) < 255)
    far = np.ones(out.shape[:2], bool)
    far[max(0, y0 - 3):y1 + 3, max(0, x0 - 3):x1 + 3] = False
    assert np.all(out[far] == 255)
    assert abs((x1 - x0) / preset.width - preset.fill) <= 0.02


def test_rgba_onto_a_white_preset_composites_and_rgb_onto_transparent_pads_with_alpha_0() -> None:
    image, mask = product_shot(cast=None)
    r = CpuRetoucher()
    rgba = r.correct([image], [mask], RetouchOptions("transparent"))[0]
    white = r.render(rgba, None, BOOK["taobao_main"])
    assert white.shape == (800, 800, 3)
    assert white[0, 0].tolist() == [255, 255, 255]
    clear = r.render(image, None, BOOK["transparent_png"])
    assert clear.shape == (1000, 1000, 4)
    assert clear[0, 0, 3] == 0 and clear[500, 500, 3] == 255


def test_shrinking_matches_opencv_area_within_1_lsb() -> None:
    """fill 1, no sharpening, same aspect: the canvas is the image, resampled with the area
    filter; OpenCV's INTER_AREA agrees within 1 LSB everywhere."""
    image = photo("astronaut")
    for side in (128, 200, 317):
        preset = Preset("t", side, side, fill=1.0, sharpen=0.0)
        ours = CpuRetoucher().render(image, None, preset).astype(np.int16)
        cv = cv2.resize(image, (side, side), interpolation=cv2.INTER_AREA)
        assert np.abs(ours - cv).max() <= 1


def test_enlarging_matches_opencv_cubic_within_1_lsb_inside() -> None:
    """With OpenCV's a = -0.75, enlarging agrees with INTER_CUBIC within 1 LSB away from the
    borders (OpenCV replicates the border; we blend towards the background)."""
    small = cv2.resize(photo("astronaut"), (128, 128), interpolation=cv2.INTER_AREA)
    r = CpuRetoucher(RetouchConfig(geometry=GeometryConfig(cubic_a=-0.75)))
    for side in (300, 512):
        preset = Preset("t", side, side, fill=1.0, sharpen=0.0)
        ours = r.render(small, None, preset).astype(np.int16)
        cv = cv2.resize(small, (side, side), interpolation=cv2.INTER_CUBIC)
        m = 3 * side // 128 + 2
        assert np.abs(ours - cv)[m:-m, m:-m].max() <= 1


def test_sharpening_raises_edge_contrast() -> None:
    image = photo("chelsea")
    sharp = CpuRetoucher().render(image, None, replace(BOOK["taobao_main"], sharpen=1.0))
    soft = CpuRetoucher().render(image, None, replace(BOOK["taobao_main"], sharpen=0.0))

    def lap_var(x: np.ndarray) -> float:
        return float(cv2.Laplacian(cv2.cvtColor(x, cv2.COLOR_RGB2GRAY), cv2.CV_32F).var())

    assert lap_var(sharp) > 1.5 * lap_var(soft)


@pytest.mark.parametrize("preset", [
    BOOK["taobao_main"],                                     # shrink, white
    BOOK["transparent_png"],                                 # enlarge, transparent
    Preset("wide", 900, 300, fill=0.9, sharpen=0.8),         # enlarge, white
    Preset("tiny", 37, 53, format="png", background="transparent", fill=0.5),  # shrink
])
def test_render_fused_equals_unfused_bit_exactly(preset: Preset) -> None:
    r = CpuRetoucher()
    for name, image, mask in variants():
        fused = r.render(image, mask, preset)
        unfused = r.render_unfused(image, mask, preset)
        assert fused.shape == unfused.shape, name
        assert np.array_equal(fused, unfused), name


@pytest.mark.parametrize("preset", [
    Preset("flat", 640, 480, fill=0.3, sharpen=0.0),                          # no unsharp mask
    Preset("padded", 300, 900, format="png", background="transparent", fill=0.2),  # empty bands
])
def test_render_fast_paths_equal_unfused_bit_exactly(preset: Preset) -> None:
    """The CPU twin's shortcuts (sharpen 0 skipped, bands wholly in the pad filled) change no
    bit; a small subject in a corner leaves whole bands of the canvas empty."""
    image, hard = product_shot()
    corner = np.zeros_like(hard)
    corner[500:560, 20:90] = 255
    r = CpuRetoucher()
    for mask in (soft_mask(hard), corner):
        assert np.array_equal(r.render(image, mask, preset), r.render_unfused(image, mask, preset))


@pytest.mark.parametrize("preset", [
    BOOK["taobao_main"],                                                      # shrink, white
    BOOK["xiaohongshu_cover"],                                                # enlarge, white, tall canvas
    Preset("wide", 900, 300, fill=0.9, sharpen=0.8),                          # enlarge, white
    Preset("flat", 640, 480, fill=0.3, sharpen=0.0),                          # no unsharp mask
    BOOK["transparent_png"],                                                  # transparent
    Preset("tiny", 37, 53, format="png", background="transparent", fill=0.5),  # shrink, transparent
])
@pytest.mark.parametrize("tile", [(8, 32), (1, 1)], ids=["tiles", "pixels"])
@pytest.mark.parametrize("edge", ["soft", "hard"])
def test_render_skips_the_blank_canvas_and_still_equals_unfused_bit_exactly(
    preset: Preset, tile: tuple[int, int], edge: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the pipeline renders from: the corrected image, its backdrop composited to pure
    white. Canvas pixels whose neighbourhood reads only that white (or, transparent, only alpha
    0) are filled, not computed; the subject has white highlights of its own (blank pixels
    inside it) and a stray white-ringed island, and the result is still the unfused chain's,
    bit for bit, with most of the white canvas exactly 255. One-pixel tiles leave no slack: the
    spans are then exact, and only the halo of neighbours keeps the edges right."""
    from gpu_kernels.retouch import render

    monkeypatch.setattr(render, "TILE_ROWS", tile[0])
    monkeypatch.setattr(render, "TILE_COLS", tile[1])
    image, hard = product_shot()
    mask = soft_mask(hard) if edge == "soft" else hard.copy()
    mask[40:52, 30:44] = 255  # a small island far from the subject
    a = mask.astype(np.float32)[..., None] / 255
    white = np.round(image * a + 255 * (1 - a)).astype(np.uint8)
    ys, xs = np.nonzero(hard)
    white[ys[::7], xs[::7]] = 255  # highlights inside the subject
    r = CpuRetoucher()
    fused = r.render(white, mask, preset)
    assert np.array_equal(fused, r.render_unfused(white, mask, preset))
    if preset.background == "white":
        assert (fused == 255).all(axis=2).mean() > 0.2


def test_a_small_canvas_from_a_small_source_maps_no_blank_pixels_and_equals_unfused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Canvas and source both at most MAP_MIN_PIXELS: the render skips the blank map (at 64x64
    it cost more than the whole render, bench/bench_overhead.py --fixed-cost) and is still the unfused chain's,
    bit for bit, white or transparent; one side larger and the map is made."""
    from gpu_kernels.retouch import render

    image, hard = product_shot()
    small = cv2.resize(image, (120, 90), interpolation=cv2.INTER_AREA)
    mask = cv2.resize(hard, (120, 90), interpolation=cv2.INTER_NEAREST)
    made = []
    real = render._subject_columns
    monkeypatch.setattr(render, "_subject_columns", lambda src, t: made.append(src.shape) or real(src, t))
    r = CpuRetoucher()
    for background in ("white", "transparent"):
        preset = Preset("t", 96, 96, format="png", fill=0.9, sharpen=0.5, background=background)
        assert np.array_equal(r.render(small, mask, preset), r.render_unfused(small, mask, preset))
    assert made == []
    r.render(small, mask, Preset("t", 200, 200, fill=0.9, sharpen=0.5))
    assert len(made) == 1


def test_subject_columns_cover_every_pixel_that_is_not_blank() -> None:
    """The blank map's spans against a pixel-by-pixel scan: every non-blank pixel lies inside
    its run's span, and a span reaches at most one tile beyond its outermost non-blank pixels."""
    from gpu_kernels.retouch.render import TILE_COLS, TILE_ROWS, _subject_columns

    rng = np.random.default_rng(3)
    for h, w, c, transparent in ((37, 101, 3, False), (64, 64, 4, True), (19, 70, 1, False), (40, 33, 4, False)):
        src = np.full((h, w, c), 0 if transparent else 255, np.uint8)
        for _ in range(5):
            y, x = int(rng.integers(h)), int(rng.integers(w))
            src[y, x, int(rng.integers(c))] = 128
        spans = _subject_columns(src, transparent)
        assert spans is not None
        first, last = spans
        busy = (src != (0 if transparent else 255)).any(axis=2)
        for run in range(len(first)):
            cols = np.nonzero(busy[run * TILE_ROWS:(run + 1) * TILE_ROWS].any(axis=0))[0]
            if cols.size == 0:
                assert (first[run], last[run]) == (w, -1)
            else:
                assert first[run] <= cols[0] and last[run] >= cols[-1]
                assert cols[0] - first[run] < TILE_COLS and last[run] - cols[-1] < TILE_COLS
    assert _subject_columns(np.zeros((8, 8, 3), np.uint8), True) is None  # opaque: nothing transparent


# -- the CUDA source, compiled for the CPU --------------------------------------------------------

PRELUDE = r"""
#include <math.h>
#include <algorithm>
using std::min; using std::max;
#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__
struct lb_dim3 { unsigned int x, y, z; };
static lb_dim3 blockIdx, threadIdx, blockDim;
static inline void __syncthreads() {}
"""

DRIVERS = r"""
extern "C" void emu_correct(lb_dim3 grid, lb_dim3 block,
    const unsigned char* src, int cin, const unsigned char* alpha, long long off, int step,
    int has_alpha, const float* alpha_tab, unsigned char* dst, int mode, int height, int width,
    const float* wb, const float* gcols, int has_gain, int gh, float gstep, float gorigin,
    const float* lut, int nlut, const float* lut_scale, int has_lut) {
  blockDim = block;
  for (unsigned by = 0; by < grid.y; ++by) for (unsigned bx = 0; bx < grid.x; ++bx) {
    blockIdx = {bx, by, 0};
    for (unsigned ty = 0; ty < block.y; ++ty) for (unsigned tx = 0; tx < block.x; ++tx) {
      threadIdx = {tx, ty, 0};
      lb_correct(src, cin, alpha, off, step, has_alpha, alpha_tab, dst, mode, height, width,
                 wb, gcols, has_gain, gh, gstep, gorigin, lut, nlut, lut_scale, has_lut);
    }
  }
}
extern "C" void emu_render(lb_dim3 grid, lb_dim3 block,
    const unsigned long long* srcs, const int* dims, const float* params, unsigned char* dst,
    int out_h, int out_w, int transparent, float amount, const float* kc) {
  static float tile[LB_HALO * LB_HALO * 4];
  blockDim = block;
  for (unsigned bz = 0; bz < grid.z; ++bz) for (unsigned by = 0; by < grid.y; ++by)
  for (unsigned bx = 0; bx < grid.x; ++bx) {
    blockIdx = {bx, by, bz};
    for (int phase = 0; phase < 2; ++phase)  /* __syncthreads() between the phases */
      for (unsigned ty = 0; ty < block.y; ++ty) for (unsigned tx = 0; tx < block.x; ++tx) {
        threadIdx = {tx, ty, 0};
        lb_render_phase(phase, tile, srcs, dims, params, dst, out_h, out_w, transparent,
                        amount, kc);
      }
  }
}
"""


class Dim3(ctypes.Structure):
    _fields_ = [("x", ctypes.c_uint), ("y", ctypes.c_uint), ("z", ctypes.c_uint)]


@pytest.fixture(scope="module")
def kernels(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    """``KERNEL_SOURCE`` compiled by g++ as plain C++ (a thread = a loop iteration)."""
    if shutil.which("g++") is None:
        pytest.skip("g++ is not available")
    tmp: Path = tmp_path_factory.mktemp("kernels")
    (tmp / "k.cpp").write_text(PRELUDE + KERNEL_SOURCE + DRIVERS)
    subprocess.run(["g++", "-O2", "-ffp-contract=off", "-shared", "-fPIC",
                    "-o", str(tmp / "k.so"), str(tmp / "k.cpp")], check=True)
    return ctypes.CDLL(str(tmp / "k.so"))


def launch(lib: ctypes.CDLL, name: str, grid: tuple[int, ...], block: tuple[int, ...],
           args: tuple[Any, ...]) -> None:
    def arg(a: Any) -> Any:
        if isinstance(a, np.ndarray):
            assert a.flags.c_contiguous
            return ctypes.c_void_p(a.ctypes.data)
        return {np.int32: ctypes.c_int, np.int64: ctypes.c_longlong,
                np.float32: ctypes.c_float}[type(a)](a.item())

    fn = getattr(lib, name)
    fn.restype = None
    fn(Dim3(*grid), Dim3(*block), *[arg(a) for a in args])


@pytest.mark.parametrize("background", ["white", "transparent", "keep"])
def test_correct_kernel_source_equals_the_numpy_twin(kernels: ctypes.CDLL, background: str) -> None:
    r = CpuRetoucher()
    for lighting in ("auto", "off"):
        options = RetouchOptions(background, lighting)  # type: ignore[arg-type]
        for name, image, mask in variants():
            pixels = np.ascontiguousarray(as_pixels(image, stage="test"))
            alpha, own = alpha_source(mask, pixels, stage="test")
            pixels = np.ascontiguousarray(r.edge_colours(pixels, None if own else alpha, options))
            plan = r.plan(image, mask, options)
            grid, block, args, out = correct_launch(
                np, pixels, alpha, own, plan, effective_background(options.background, alpha),
                np.zeros(1, np.uint8), np.zeros(1, np.float32))
            launch(kernels, "emu_correct", grid, block, args)
            assert np.array_equal(out, r.correct([image], [mask], options)[0]), (name, lighting)


@pytest.mark.parametrize("preset", [
    BOOK["thumb_webp"],
    Preset("clear", 300, 360, format="png", background="transparent", fill=0.7, sharpen=0.6),
    Preset("big", 700, 500, fill=0.95, sharpen=0.3),
])
def test_render_kernel_source_equals_the_numpy_twin_for_a_mixed_batch(
    kernels: ctypes.CDLL, preset: Preset
) -> None:
    """One launch over images of different sizes and channel counts (a pointer table)."""
    r = CpuRetoucher()
    items = [(image, mask) for _, image, mask in variants()]
    items.append((np.full((1, 1, 3), 90, np.uint8), None))
    sources = []
    for image, mask in items:
        pixels = np.ascontiguousarray(as_pixels(image, stage="test"))
        if preset.background == "transparent":  # as CupyRetoucher.render_batch: the subject's alpha
            alpha, _ = alpha_source(mask, pixels, stage="test")
            pixels = np.ascontiguousarray(cutout_source(np, pixels, alpha))
        sources.append((pixels, r.placement(image, mask, preset)))
    grid, block, args, out = render_launch(
        np, sources, preset, r.config.geometry.cubic_coefficients(), lambda a: a.ctypes.data)
    launch(kernels, "emu_render", grid, block, args)
    for j, (image, mask) in enumerate(items):
        assert np.array_equal(out[j], r.render(image, mask, preset)), j


def find_nvrtc() -> ctypes.CDLL | None:
    """NVRTC from the ``nvidia-cuda-nvrtc`` wheel (compiles CUDA without a GPU), if installed."""
    try:
        import nvidia
    except ImportError:
        return None
    for base in getattr(nvidia, "__path__", []):
        for lib in sorted(Path(base).glob("cu*/lib/libnvrtc.so.*")):
            for builtins in sorted(lib.parent.glob("libnvrtc-builtins.so.*")):
                ctypes.CDLL(str(builtins), mode=ctypes.RTLD_GLOBAL)  # dlopen'ed by name later
            return ctypes.CDLL(str(lib))
    return None


def test_kernel_source_compiles_with_nvrtc_as_cupy_will() -> None:
    """The exact source and options CuPy uses (``--fmad=false``), for the H200 (sm_90): no
    errors, no warnings, both entry points, no fused multiply-adds, no local-memory arrays."""
    lib = find_nvrtc()
    if lib is None:
        pytest.skip("NVRTC is not installed (pip install nvidia-cuda-nvrtc)")
    prog = ctypes.c_void_p()
    assert lib.nvrtcCreateProgram(ctypes.byref(prog), KERNEL_SOURCE.encode(), b"retouch.cu",
                                  0, None, None) == 0
    opts = [b"--fmad=false", b"-arch=compute_90"]
    rc = lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
    size = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetProgramLog(prog, log)
    assert rc == 0, log.value.decode()
    assert log.value.decode().strip() == ""
    lib.nvrtcGetPTXSize(prog, ctypes.byref(size))
    ptx = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetPTX(prog, ptx)
    lib.nvrtcDestroyProgram(ctypes.byref(prog))
    text = ptx.value.decode()
    assert ".entry lb_correct" in text and ".entry lb_render" in text
    assert "fma.rn" not in text and ".local" not in text


# -- robustness -----------------------------------------------------------------------------------

def test_inputs_are_never_modified() -> None:
    """Inputs are passed read-only (any in-place write would raise) and compared afterwards."""
    r = CpuRetoucher()
    for _, image, mask in variants():
        image_copy = image.copy()
        mask_copy = None if mask is None else mask.copy()
        image.flags.writeable = False
        if mask is not None:
            mask.flags.writeable = False
        for bg in ("white", "transparent", "keep"):
            r.correct([image], [mask], RetouchOptions(bg))
        for preset in (BOOK["thumb_webp"], BOOK["transparent_png"]):
            r.render(image, mask, preset)
        assert np.array_equal(image, image_copy)
        assert mask is None or (mask_copy is not None and np.array_equal(mask, mask_copy))


ODD_OK = {
    "1x1": np.full((1, 1, 3), 200, np.uint8),
    "10000x10": np.tile(np.arange(10, dtype=np.uint8)[None, :, None] * 20, (10000, 1, 3)),
    "10x10000": np.tile(np.arange(10, dtype=np.uint8)[:, None, None] * 20, (1, 10000, 3)),
    "gray (H, W)": photo("camera")[::2, ::2].copy(),
    "gray (H, W, 1)": photo("camera")[::2, ::2, None].copy(),
    "rgba": np.dstack([photo("coffee"), np.full(photo("coffee").shape[:2], 128, np.uint8)]),
}


@pytest.mark.parametrize("name", list(ODD_OK))
def test_odd_shapes_work(name: str) -> None:
    image = ODD_OK[name]
    r = CpuRetoucher()
    for bg, channels in (("white", 3), ("transparent", 4), ("keep", 3)):
        out = r.correct([image], [None], RetouchOptions(bg))[0]  # type: ignore[arg-type]
        assert not isinstance(out, LightboxError)
        assert out.shape == (*image.shape[:2], channels) and out.dtype == np.uint8
    for preset in (BOOK["taobao_main"], BOOK["transparent_png"]):
        out = r.render(image, None, preset)
        channels = 4 if preset.background == "transparent" else 3
        assert out.shape == (preset.height, preset.width, channels)
    if name == "1x1":
        assert np.all(r.render(image, None, BOOK["thumb_webp"])[200, 200] != 255)


ODD_BAD = {
    "two channels": (np.zeros((8, 8, 2), np.uint8), None, "(8, 8, 2)"),
    "float image": (np.zeros((8, 8, 3), np.float32), None, "float32"),
    "empty": (np.zeros((0, 5, 3), np.uint8), None, "(0, 5, 3)"),
    "4-d": (np.zeros((2, 8, 8, 3), np.uint8), None, "(2, 8, 8, 3)"),
    "mask shape": (np.zeros((8, 8, 3), np.uint8), np.zeros((8, 9), np.uint8), "(8, 9)"),
    "mask dtype": (np.zeros((8, 8, 3), np.uint8), np.zeros((8, 8), np.float64), "float64"),
    "not an array": ("pixels", None, "dtype <U6"),
}


@pytest.mark.parametrize("name", list(ODD_BAD))
def test_bad_shapes_fail_clearly_and_alone(name: str) -> None:
    """``correct`` returns a ProcessingFailed in the bad item's place (batch-mates fine);
    ``render`` raises it; the message names the shape or dtype."""
    image, mask, needle = ODD_BAD[name]
    good = photo("coffee")
    r = CpuRetoucher()
    out = r.correct([good, image, good], [None, mask, None], RetouchOptions("white"))
    assert isinstance(out[1], ProcessingFailed)
    assert out[1].code == ErrorCode.PROCESSING_FAILED and not out[1].retriable
    assert needle in str(out[1]) and out[1].stage == "retouch.correct"
    assert all(isinstance(o, np.ndarray) for o in (out[0], out[2]))
    with pytest.raises(ProcessingFailed, match=r"retouch\.render") as info:
        r.render(image, mask, BOOK["thumb_webp"])
    assert needle in str(info.value)
    batch = r.render_batch([good, image], [None, mask], BOOK["thumb_webp"])
    assert isinstance(batch[0], np.ndarray) and isinstance(batch[1], ProcessingFailed)


def test_bool_and_channel_masks_are_accepted() -> None:
    image, mask = product_shot()
    r = CpuRetoucher()
    ref = r.correct([image], [mask], RetouchOptions("white"))[0]
    for m in (mask > 0, mask[..., None]):
        assert np.array_equal(r.correct([image], [m], RetouchOptions("white"))[0], ref)


def test_an_empty_mask_renders_the_whole_image() -> None:
    image = photo("chelsea")
    r = CpuRetoucher()
    empty = np.zeros(image.shape[:2], np.uint8)
    assert np.array_equal(r.render(image, empty, BOOK["thumb_webp"]),
                          r.render(image, None, BOOK["thumb_webp"]))


# -- the GPU check script and import hygiene ------------------------------------------------------

ROOT = Path(__file__).resolve().parents[2]


def test_the_package_imports_nothing_the_gpu_machine_lacks() -> None:
    """bench/gpu/checks.py retouch runs where only NumPy, CuPy, OpenCV and torch exist."""
    code = "import sys, json, gpu_kernels.retouch; print(json.dumps(sorted(sys.modules)))"
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, check=True, timeout=120)
    tops = {m.split(".")[0] for m in json.loads(proc.stdout)}
    heavy = {"pydantic", "fastavro", "faust", "aiokafka", "cv2", "skimage", "scipy", "cupy",
             "PIL", "nvidia", "onnxruntime"}
    assert not tops & heavy


def test_the_gpu_check_script_exits_cleanly_without_a_gpu(tmp_path: Path) -> None:
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() > 0:
            pytest.skip("a GPU is present: the script would run for real")
    except Exception:  # no CuPy, or no device
        pass
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu" / "checks.py"), "retouch"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "OUT": str(tmp_path), "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr
    report = json.loads((tmp_path / "gpu_check_retouch.json").read_text())
    assert report["status"] == "skipped"
    assert "CuPy" in report["reason"] or "device" in report["reason"]
