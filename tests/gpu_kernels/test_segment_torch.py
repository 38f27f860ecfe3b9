"""The PyTorch runtime (``[torch]`` extra) on the CPU: the ONNX file as a torch module, parity with
ONNX Runtime's masks, the gate, and its place in the runtime choice. Skipped without torch
(``make test-torch`` installs it). GPU twin: tests/gpu_kernels/test_segment_torch_gpu.py."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from gpu_kernels.segment import OnnxSegmenter
from gpu_kernels.segment.fetch_model import ModelFiles
from gpu_kernels.segment.model import U2NETP, preprocess
from gpu_kernels.segment.onnx_runner import cpu_session_options
from gpu_kernels.segment.onnx_torch import import_torch
from gpu_kernels.segment.ops import CpuOps
from gpu_kernels.segment.runtime import (
    available_runtimes,
    cached_auto_choice,
    make_model_segmenter,
    mask_iou,
    run_gate,
)
from gpu_kernels.segment.samples import make_composite
from schemas.errors import ProcessingFailed

if importlib.util.find_spec("torch") is None:
    pytest.skip("torch is not installed (the [torch] extra; make test-torch)", allow_module_level=True)
torch = import_torch()  # idle OpenMP threads sleep, as in the worker

from gpu_kernels.segment.machine import torch_cpu_supports  # noqa: E402
from gpu_kernels.segment.onnx_torch import load_onnx_module  # noqa: E402
from gpu_kernels.segment.torch_runner import TorchSegmenter  # noqa: E402


def small_gate() -> list[np.ndarray]:
    return [make_composite("coffee", "bottle", "plain").image, make_composite("rocket", "ellipse", "gradient").image]


def test_the_onnx_graph_as_a_torch_module_gives_onnxruntimes_output(u2netp: ModelFiles) -> None:
    """Same numbers as ONNX Runtime on a real batch of 2, from the published file with its fixed
    batch of 1 too (shapes are read at run time), and only the chosen output's nodes are kept."""
    x = preprocess(small_gate(), U2NETP, 2, CpuOps())
    s = ort.InferenceSession(str(u2netp.batched), cpu_session_options(2), providers=["CPUExecutionProvider"])
    want = s.run(None, {s.get_inputs()[0].name: x})
    with torch.inference_mode():
        got = load_onnx_module(u2netp.original)(torch.from_numpy(x)).numpy()
        side = load_onnx_module(u2netp.batched, output_index=3)(torch.from_numpy(x)).numpy()
    assert got.shape == want[0].shape == (2, 1, 320, 320)
    np.testing.assert_allclose(got, want[0], atol=2e-5)
    np.testing.assert_allclose(side, want[3], atol=2e-5)
    module = load_onnx_module(u2netp.batched)
    assert sum(p.numel() for p in module.parameters()) == 1_125_485  # u2netp's weights, side heads' included
    assert not any(p.requires_grad for p in module.parameters())


def _tiny_model(path: Path, op: str) -> Path:
    w = helper.make_tensor("w", TensorProto.FLOAT, [1, 3, 1, 1], [0.5, 0.25, 0.25])
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node(op, ["c"], ["y"])]
    graph = helper.make_graph(nodes, "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 4, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, 4, 4])], [w])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)]), str(path))
    return path


def test_an_unsupported_operator_or_a_bad_file_is_refused_at_load(tmp_path: Path) -> None:
    ok = load_onnx_module(_tiny_model(tmp_path / "ok.onnx", "Sigmoid"))
    x = torch.ones(1, 3, 4, 4)
    assert torch.allclose(ok(x), torch.sigmoid(torch.ones(1, 1, 4, 4)))
    with pytest.raises(ProcessingFailed, match=r"does not support ONNX operator\(s\) \['Softplus'\]"):
        load_onnx_module(_tiny_model(tmp_path / "softplus.onnx", "Softplus"))
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x00not an onnx file" * 10)
    with pytest.raises(ProcessingFailed, match="cannot read ONNX model"):
        load_onnx_module(bad)
    with pytest.raises(ProcessingFailed, match="does not exist"):
        TorchSegmenter(tmp_path / "missing.onnx")


def test_fp32_masks_match_onnxruntime_in_batches_with_bad_items_in_place(u2netp: ModelFiles) -> None:
    images = small_gate()
    batch = [images[0], np.zeros((5, 5), np.uint8), images[1]]  # a grey 2-D array is a bad item
    with OnnxSegmenter(u2netp.batched, threads=2) as ref, \
            TorchSegmenter(u2netp.batched, threads=2, max_batch=2) as seg:
        assert seg.buckets == (1, 2) and seg.version == ref.version
        got = seg.segment_batch(batch)
        want = ref.segment_batch(images)
    assert isinstance(got[1], ProcessingFailed)
    for g, w, im in zip((got[0], got[2]), want, images, strict=True):
        assert isinstance(g, np.ndarray) and g.shape == im.shape[:2] and g.dtype == np.uint8
        assert mask_iou(g, w) > 0.999
        assert 0.05 < float((g >= 128).mean()) < 0.95  # a real cutout, not an empty or full mask


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_lower_precisions_pass_the_gate_against_onnxruntime(u2netp: ModelFiles, precision: str) -> None:
    if not torch_cpu_supports(precision):
        pytest.skip(f"oneDNN has no native {precision} on this CPU (autocast would emulate it slowly)")
    with OnnxSegmenter(u2netp.batched, threads=2) as ref, \
            TorchSegmenter(u2netp.batched, precision=precision, threads=2) as seg:
        result = run_gate(f"torch-{precision}", seg, ref, small_gate())
        with torch.inference_mode():
            x = torch.zeros(1, 3, 320, 320)
            assert seg._forward(x).dtype == torch.float32  # autocast inside, float32 out
    assert result.passed and result.mean_iou >= 0.97, result


def test_a_segmenter_used_after_close_refuses(u2netp: ModelFiles) -> None:
    seg = TorchSegmenter(u2netp.batched, threads=1)
    seg.close()
    out = seg.segment_batch(small_gate()[:1])
    assert isinstance(out[0], ProcessingFailed) and "after close" in str(out[0])


def test_torch_runtimes_by_name_and_through_the_gate(u2netp: ModelFiles, tmp_path: Path) -> None:
    assert {"torch", "torch-fp32"} <= set(available_runtimes("cpu"))
    seg, choice = make_model_segmenter(u2netp.batched, runtime="torch-fp32", cache_dir=tmp_path, threads=2)
    assert isinstance(seg, TorchSegmenter) and seg.precision == "fp32" and choice.runtime == "torch-fp32"
    seg.close()
    # "torch" with a gate nothing passes keeps fp32, and the verdicts are cached
    seg, choice = make_model_segmenter(u2netp.batched, runtime="torch", cache_dir=tmp_path, images=small_gate,
                                       gate=(1.01, 1.01), threads=2)
    assert isinstance(seg, TorchSegmenter) and choice.runtime == "torch-fp32"
    assert all(g.runtime.startswith("torch-") and not g.passed for g in choice.gates)
    assert {g.runtime for g in choice.gates} == {f"torch-{p}" for p in ("bf16", "fp16") if torch_cpu_supports(p)}
    seg.close()
    if torch_cpu_supports("bf16"):
        seg, choice = make_model_segmenter(u2netp.batched, runtime="torch", cache_dir=tmp_path / "b",
                                           images=small_gate, threads=2)
        assert choice.runtime == "torch-bf16" and isinstance(seg, TorchSegmenter) and seg.precision == "bf16"
        seg.close()


@pytest.mark.slow
def test_auto_gates_the_torch_candidates_and_doctor_reads_its_pick(u2netp: ModelFiles, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """auto weighs torch beside the others; the cached verdicts alone then tell what auto picks,
    and ``lightbox doctor`` says it."""
    pick, why = cached_auto_choice(u2netp.batched, threads=2, cache_dir=tmp_path)
    assert pick is None and "not measured yet" in why
    seg, choice = make_model_segmenter(u2netp.batched, runtime="auto", cache_dir=tmp_path, images=small_gate,
                                       threads=2)
    names = {g.runtime for g in choice.gates}
    assert "torch-fp32" in names and ("torch-bf16" in names) == torch_cpu_supports("bf16")
    verdicts = json.loads((tmp_path / "gate.json").read_text())
    assert {v["runtime"] for v in verdicts.values()} == names
    pick, why = cached_auto_choice(u2netp.batched, threads=2, cache_dir=tmp_path)
    assert pick == choice.runtime, (pick, why, choice)
    seg.close()
    from lightbox.doctor import _runtimes

    (tmp_path / "u2netp").mkdir()
    shutil.copy(u2netp.batched, tmp_path / "u2netp" / "u2netp.batched.onnx")
    for key, value in (("MODEL_DIR", str(tmp_path)), ("SEGMENT_THREADS", "2"), ("DEVICE", "cpu")):
        monkeypatch.setenv(f"LIGHTBOX_{key}", value)
    check = _runtimes()
    assert check.status == "ok" and "torch-fp32" in check.detail and f"auto: {choice.runtime} (" in check.detail
