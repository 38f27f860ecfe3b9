"""Marketplace compliance per variant: measures on the rendered canvas and the preset's verdict."""

from __future__ import annotations

import io
from pathlib import Path

import cv2
import numpy as np
import pytest
from PIL import Image, ImageDraw

from gpu_kernels.backends import RetouchOptions
from gpu_kernels.codec import CpuEncoder, make_decoder
from gpu_kernels.pipeline import ImagePipeline, Job, JobResult
from gpu_kernels.presets import Preset, load_presets
from gpu_kernels.retouch import CpuRetoucher
from gpu_kernels.segment import make_segmenter
from gpu_kernels.spans import SpanRecorder
from gpu_kernels.stages.base import LANES
from gpu_kernels.stages.compliance import border_white_share, measure_compliance, source_cut

AMAZON = load_presets()["amazon_main"]


def product_photo(*, cut: bool = False) -> bytes:
    """A dark red product on a plain light-grey backdrop; ``cut``: it runs off the bottom edge."""
    img = Image.new("RGB", (800, 600), (232, 232, 228))
    box = (250, 200, 550, 700) if cut else (250, 150, 550, 450)
    ImageDraw.Draw(img).ellipse(box, fill=(150, 30, 40))
    buf = io.BytesIO()
    img.save(buf, format="JPEG", quality=95)
    return buf.getvalue()


def run(data: bytes, presets: list[Preset], options: RetouchOptions | None = None) -> JobResult:
    pipe = ImagePipeline(make_decoder("cpu"), CpuRetoucher(), CpuEncoder(), None, make_segmenter("classical"))
    job = Job(data, presets, options or RetouchOptions(), SpanRecorder())
    (res,) = pipe.run_batch([job])
    assert res.ok, res.error
    (span,) = [s for s in job.spans.spans if s.stage == "compliance"]
    assert span.device == "cpu"
    return res


def test_amazon_rules_hold_for_a_clean_product_shot() -> None:
    (v,) = run(product_photo(), [AMAZON]).variants
    c = v.compliance
    assert c is not None
    assert c.white_border == 1.0 and not c.cut_off and c.min_side_ok
    assert abs(c.fill - AMAZON.fill) < 0.01
    assert c.compliant


def test_a_product_cut_by_the_photo_frame_is_not_compliant() -> None:
    res = run(product_photo(cut=True), [AMAZON, load_presets()["jd_main"]])
    amazon, jd = (v.compliance for v in res.variants)
    assert amazon is not None and jd is not None
    assert amazon.cut_off and not amazon.compliant
    assert jd.cut_off and jd.compliant  # jd_main has no cut rule


def test_too_little_fill_and_too_small_sides_are_not_compliant() -> None:
    low = Preset("low_fill", 1000, 1000, fill=0.6, min_fill=0.85)
    small = Preset("small", 500, 500, fill=0.85, min_side=1000)
    a, b = (v.compliance for v in run(product_photo(), [low, small]).variants)
    assert a is not None and abs(a.fill - 0.6) < 0.01 and a.min_side_ok and not a.compliant
    assert b is not None and not b.min_side_ok and b.fill >= 0.845 and not b.compliant


def test_a_kept_backdrop_on_the_border_is_not_pure_white() -> None:
    """background=keep with the photo filling the canvas width: its grey backdrop is on the border."""
    edge_to_edge = Preset("edge_to_edge", 1000, 1000, fill=1.0, pure_white=True)
    (v,) = run(product_photo(), [edge_to_edge], RetouchOptions(background="keep")).variants
    c = v.compliance
    assert c is not None and 0.5 < c.white_border < 0.75 and not c.compliant  # white pad above/below only


def test_measures_on_synthetic_canvases() -> None:
    canvas = np.full((100, 200, 3), 255, np.uint8)
    canvas[10:90, 50:150] = 40
    rule = Preset("r", 200, 100, fill=0.8, min_fill=0.8, pure_white=True, allow_cut=False, min_side=100)
    c = measure_compliance(canvas, rule)
    assert (c.white_border, c.fill, c.cut_off, c.min_side_ok, c.compliant) == (1.0, 0.8, False, True, True)
    canvas[0, 0] = (255, 255, 254)  # one border pixel off pure white
    c = measure_compliance(canvas, rule)
    assert c.white_border == pytest.approx(1 - 1 / (2 * 200 + 2 * 98)) and not c.compliant
    canvas[0, 0] = 255
    canvas[10:100, 50:150] = 40  # touches the bottom edge
    c = measure_compliance(canvas, rule)
    assert c.cut_off and not c.compliant
    # the box measured before a shadow is what counts
    assert measure_compliance(canvas, rule, box=(50, 10, 150, 90)).fill == pytest.approx(0.8)
    # RGBA: transparent border is clean background
    rgba = np.zeros((10, 10, 4), np.uint8)
    assert border_white_share(rgba) == 1.0
    mask = np.zeros((50, 50), np.uint8)
    assert not source_cut(mask) and not source_cut(None)
    mask[49, 10:30] = 255
    assert source_cut(mask)


def test_every_processed_event_carries_compliance_per_variant(catalog: list[Path], tmp_path: Path) -> None:
    from agents.process import Prepared
    from agents.wiring import build_processor
    from schemas.codec import AvroCodec, load_schema
    from schemas.events import EventCodecs
    from streams.producer import ImageProducer
    from streams.settings import Settings
    from tests.agents.test_process import record

    proc = build_processor(Settings(device="cpu", segmenter="classical", data_dir=tmp_path))
    ev = ImageProducer.event({"data": product_photo()}, sku="S", image_id="i", presets=["amazon_main", "thumb_webp"])
    p = proc.prepare(record(EventCodecs.create().product.encode(ev)))
    assert isinstance(p, Prepared)
    (out,) = proc.run([p])
    codecs = EventCodecs.create()
    got = codecs.processed.decode(out.value)
    assert codecs.processed.writer_id == 5
    amazon, thumb = got["variants"]
    assert amazon["compliance"]["compliant"] is True and amazon["compliance"]["white_border"] == 1.0
    assert thumb["compliance"] is not None and set(thumb["compliance"]) == {
        "white_border", "fill", "cut_off", "min_side_ok", "compliant"}
    # a v1 consumer still reads the v2 event (the new field is skipped)
    v1 = AvroCodec(codecs.store, "ProcessedImageEvent", reader_schema=load_schema("processed_image_event.v1"))
    assert "compliance" not in v1.decode(out.value)["variants"][0]


# -- what shows is what is placed and checked: faint alpha, cut-outs, the frame --------

def encode(img: np.ndarray, fmt: str = "PNG") -> bytes:
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, format=fmt, **({"quality": 92} if fmt == "JPEG" else {}))
    return buf.getvalue()


def cutout(*, shadow: bool = False, specks: bool = False, off_right: bool = False,
           faint_edge: bool = False) -> np.ndarray:
    """An RGBA product cut-out as sellers upload them: a red bottle, transparent around it.
    ``shadow``: a soft drop shadow under it, alpha <= 100 and fading to 0 well inside the frame,
    wider than the product; ``specks``: stray alpha-2 dust all over the transparent area (left by
    a cut-out tool); ``off_right``: the product runs off the right edge; ``faint_edge``: only
    its feathered rim (alpha 60) reaches the right edge."""
    h, w = 1000, 1200
    rgba = np.zeros((h, w, 4), np.uint8)
    yy, xx = np.mgrid[:h, :w]
    cx = {off_right: 1100, faint_edge: w - 203}.get(True, 600)
    body = ((xx - cx) / 200.0) ** 2 + ((yy - 420) / 300.0) ** 2 <= 1
    if shadow:
        floor = np.zeros((h, w), np.float32)
        cv2.ellipse(floor, (600, 730), (300, 30), 0, 0, 360, 1.0, -1)
        soft = np.asarray(cv2.GaussianBlur(floor, (0, 0), 25), np.float32)
        rgba[..., 3] = np.rint(100 * soft / soft.max()).astype(np.uint8)
    if specks:
        dust = (np.random.default_rng(0).random((h, w)) < 0.001) & ~body
        rgba[dust] = (0, 0, 0, 2)
    rgba[body] = (150, 30, 40, 255)
    if faint_edge:  # the body ends 2 px before the frame; a 3 px rim of alpha 60 reaches it
        rim = cv2.dilate(body.astype(np.uint8), np.ones((7, 7), np.uint8)).astype(bool) & ~body
        rgba[rim] = (150, 30, 40, 60)
    return rgba


def run_with(data: bytes, presets: list[Preset], kind: str) -> tuple[JobResult, np.ndarray | None]:
    """The pipeline with one segmenter; also the mask the compliance stage saw."""
    seg = make_segmenter("model" if kind == "model" else "classical")
    pipe = ImagePipeline(make_decoder("cpu"), CpuRetoucher(), CpuEncoder(), seg if kind == "model" else None,
                           seg if kind == "classical" else None)
    job = Job(data, presets, RetouchOptions(), SpanRecorder())
    ctx = pipe.start([job])
    for lane in LANES:
        pipe.run_lane(ctx, lane)
    (res,) = ctx.finalize()
    assert res.ok, res.error
    mask = ctx.masks.get(0)
    return res, None if mask is None else np.asarray(mask)


@pytest.fixture(params=["classical", "model"])
def kind(request: pytest.FixtureRequest) -> str:
    if request.param == "model":
        request.getfixturevalue("u2netp")  # skips when the model cannot be fetched
    return str(request.param)


def test_a_realistic_product_shot_is_compliant_for_amazon(kind: str) -> None:
    """A white box with a cast shadow and a printed photo beside it on wood grain (JPEG), fully
    inside the frame: pure white border, fill at the preset's 0.85, not cut, compliant."""
    from gpu_kernels.retouch.scenes import make_scene

    res, _ = run_with(encode(make_scene("wood").image, "JPEG"), [AMAZON], kind)
    c = res.variants[0].compliance
    assert c is not None
    assert c.white_border == 1.0 and not c.cut_off and c.min_side_ok
    assert AMAZON.fill - 0.005 <= c.fill <= AMAZON.fill + 0.02
    assert c.compliant


def test_a_cut_out_with_a_soft_drop_shadow_is_placed_whole_and_compliant(kind: str) -> None:
    """The shadow's alpha (<= 100) shows on the canvas, so it belongs to the subject box: it is
    placed inside the canvas, not cropped by its edge. (With the box at alpha >= 128 the shadow
    ran off the canvas' bottom: white border 0.65, fill 1.0, cut off.)"""
    rgba = cutout(shadow=True)
    res, mask = run_with(encode(rgba), [AMAZON], kind)
    assert mask is not None and np.array_equal(mask, rgba[..., 3])  # a cut-out's alpha is kept as is
    c = res.variants[0].compliance
    assert c is not None and c.white_border == 1.0 and not c.cut_off and c.compliant
    assert AMAZON.fill - 0.005 <= c.fill <= AMAZON.fill + 0.02
    canvas = np.asarray(Image.open(io.BytesIO(res.variants[0].data)).convert("RGB")).astype(np.int32)
    red = np.flatnonzero((canvas[..., 0] - canvas[..., 1] > 60).any(axis=1))
    grey = np.flatnonzero((canvas.max(axis=2) < 245).any(axis=1))
    assert grey[-1] > red[-1] + 0.03 * AMAZON.height  # the shadow shows below the bottle ...
    assert grey[-1] < AMAZON.height - 0.05 * AMAZON.height  # ... and ends inside the canvas


def test_stray_specks_of_a_cut_out_are_dropped_not_placed(kind: str) -> None:
    """Alpha-2 dust over the transparent area would show (254 on white) and stretch the subject
    box to the whole photo; mask clean-up zeroes it and leaves the product's alpha untouched."""
    rgba = cutout(specks=True)
    res, mask = run_with(encode(rgba), [AMAZON], kind)
    assert mask is not None
    product = rgba[..., 3] == 255
    touching = cv2.dilate(product.astype(np.uint8), np.ones((3, 3), np.uint8)).astype(bool)
    assert np.array_equal(mask[touching], rgba[..., 3][touching])  # dust on the product's edge is its edge
    assert int((rgba[..., 3] > 0)[~touching].sum()) > 500 and int(mask[~touching].max()) == 0
    c = res.variants[0].compliance
    assert c is not None and c.white_border == 1.0 and not c.cut_off and c.compliant


@pytest.mark.parametrize("how", ["off_right", "faint_edge"])
def test_a_cut_out_that_touches_the_frame_is_flagged(how: str) -> None:
    """A product running off the photo's edge is cut, and so is one whose visible (faint) rim
    lies along it: what shows and is cut by the frame counts, whatever its alpha."""
    res, _ = run_with(encode(cutout(**{how: True})), [AMAZON, load_presets()["jd_main"]], "classical")
    amazon, jd = (v.compliance for v in res.variants)
    assert amazon is not None and jd is not None
    assert amazon.cut_off and not amazon.compliant
    assert jd.cut_off and jd.compliant


def test_the_subject_box_holds_every_pixel_that_shows() -> None:
    from gpu_kernels.retouch.geometry import VISIBLE_ALPHA, GeometryConfig, subject_box

    alpha = np.zeros((100, 200), np.uint8)
    alpha[40:60, 80:120] = 255
    alpha[10, 100:105] = 30       # a thin, faint part (a cable, a whisker) above the body
    alpha[50, 150] = 1
    assert GeometryConfig().mask_threshold == VISIBLE_ALPHA == 1
    assert subject_box(np, alpha, 100, 200, GeometryConfig().mask_threshold).tolist() == [80, 10, 151, 60]


def test_the_canvas_is_exactly_255_wherever_no_alpha_reaches() -> None:
    """amazon_main from a real photo with a soft-edged mask: every canvas pixel whose resampling
    taps (and the 3x3 sharpening neighbourhood) read no source pixel with alpha > 0 is exactly
    (255, 255, 255); the others are the product (not all white)."""
    from gpu_kernels.retouch.geometry import axis_taps

    image = np.asarray(Image.open(io.BytesIO(product_photo())).convert("RGB"))
    hard = (image.astype(np.int32).sum(axis=2) < 600).astype(np.float32)
    mask = np.rint(255 * cv2.GaussianBlur(hard, (0, 0), 3.0)).astype(np.uint8)  # a matte's soft edge
    assert ((mask > 0) & (mask < 128)).sum() > 1000  # a rim of faint alpha, outside the hard outline too
    r = CpuRetoucher()
    white = r.correct([image], [mask], RetouchOptions("white"))[0]
    canvas = r.render(white, mask, AMAZON)
    inv_k, ox, oy = (float(v) for v in r.placement(white, mask, AMAZON))
    coeffs = r.config.geometry.cubic_coefficients()
    reach = []
    for origin, n_out, n_src in ((oy, AMAZON.height, image.shape[0]), (ox, AMAZON.width, image.shape[1])):
        idx, w = axis_taps(inv_k, origin, n_out, n_src, coeffs)
        m = np.zeros((n_out, n_src), np.float32)
        rows = np.repeat(np.arange(n_out), idx.shape[1])
        np.add.at(m, (rows, idx.ravel()), (w != 0).ravel().astype(np.float32))
        reach.append(m)
    touched = reach[0] @ (mask > 0).astype(np.float32) @ reach[1].T > 0
    touched = cv2.dilate(touched.astype(np.uint8), np.ones((3, 3), np.uint8)).astype(bool)
    assert (canvas[~touched] == 255).all()
    assert touched.mean() < 0.9 and (canvas[touched] != 255).any(axis=1).mean() > 0.9


def test_cut_out_clean_up_agrees_on_both_backends() -> None:
    """``clean_cutout`` over OpenCV (CPU) and over the array-module code the GPU runs (here on
    NumPy + SciPy): the same alpha; a cut-out with nothing stray comes back as the same array."""
    from gpu_kernels.segment.ops import CpuOps, numpy_xp_ops
    from gpu_kernels.segment.postprocess import MaskPostprocess, clean_cutout

    alpha = cutout(shadow=True, specks=True)[..., 3]
    cpu = clean_cutout(alpha, MaskPostprocess(), CpuOps())
    xp = clean_cutout(alpha, MaskPostprocess(), numpy_xp_ops())
    assert cpu.dtype == np.uint8 and np.array_equal(cpu, xp) and int((cpu != alpha).sum()) > 500
    clean = cutout(shadow=True)[..., 3]
    assert clean_cutout(clean, MaskPostprocess(), CpuOps()) is clean
