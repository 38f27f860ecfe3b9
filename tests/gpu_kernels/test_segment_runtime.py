"""Model runtimes behind the fidelity gate: OpenVINO, INT8, FP16, static-batch copies (CPU twins)."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from gpu_kernels.segment import ClassicalSegmenter, OnnxSegmenter
from gpu_kernels.segment.fetch_model import ModelFiles, make_batch_static
from gpu_kernels.segment.model import U2NETP, output_to_probability, preprocess
from gpu_kernels.segment.onnx_runner import cpu_session_options
from gpu_kernels.segment.ops import CpuOps
from gpu_kernels.segment.postprocess import MaskPostprocess
from gpu_kernels.segment.runtime import (
    GateResult,
    calibration_images,
    gate_images,
    make_model_segmenter,
    mask_iou,
    run_gate,
)
from gpu_kernels.segment.samples import make_composite
from gpu_kernels.segment.variants import derived_path, make_fp16
from schemas.errors import ProcessingFailed

openvino = pytest.importorskip("openvino")


def small_gate() -> list[np.ndarray]:
    return [make_composite("coffee", "bottle", "plain").image, make_composite("rocket", "ellipse", "gradient").image]


def test_mask_iou() -> None:
    a = np.zeros((4, 4), np.uint8)
    b = a.copy()
    assert mask_iou(a, b) == 1.0  # both empty
    a[:2] = 255
    b[:1] = 200
    assert mask_iou(a, b) == pytest.approx(0.5)
    b[:] = 127  # below the threshold counts as background
    assert mask_iou(a, b) == 0.0


def test_gate_and_calibration_sets_are_real_photos_and_disjoint() -> None:
    gate, calib = gate_images(), calibration_images()
    assert len(gate) == 16 and len(calib) >= 16
    assert all(g.ndim == 3 and g.shape[2] == 3 and g.dtype == np.uint8 for g in gate + calib)
    gate_keys = {hashlib.sha256(g.tobytes()).digest() for g in gate}
    assert not any(hashlib.sha256(c.tobytes()).digest() in gate_keys for c in calib)


def test_gate_passes_a_segmenter_against_itself_and_fails_a_different_one(u2netp: ModelFiles) -> None:
    images = small_gate()
    with OnnxSegmenter(u2netp.batched, threads=2) as ref, OnnxSegmenter(u2netp.batched, threads=2) as same:
        ok = run_gate("same", same, ref, images)
        assert ok.passed and ok.mean_iou == 1.0 and ok.worst_iou == 1.0 and ok.n == 2
        assert ok.ms_per_image > 0 and ok.reference_ms_per_image > 0

        class Inverted:
            device = "cpu"

            def segment_batch(self, imgs: Any) -> list[Any]:
                return [255 - m for m in ref.segment_batch(imgs)]

            def close(self) -> None: ...

        bad = run_gate("inverted", Inverted(), ref, images)
        assert not bad.passed and bad.worst_iou < 0.5
        strict = run_gate("same", same, ref, images, mean_min=1.01)
        assert not strict.passed


def test_the_gate_compares_the_model_alone_not_the_refinement_after_it(u2netp: ModelFiles) -> None:
    """Two segmenters on the same model, one with a far costlier mask refinement: each counts
    its model's own wall time (``model_s``), and the gate compares those, so the refinement
    (the same code for every runtime) does not decide which runtime is faster."""
    images = small_gate()
    heavy_post = MaskPostprocess(guide_sigma=12.0, matte_band=0.03)
    with OnnxSegmenter(u2netp.batched, threads=2) as ref, \
            OnnxSegmenter(u2netp.batched, threads=2, post=heavy_post) as heavy:
        assert ref.model_s == 0.0
        t0 = time.perf_counter()
        heavy.segment_batch([images[0]])
        whole = time.perf_counter() - t0
        assert 0.0 < heavy.model_s < whole  # the model's share only
        before = heavy.model_s
        result = run_gate("heavy-post", heavy, ref, images)
        assert heavy.model_s > before and result.n == len(images)
        gate_model_s = heavy.model_s - before  # what the gate timed: the model's share of its calls
        assert result.ms_per_image <= gate_model_s * 1000 + 0.1  # a median of those, not the whole calls


def test_openvino_f32_masks_match_onnxruntime(u2netp: ModelFiles) -> None:
    from gpu_kernels.segment.openvino_runner import OpenVinoSegmenter

    images = small_gate()
    with OnnxSegmenter(u2netp.batched, threads=2) as ref, \
            OpenVinoSegmenter(u2netp.batched, precision="f32", threads=2, max_batch=2) as ov:
        got = ov.segment_batch(images)  # one padded bucket of 2
        want = ref.segment_batch(images)
    for g, w, im in zip(got, want, images, strict=True):
        assert g.shape == im.shape[:2] and g.dtype == np.uint8
        assert mask_iou(g, w) > 0.99


def test_openvino_runs_several_images_side_by_side_with_the_same_masks(u2netp: ModelFiles) -> None:
    """Two or more images in a chunk go to the streams compilation, one image per stream; the
    masks are those the one-at-a-time model gives, and a single image never compiles it."""
    from gpu_kernels.segment.openvino_runner import OpenVinoSegmenter

    images = [*small_gate(), make_composite("coffee", "star", "brick").image]
    with OpenVinoSegmenter(u2netp.original, precision="f32", threads=2) as pair, \
            OpenVinoSegmenter(u2netp.original, precision="f32", threads=2, streams=1) as one:
        assert (pair.streams, pair.buckets, one.buckets) == (2, (1, 2), (1,))
        first = pair.segment_batch(images[:1])
        assert pair._side_by_side == []  # one image: the latency compilation alone
        got = pair.segment_batch(images)  # a chunk of 2 side by side, then 1
        assert len(pair._side_by_side) == 2
        want = one.segment_batch(images)
    assert np.array_equal(first[0], want[0])
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape and mask_iou(g, w) > 0.999
        assert np.abs(g.astype(int) - w.astype(int)).max() <= 2


def test_openvino_fixes_the_batch_at_one_when_every_request_runs_one_image(u2netp: ModelFiles,
                                                                          tmp_path: Path) -> None:
    """``max_batch=1`` (the default): a copy of the symbolic-batch model with the batch fixed at 1
    is written to the cache once and compiled, with the masks of the symbolic model, alone and
    side by side; a larger ``max_batch`` keeps the symbolic batch, and a cache that cannot be
    written leaves the model as it is."""
    from gpu_kernels.segment.openvino_runner import OpenVinoSegmenter

    images = [*small_gate(), make_composite("coffee", "star", "brick").image]
    with OpenVinoSegmenter(u2netp.batched, precision="f32", threads=2, cache_dir=tmp_path / "ov") as fixed, \
            OpenVinoSegmenter(u2netp.batched, precision="f32", threads=2, max_batch=2,
                              cache_dir=tmp_path / "ov2") as symbolic:
        fixed.prepare()
        symbolic.prepare()
        assert fixed._compiled.input(0).get_partial_shape().is_static
        assert fixed._compiled.input(0).get_partial_shape()[0].get_length() == 1
        assert symbolic._compiled.input(0).get_partial_shape()[0].is_dynamic
        copy = derived_path(u2netp.batched, "b1", tmp_path / "ov")
        assert fixed._source == copy and copy.is_file()
        assert [d.dim_value for d in onnx.load(str(copy)).graph.input[0].type.tensor_type.shape.dim] == [1, 3, 320, 320]
        alone = fixed.segment_batch(images[:1])
        got = fixed.segment_batch(images)  # a pair on the streams, then one
        assert len(fixed._side_by_side) == 2
        want = symbolic.segment_batch(images)
    assert np.array_equal(alone[0], want[0])
    for g, w in zip(got, want, strict=True):
        assert np.abs(g.astype(int) - w.astype(int)).max() <= 2
    (tmp_path / "not-a-folder").write_bytes(b"")
    with OpenVinoSegmenter(u2netp.batched, precision="f32", threads=2, cache_dir=tmp_path / "not-a-folder") as seg:
        assert seg._source == u2netp.batched
        seg.prepare()
        assert seg._compiled.input(0).get_partial_shape()[0].is_dynamic


def test_openvino_compiles_at_start_up_only_what_its_calls_run_on(u2netp: ModelFiles, tmp_path: Path) -> None:
    """Nothing is compiled at construction. ``device_callers`` prepares the model: the one-image
    compilation for one caller, or for a worker's callers (a lone image keeps its latency); the
    streams alone when every image takes them (``lightbox process`` of several files), whose single
    images then never compile the other. A file OpenVINO cannot load fails there, at start-up."""
    from gpu_kernels.codec import CpuEncoder, make_decoder
    from gpu_kernels.pipeline import ImagePipeline
    from gpu_kernels.retouch import CpuRetoucher
    from gpu_kernels.segment.openvino_runner import OpenVinoSegmenter

    def pipeline(seg: OpenVinoSegmenter) -> ImagePipeline:
        return ImagePipeline(make_decoder("cpu"), CpuRetoucher(), CpuEncoder(), seg, None)

    image = small_gate()[0]
    with OpenVinoSegmenter(u2netp.batched, precision="f32", threads=2, cache_dir=tmp_path / "ov") as seg:
        assert seg._compiled is None and seg._side_by_side == []
        pipeline(seg).device_callers(2, lone_latency=False)
        assert seg._compiled is None and len(seg._side_by_side) == 2
        (alpha,) = seg.segment_batch([image])  # one image, on a stream
        assert seg._compiled is None and alpha.shape == image.shape[:2]
    for n, lone in ((1, False), (2, True)):
        with OpenVinoSegmenter(u2netp.batched, precision="f32", threads=2, cache_dir=tmp_path / "ov") as seg:
            pipeline(seg).device_callers(n, lone_latency=lone)
            assert seg._compiled is not None and seg._side_by_side == []
            (alone,) = seg.segment_batch([image])
            assert seg._side_by_side == [] and np.abs(alone.astype(int) - alpha.astype(int)).max() <= 2
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a model")
    with OpenVinoSegmenter(bad, precision="f32", threads=2, cache_dir=tmp_path / "ov") as seg:
        assert seg._source == bad  # no batch-fixed copy of a file 'onnx' cannot parse
        with pytest.raises(ProcessingFailed, match="cannot load model"):
            pipeline(seg).device_callers(2, lone_latency=False)
        (failed,) = seg.segment_batch([image])  # and, unprepared, on the first image: for that image
        assert isinstance(failed, ProcessingFailed) and "cannot load model" in str(failed)


def test_openvino_takes_calls_from_two_threads_each_on_its_own_stream(u2netp: ModelFiles) -> None:
    """``callers.concurrent``: two threads segmenting single images at once each get a stream
    (both streams made, none shared), and the masks are those of one call after another."""
    import threading

    from gpu_kernels.segment.openvino_runner import OpenVinoSegmenter

    images = [*small_gate(), make_composite("coffee", "star", "brick").image,
              make_composite("rocket", "hexagon", "plain").image]
    with OpenVinoSegmenter(u2netp.original, precision="f32", threads=2, streams=1) as one:
        want = [one.segment_batch([im])[0] for im in images]
    with OpenVinoSegmenter(u2netp.original, precision="f32", threads=2) as seg:
        seg.callers.concurrent = True
        got: dict[int, np.ndarray] = {}
        errors: list[BaseException] = []

        def work(k: int) -> None:
            try:
                for i in range(k, len(images), 2):
                    got[i] = seg.segment_batch([images[i]])[0]
            except BaseException as exc:  # reported below
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(k,)) for k in (0, 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not any(t.is_alive() for t in threads) and not errors, errors
        assert len(seg._side_by_side) == 2 and seg._free.qsize() == 2  # every request back in the pool
    for i, w in enumerate(want):
        assert mask_iou(got[i], w) > 0.999 and np.abs(got[i].astype(int) - w.astype(int)).max() <= 2


def test_openvino_gives_a_lone_call_every_thread_and_a_call_beside_another_thread_a_stream(u2netp: ModelFiles) -> None:
    """With ``callers.concurrent``, an image with no other thread's call in progress or ended
    within ``LONE_GAP_S`` runs on the latency compilation (all threads: a light-load worker keeps
    its latency); one that follows another thread's call closely takes a stream."""
    import threading

    from gpu_kernels.segment.bucketed import LONE_GAP_S
    from gpu_kernels.segment.openvino_runner import OpenVinoSegmenter

    image = small_gate()[0]
    with OpenVinoSegmenter(u2netp.original, precision="f32", threads=2) as seg:
        seg.callers.concurrent = True
        taken: list[int] = []
        take = seg._take_streams

        def counted(n: int) -> list[Any]:
            taken.append(n)
            return take(n)

        seg._take_streams = counted  # type: ignore[method-assign]

        def in_thread() -> np.ndarray:
            out: list[Any] = []
            t = threading.Thread(target=lambda: out.append(seg.segment_batch([image])[0]))
            t.start()
            t.join(60)
            assert not t.is_alive()
            return np.asarray(out[0])

        alone = seg.segment_batch([image])[0]
        seg.segment_batch([image])  # the same thread again: its own last call does not count
        assert taken == []
        beside = in_thread()  # right after the main thread's call: a stream
        assert taken == [1] and seg._free.qsize() == 2  # both stream requests made, both back
        time.sleep(LONE_GAP_S + 0.05)
        later = in_thread()  # nothing for longer than LONE_GAP_S: alone again
        assert taken == [1]
    for got in (beside, later):
        assert np.abs(alone.astype(int) - got.astype(int)).max() <= 2


def test_openvino_loads_without_its_model_converter_which_still_imports_when_asked() -> None:
    import subprocess
    import sys

    code = ("import sys; from gpu_kernels.segment.openvino_runner import shared_core; core = shared_core(); "
            "assert 'CPU' in core.available_devices; print('openvino.tools.ovc' in sys.modules); "
            "from openvino.tools.ovc import convert_model; print(callable(convert_model))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[2])
    assert out.stdout.split() == ["False", "True"]


def test_openvino_refuses_a_batch_the_model_cannot_take(u2netp: ModelFiles) -> None:
    from gpu_kernels.segment.openvino_runner import OpenVinoSegmenter

    with pytest.raises(ProcessingFailed, match="fixed batch of 1"):
        OpenVinoSegmenter(u2netp.original, max_batch=4).prepare()


def test_static_batch_copy_folds_shapes_and_matches(u2netp: ModelFiles, tmp_path: Path) -> None:
    """The copy CUDA graphs are captured from: same outputs, no shape arithmetic left after
    ONNX Runtime's optimisation (so no node has to fall back to the CPU on a GPU)."""
    static = tmp_path / "b2.onnx"
    make_batch_static(u2netp.batched, static, 2)
    dims = onnx.load(str(static)).graph.input[0].type.tensor_type.shape.dim
    assert dims[0].dim_value == 2
    opts = cpu_session_options(2)
    opts.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    s_static = ort.InferenceSession(str(static), opts, providers=["CPUExecutionProvider"])
    s_sym = ort.InferenceSession(str(u2netp.batched), cpu_session_options(2), providers=["CPUExecutionProvider"])
    x = preprocess(small_gate(), U2NETP, 2, CpuOps())
    name = s_sym.get_inputs()[0].name
    np.testing.assert_allclose(s_static.run(None, {name: x})[0], s_sym.run(None, {name: x})[0], atol=1e-5)
    ops = {n.op_type for n in onnx.load(str(tmp_path / "optimized.onnx")).graph.node}
    assert "Shape" not in ops and "Gather" not in ops, ops
    with pytest.raises(ValueError):
        make_batch_static(u2netp.batched, static, 0)


def test_fp16_copy_keeps_float32_io_and_its_masks_close(u2netp: ModelFiles, tmp_path: Path) -> None:
    """The GPU's FP16 variant, run here by ONNX Runtime's CPU provider: float32 in and out,
    masks near fp32 (the real gate runs on the GPU)."""
    path = make_fp16(u2netp.batched, derived_path(u2netp.batched, "fp16", tmp_path))
    assert path.name.endswith(".fp16.onnx") and path.parent == tmp_path
    s = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert s.get_inputs()[0].type == "tensor(float)" and s.get_outputs()[0].type == "tensor(float)"
    with OnnxSegmenter(u2netp.batched, threads=2) as ref, OnnxSegmenter(path, threads=2) as half:
        result = run_gate("fp16-cpu", half, ref, small_gate())
    assert result.mean_iou > 0.9


def test_fp32_is_used_as_asked_and_fp16_is_refused_on_cpu(u2netp: ModelFiles, tmp_path: Path) -> None:
    seg, choice = make_model_segmenter(u2netp.batched, runtime="fp32", cache_dir=tmp_path)
    assert isinstance(seg, OnnxSegmenter) and choice.runtime == "fp32" and not choice.gates
    assert seg.buckets == (1,)
    with pytest.raises(ProcessingFailed, match="fp16 runtime is for the GPU"):
        make_model_segmenter(u2netp.batched, runtime="fp16", cache_dir=tmp_path)
    with pytest.raises(ProcessingFailed, match="unknown segment runtime"):
        make_model_segmenter(u2netp.batched, runtime="tensorrt", cache_dir=tmp_path)


def test_openvino_runtime_falls_back_to_f32_when_bf16_fails_the_gate(u2netp: ModelFiles, tmp_path: Path) -> None:
    from gpu_kernels.segment.openvino_runner import OpenVinoSegmenter

    calls: list[int] = []

    def images() -> list[np.ndarray]:
        calls.append(1)
        return small_gate()

    seg, choice = make_model_segmenter(u2netp.batched, runtime="openvino", cache_dir=tmp_path, images=images,
                                       gate=(1.01, 1.01), threads=2)  # a gate nothing can pass
    assert isinstance(seg, OpenVinoSegmenter)
    assert choice.runtime == "openvino-f32" and seg.precision == "f32"
    assert all(not g.passed for g in choice.gates) and calls == [1]
    cached = json.loads((tmp_path / "gate.json").read_text())
    assert {v["runtime"] for v in cached.values()} == {g.runtime for g in choice.gates}
    # a second start reads the verdicts: no gate run
    _, again = make_model_segmenter(u2netp.batched, runtime="openvino", cache_dir=tmp_path, images=images,
                                    gate=(1.01, 1.01), threads=2)
    assert calls == [1] and again.gates == choice.gates


def test_unsure_share_is_the_band_around_one_half_against_the_subject() -> None:
    from gpu_kernels.segment.openvino_runner import unsure_share

    crisp = np.zeros((1, 100, 100), np.float32)
    crisp[0, 20:80, 20:80] = 1.0  # a subject of 3,600 pixels, nothing unsure
    soft = crisp.copy()
    soft[0, 20:80, 20:30] = 0.55  # 600 of its pixels unsure (still subject)
    soft[0, 0:10, 0:10] = 0.42  # and 100 background pixels
    none = np.full((1, 100, 100), 0.45, np.float32)  # all unsure, no subject: against 1 % of the map
    got = unsure_share(np.concatenate([crisp, soft, none]))
    assert got.shape == (3,)
    assert got[0] == 0.0 and got[1] == pytest.approx(700 / 3600) and got[2] == pytest.approx(100.0)


def test_checked_bf16_runs_exactly_the_unsure_images_again_at_f32(u2netp: ModelFiles) -> None:
    """recheck: an image whose bf16 map's unsure share exceeds it gets the f32 output, the others
    keep bf16's."""
    from gpu_kernels.segment.machine import openvino_bf16 as supports_bf16
    from gpu_kernels.segment.openvino_runner import OpenVinoSegmenter, unsure_share

    if not supports_bf16():
        pytest.skip("this CPU has no bf16 instructions (AVX512-BF16, AMX): the checked bf16 is not offered here")
    xs = [preprocess([im], U2NETP, 1, CpuOps()) for im in (*small_gate(), *gate_images()[:2])]
    opts: dict[str, Any] = {"threads": 2, "streams": 1}
    with OpenVinoSegmenter(u2netp.original, precision="bf16", **opts) as plain, \
            OpenVinoSegmenter(u2netp.original, precision="f32", **opts) as exact:
        fast = [plain._infer(x) for x in xs]
        slow = [exact._infer(x) for x in xs]
    shares = [float(unsure_share(output_to_probability(f, U2NETP, np))[0]) for f in fast]
    cut = float(np.median(shares))  # some images above it, some not (unless all shares tie)
    for recheck in (-1.0, cut, float("inf")):
        with OpenVinoSegmenter(u2netp.original, precision="bf16", recheck=recheck, **opts) as checked:
            got = [checked._infer(x) for x in xs]
            again = [s > recheck for s in shares]
            assert checked.rechecked == sum(again)
        for g, f, e, redo in zip(got, fast, slow, again, strict=True):
            np.testing.assert_allclose(g, e if redo else f, atol=1e-6)
    with OpenVinoSegmenter(u2netp.original, precision="f32", recheck=0.0, **opts) as f32:
        assert f32.recheck is None  # only bf16 is checked
        f32._infer(xs[0])
        assert f32.rechecked == 0


def test_checked_bf16_is_a_runtime_where_the_cpu_has_bf16(u2netp: ModelFiles, tmp_path: Path) -> None:
    from gpu_kernels.segment.machine import openvino_bf16 as supports_bf16
    from gpu_kernels.segment.openvino_runner import RECHECK_UNSURE
    from gpu_kernels.segment.runtime import available_runtimes

    if not supports_bf16():
        assert "openvino-checked" not in available_runtimes()
        with pytest.raises(ProcessingFailed, match="not available"):
            make_model_segmenter(u2netp.batched, runtime="openvino-checked", cache_dir=tmp_path)
        return
    assert "openvino-checked" in available_runtimes()
    seg, choice = make_model_segmenter(u2netp.batched, runtime="openvino-checked", cache_dir=tmp_path)
    with seg:
        assert choice.runtime == "openvino-checked" and choice.reason == "asked for (not gated)"
        assert getattr(seg, "precision") == "bf16" and getattr(seg, "recheck") == RECHECK_UNSURE  # noqa: B009


@pytest.mark.slow
def test_auto_picks_only_what_passes_and_is_faster(u2netp: ModelFiles, tmp_path: Path) -> None:
    """auto on the CPU: every candidate gated (INT8 built and calibrated here); with an
    impossible gate it keeps fp32, and with no gate at all it takes the fastest candidate."""
    seg, choice = make_model_segmenter(u2netp.batched, runtime="auto", cache_dir=tmp_path, images=small_gate,
                                       gate=(1.01, 1.01), threads=2)
    assert isinstance(seg, OnnxSegmenter) and choice.runtime == "fp32"
    assert "int8" in {g.runtime for g in choice.gates}
    assert list((tmp_path / "variants").glob("*.int8.onnx"))
    seg2, loose = make_model_segmenter(u2netp.batched, runtime="auto", cache_dir=tmp_path / "loose",
                                       images=small_gate, gate=(0.0, 0.0), threads=2)
    fast = [g for g in loose.gates if g.speedup >= 1.10]
    if fast:  # timing on a shared machine: only assert the rule, not which runtime wins
        assert loose.runtime == min(fast, key=lambda g: g.ms_per_image).runtime
    else:
        assert loose.runtime == "fp32"
    seg.close()
    seg2.close()


def test_the_gate_takes_any_segmenter() -> None:
    images = small_gate()
    a, b = ClassicalSegmenter(), ClassicalSegmenter()
    result = run_gate("classical", a, b, images)
    assert isinstance(result, GateResult) and result.passed
