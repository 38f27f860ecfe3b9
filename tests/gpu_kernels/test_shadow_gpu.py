"""Contact shadow: the CuPy kernel gives the NumPy twin's bytes. Skipped without a GPU."""

from __future__ import annotations

import numpy as np
import pytest

from tests.gpu import cupy_or_skip

pytestmark = pytest.mark.gpu

cp = cupy_or_skip()

from gpu_kernels.stages.shadow import ShadowConfig, contact_shadow  # noqa: E402


@pytest.mark.parametrize("seed", range(4))
def test_gpu_shadow_matches_the_cpu_twin_exactly(seed: int) -> None:
    rng = np.random.default_rng(seed)
    h, w = rng.integers(200, 900, 2)
    img = np.full((h, w, 3), 255, np.uint8)
    y0, x0 = rng.integers(5, h // 3), rng.integers(5, w // 3)
    y1, x1 = rng.integers(h // 2, h - 10), rng.integers(w // 2, w - 5)
    img[y0:y1, x0:x1] = rng.integers(0, 256, (y1 - y0, x1 - x0, 3), dtype=np.uint8)
    img[y1 - 3:y1, x0:x1:7] = 255  # a ragged base: some columns of the footprint are background
    cfg = ShadowConfig(strength=float(rng.uniform(0.1, 0.6)), depth=float(rng.uniform(0.02, 0.2)))
    cpu = contact_shadow(img, cfg)
    gpu = contact_shadow(cp.asarray(img), cfg)
    assert isinstance(gpu, cp.ndarray)
    assert np.array_equal(cp.asnumpy(gpu), cpu)
    assert (cpu != img).any()
