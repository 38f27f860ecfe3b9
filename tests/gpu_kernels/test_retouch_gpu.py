"""CupyRetoucher vs CpuRetoucher on real photos; skipped without CuPy or a CUDA device.

Run on a GPU machine with ``PYTHONPATH=. pytest -m gpu tests/gpu_kernels/test_retouch_gpu.py``.
Tolerance: uint8 outputs within 1 LSB of the CPU twin (the kernels repeat the twin's float32
operations in order with ``--fmad=false``; the float64 parameter estimation may differ in the
last bit between NumPy and CuPy, which can flip a rounding).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from gpu_kernels.backends import Retoucher, RetouchOptions
from gpu_kernels.presets import Preset
from gpu_kernels.retouch import CpuRetoucher, CupyRetoucher
from schemas.errors import ProcessingFailed
from tests.gpu import cupy_or_skip
from tests.gpu_kernels.test_retouch import BOOK, ODD_BAD, ODD_OK, variants

pytestmark = pytest.mark.gpu

cp: Any = cupy_or_skip()

PRESETS = [
    BOOK["taobao_main"],
    BOOK["amazon_main"],
    BOOK["transparent_png"],
    Preset("wide", 900, 300, fill=0.9, sharpen=0.8),
    Preset("tiny", 37, 53, format="png", background="transparent", fill=0.5),
]


@pytest.fixture(scope="module")
def gpu() -> CupyRetoucher:
    return CupyRetoucher()


def within_one_lsb(a: Any, b: np.ndarray) -> None:
    a = cp.asnumpy(a)
    assert a.shape == b.shape and a.dtype == b.dtype == np.uint8
    diff = np.abs(a.astype(np.int16) - b)
    assert diff.max() <= 1, f"max diff {diff.max()} at {np.argwhere(diff > 1)[:5].tolist()}"


def test_is_a_retoucher(gpu: CupyRetoucher) -> None:
    assert isinstance(gpu, Retoucher) and gpu.device == "gpu"


@pytest.mark.parametrize("background", ["white", "transparent", "keep"])
@pytest.mark.parametrize("lighting", ["auto", "off"])
def test_correct_matches_cpu(gpu: CupyRetoucher, background: str, lighting: str) -> None:
    cpu = CpuRetoucher()
    options = RetouchOptions(background, lighting)  # type: ignore[arg-type]
    for _, image, mask in variants():
        dev_mask = None if mask is None else cp.asarray(mask)
        out = gpu.correct([cp.asarray(image)], [dev_mask], options)[0]
        assert isinstance(out, cp.ndarray)
        within_one_lsb(out, cpu.correct([image], [mask], options)[0])


def test_plans_match_cpu(gpu: CupyRetoucher) -> None:
    cpu = CpuRetoucher()
    for _, image, mask in variants():
        a, b = gpu.plan(image, mask, RetouchOptions()), cpu.plan(image, mask, RetouchOptions())
        assert a.grid == b.grid
        pairs = ((a.wb, b.wb), (a.gain_map, b.gain_map), (a.lut, b.lut), (a.lut_scale, b.lut_scale))
        for x, y in pairs:
            assert (x is None) == (y is None)
            if x is not None:
                np.testing.assert_allclose(cp.asnumpy(x), np.asarray(y), rtol=1e-5, atol=1e-4)


def test_correct_fused_matches_the_unfused_gpu_chain(gpu: CupyRetoucher) -> None:
    for _, image, mask in variants():
        for bg in ("white", "transparent", "keep"):
            options = RetouchOptions(bg)
            fused = gpu.correct([image], [mask], options)[0]
            within_one_lsb(fused, cp.asnumpy(gpu.correct_unfused(image, mask, options)))


@pytest.mark.parametrize("preset", PRESETS, ids=lambda p: p.name)
def test_render_matches_cpu(gpu: CupyRetoucher, preset: Preset) -> None:
    cpu = CpuRetoucher()
    for _, image, mask in variants():
        within_one_lsb(gpu.render(cp.asarray(image), mask, preset), cpu.render(image, mask, preset))


@pytest.mark.parametrize("preset", PRESETS[:3], ids=lambda p: p.name)
def test_render_batch_of_mixed_sizes_equals_one_by_one(gpu: CupyRetoucher, preset: Preset) -> None:
    items = [(image, mask) for _, image, mask in variants()]
    batch = gpu.render_batch([i for i, _ in items], [m for _, m in items], preset)
    for (image, mask), out in zip(items, batch, strict=True):
        assert np.array_equal(cp.asnumpy(out), cp.asnumpy(gpu.render(image, mask, preset)))


@pytest.mark.parametrize("preset", PRESETS[:3], ids=lambda p: p.name)
def test_render_fused_matches_the_unfused_gpu_chain(gpu: CupyRetoucher, preset: Preset) -> None:
    for _, image, mask in variants():
        within_one_lsb(gpu.render(image, mask, preset),
                       cp.asnumpy(gpu.render_unfused(image, mask, preset)))


def test_inputs_are_never_modified(gpu: CupyRetoucher) -> None:
    for _, image, mask in variants():
        dev_image = cp.asarray(image)
        dev_mask = None if mask is None else cp.asarray(mask)
        for bg in ("white", "transparent", "keep"):
            gpu.correct([dev_image], [dev_mask], RetouchOptions(bg))
        gpu.render(dev_image, dev_mask, BOOK["thumb_webp"])
        assert np.array_equal(cp.asnumpy(dev_image), image)
        assert mask is None or np.array_equal(cp.asnumpy(dev_mask), mask)


@pytest.mark.parametrize("name", list(ODD_OK))
def test_odd_shapes_match_cpu(gpu: CupyRetoucher, name: str) -> None:
    image, cpu = ODD_OK[name], CpuRetoucher()
    for bg in ("white", "transparent", "keep"):
        options = RetouchOptions(bg)
        within_one_lsb(gpu.correct([image], [None], options)[0],
                       cpu.correct([image], [None], options)[0])
    preset = BOOK["thumb_webp"]
    within_one_lsb(gpu.render(image, None, preset), cpu.render(image, None, preset))


@pytest.mark.parametrize("name", list(ODD_BAD))
def test_bad_shapes_fail_clearly(gpu: CupyRetoucher, name: str) -> None:
    image, mask, needle = ODD_BAD[name]
    if isinstance(image, str):
        pytest.skip("CuPy cannot hold strings")
    out = gpu.correct([image], [mask], RetouchOptions("white"))
    assert isinstance(out[0], ProcessingFailed) and needle in str(out[0])
    with pytest.raises(ProcessingFailed, match=r"retouch\.render"):
        gpu.render(image, mask, BOOK["thumb_webp"])


def test_windows_and_area_samples_match_cpu(gpu: CupyRetoucher) -> None:
    """Pass (a) at the outputs' resolution on the device: the window the presets read (one host read of the subject
    box) and the area-averaged sample give the CPU twin's numbers."""
    from tests.gpu_kernels.test_retouch_fast import PRESETS as FAST_PRESETS
    from tests.gpu_kernels.test_retouch_fast import small_subject

    image, mask = small_subject()
    cpu = CpuRetoucher()
    win = gpu.correction_window(cp.asarray(image), cp.asarray(mask), FAST_PRESETS)
    assert win == cpu.correction_window(image, mask, FAST_PRESETS) and win is not None
    for background in ("white", "transparent", "keep"):
        options = RetouchOptions(background)  # type: ignore[arg-type]
        out = gpu.correct([cp.asarray(image)], [cp.asarray(mask)], options, windows=[win])[0]
        within_one_lsb(out, cpu.correct([image], [mask], options, windows=[win])[0])
    from gpu_kernels.retouch import RetouchConfig

    area = RetouchConfig(sample="area", sample_side=128)
    a = CupyRetoucher(area).plan(image, mask, RetouchOptions())
    b = CpuRetoucher(area).plan(image, mask, RetouchOptions())
    assert a.grid == b.grid
    np.testing.assert_allclose(cp.asnumpy(a.wb), np.asarray(b.wb), rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(cp.asnumpy(a.gain_map), np.asarray(b.gain_map), rtol=1e-5, atol=1e-4)
