"""The device-shaped decontamination against its CPU twin, on NumPy: the same bytes (edge
pixels replaced by the same colours, the rest untouched)."""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from gpu_kernels.retouch.matting import decontaminate
from gpu_kernels.retouch.matting_device import decontaminate_device, edge_box, edge_boxes


def _photo(h: int, w: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    img = np.empty((h, w, 3), np.uint8)
    img[:] = (40, 160, 230)  # a coloured backdrop that bleeds into the edge
    mask = np.zeros((h, w), np.uint8)
    cv2.ellipse(mask, (w // 2, h // 2), (w // 4, h // 3), 20.0, 0, 360, 255, -1)
    tex = cv2.resize(rng.integers(0, 256, (5, 5, 3), dtype=np.uint8), (w, h), interpolation=cv2.INTER_CUBIC)
    soft = cv2.GaussianBlur(mask.astype(np.float32), (0, 0), 2.0) / 255.0
    mixed = tex * soft[..., None] + img * (1 - soft[..., None])
    alpha = np.clip(np.rint(soft * 255), 0, 255).astype(np.uint8)
    return np.clip(np.rint(mixed), 0, 255).astype(np.uint8), alpha


@pytest.mark.parametrize(("h", "w", "seed"), [(120, 160, 1), (300, 220, 2), (700, 900, 3)])
def test_device_decontamination_matches_the_cpu_twin(h: int, w: int, seed: int) -> None:
    pixels, alpha = _photo(h, w, seed)
    want = decontaminate(np, pixels, alpha)
    got = decontaminate_device(np, pixels, alpha)
    edge = (alpha > 0) & (alpha < 255)
    assert np.array_equal(got[~edge], pixels[~edge])  # only edge pixels change, as in the twin
    assert np.array_equal(got, want), int(np.abs(got.astype(np.int16) - want).max())  # bit-identical


def test_no_edge_no_change_and_boxes_read_together() -> None:
    pixels, alpha = _photo(80, 90, 4)
    flat = np.where(alpha > 127, 255, 0).astype(np.uint8)
    assert edge_box(np, flat) is None
    assert decontaminate_device(np, pixels, flat) is pixels
    boxes = edge_boxes(np, [alpha, flat])
    rows, cols = np.nonzero(((alpha > 0) & (alpha < 255)).any(axis=1))[0], np.nonzero(
        ((alpha > 0) & (alpha < 255)).any(axis=0))[0]
    assert boxes == [(int(rows[0]), int(rows[-1]), int(cols[0]), int(cols[-1])), None]


def test_a_batch_decontaminated_as_stacks_equals_each_image_on_its_own() -> None:
    """Mixed sizes, subjects in different places (each crop its own sampling grid and borders),
    one without an edge, one without a mask: the CPU twin's bytes for every image."""
    import scipy.ndimage as ndi

    from gpu_kernels.retouch.matting_device import decontaminate_batch

    cases = [_photo(120, 160, 1), _photo(300, 220, 2), _photo(700, 900, 3), _photo(300, 220, 5)]
    pixels, alpha = _photo(300, 220, 7)
    cases.append((np.roll(pixels, (100, 60), (0, 1)), np.roll(alpha, (100, 60), (0, 1))))  # near a corner
    cases.append((pixels, np.where(alpha > 127, 255, 0).astype(np.uint8)))  # no edge
    got = decontaminate_batch(np, [p for p, _ in cases] + [pixels], [a for _, a in cases] + [None], ndi=ndi)
    for k, ((p, a), g) in enumerate(zip(cases, got, strict=False)):
        assert np.array_equal(g, decontaminate(np, p, a)), k
    assert got[-1] is pixels


def test_the_batch_is_one_host_read_and_its_calls_do_not_grow_with_it() -> None:
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from bench.gpu.host_work import TALLY, _AsCupyx, _wrap, counted_modules
    from gpu_kernels.retouch.matting_device import decontaminate_batch

    xp, cndi = counted_modules()
    photos = [_photo(300, 220, k) for k in range(4)]
    seen = []
    with _AsCupyx(cndi):
        for n in (4, 12):
            cases = [photos[k % 4] for k in range(n)]
            TALLY.__init__()  # type: ignore[misc]
            got = decontaminate_batch(xp, [_wrap(p) for p, _ in cases], [_wrap(a) for _, a in cases])
            seen.append((TALLY.syncs, TALLY.calls))
            assert np.array_equal(np.asarray(got[-1]).view(np.ndarray),
                                  decontaminate_device(np, *cases[-1]))
    assert seen[0] == seen[1] and seen[0][0] == 1, seen


def test_more_images_of_one_size_than_a_stack_holds(monkeypatch: pytest.MonkeyPatch) -> None:
    import scipy.ndimage as ndi

    from gpu_kernels.retouch import matting_device

    monkeypatch.setattr(matting_device, "STACK_PIXELS", 2 * 300 * 220)
    cases = [_photo(300, 220, k) for k in range(5)]
    got = matting_device.decontaminate_batch(np, [p for p, _ in cases], [a for _, a in cases], ndi=ndi)
    for (p, a), g in zip(cases, got, strict=True):
        assert np.array_equal(g, decontaminate(np, p, a))
