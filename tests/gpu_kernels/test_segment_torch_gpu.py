"""The PyTorch runtime on a CUDA GPU: DLPack in and out, pinned uploads, CUDA graphs per bucket,
torch.compile, and the fp16 gate against ONNX Runtime fp32 masks.

Skipped without torch's CUDA build, CuPy and a device. CPU twin: tests/gpu_kernels/test_segment_torch.py.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from gpu_kernels.segment.onnx_torch import import_torch
from tests.gpu import cupy_or_skip

pytestmark = pytest.mark.gpu
if importlib.util.find_spec("torch") is None:
    pytest.skip("torch is not installed (the [torch] extra; make test-torch)", allow_module_level=True)
torch = import_torch()  # idle OpenMP threads sleep, as in the worker
if not torch.cuda.is_available():
    pytest.skip("torch has no CUDA device", allow_module_level=True)
cp = cupy_or_skip()

from gpu_kernels.segment import OnnxSegmenter  # noqa: E402
from gpu_kernels.segment.fetch_model import ModelFiles  # noqa: E402
from gpu_kernels.segment.runtime import make_model_segmenter, mask_iou  # noqa: E402
from gpu_kernels.segment.samples import make_composite  # noqa: E402
from gpu_kernels.segment.torch_runner import TorchSegmenter  # noqa: E402


def images() -> list[np.ndarray]:
    return [make_composite(o, "bottle", "gradient").image for o in ("coffee", "rocket", "chelsea")]


def test_gpu_masks_match_onnxruntime_cpu_from_cupy_numpy_and_dlpack(u2netp: ModelFiles) -> None:
    imgs = images()
    with OnnxSegmenter(u2netp.batched, threads=2) as ref:
        want = ref.segment_batch(imgs)
    with TorchSegmenter(u2netp.batched, device="gpu", max_batch=4) as seg:
        from_cupy = seg.segment_batch([cp.asarray(i) for i in imgs])  # bucket 4, padded
        from_numpy = seg.segment_batch(imgs)  # pinned uploads
        from_torch = seg.segment_batch([torch.from_numpy(i).cuda() for i in imgs])  # DLPack
    for w, a, b, c in zip(want, from_cupy, from_numpy, from_torch, strict=True):
        assert isinstance(a, cp.ndarray) and isinstance(w, np.ndarray) and a.shape == w.shape
        assert mask_iou(cp.asnumpy(a), w) > 0.99
        np.testing.assert_array_equal(cp.asnumpy(a), cp.asnumpy(b))
        np.testing.assert_array_equal(cp.asnumpy(a), cp.asnumpy(c))


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_cuda_graphs_give_the_eager_masks(u2netp: ModelFiles, precision: str) -> None:
    imgs = [cp.asarray(i) for i in images()]
    with TorchSegmenter(u2netp.batched, device="gpu", max_batch=4, precision=precision) as eager, \
            TorchSegmenter(u2netp.batched, device="gpu", max_batch=4, precision=precision,
                           cuda_graphs=True) as graphs:
        want = eager.segment_batch(imgs)
        got = graphs.segment_batch(imgs)  # bucket 4
        one = graphs.segment_batch(imgs[:1])  # bucket 1, then bucket 4 replayed
        again = graphs.segment_batch(imgs)
        assert graphs.cuda_graph_buckets == (1, 4), graphs.cuda_graph_errors
    for w, g, r in zip(want, got, again, strict=True):
        assert mask_iou(cp.asnumpy(w), cp.asnumpy(g)) > 0.999
        np.testing.assert_array_equal(cp.asnumpy(g), cp.asnumpy(r))
    assert mask_iou(cp.asnumpy(one[0]), cp.asnumpy(want[0])) > 0.999


def test_fp16_is_taken_only_through_the_gate(u2netp: ModelFiles, tmp_path: Path) -> None:
    seg, choice = make_model_segmenter(u2netp.batched, device="gpu", runtime="torch", cache_dir=tmp_path,
                                       images=images)
    gate = choice.gates[0]
    assert gate.runtime == "torch-fp16" and gate.n == 3
    assert choice.runtime == ("torch-fp16" if gate.passed else "torch-fp32")
    assert isinstance(seg, TorchSegmenter)
    seg.close()
    strict, refused = make_model_segmenter(u2netp.batched, device="gpu", runtime="torch", cache_dir=tmp_path,
                                           images=images, gate=(1.01, 1.01))
    assert refused.runtime == "torch-fp32" and isinstance(strict, TorchSegmenter) and strict.precision == "fp32"
    strict.close()


@pytest.mark.slow
def test_compiled_module_with_graphs_gives_the_eager_masks(u2netp: ModelFiles) -> None:
    imgs = [cp.asarray(i) for i in images()[:2]]
    with TorchSegmenter(u2netp.batched, device="gpu", max_batch=2, precision="fp16") as eager, \
            TorchSegmenter(u2netp.batched, device="gpu", max_batch=2, precision="fp16", compile=True,
                           cuda_graphs=True) as fast:
        want = eager.segment_batch(imgs)
        got = fast.segment_batch(imgs)
        assert fast.compile_error is None, fast.compile_error
    for w, g in zip(want, got, strict=True):
        assert mask_iou(cp.asnumpy(w), cp.asnumpy(g)) > 0.99
