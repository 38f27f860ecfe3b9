"""Marketplace compliance per variant: measures on the rendered canvas and the preset's verdict."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageDraw

from gpu_kernels.backends import RetouchOptions
from gpu_kernels.codec import CpuEncoder, make_decoder
from gpu_kernels.pipeline import Job, JobResult, RetouchPipeline
from gpu_kernels.presets import Preset, load_presets
from gpu_kernels.retouch import CpuRetoucher
from gpu_kernels.segment import make_segmenter
from gpu_kernels.spans import SpanRecorder
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
    pipe = RetouchPipeline(make_decoder("cpu"), CpuRetoucher(), CpuEncoder(), None, make_segmenter("classical"))
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
    from tests.test_process import record

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
