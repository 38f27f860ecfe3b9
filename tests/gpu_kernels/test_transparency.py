"""Transparent presets carry the subject's alpha, read back from the encoded PNG and WebP.

A known cut-out (an antialiased disc and a bar, drawn at 4x and area-averaged, on a cream
backdrop) goes through pass (a) on white (the default) and a transparent preset; the encoded
file is decoded with Pillow and its alpha compared with the true alpha placed on the canvas
alike (the inverted alpha rendered on a white canvas).
"""

from __future__ import annotations

import io
from typing import Literal

import cv2
import numpy as np
import pytest
from PIL import Image

from gpu_kernels.backends import RetouchOptions
from gpu_kernels.codec import make_encoder
from gpu_kernels.presets import Preset, load_presets
from gpu_kernels.retouch import CpuRetoucher, RetouchConfig
from gpu_kernels.retouch.composite import cutout_source
from gpu_kernels.retouch.render import render_reference

CREAM = np.array([242.0, 230.0, 204.0])
PRODUCT = np.array([60.0, 110.0, 200.0])


def known_cutout() -> tuple[np.ndarray, np.ndarray]:
    """``(image (300, 400, 3) uint8, true alpha (300, 400) uint8)``."""
    big = np.zeros((1200, 1600), np.uint8)
    cv2.circle(big, (700, 600), 360, 255, -1)
    cv2.rectangle(big, (1000, 560), (1400, 640), 255, -1)
    alpha = cv2.resize(big, (400, 300), interpolation=cv2.INTER_AREA)
    a = alpha.astype(np.float64)[..., None] / 255.0
    image = np.rint(PRODUCT * a + CREAM * (1.0 - a)).astype(np.uint8)
    return image, alpha


def canvas_alpha(alpha: np.ndarray, r: CpuRetoucher, preset: Preset) -> np.ndarray:
    """The true alpha placed on ``preset``'s canvas (the inverted alpha rendered on white)."""
    inv = (255 - alpha)[..., None]
    params = r.placement(inv, alpha, preset)
    out = render_reference(np, inv, params, preset.width, preset.height, False, 0.0,
                           r.config.geometry.cubic_coefficients())
    return 255 - np.asarray(out)[..., 0].astype(np.int16)


@pytest.mark.parametrize("fmt", ["png", "webp"])
def test_a_transparent_preset_writes_the_subject_s_alpha(fmt: Literal["png", "webp"]) -> None:
    """Alpha read back from the file is within 3 levels (mean) of the true alpha on the canvas,
    exactly 0 on the canvas' border and far from the subject, 255 inside it; the subject's colour
    is its own (no white or cream mixed in at full alpha). Before, the removed background was
    painted opaque white inside the scaled photo."""
    image, alpha = known_cutout()
    r = CpuRetoucher(RetouchConfig(decontaminate=True))
    base = load_presets()["transparent_png"]
    preset = Preset(name=f"t_{fmt}", width=base.width, height=base.height, format=fmt, quality=90,
                    fill=base.fill, background="transparent", sharpen=base.sharpen)
    corrected = r.correct([image], [alpha], RetouchOptions("white", lighting="off"))[0]  # composite only
    rendered = r.render(corrected, alpha, preset)
    data = make_encoder("cpu").encode(rendered, preset)
    back = np.asarray(Image.open(io.BytesIO(data)).convert("RGBA"))
    got = back[..., 3].astype(np.int16)
    truth = canvas_alpha(alpha, r, preset)
    assert np.abs(got - truth).mean() <= 3.0
    far = cv2.dilate((truth > 0).astype(np.uint8), np.ones((9, 9), np.uint8)) == 0
    assert far.sum() > 0.3 * far.size
    assert np.all(got[far] == 0), "opaque pixels outside the subject"
    inner = cv2.erode((truth >= 255).astype(np.uint8), np.ones((9, 9), np.uint8)).astype(bool)
    assert np.all(got[inner] == 255)
    colour = back[..., :3][inner].astype(np.float64).mean(axis=0)
    assert np.abs(colour - PRODUCT).max() <= 6, colour
    edge = (truth >= 64) & (truth <= 192)  # half-covered pixels keep the product's colour, not white
    edge_colour = back[..., :3][edge].astype(np.float64).mean(axis=0)
    assert np.abs(edge_colour - PRODUCT).max() <= 20, edge_colour


def test_cutout_source_uncomposites_white() -> None:
    """A colour composited over white by alpha comes back (to rounding); alpha 0 gives colour 0;
    an RGBA image or no alpha is returned as is."""
    rng = np.random.default_rng(1)
    colour = rng.integers(0, 256, (64, 64, 3)).astype(np.float64)
    alpha = rng.integers(0, 256, (64, 64)).astype(np.uint8)
    a = alpha[..., None] / 255.0
    white = np.rint(colour * a + 255.0 * (1.0 - a)).astype(np.uint8)
    out = cutout_source(np, white, alpha)
    assert out.shape == (64, 64, 4) and np.array_equal(out[..., 3], alpha)
    premul = out[..., :3].astype(np.float64) * a
    assert np.abs(premul - colour * a).max() <= 1.0
    assert np.all(out[alpha == 0, :3] == 0)
    rgba = np.dstack([white, alpha])
    assert cutout_source(np, rgba, alpha) is rgba
    assert cutout_source(np, white, None) is white


def test_without_a_mask_a_transparent_canvas_pads_transparent_around_an_opaque_photo() -> None:
    """No mask: nothing is cut out (the photo stays opaque), the padding is transparent."""
    image, _ = known_cutout()
    r = CpuRetoucher()
    preset = load_presets()["transparent_png"]
    out = np.asarray(r.render(image, None, preset))
    assert out.shape[-1] == 4
    assert (out[..., 3] == 255).any() and (out[..., 3] == 0).any()
