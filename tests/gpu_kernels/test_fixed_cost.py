"""The per-image floor of the CPU stages: work sized by the image, not by fixed grids or
per-call tables. Each change here must leave every output bit as it was."""

from __future__ import annotations

import numpy as np
import pytest
import skimage.data

from gpu_kernels.retouch import RetinexConfig, RetouchConfig
from gpu_kernels.retouch.checks import alpha_source
from gpu_kernels.retouch.correction import correct_fused_cpu, correct_reference, plan_correction
from gpu_kernels.retouch.cpu import effective_background
from gpu_kernels.retouch.geometry import axis_taps
from gpu_kernels.retouch.illumination import gaussian_matrix
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
