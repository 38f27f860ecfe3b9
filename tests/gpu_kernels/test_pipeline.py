"""The batch pipeline's per-item failure isolation and span bookkeeping (real CPU stages)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from gpu_kernels.backends import RetouchOptions
from gpu_kernels.codec import CpuEncoder, make_decoder
from gpu_kernels.pipeline import ImagePipeline, Job
from gpu_kernels.presets import Preset, load_presets
from gpu_kernels.retouch import CpuRetoucher
from gpu_kernels.spans import SpanRecorder
from schemas.errors import ProcessingFailed


class EncoderFailingOn(CpuEncoder):
    """The real CPU encoder, except that it fails for images of one exact size."""

    def __init__(self, bad_shape: tuple[int, int]) -> None:
        super().__init__()
        self.bad_shape = bad_shape

    def encode(self, image, preset: Preset) -> bytes:  # type: ignore[no-untyped-def]
        if image.shape[:2] == self.bad_shape:
            raise ProcessingFailed("refused on purpose")
        return super().encode(image, preset)


def test_one_items_failure_leaves_its_batch_mates_whole(catalog: list[Path]) -> None:
    presets = load_presets().resolve(["jd_main", "thumb_webp"])
    custom = Preset("odd", 321, 123)
    pipe = ImagePipeline(make_decoder("cpu"), CpuRetoucher(), EncoderFailingOn((123, 321)))
    jobs = [Job(p.read_bytes(), presets, RetouchOptions(), SpanRecorder()) for p in catalog[:3]]
    jobs[1] = Job(catalog[1].read_bytes(), [*presets, custom], RetouchOptions(), SpanRecorder())
    results = pipe.run_batch(jobs)
    assert [r.ok for r in results] == [True, False, True]
    assert results[1].error is not None and results[1].error.stage == "encode:odd"
    assert results[1].variants == []
    for r in (results[0], results[2]):
        assert [(v.preset, v.width, v.height) for v in r.variants] == [("jd_main", 800, 800), ("thumb_webp", 400, 400)]
        assert r.quality is not None and 0 < r.quality.background_whiteness <= 1
    # batched stages record the batch they ran in
    decode = next(s for s in jobs[0].spans.spans if s.stage == "decode")
    render = next(s for s in jobs[0].spans.spans if s.stage == "preset:jd_main")
    assert decode.batch_size == 3 and render.batch_size == 3
    pipe.close()


class CountingSegmenter:
    """Wraps a real segmenter and counts the images it was given."""

    def __init__(self, inner) -> None:  # type: ignore[no-untyped-def]
        self.inner, self.device, self.seen = inner, inner.device, 0

    def segment_batch(self, images):  # type: ignore[no-untyped-def]
        self.seen += len(images)
        return self.inner.segment_batch(images)

    def close(self) -> None:
        self.inner.close()


def test_segmentation_is_chosen_per_event(catalog: list[Path]) -> None:
    from gpu_kernels.segment import make_segmenter

    model = CountingSegmenter(make_segmenter("classical", "cpu"))  # stands in for the model: counts only
    classical = CountingSegmenter(make_segmenter("classical", "cpu"))
    pipe = ImagePipeline(make_decoder("cpu"), CpuRetoucher(), CpuEncoder(), model, classical)
    presets = load_presets().resolve(["thumb_webp"])
    opts = [RetouchOptions(), RetouchOptions(segmentation="classical"), RetouchOptions(background="keep"),
            RetouchOptions(segmentation="model")]
    jobs = [Job(catalog[k].read_bytes(), presets, o, SpanRecorder()) for k, o in enumerate(opts)]
    assert all(r.ok for r in pipe.run_batch(jobs))
    assert (model.seen, classical.seen) == (2, 1)  # "keep" is not segmented at all
    assert not any(s.stage == "segment" for s in jobs[2].spans.spans)
    no_model = ImagePipeline(make_decoder("cpu"), CpuRetoucher(), CpuEncoder(), None, classical)
    assert no_model.run_batch([Job(catalog[0].read_bytes(), presets, RetouchOptions(), SpanRecorder())])[0].ok
    assert classical.seen == 2  # no model configured: the fallback serves "auto"


def test_a_cpu_model_s_mask_refinement_runs_in_the_output_lane_with_the_same_alpha(catalog: list[Path], u2netp) -> None:  # type: ignore[no-untyped-def]
    from gpu_kernels.segment.bucketed import Unrefined, output_work_pixels
    from gpu_kernels.segment.onnx_runner import OnnxSegmenter

    seg = OnnxSegmenter(u2netp.batched, max_batch=2, threads=2)
    pipe = ImagePipeline(make_decoder("cpu"), CpuRetoucher(), CpuEncoder(), seg)
    presets = load_presets().resolve(["thumb_webp"])
    jobs = [Job(p.read_bytes(), presets, RetouchOptions(), SpanRecorder()) for p in catalog[:3]]
    ctx = pipe.start(jobs)
    pipe.run_lane(ctx, "decode")
    pipe.run_lane(ctx, "device")
    # the device thread ran the model only: each mask waits for its refinement
    assert all(isinstance(ctx.masks[i], Unrefined) for i in range(3))
    assert all(not any(s.stage == "refine" for s in j.spans.spans) for j in jobs)
    pipe.run_lane(ctx, "output")
    # model and refinement in one go, refined at what the 400² canvas reaches, as the stage does
    canvases = [(p.width, p.height, p.fill) for p in presets]
    whole = []
    for i in range(3):
        img = ctx.images[i]
        unrefined = seg.infer_batch([img])[0]
        assert isinstance(unrefined, Unrefined)
        whole.append(unrefined.alpha(img, output_work_pixels(unrefined.prob, *img.shape[:2], canvases)))
    for i in range(3):
        assert ctx.masks[i].dtype == np.uint8 and np.array_equal(ctx.masks[i], whole[i])
        stages = [s.stage for s in jobs[i].spans.spans]
        assert stages.index("segment") < stages.index("refine") < stages.index("correct")
    assert all(r.ok for r in ctx.finalize())
    pipe.close()


def test_a_refinement_that_raises_fails_its_item_only(catalog: list[Path], u2netp, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from gpu_kernels.segment.bucketed import BucketedSegmenter
    from gpu_kernels.segment.onnx_runner import OnnxSegmenter

    seg = OnnxSegmenter(u2netp.batched, max_batch=2, threads=2)
    pipe = ImagePipeline(make_decoder("cpu"), CpuRetoucher(), CpuEncoder(), seg)
    presets = load_presets().resolve(["thumb_webp"])
    jobs = [Job(p.read_bytes(), presets, RetouchOptions(), SpanRecorder()) for p in catalog[:3]]
    widths = [make_decoder("cpu").decode_batch([j.data], max_side=400)[0].shape[1] for j in jobs]
    real = BucketedSegmenter.refine_batch

    def refine_batch(self, probs, images, max_pixels=None):  # type: ignore[no-untyped-def]
        if any(image.shape[1] == widths[1] for image in images):  # the batch's refinement raises
            raise ValueError("a bug in the refinement")
        return real(self, probs, images, max_pixels)

    monkeypatch.setattr(BucketedSegmenter, "refine_batch", refine_batch)
    results = pipe.run_batch(jobs)
    assert [r.ok for r in results] == [True, False, True]
    err = results[1].error
    assert isinstance(err, ProcessingFailed) and err.stage == "refine" and "ValueError" in err.message
    pipe.close()


class CountingRetoucher(CpuRetoucher):
    """The real CPU retoucher, counting the canvases it renders per preset."""

    def __init__(self) -> None:
        super().__init__()
        self.rendered: dict[str, int] = {}

    def render(self, image, mask, preset: Preset):  # type: ignore[no-untyped-def]
        self.rendered[preset.name] = self.rendered.get(preset.name, 0) + 1
        return super().render(image, mask, preset)


class CountingEncoder(CpuEncoder):
    """The real CPU encoder, counting the images it encodes per preset."""

    def __init__(self) -> None:
        super().__init__()
        self.encoded: dict[str, int] = {}

    def encode(self, image, preset: Preset) -> bytes:  # type: ignore[no-untyped-def]
        self.encoded[preset.name] = self.encoded.get(preset.name, 0) + 1
        return super().encode(image, preset)


def test_presets_with_the_same_look_share_one_canvas_and_one_encode(catalog: list[Path]) -> None:
    """Two marketplaces asking for the same 800 x 800 canvas: rendered and encoded once per image
    (whichever order each event names them in), the variants' bytes equal to those of each preset
    alone; a third with the same canvas as PNG shares the canvas and is encoded on its own; the
    marketplace rules stay each preset's own."""
    taobao, jd = load_presets().resolve(["taobao_main", "jd_main"])
    assert taobao.look == jd.look and taobao.encoding == jd.encoding
    strict = Preset("strict_800", 800, 800, min_fill=0.95)  # the same canvas, a stricter rule
    png = Preset("png_800", 800, 800, format="png")
    retoucher, encoder = CountingRetoucher(), CountingEncoder()
    pipe = ImagePipeline(make_decoder("cpu"), retoucher, encoder)
    blobs = [p.read_bytes() for p in catalog[:2]]
    orders = [[taobao, jd, strict, png], [png, strict, jd, taobao]]
    jobs = [Job(b, o, RetouchOptions(), SpanRecorder()) for b, o in zip(blobs, orders, strict=True)]
    results = pipe.run_batch(jobs)
    assert all(r.ok for r in results)
    assert sum(retoucher.rendered.values()) == 2  # one canvas per image, for all four presets
    assert sum(encoder.encoded.values()) == 4  # one JPEG and one PNG per image
    alone = ImagePipeline(make_decoder("cpu"), CpuRetoucher(), CpuEncoder())
    for blob, order, res in zip(blobs, orders, results, strict=True):
        by_name = {v.preset: v for v in res.variants}
        assert [v.preset for v in res.variants] == [p.name for p in order]
        for p in order:
            single = alone.run_batch([Job(blob, [p], RetouchOptions(), SpanRecorder())])[0].variants[0]
            assert by_name[p.name].data == single.data and by_name[p.name].compliance == single.compliance
        assert by_name["taobao_main"].data == by_name["jd_main"].data != by_name["png_800"].data
        assert by_name["strict_800"].compliance != by_name["taobao_main"].compliance  # its own rule
    names = {s.stage for s in jobs[0].spans.spans}
    assert {"preset:jd_main", "encode:jd_main", "preset:png_800", "encode:png_800"} <= names
    pipe.close()
    alone.close()


def test_presets_with_the_same_look_and_a_contact_shadow_share_the_shadowed_canvas(catalog: list[Path]) -> None:
    a, b = Preset("shadow_a", 600, 600, shadow="contact"), Preset("shadow_b", 600, 600, shadow="contact")
    retoucher = CountingRetoucher()
    pipe = ImagePipeline(make_decoder("cpu"), retoucher, CpuEncoder())
    job = Job(catalog[0].read_bytes(), [a, b], RetouchOptions(), SpanRecorder())
    res = pipe.run_batch([job])[0]
    alone = ImagePipeline(make_decoder("cpu"), CpuRetoucher(), CpuEncoder())
    single = alone.run_batch([Job(catalog[0].read_bytes(), [b], RetouchOptions(), SpanRecorder())])[0].variants[0]
    assert res.ok and retoucher.rendered == {"shadow_a": 1}
    assert res.variants[0].data == res.variants[1].data == single.data
    assert res.variants[1].compliance == single.compliance
    pipe.close()
    alone.close()


def test_every_field_of_a_preset_is_in_its_look_its_encoding_or_its_rules() -> None:
    """A field that changes the canvas changes :attr:`Preset.look`, one that changes only the bytes
    :attr:`Preset.encoding`, and the marketplace rules neither (presets equal there share a render
    or an encode). A new field fails here until it is placed."""
    import dataclasses

    base = Preset("p", 800, 800, format="png")
    canvas = {"width": 801, "height": 799, "fill": 0.7, "background": "transparent", "sharpen": 0.0,
              "shadow": "contact"}
    encoding = {"format": "webp", "quality": 80}
    rules = {"name": "q", "min_side": 1000, "min_fill": 0.85, "pure_white": True, "allow_cut": False}
    assert {f.name for f in dataclasses.fields(Preset)} == set(canvas) | set(encoding) | set(rules)
    for name, value in canvas.items():
        assert dataclasses.replace(base, **{name: value}).look != base.look, name
    for name, value in encoding.items():
        other = dataclasses.replace(base, **{name: value})
        assert other.look == base.look and other.encoding != base.encoding, name
    for name, value in rules.items():
        other = dataclasses.replace(base, **{name: value})
        assert other.look == base.look and other.encoding == base.encoding, name
