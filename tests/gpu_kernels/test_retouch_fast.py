"""Pass (a) at the resolution that reaches an output.

* colour statistics on a small copy: the gains stay within 1-2 % of the full-resolution ones;
* white balance (and the whole chain without a Retinex map) by per-channel tables: bit-identical
  to the per-pixel float path;
* the Retinex map on the sample grid, read through :class:`MapGrid` (strided or block centres);
* colouring only the window the presets read: the rendered variants equal the whole-image ones
  within 1 level.

The GPU twins of these are in tests/gpu_kernels/test_retouch_gpu.py (skipped without a GPU); the kernel
source with a shifted grid is checked here through g++.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np
import pytest
import skimage.data

from gpu_kernels.backends import RetouchOptions
from gpu_kernels.codec import CpuEncoder, make_decoder
from gpu_kernels.pipeline import ImagePipeline, Job
from gpu_kernels.presets import Preset, load_presets
from gpu_kernels.retouch import CpuRetoucher, RetinexConfig, RetouchConfig
from gpu_kernels.retouch.checks import alpha_source, as_pixels
from gpu_kernels.retouch.color import area_sample, estimate_tone
from gpu_kernels.retouch.correction import correct_fused_cpu, correct_reference, plan_correction, statistics_sample
from gpu_kernels.retouch.cpu import effective_background
from gpu_kernels.retouch.geometry import read_window
from gpu_kernels.retouch.gpu import correct_launch
from gpu_kernels.retouch.illumination import MapGrid, gain_rows, gaussian_matrix
from gpu_kernels.segment.classical import ClassicalSegmenter
from gpu_kernels.spans import SpanRecorder
from tests.gpu_kernels.test_retouch import kernels, launch, product_shot, soft_mask  # noqa: F401  (kernels: fixture)

BOOK = load_presets()
PRESETS = BOOK.resolve(["taobao_main", "xiaohongshu_cover", "thumb_webp"])
FULL = RetouchConfig(sample_side=1 << 20)  # every pixel: the reference the sample is held to


def photo(name: str) -> np.ndarray:
    return np.asarray(getattr(skimage.data, name)())[..., :3]


def gains(image: np.ndarray, mask: np.ndarray | None, cfg: RetouchConfig) -> tuple[np.ndarray, float]:
    """(white balance gains, exposure gain) of ``image`` estimated on ``cfg``'s sample."""
    plan = plan_correction(np, image, mask, "auto", cfg, gaussian_matrix)
    rgb, a, _ = statistics_sample(np, image, mask, cfg)
    tone = estimate_tone(np, rgb.reshape(-1, 3), None if a is None else a.reshape(-1), cfg.exposure)
    return np.asarray(plan.wb, np.float64), float(tone[0])


def scenes() -> list[tuple[str, np.ndarray, np.ndarray | None]]:
    shot, hard = product_shot()
    out: list[tuple[str, np.ndarray, np.ndarray | None]] = [("product+mask", shot, soft_mask(hard))]
    rng = np.random.default_rng(3)
    for name in ("coffee", "rocket", "chelsea"):
        img = photo(name)
        noisy = np.clip(img + rng.normal(0.0, 4.0, img.shape), 0, 255).astype(np.uint8)
        out += [(name, img, None), (f"{name}-dark", (img * 0.45).astype(np.uint8), None),
                (f"{name}-cast", np.clip(img * [1.15, 1.0, 0.8], 0, 255).astype(np.uint8), None),
                (f"{name}-noisy", noisy, None)]
    return out


# -- 1. statistics on a small copy ----------------------------------------------------------------

def test_default_sample_gains_are_within_1_percent_of_full_resolution() -> None:
    cfg = RetouchConfig()
    assert cfg.sample == "strided" and cfg.sample_side <= 160
    for name, image, mask in scenes():
        wb, tone = gains(image, mask, cfg)
        wb_full, tone_full = gains(image, mask, FULL)
        assert np.abs(wb / wb_full - 1).max() <= 0.015, (name, wb, wb_full)
        assert abs(tone / tone_full - 1) <= 0.015, (name, tone, tone_full)


def test_area_sample_is_the_exact_block_mean_of_every_tiled_pixel() -> None:
    rng = np.random.default_rng(0)
    for shape, side in (((301, 457, 3), 100), ((64, 64, 3), 128), ((5, 900), 64), ((300, 2000, 1), 300)):
        plane = rng.integers(0, 256, shape, dtype=np.uint8)
        mean, (fy, fx), (oy, ox) = area_sample(np, plane, side)
        gh, gw = mean.shape[:2]
        assert max(gh, gw) <= side and gh * fy <= shape[0] and gw * fx <= shape[1]
        assert oy == (shape[0] - gh * fy) // 2 and ox == (shape[1] - gw * fx) // 2
        blocks = plane[oy:oy + gh * fy, ox:ox + gw * fx].astype(np.float64)
        expect = blocks.reshape(gh, fy, gw, fx, *shape[2:]).mean(axis=(1, 3))
        assert np.allclose(mean, expect, rtol=0, atol=1e-9), shape


def test_area_sample_plans_and_reads_its_map_at_the_block_centres() -> None:
    """The area option works end to end (kept for comparison) and its grid puts map cell ``j`` at
    the centre of block ``j``: there the bilinear read returns the cell exactly."""
    image, hard = product_shot()
    mask = soft_mask(hard)
    cfg = RetouchConfig(sample="area", sample_side=128)
    plan = plan_correction(np, image, mask, "auto", cfg, gaussian_matrix)
    assert plan.gain_map is not None and max(plan.gain_map.shape) <= 128
    g = plan.grid
    assert g.step_y == g.step_x and g.origin_y == (g.step_y - 1) / 2 + (image.shape[0] % g.step_y) // 2
    cols = plan.gain_map  # already at the cell columns: read rows at cell centres
    centres = [int(g.origin_y + j * g.step_y) for j in range(plan.gain_map.shape[0])]
    if g.step_y % 2 == 1:  # odd blocks have an integer centre
        rows = np.stack([gain_rows(np, cols, y, y + 1, g)[0] for y in centres])
        assert np.array_equal(rows, plan.gain_map)
    wb, tone = gains(image, mask, cfg)
    wb_full, tone_full = gains(image, mask, FULL)
    assert np.abs(wb / wb_full - 1).max() <= 0.05 and abs(tone / tone_full - 1) <= 0.05


# -- 2. per-channel tables --------------------------------------------------------------------------

@pytest.mark.parametrize("background", ["white", "transparent", "keep"])
@pytest.mark.parametrize("strength", [0.0, 0.5])
def test_tables_equal_the_per_pixel_float_path_bit_exactly(background: str, strength: float) -> None:
    cfg = RetouchConfig(retinex=RetinexConfig(strength=strength))
    shot, hard = product_shot()
    items = [(shot, soft_mask(hard)), (photo("astronaut"), None), ((photo("coffee") * 0.45).astype(np.uint8), None)]
    for image, mask in items:
        alpha, _ = alpha_source(mask, image, stage="test")
        plan = plan_correction(np, image, alpha, "auto", cfg, gaussian_matrix)
        bg = effective_background(background, alpha)  # type: ignore[arg-type]
        by_table = correct_fused_cpu(image, alpha, plan, bg, tables=True)
        per_pixel = correct_fused_cpu(image, alpha, plan, bg, tables=False)
        assert np.array_equal(by_table, per_pixel)
        assert np.array_equal(by_table, np.asarray(correct_reference(np, image, alpha, plan, bg)))


# -- 3/4. the window the presets read -------------------------------------------------------------

def small_subject() -> tuple[np.ndarray, np.ndarray]:
    """A product shot with the subject in a corner: most of the frame is never rendered."""
    shot, hard = product_shot()
    return np.ascontiguousarray(np.pad(shot, ((0, 500), (0, 700), (0, 0)), constant_values=200)), \
        np.pad(soft_mask(hard), ((0, 500), (0, 700)))


def test_the_window_covers_what_the_presets_read_and_leaves_the_rest() -> None:
    image, mask = small_subject()
    r = CpuRetoucher()
    win = r.correction_window(image, mask, PRESETS)
    assert win is not None
    x0, y0, x1, y1 = win
    h, w = mask.shape
    assert (x1 - x0) * (y1 - y0) < 0.6 * h * w
    ys, xs = np.nonzero(mask)
    assert x0 <= xs.min() and xs.max() < x1 and y0 <= ys.min() and ys.max() < y1
    assert CpuRetoucher(RetouchConfig(crop_to_presets=False)).correction_window(image, mask, PRESETS) is None
    assert r.correction_window(image, None, PRESETS) is None
    # a subject that fills the frame leaves nothing out
    full = np.full(mask.shape, 255, np.uint8)
    assert r.correction_window(image, full, PRESETS) is None
    # the same union computed preset by preset
    box = np.array([xs.min(), ys.min(), xs.max() + 1, ys.max() + 1])
    coeffs = r.config.geometry.cubic_coefficients()
    parts = [read_window(box, [(p.width, p.height, p.fill)], h, w, coeffs) for p in PRESETS]
    assert win == (min(p[0] for p in parts), min(p[1] for p in parts),
                   max(p[2] for p in parts), max(p[3] for p in parts))


@pytest.mark.parametrize("background", ["white", "keep", "transparent"])
def test_rendering_from_the_window_equals_rendering_from_the_whole_image(background: str) -> None:
    image, mask = small_subject()
    r = CpuRetoucher()
    options = RetouchOptions(background)  # type: ignore[arg-type]
    presets = [*PRESETS, Preset("clear", 300, 360, format="png", background="transparent", fill=0.7),
               Preset("loose", 500, 500, fill=0.3)]
    win = r.correction_window(image, mask, presets)
    assert win is not None
    x0, y0, x1, y1 = win
    whole = r.correct([image], [mask], options)[0]
    part = r.correct([image], [mask], options, windows=[win])[0]
    assert part.shape[:2] == (y1 - y0, x1 - x0)
    assert np.array_equal(part, whole[y0:y1, x0:x1])  # the same colours, pixel for pixel
    for p in presets:
        a = r.render(whole, mask, p).astype(np.int16)
        b = r.render(part, mask[y0:y1, x0:x1], p).astype(np.int16)
        assert np.abs(a - b).max() <= 1, p.name
        assert (a != b).mean() < 0.001, p.name


def test_the_pipeline_colours_only_the_window_and_its_variants_match(catalog: list[Path]) -> None:
    """Through the stage list (classical masks on the sample catalog): the correct stage keeps the
    window, the render stage crops the mask alike; every variant is within 1 level of the
    previous path's (whole image)."""
    def run(cfg: RetouchConfig) -> tuple[list[list[np.ndarray]], list[tuple[int, ...] | None]]:
        pipe = ImagePipeline(make_decoder("cpu"), CpuRetoucher(cfg), CpuEncoder(), None, ClassicalSegmenter())
        jobs = [Job(p.read_bytes(), PRESETS, RetouchOptions(), SpanRecorder()) for p in catalog[:4]]
        ctx = pipe.start(jobs)
        for lane in ("decode", "device", "output"):  # render runs in the output lane on the CPU
            pipe.run_lane(ctx, lane)  # type: ignore[arg-type]
        rendered = [[np.asarray(ctx.rendered[i, p.name]) for p in PRESETS] for i in range(len(jobs))]
        wins = [ctx.memo.get(("correct:window", i)) for i in range(len(jobs))]
        assert all(ctx.results[i].ok for i in range(len(jobs)))
        pipe.close()
        return rendered, wins

    cfg = RetouchConfig()
    new, wins = run(cfg)
    old, old_wins = run(RetouchConfig(sample=cfg.sample, sample_side=cfg.sample_side, crop_to_presets=False))
    assert any(w is not None for w in wins) and all(w is None for w in old_wins)
    for a_item, b_item in zip(new, old, strict=True):
        for a, b in zip(a_item, b_item, strict=True):
            assert a.shape == b.shape
            assert np.abs(a.astype(np.int16) - b).max() <= 1


def test_the_kernel_source_reads_a_shifted_grid_as_the_numpy_twin(kernels: ctypes.CDLL) -> None:  # noqa: F811
    """``lb_correct`` (g++) on a window of an image, with the plan shifted to it: equal to the CPU
    twin bit for bit (the grid origin is a kernel argument)."""
    image, mask = small_subject()
    r = CpuRetoucher(RetouchConfig(tables=False))
    win = r.correction_window(image, mask, PRESETS)
    assert win is not None
    x0, y0, x1, y1 = win
    for background in ("white", "keep"):
        options = RetouchOptions(background)  # type: ignore[arg-type]
        plan = r.plan(image, mask, options).shifted(y0, x0)
        assert plan.grid.origin_y == -y0 and plan.grid.origin_x == -x0
        pixels = np.ascontiguousarray(r.edge_colours(as_pixels(image, stage="test"), mask, options)[y0:y1, x0:x1])
        alpha = np.ascontiguousarray(mask[y0:y1, x0:x1])
        grid, block, args, out = correct_launch(np, pixels, alpha, False, plan, background,
                                                np.zeros(1, np.uint8), np.zeros(1, np.float32))
        launch(kernels, "emu_correct", grid, block, args)
        assert np.array_equal(out, r.correct([image], [mask], options, windows=[win])[0]), background


def test_a_map_grid_shifted_by_a_window_reads_the_same_gains() -> None:
    gain_map = np.random.default_rng(1).uniform(0.6, 2.0, (20, 30)).astype(np.float32)
    for grid in (MapGrid(8, 8), MapGrid(8, 8, 3.5, 5.5)):
        whole = gain_rows(np, gain_map, 0, 160, grid)
        part = gain_rows(np, gain_map, 0, 60, grid.shifted(40, 0))
        assert np.array_equal(part, whole[40:100])
