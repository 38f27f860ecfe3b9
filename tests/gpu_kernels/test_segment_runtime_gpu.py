"""GPU paths of the model runtimes: CUDA graphs per bucket, the FP16 gate, pinned uploads.

Skipped without CuPy and a CUDA device, and (model tests) without onnxruntime's CUDA provider.
Their CPU twins: tests/gpu_kernels/test_segment_runtime.py (static-batch copies, FP16 copy, the gate).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.gpu import cupy_or_skip

pytestmark = pytest.mark.gpu
cp = cupy_or_skip()

from gpu_kernels.pinned import PinnedUploader  # noqa: E402
from gpu_kernels.segment import OnnxSegmenter  # noqa: E402
from gpu_kernels.segment.fetch_model import ModelFiles  # noqa: E402
from gpu_kernels.segment.runtime import make_model_segmenter, mask_iou  # noqa: E402
from gpu_kernels.segment.samples import make_composite  # noqa: E402


def cuda_provider_or_skip() -> None:
    import onnxruntime as ort

    if "CUDAExecutionProvider" not in ort.get_available_providers():
        pytest.skip("onnxruntime has no CUDA provider (install onnxruntime-gpu)")


def images() -> list[np.ndarray]:
    return [make_composite(o, "bottle", "gradient").image for o in ("coffee", "rocket", "chelsea")]


def test_pinned_uploads_match_and_are_not_clobbered_by_later_ones() -> None:
    up = PinnedUploader(slots=2)
    rng = np.random.default_rng(0)
    hosts = [rng.integers(0, 256, (300 + 7 * k, 400, 3), dtype=np.uint8) for k in range(6)]
    devs = [up.upload(h) for h in hosts]  # more uploads than slots: buffers are reused
    cp.cuda.Device().synchronize()
    for h, d in zip(hosts, devs, strict=True):
        assert d.shape == h.shape and d.dtype == h.dtype
        np.testing.assert_array_equal(cp.asnumpy(d), h)
    f = np.linspace(0, 1, 12, dtype=np.float32).reshape(3, 4)
    np.testing.assert_array_equal(cp.asnumpy(up.upload(f[:, ::2])), f[:, ::2])  # non-contiguous input


def test_cuda_graphs_give_the_plain_masks(u2netp: ModelFiles) -> None:
    cuda_provider_or_skip()
    imgs = [cp.asarray(i) for i in images()]
    with OnnxSegmenter(u2netp.batched, device="gpu", max_batch=4, use_tensorrt=False) as plain, \
            OnnxSegmenter(u2netp.batched, device="gpu", max_batch=4, use_tensorrt=False, cuda_graphs=True) as graphs:
        want = plain.segment_batch(imgs)
        got = graphs.segment_batch(imgs)  # bucket 4 (3 images, padded)
        again = graphs.segment_batch(imgs[:1])  # bucket 1, then a replay of bucket 4
        replay = graphs.segment_batch(imgs)
        assert graphs.cuda_graph_buckets == (1, 4), graphs.cuda_graph_errors
    for w, g, r in zip(want, got, replay, strict=True):
        assert mask_iou(cp.asnumpy(w), cp.asnumpy(g)) > 0.999
        np.testing.assert_array_equal(cp.asnumpy(g), cp.asnumpy(r))  # a replay gives the same masks
    assert mask_iou(cp.asnumpy(again[0]), cp.asnumpy(want[0])) > 0.999


def test_fp16_is_taken_only_through_the_gate(u2netp: ModelFiles, tmp_path: Path) -> None:
    cuda_provider_or_skip()
    seg, choice = make_model_segmenter(u2netp.batched, device="gpu", runtime="fp16", cache_dir=tmp_path,
                                       images=images, use_tensorrt=False)
    gate = choice.gates[0]
    assert gate.runtime == "fp16" and gate.n == 3
    assert choice.runtime == ("fp16" if gate.passed else "fp32")
    seg.close()
    strict, refused = make_model_segmenter(u2netp.batched, device="gpu", runtime="fp16", cache_dir=tmp_path,
                                           images=images, gate=(1.01, 1.01), use_tensorrt=False)
    assert refused.runtime == "fp32" and isinstance(strict, OnnxSegmenter)
    strict.close()
