"""Contact shadow: a soft shadow strictly below the subject; the rest of the background stays 255."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gpu_kernels.backends import RetouchOptions
from gpu_kernels.codec import CpuEncoder, make_decoder
from gpu_kernels.pipeline import ImagePipeline, Job
from gpu_kernels.presets import Preset, load_presets
from gpu_kernels.retouch import CpuRetoucher
from gpu_kernels.segment import make_segmenter
from gpu_kernels.spans import SpanRecorder
from gpu_kernels.stages.shadow import ShadowConfig, canvas_box, contact_shadow


def canvas_with_box(h: int = 400, w: int = 400) -> np.ndarray:
    img = np.full((h, w, 3), 255, np.uint8)
    img[100:300, 120:280] = (90, 30, 30)
    img[150:160, 100:120] = (250, 250, 250)  # a near-white handle sticking out to the left, higher up
    return img


def test_shadow_is_only_below_the_subject_and_darkest_at_contact() -> None:
    img = canvas_with_box()
    out = contact_shadow(img)
    assert out is not img and np.array_equal(img, canvas_with_box())  # input untouched
    changed = (out != img).any(axis=2)
    ys, xs = np.nonzero(changed)
    assert changed.sum() > 500
    assert ys.min() == 300  # the first row below the subject's lowest row (299)
    assert (out[changed] < 255).all()  # only ever darker
    assert np.array_equal(out[:300], img[:300])  # nothing at or above the subject's base changes
    # beside and below the shadow, the background is exactly 255
    background = (img == 255).all(axis=2) & ~changed
    assert (out[background] == 255).all()
    # the shadow stays under the footprint (columns 120..279), softened by a few sigma only
    assert xs.min() >= 100 and xs.max() < 300
    col = out[300:, 200, 0].astype(int)
    assert col[0] == out[300, :, 0].min() and (np.diff(col) >= 0).all()  # darkest at contact, fading down
    assert col[0] <= 200 and col[-1] == 255


def test_no_room_empty_canvas_and_rgba_come_back_unchanged() -> None:
    flush = np.full((50, 50, 3), 255, np.uint8)
    flush[10:50, 10:40] = 0  # subject on the bottom edge
    assert np.array_equal(contact_shadow(flush), flush)
    empty = np.full((20, 20, 3), 255, np.uint8)
    assert np.array_equal(contact_shadow(empty), empty) and canvas_box(empty) is None
    rgba = np.zeros((20, 20, 4), np.uint8)
    assert contact_shadow(rgba) is rgba


def test_a_deeper_shadow_reaches_further_but_never_past_the_canvas() -> None:
    img = canvas_with_box(320, 400)  # 20 rows of room
    out = contact_shadow(img, ShadowConfig(depth=0.5))
    ys = np.nonzero((out != img).any(axis=2))[0]
    assert ys.min() == 300 and ys.max() <= 319


def test_preset_shadow_option_is_validated() -> None:
    assert load_presets()["catalog_shadow"].shadow == "contact"
    assert load_presets()["amazon_main"].shadow == "none"
    with pytest.raises(ValueError, match="none or contact"):
        Preset("p", 10, 10, shadow="drop")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="white background"):
        Preset("p", 10, 10, format="png", background="transparent", shadow="contact")


def test_the_shadow_stage_through_the_pipeline(catalog: list[Path]) -> None:
    """The same image rendered with and without the shadow: only pixels below the product differ."""
    shadowed = load_presets()["catalog_shadow"]
    plain = Preset("plain", shadowed.width, shadowed.height, fill=shadowed.fill, quality=shadowed.quality)
    pipe = ImagePipeline(make_decoder("cpu"), CpuRetoucher(), CpuEncoder(), None, make_segmenter("classical"))
    jobs = [Job(f.read_bytes(), [shadowed, plain], RetouchOptions(), SpanRecorder()) for f in catalog[:3]]
    ctx = pipe.start(jobs)
    for lane in ("decode", "device", "output"):  # render and shadow run in the output lane on the CPU
        pipe.run_lane(ctx, lane)  # type: ignore[arg-type]
    for i, job in enumerate(jobs):
        a, b = ctx.rendered[i, shadowed.name], ctx.rendered[i, plain.name]
        box = canvas_box(b)
        assert box is not None
        changed = (a != b).any(axis=2)
        assert changed.any(), f"item {i}: no shadow drawn"
        assert np.nonzero(changed)[0].min() == box[3]  # strictly below the subject's lowest row
        assert (b[changed] == 255).all() and (a[changed] < 255).all()  # on background, darker
        assert ((a == 255).all(axis=2) | ~(b == 255).all(axis=2) | changed).all()  # other background stays 255
        (span,) = [s for s in job.spans.spans if s.stage == "shadow:catalog_shadow"]
        assert span.batch_size == 3
        assert not any(s.stage == "shadow:plain" for s in job.spans.spans)
    assert all(r.ok and [v.preset for v in r.variants] == ["catalog_shadow", "plain"] for r in ctx.finalize())


def test_canvas_box_matches_the_any_channel_definition() -> None:
    """The fast RGB path (row then column minima) finds the same box as 'any channel below 255'."""
    from gpu_kernels.stages.shadow import canvas_box

    rng = np.random.default_rng(7)
    for _ in range(300):
        h, w = (int(v) for v in rng.integers(1, 40, 2))
        img = np.full((h, w, 3), 255, np.uint8)
        for _ in range(int(rng.integers(0, 5))):
            img[rng.integers(0, h), rng.integers(0, w), rng.integers(0, 3)] = rng.integers(0, 255)
        subject = (img != 255).any(axis=2)
        rows, cols = np.flatnonzero(subject.any(axis=1)), np.flatnonzero(subject.any(axis=0))
        want = None if rows.size == 0 else (int(cols[0]), int(rows[0]), int(cols[-1]) + 1, int(rows[-1]) + 1)
        assert canvas_box(img) == want
