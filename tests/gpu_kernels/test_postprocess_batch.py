"""The device refinement of a batch (``alpha_batch``: images of one size as one stack, the rare
rules checked by flags, the flagged images refined on their own) against the per-image
refinement, over NumPy: the same alpha, bit for bit, for every image of a mixed batch."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import scipy.ndimage as ndi

from gpu_kernels.segment.ops import CpuOps, XpOps
from gpu_kernels.segment.postprocess import MaskPostprocess, alpha_from_probability
from gpu_kernels.segment.postprocess_batch import alpha_batch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.gpu.host_work import TALLY, _AsCupyx, _wrap, counted_modules, synth


def _batch(size: int) -> list[tuple[np.ndarray, np.ndarray | None]]:
    """Plain photos of three sizes, and one each that a rule changes: an island far from the
    subject, an enclosed hole, a backdrop-coloured unsure slab; one with no subject; a grey one;
    one without an image; one with a speck island and a speck hole."""
    photos = [synth(k, size) for k in range(5)]
    out: list[tuple[np.ndarray, np.ndarray | None]] = [(p, i) for i, p in photos]
    img, prob = synth(6, size)
    island = prob.copy()
    island[4:4 + size // 12, 4:4 + size // 12] = 1.0
    out.append((island, img))
    img, prob = synth(7, size)
    holed = prob.copy()
    h, w = holed.shape
    holed[h // 2 - size // 20:h // 2 + size // 20, w // 2 - size // 20:w // 2 + size // 20] = 0.0
    out.append((holed, img))
    img, prob = synth(8, size)
    slab = prob.copy()
    slab[h // 2 - size // 8:h // 2 + size // 8, :] = np.maximum(slab[h // 2 - size // 8:h // 2 + size // 8, :], 0.6)
    out.append((slab, img))
    out.append((np.zeros_like(prob), img))
    out.append((prob.copy(), img[..., :1].copy()))  # one channel: refined on its own
    out.append((prob, None))  # no image
    img, prob = synth(9, size)
    specks = prob.copy()
    h, w = specks.shape
    specks[2:4, 2:4] = 1.0  # an island of 4 px far from the subject: dropped in the stack
    specks[h // 2:h // 2 + 2, w // 2:w // 2 + 2] = 0.0  # a hole of 4 px in it: filled in the stack
    out.append((specks, img))
    return out


def _compare(xp: Any, ops: Any, cases: list[tuple[np.ndarray, np.ndarray | None]],
             cfg: MaskPostprocess) -> None:
    probs = [_wrap(p) if xp is not np else p for p, _ in cases]
    images = [None if i is None else (_wrap(i) if xp is not np else i) for _, i in cases]
    want = [alpha_from_probability(p, cfg, ops, i) for p, i in zip(probs, images, strict=True)]
    got = alpha_batch(probs, images, cfg, ops)
    assert len(got) == len(want)
    for k, (a, b) in enumerate(zip(want, got, strict=True)):
        a, b = np.asarray(a).view(np.ndarray), np.asarray(b).view(np.ndarray)
        assert a.shape == b.shape and a.dtype == b.dtype == np.uint8, k
        assert np.array_equal(a, b), (k, int((a != b).sum()), int(np.abs(a.astype(int) - b).max()))


@pytest.mark.parametrize("size", [160, 420])
def test_the_batched_refinement_equals_the_per_image_one_on_the_device_branch(size: int) -> None:
    xp, cndi = counted_modules()  # CuPy's calls, over NumPy (cupyx.scipy.ndimage as scipy's)
    with _AsCupyx(cndi):
        _compare(xp, XpOps(xp, cndi, "gpu"), _batch(size), MaskPostprocess())


def test_the_batched_refinement_equals_the_per_image_one_over_plain_numpy() -> None:
    _compare(np, XpOps(np, ndi, "gpu"), _batch(240), MaskPostprocess())


def test_settings_that_switch_rules_off_or_feather_without_the_matte() -> None:
    xp, cndi = counted_modules()
    with _AsCupyx(cndi):
        ops = XpOps(xp, cndi, "gpu")
        cases = _batch(160)
        for cfg in (MaskPostprocess(guide_sigma=0.0, backdrop_delta_e=0.0),
                    MaskPostprocess(min_component=0.0, clutter_delta_e=0.0, speck_hole=0.0, max_hole=0.0),
                    MaskPostprocess(matte=False)):
            _compare(xp, ops, cases, cfg)


def test_plain_photos_cost_three_host_reads_whatever_the_batch() -> None:
    """The two labellings' counts and the flags: per batch, not per image; no image refined again."""
    xp, cndi = counted_modules()
    with _AsCupyx(cndi):
        ops = XpOps(xp, cndi, "gpu")
        photos = [synth(k, 200) for k in range(3)]
        seen = []
        for n in (3, 3, 9):  # the first fills the device caches (resampling matrices, disks)
            probs = [_wrap(photos[k % 3][1]) for k in range(n)]
            images = [_wrap(photos[k % 3][0]) for k in range(n)]
            TALLY.__init__()  # type: ignore[misc]
            alpha_batch(probs, images, MaskPostprocess(), ops)
            seen.append((TALLY.syncs, TALLY.calls, dict(TALLY.sync_names)))
        assert seen[1][0] == seen[2][0] == 3, seen
        assert seen[1][1] == seen[2][1], seen  # three sizes: three stacks, whatever their depth


def test_a_cpu_backend_refines_one_by_one() -> None:
    cases = _batch(160)[:6]
    cfg, ops = MaskPostprocess(), CpuOps()
    got = alpha_batch([p for p, _ in cases], [i for _, i in cases], cfg, ops)
    for (p, i), a in zip(cases, got, strict=True):
        assert np.array_equal(a, alpha_from_probability(p, cfg, ops, i))


def _refined_alone(cases: list[tuple[np.ndarray, np.ndarray | None]], monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The indices of ``cases`` that :func:`alpha_batch` refines on their own, sorted."""
    import gpu_kernels.segment.postprocess_batch as batch

    alone: list[int] = []
    ids = {id(p): k for k, (p, _) in enumerate(cases)}

    def one(prob: Any, cfg: MaskPostprocess, ops: Any, image: Any) -> Any:
        alone.append(ids[id(prob)])
        return alpha_from_probability(prob, cfg, ops, image)

    with monkeypatch.context() as patched:
        patched.setattr(batch, "alpha_from_probability", one)
        alpha_batch([p for p, _ in cases], [i for _, i in cases], MaskPostprocess(), XpOps(np, ndi, "gpu"))
    return sorted(alone)


def test_only_the_images_a_rule_changes_are_refined_again(monkeypatch: pytest.MonkeyPatch) -> None:
    alone = _refined_alone(_batch(160), monkeypatch)
    # the grey photo and the one without an image alone from the start; then the island, the
    # hole and the slab (flagged); the plain photos, the empty one and the specks (dropped and
    # filled in the stack) stay in their stacks
    assert alone == [5, 6, 7, 9, 10], alone


def test_a_size_with_more_images_than_a_stack_holds_makes_several(monkeypatch: pytest.MonkeyPatch) -> None:
    import gpu_kernels.segment.postprocess_batch as batch

    monkeypatch.setattr(batch, "STACK_PIXELS", 2 * 160 * 160)  # two of the square photos a stack
    photos = [synth(3 * k, 160) for k in range(3)] + [synth(1, 160)]
    _compare(np, XpOps(np, ndi, "gpu"), [(p, i) for i, p in photos] + _batch(160)[5:8], MaskPostprocess())


def test_real_photos_with_the_model_batched_equal_one_by_one(u2netp: Any) -> None:
    """scikit-image's photos with u2netp's probabilities: specks, holes, backdrop regions and two
    of one size (astronaut and the tissue sample); some flagged, some refined in their stack."""
    import skimage.data

    from gpu_kernels.segment.onnx_runner import OnnxSegmenter

    names = ["astronaut", "immunohistochemistry", "coffee", "chelsea", "rocket"]
    images = [np.ascontiguousarray(getattr(skimage.data, n)()[..., :3]) for n in names]
    ops = XpOps(np, ndi, "gpu")
    masks = OnnxSegmenter(u2netp.original).infer_batch(images)
    probs = [ops.resize_map(m.prob, *im.shape[:2]) for m, im in zip(masks, images, strict=True)]  # type: ignore[union-attr]
    _compare(np, ops, list(zip(probs, images, strict=True)), MaskPostprocess())


def test_a_part_to_grow_into_is_flagged_and_refined_on_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """A wheel whose lower half the model half sees (the grow rule adds it) is sent to the
    per-image refinement; the plain photos beside it stay in their stack; the values equal."""
    from tests.gpu_kernels.test_subject_selection import toy

    image, prob, _ = toy()
    cases: list[tuple[np.ndarray, np.ndarray | None]] = [(p, i) for i, p in (synth(k, 300) for k in range(3))]
    cases += [(prob, image), (prob.copy(), image.copy())]
    assert _refined_alone(cases, monkeypatch) == [3, 4]
    _compare(np, XpOps(np, ndi, "gpu"), cases, MaskPostprocess())


def test_a_bay_at_the_frame_is_flagged_and_refined_on_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """A subject cut by the frame with bays open to its side (one the model sees at 0.2, too
    little for the grow rule, enough for a bay) is sent to the per-image refinement; plain photos
    beside it stay in their stack; the values equal."""
    from tests.gpu_kernels.test_segment import _bay_scene

    image, prob = _bay_scene(seen=0.2)
    _alone_among_plain_photos(prob, image, monkeypatch)


def _alone_among_plain_photos(prob: np.ndarray, image: np.ndarray, monkeypatch: pytest.MonkeyPatch) -> None:
    """``prob`` and ``image`` batched after two plain photos: that image alone is refined on its
    own, and every value equals the per-image refinement, over NumPy and on the device branch."""
    cases: list[tuple[np.ndarray, np.ndarray | None]] = [(p, i) for i, p in (synth(k, 300) for k in range(2))]
    cases += [(prob, image)]
    assert _refined_alone(cases, monkeypatch) == [2]
    _compare(np, XpOps(np, ndi, "gpu"), cases, MaskPostprocess())
    xp, cndi = counted_modules()
    with _AsCupyx(cndi):
        _compare(xp, XpOps(xp, cndi, "gpu"), cases, MaskPostprocess())


def test_a_hole_the_model_wavered_in_is_refined_on_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """A backdrop-pale hole the model never calls background (filled by the per-image rule) is
    sent to the per-image refinement; the plain photos beside it stay in their stack; the values
    equal, over NumPy and on the device branch."""
    from tests.gpu_kernels.test_segment import wavered_scene

    image, prob = wavered_scene(0.42)
    _alone_among_plain_photos(prob, image, monkeypatch)
    alpha = np.asarray(alpha_batch([prob], [image], MaskPostprocess(guide_sigma=0.0), XpOps(np, ndi, "gpu"))[0])
    assert (alpha[135:165, 185:225] >= 128).all()


def test_a_wedge_of_sure_backdrop_between_items_is_refined_on_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """Backdrop between the items of a tray with a wedge of it the model is sure of: the image is
    flagged (the backdrop rule drops the patch, and the wedge with it) and refined on its own;
    the values equal, over NumPy and on the device branch."""
    from tests.gpu_kernels.test_subject_selection import wedged_tray

    image, prob, parts = wedged_tray()
    _alone_among_plain_photos(prob, image, monkeypatch)
    alpha = np.asarray(alpha_batch([prob], [image], MaskPostprocess(), XpOps(np, ndi, "gpu"))[0]) >= 128
    assert alpha[parts["wedge"]].mean() < 0.05
