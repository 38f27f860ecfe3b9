"""Edge matting and colour decontamination (gpu_kernels.retouch.matting), CPU; the GPU twin
is compared in test_matting_gpu_matches_cpu (skipped without a CUDA device)."""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from gpu_kernels.retouch.matting import (
    MattingConfig,
    box_blur,
    box_means_at,
    colour_line_alpha,
    colour_line_planes,
    decontaminate,
    foreground_colour,
    matte_band,
)

FG = np.array([40.0, 90.0, 200.0])
BG = np.array([242.0, 230.0, 204.0])


def soft_disc(h: int = 240, w: int = 320, blur: float = 2.5) -> tuple[np.ndarray, np.ndarray]:
    """A blue disc with a soft (blurred) edge on cream: ``(image uint8, true alpha float32)``."""
    m = np.zeros((h, w), np.float32)
    cv2.circle(m, (w // 2, h // 2), 80, 1.0, -1)
    alpha = np.asarray(cv2.GaussianBlur(m, (0, 0), blur), np.float32)
    image = np.rint(FG * alpha[..., None] + BG * (1.0 - alpha[..., None])).astype(np.uint8)
    return image, alpha


def test_the_matte_follows_a_soft_edge_better_than_the_hard_mask() -> None:
    """Inside the band the matte's alpha is closer to the truth (mean abs error under half the
    hard mask's), and outside the band it is the hard mask exactly."""
    image, truth = soft_disc()
    hard = truth >= 0.5
    unknown = (cv2.dilate(hard.astype(np.uint8), np.ones((9, 9), np.uint8)) > 0) & ~(
        cv2.erode(hard.astype(np.uint8), np.ones((9, 9), np.uint8)) > 0)
    alpha = matte_band(np, image, hard, unknown, 4, 1e-3)
    err_matte = np.abs(alpha - truth)[unknown].mean()
    err_hard = np.abs(hard.astype(np.float32) - truth)[unknown].mean()
    assert err_matte < 0.5 * err_hard, (err_matte, err_hard)
    assert np.array_equal(alpha[~unknown], hard[~unknown].astype(np.float32))


def _line_means(f: np.ndarray, b: np.ndarray, n: int, wf: float = 0.5, wb: float = 0.5) -> list[np.ndarray]:
    """The box means colour_line_alpha reads, for ``n`` pixels with subject mean ``f`` and
    backdrop mean ``b`` (each a share ``wf``/``wb`` of the window)."""
    full = np.ones(n, np.float32)
    return [full * wf, *(full * np.float32(wf * c) for c in f), full * wb, *(full * np.float32(wb * c) for c in b)]


def test_the_colour_line_gives_a_mixed_pixel_its_subject_share() -> None:
    """Pixels mixed from the subject's and the backdrop's colours get the subject's share as
    alpha (within float32 rounding), near 0 and 1 snapped; a pixel off the line (another colour),
    one whose means are too close together, or one with too few sure pixels of a kind around it
    keeps the alpha it had."""
    shares = np.array([0.05, 0.3, 0.5, 0.8, 0.95], np.float32)
    pix = [np.float32(FG[c]) * shares + np.float32(BG[c]) * (1 - shares) for c in range(3)]
    before = np.full(shares.shape, 0.9, np.float32)
    got = colour_line_alpha(np, pix, _line_means(FG, BG, shares.size), before, 60.0, 0.2, 0.1)
    assert np.allclose(got, [0.0, 0.3, 0.5, 0.8, 1.0], atol=1e-4), got
    off = [np.full(1, np.float32(v)) for v in (200.0, 40.0, 40.0)]  # red: not blue, not cream
    assert colour_line_alpha(np, off, _line_means(FG, BG, 1), before[:1], 60.0, 0.2, 0.1)[0] == np.float32(0.9)
    mid = [p[2:3] for p in pix]
    near = BG - np.array([20.0, 20.0, 20.0])  # means 35 levels apart: under min_sep
    assert colour_line_alpha(np, mid, _line_means(near, BG, 1), before[:1], 60.0, 0.2, 0.1)[0] == np.float32(0.9)
    lone = _line_means(FG, BG, 1, wb=0.01)  # hardly any sure backdrop in the window
    assert colour_line_alpha(np, mid, lone, before[:1], 60.0, 0.2, 0.1)[0] == np.float32(0.9)


def test_the_colour_line_planes_sample_the_sure_pixels() -> None:
    """The planes sample every s-th pixel: whether it is a sure subject pixel (hard outside
    unknown) and its colour there, then the same for the sure backdrop."""
    image, truth = soft_disc()
    hard = truth >= 0.5
    unknown = np.abs(truth - 0.5) < 0.45
    planes = colour_line_planes(np, image, hard, unknown, 2)
    assert len(planes) == 8 and planes[0].shape == (120, 160)
    inner, outer = (60, 80), (2, 2)  # the disc's centre, the frame's corner (shrunk by 2)
    assert planes[0][inner] == 1 and planes[4][inner] == 0 and planes[0][outer] == 0 and planes[4][outer] == 1
    assert np.allclose([planes[1 + c][inner] for c in range(3)], FG, atol=1)
    assert np.allclose([planes[5 + c][outer] for c in range(3)], BG, atol=1)


def test_decontamination_brings_edge_pixels_back_to_the_subject_s_colour() -> None:
    """Half-covered pixels (alpha 0.25..0.75) are a mix with the cream backdrop; after
    decontamination their colour is within 25 levels (mean, per channel) of the subject's and at
    most a third of the raw pixels' distance (over 90 away); fully covered and uncovered pixels
    are unchanged."""
    image, truth = soft_disc()
    alpha8 = np.rint(truth * 255).astype(np.uint8)
    out = decontaminate(np, image, alpha8)
    edge = (truth > 0.25) & (truth < 0.75)
    raw = np.abs(image[edge].astype(np.float64) - FG).mean(axis=0)
    fixed = np.abs(out[edge].astype(np.float64) - FG).mean(axis=0)
    assert raw.max() > 90 and fixed.max() <= 25 and fixed.max() <= raw.max() / 3, (raw, fixed)
    solid = (alpha8 == 0) | (alpha8 == 255)
    assert np.array_equal(out[solid], image[solid])


def test_foreground_colour_is_the_pixel_where_fully_covered() -> None:
    image, truth = soft_disc()
    inner = truth >= 0.999
    f = foreground_colour(np, image, truth, (24, 3), inner)
    assert f.shape == (int(inner.sum()), 3)
    assert np.abs(f - image[inner]).max() <= 0.5


def test_decontaminate_leaves_a_hard_mask_alone_and_checks_settings() -> None:
    image, truth = soft_disc()
    hard = np.where(truth >= 0.5, 255, 0).astype(np.uint8)
    assert decontaminate(np, image, hard) is image
    with pytest.raises(ValueError):
        MattingConfig(eps=0)


def test_matting_gpu_matches_cpu() -> None:
    from tests.gpu import cupy_or_skip

    cp = cupy_or_skip()
    image, truth = soft_disc()
    hard = truth >= 0.5
    unknown = (cv2.dilate(hard.astype(np.uint8), np.ones((9, 9), np.uint8)) > 0) & ~(
        cv2.erode(hard.astype(np.uint8), np.ones((9, 9), np.uint8)) > 0)
    cpu = matte_band(np, image, hard, unknown, 4, 1e-3)
    gpu = cp.asnumpy(matte_band(cp, cp.asarray(image), cp.asarray(hard), cp.asarray(unknown), 4, 1e-3))
    assert np.abs(cpu - gpu).max() <= 2e-3
    alpha8 = np.rint(truth * 255).astype(np.uint8)
    d_cpu = decontaminate(np, image, alpha8)
    d_gpu = cp.asnumpy(decontaminate(cp, cp.asarray(image), cp.asarray(alpha8)))
    assert np.abs(d_cpu.astype(np.int16) - d_gpu).max() <= 1


def test_box_means_at_points_equal_the_whole_frame_filter() -> None:
    """The tiled read of box means (only the squares holding a point are filtered) gives the
    values of the whole-frame filter at those points, at the frame's borders too."""
    rng = np.random.default_rng(3)
    planes = [rng.random((700, 530), dtype=np.float32), rng.random((700, 530, 3), dtype=np.float32) * 255]
    ys = np.concatenate([rng.integers(0, 700, 400), [0, 699, 0, 699]])
    xs = np.concatenate([rng.integers(0, 530, 400), [0, 0, 529, 529]])
    for radius in (1, 6, 40):
        got = box_means_at(np, planes, radius, ys, xs)
        for p, g in zip(planes, got, strict=True):
            want = box_blur(np, p, radius)[ys, xs]
            assert g.shape == want.shape
            assert np.abs(g - want).max() <= 1e-3 * max(1.0, float(p.max()))


def test_decontamination_of_a_small_subject_in_a_large_frame_matches_the_untiled_path(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A soft disc in a 1200x1500 frame (box means read on the edge's tiles only) is
    decontaminated as with the means filtered over the whole box, within one level."""
    import gpu_kernels.retouch.matting as matting

    image, truth = soft_disc()
    big = np.full((1200, 1500, 3), BG.astype(np.uint8), np.uint8)
    big_a = np.zeros((1200, 1500), np.uint8)
    big[500:740, 600:920] = image
    big_a[500:740, 600:920] = np.rint(truth * 255).astype(np.uint8)
    got = decontaminate(np, big, big_a)
    whole = matting.box_means_at
    monkeypatch.setattr(matting, "box_means_at", lambda xp, planes, r, ys, xs, shape=None: whole(
        xp, planes, r, ys, xs, shape=shape, tile=10**6))
    want = decontaminate(np, big, big_a)
    edge = (big_a > 0) & (big_a < 255)
    assert edge.sum() > 500
    assert np.abs(got.astype(np.int16) - want).max() <= 1
    assert not np.array_equal(got[edge], big[edge])  # the edge was rewritten


def test_tiled_erosion_and_the_boxed_matte_equal_the_whole_frame() -> None:
    """``erode_near_outline`` is ``ops.erode`` exactly (shapes at the borders, holes, radii
    beyond a tile), and ``matte_alpha`` on a subject in a large frame (matted on its box) is
    byte-identical to the matte computed over the whole frame."""
    from gpu_kernels.segment import MaskPostprocess
    from gpu_kernels.segment.ops import CpuOps
    from gpu_kernels.segment.postprocess import _matte_box, erode_near_outline, matte_alpha

    ops = CpuOps()
    rng = np.random.default_rng(5)
    m = np.zeros((900, 1100), np.uint8)
    cv2.circle(m, (700, 400), 250, 1, -1)
    m[:6, :300] = 1
    m[rng.random(m.shape) < 2e-4] ^= 1
    for mask in (m.astype(bool), ~m.astype(bool)):
        for radius in (1, 7, 33, 140):
            assert np.array_equal(erode_near_outline(mask, radius, ops), ops.erode(mask, radius))
    image, truth = soft_disc()
    frame = np.full((1000, 1300, 3), BG.astype(np.uint8), np.uint8)
    prob = np.zeros((1000, 1300), np.float32)
    frame[400:640, 500:820] = image
    prob[400:640, 500:820] = truth
    hard = prob >= 0.5
    cfg = MaskPostprocess()
    band = max(2, round(cfg.matte_band * float(np.hypot(1000, 1300))))
    boxed = matte_alpha(prob, hard, frame, cfg, ops)
    assert np.array_equal(boxed, _matte_box(prob, hard, frame, band, cfg, ops))
    assert ((boxed > 0) & (boxed < 255)).sum() > 100  # a real soft edge was matted


def test_the_refinement_s_colour_line_brings_a_soft_rim_nearer_its_coverage() -> None:
    """A subject with a soft rim and a model map blurred wider than it: over the rim the alpha's
    mean error against the true coverage is under 0.8 of the guided filter's alone (0.070
    against 0.097 when written), and the outline (alpha >= 128) is the same but for a few pixels."""
    from gpu_kernels.segment import MaskPostprocess, alpha_from_probability
    from gpu_kernels.segment.ops import CpuOps

    image, truth = soft_disc(blur=1.5)
    prob = np.asarray(cv2.GaussianBlur((truth >= 0.5).astype(np.float32), (0, 0), 3.0), np.float32)
    on = alpha_from_probability(prob, MaskPostprocess(), CpuOps(), image).astype(np.float32) / 255
    off = alpha_from_probability(prob, MaskPostprocess(matte_colour=False), CpuOps(), image).astype(np.float32) / 255
    rim = ((truth > 0.02) & (truth < 0.98)) | ((on > 0) & (on < 1)) | ((off > 0) & (off < 1))
    err_on, err_off = np.abs(on - truth)[rim].mean(), np.abs(off - truth)[rim].mean()
    assert err_on < 0.8 * err_off, (err_on, err_off)
    assert int(((on >= 0.5) != (off >= 0.5)).sum()) <= 0.01 * int((off >= 0.5).sum())


def test_the_colour_line_leaves_a_hard_edge_s_jpeg_ringing_outside_the_mask_alone() -> None:
    """A sharp-edged product, JPEG-compressed: outside the hard mask, where the model gives less
    than ``matte_colour_outside``, the alpha is what the refinement without the colour line
    gives (no halo of ringing made opaque)."""
    from gpu_kernels.segment import MaskPostprocess, alpha_from_probability
    from gpu_kernels.segment.ops import CpuOps

    image, truth = soft_disc(blur=0.6)
    ok, jpeg = cv2.imencode(".jpg", image[..., ::-1], [cv2.IMWRITE_JPEG_QUALITY, 70])
    assert ok
    image = np.ascontiguousarray(cv2.imdecode(jpeg, cv2.IMREAD_COLOR)[..., ::-1])
    prob = np.asarray(cv2.GaussianBlur((truth >= 0.5).astype(np.float32), (0, 0), 2.0), np.float32)
    on = alpha_from_probability(prob, MaskPostprocess(), CpuOps(), image)
    off = alpha_from_probability(prob, MaskPostprocess(matte_colour=False), CpuOps(), image)
    low = prob < MaskPostprocess().matte_colour_outside
    assert np.array_equal(on[low], off[low])
    assert not np.array_equal(on, off)  # the rule ran: inside the outline it moved some pixels
