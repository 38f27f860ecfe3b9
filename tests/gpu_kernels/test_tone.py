"""Exposure keeps products' colours: a flat red, navy, black, white or orange product
on a white backdrop comes out the colour it went in; an underexposed photo is raised back to what
the well-exposed one gives; an over-exposed or washed-out photo is not made worse.

Colour differences are CIEDE2000 (skimage) on the subject's pixels; the scenes are those of
``bench/bench_output.py tone`` (which reports the figures before and after the change)."""

from __future__ import annotations

import numpy as np
import pytest
import skimage.data
from skimage.color import deltaE_ciede2000, rgb2lab

from gpu_kernels.backends import RetouchOptions
from gpu_kernels.retouch import CpuRetoucher, RetinexConfig, RetouchConfig, WhiteBalanceConfig
from gpu_kernels.retouch.correction import plan_correction
from gpu_kernels.retouch.illumination import gaussian_matrix

PRODUCTS = {
    "red": (150, 30, 40),
    "navy": (25, 35, 90),
    "black": (20, 20, 22),
    "white": (245, 245, 245),
    "orange": (240, 120, 20),
}
EXPOSURE_ONLY = RetouchConfig(white_balance=WhiteBalanceConfig(max_gain=1.0), retinex=RetinexConfig(strength=0.0))


def product_scene(rgb: tuple[int, int, int], h: int = 240, w: int = 320) -> tuple[np.ndarray, np.ndarray]:
    """A flat product (an ellipse, +-2 levels of noise) on a white (255) backdrop, and its mask."""
    yy, xx = np.mgrid[:h, :w]
    inside = ((yy - h / 2) / (0.32 * h)) ** 2 + ((xx - w / 2) / (0.28 * w)) ** 2 <= 1.0
    noise = np.random.default_rng(7).integers(-2, 3, (h, w, 3))
    image = np.full((h, w, 3), 255, np.int16)
    image[inside] = np.clip(np.array(rgb) + noise[inside], 0, 255)
    return image.astype(np.uint8), np.where(inside, 255, 0).astype(np.uint8)


def photo(name: str) -> np.ndarray:
    return np.ascontiguousarray(getattr(skimage.data, name)()[..., :3])


def mean_lstar(image: np.ndarray) -> float:
    return float(rgb2lab(image)[..., 0].mean())


def lstar_error(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(rgb2lab(a)[..., 0] - rgb2lab(b)[..., 0]).mean())


@pytest.mark.parametrize("config", [RetouchConfig(), RetouchConfig(retinex=RetinexConfig(strength=0.0))],
                         ids=["retinex", "no-retinex"])
@pytest.mark.parametrize("name", list(PRODUCTS))
def test_a_flat_product_on_white_keeps_its_colour(name: str, config: RetouchConfig) -> None:
    """Every subject pixel within CIEDE2000 3 of its input (a tone curve stretched to the
    subject's percentiles gave median 20 for the red, 16 for the navy, 12 for the black), no channel newly at 255, and
    the tone gain is 1 (the white backdrop is the exposure's reference)."""
    image, mask = product_scene(PRODUCTS[name])
    plan = plan_correction(np, image, mask, "auto", config, gaussian_matrix)
    assert plan.lut is not None and plan.lut_scale is not None
    assert plan.lut[1] * plan.lut_scale[0] == pytest.approx(1.0, rel=1e-3)  # slope: the gain
    for background in ("keep", "white"):
        out = CpuRetoucher(config).correct([image], [mask], RetouchOptions(background))[0]
        sel = mask == 255
        de = deltaE_ciede2000(rgb2lab(image[sel][None]), rgb2lab(out[sel][None]))[0]
        assert float(de.max()) <= 3.0, (name, background, float(np.median(de)), float(de.max()))
        assert not ((out[sel] == 255) & (image[sel] < 255)).any()


def test_a_saturated_product_filling_the_frame_keeps_its_hue_and_clips_nothing() -> None:
    """No backdrop, no mask: a flat red (150, 30, 40) filling the frame may be raised (nothing
    says its exposure is right) but keeps its hue angle within 3 degrees and its chroma from
    falling, and no channel reaches 255."""
    image = np.broadcast_to(np.array(PRODUCTS["red"], np.uint8), (120, 160, 3)).copy()
    out = CpuRetoucher().correct([image], [None], RetouchOptions("keep"))[0]
    lab_in, lab_out = rgb2lab(image[:1, :1])[0, 0], rgb2lab(out[:1, :1])[0, 0]
    hue = np.degrees(np.arctan2(lab_in[2], lab_in[1]) - np.arctan2(lab_out[2], lab_out[1]))
    assert abs(hue) <= 3.0, (lab_in, lab_out)
    assert np.hypot(*lab_out[1:]) >= np.hypot(*lab_in[1:]) - 1.0
    assert int(out.max()) < 255


@pytest.mark.parametrize("name", ["astronaut", "coffee", "chelsea"])
def test_an_underexposed_photo_comes_back_to_the_original_s_output(name: str) -> None:
    """The photo darkened to 45 % (about 2.3 stops in linear light): the output's mean L* is
    within 3 of the output for the original photo (default config: white balance and Retinex act
    on both) where the input was >= 20 below, and the mean |dL*| between the two outputs is <= 4."""
    original = photo(name)
    dark = (original * 0.45).astype(np.uint8)
    r = CpuRetoucher()
    reference = r.correct([original], [None], RetouchOptions("keep"))[0]
    out = r.correct([dark], [None], RetouchOptions("keep"))[0]
    assert mean_lstar(reference) - mean_lstar(dark) >= 20
    assert abs(mean_lstar(out) - mean_lstar(reference)) <= 3.0, (mean_lstar(out), mean_lstar(reference))
    assert lstar_error(reference, out) <= 4.0


@pytest.mark.parametrize("name", ["astronaut", "coffee"])
def test_exposure_alone_restores_the_original_photo(name: str) -> None:
    """White balance and Retinex off: the darkened photo's output has the original photo's mean
    L* within 2 (these two photos reach white: the original itself is not raised)."""
    original = photo(name)
    dark = (original * 0.45).astype(np.uint8)
    out = CpuRetoucher(EXPOSURE_ONLY).correct([dark], [None], RetouchOptions("keep"))[0]
    assert abs(mean_lstar(out) - mean_lstar(original)) <= 2.0, (mean_lstar(out), mean_lstar(original))


@pytest.mark.parametrize("name", ["astronaut", "coffee", "chelsea"])
@pytest.mark.parametrize("kind", ["over", "washed"])
def test_an_overexposed_or_washed_out_photo_is_not_made_worse(name: str, kind: str) -> None:
    """Times 1.5 (clipped) or 0.55 x + 110 (veiled): the output's mean |dL*| against the original
    photo is at most the input's + 0.5, with exposure alone and with the default config, and no
    pixel has a channel newly at 255."""
    base = photo(name).astype(np.float64)
    image = (np.clip(base * 1.5, 0, 255) if kind == "over" else base * 0.55 + 110).astype(np.uint8)
    for config in (EXPOSURE_ONLY, RetouchConfig()):
        out = CpuRetoucher(config).correct([image], [None], RetouchOptions("keep"))[0]
        assert lstar_error(photo(name), out) <= lstar_error(photo(name), image) + 0.5
        assert not ((out == 255) & (image < 255)).any()


@pytest.mark.parametrize("name", list(PRODUCTS))
def test_an_underexposed_product_shot_comes_back_to_its_colours(name: str) -> None:
    """The whole product shot at 45 % (backdrop 115 instead of 255): the white backdrop is the
    exposure reference, so the subject's pixels come back within CIEDE2000 6 (95th percentile) of
    the well-exposed shot's, where the darkened input is >= 2.5 away (median; >= 10 but for the
    black product, which stays black)."""
    image, mask = product_scene(PRODUCTS[name])
    dark = (image * 0.45).astype(np.uint8)
    out = CpuRetoucher().correct([dark], [mask], RetouchOptions("keep"))[0]
    sel = mask == 255
    lab = rgb2lab(image[sel][None])
    assert float(np.median(deltaE_ciede2000(lab, rgb2lab(dark[sel][None])))) >= (2.5 if name == "black" else 10)
    de = deltaE_ciede2000(lab, rgb2lab(out[sel][None]))[0]
    assert float(np.percentile(de, 95)) <= 6.0, (name, float(np.median(de)), float(np.percentile(de, 95)))
