"""TritonSegmenter against a real Triton Inference Server.

The server is pytriton's bundled ``tritonserver`` running u2netp through
``lightbox/devservers/triton_serve.py`` in Triton's own environment (Debian's /usr/bin/python3.11 with
nvidia-pytriton: its backend stub fails under other 3.11 builds). Without that environment the
server tests skip and say how to make one; the unreachable-server test needs only tritonclient.
CI builds that environment (``.ci/run``) and sets ``LIGHTBOX_TRITON_PYTHON``: then an unusable one
fails instead of skipping.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gpu_kernels.segment.onnx_runner import OnnxSegmenter
from lightbox.devservers.launch import free_port
from schemas.errors import ProcessingFailed

pytest.importorskip("tritonclient.http", reason="tritonclient is not installed (pip install 'lightbox[triton]')")

from gpu_kernels.segment.triton_runner import TritonSegmenter
from lightbox.devservers.triton_local import TritonServer, find_triton_python

pytestmark = pytest.mark.slow


def iou(a: np.ndarray, b: np.ndarray) -> float:
    fa, fb = a > 127, b > 127
    union = int((fa | fb).sum())
    return 1.0 if union == 0 else int((fa & fb).sum()) / union


def photos() -> list[np.ndarray]:
    import skimage.data

    return [skimage.data.astronaut(), skimage.data.coffee(), skimage.data.chelsea()]


@pytest.fixture(scope="module")
def triton(u2netp: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonServer]:
    python, why = find_triton_python()
    if python is None and os.environ.get("LIGHTBOX_TRITON_PYTHON"):
        pytest.fail(f"LIGHTBOX_TRITON_PYTHON is set (as CI sets it) but unusable: {why}")
    if python is None:
        pytest.skip(why)
    log = tmp_path_factory.mktemp("triton") / "triton.log"
    with TritonServer(python, u2netp.batched, http_port=free_port(), grpc_port=free_port(),
                      metrics_port=free_port(), max_batch=8, threads=2, log_path=log) as server:
        yield server


def test_triton_masks_equal_onnx_runtime_masks(triton: TritonServer, u2netp: Any) -> None:
    images = photos()
    with OnnxSegmenter(u2netp.batched, max_batch=4) as local, TritonSegmenter(triton.url, "u2netp") as remote:
        expected = local.segment_batch(images)
        got = remote.segment_batch(images)  # one request of 3 (a bucket of 4)
        singles = [remote.segment_batch([im])[0] for im in images]  # one request each
        assert remote.version.startswith("u2netp@triton:u2netp/")
    for image, want, batched, single in zip(images, expected, got, singles, strict=True):
        assert isinstance(want, np.ndarray) and isinstance(batched, np.ndarray) and isinstance(single, np.ndarray)
        assert batched.shape == single.shape == image.shape[:2] and batched.dtype == np.uint8
        assert iou(batched, want) >= 0.99 and iou(single, want) >= 0.99
        assert 0.02 < float((batched > 127).mean()) < 0.98  # a real mask, neither empty nor full


def test_triton_segmenter_keeps_per_item_errors(triton: TritonServer) -> None:
    good = photos()[1]
    with TritonSegmenter(triton.url, "u2netp") as remote:
        out = remote.segment_batch([good, np.zeros((4, 4), np.float32)])
    assert isinstance(out[0], np.ndarray) and isinstance(out[1], ProcessingFailed)


def test_worker_wiring_builds_the_triton_segmenter(triton: TritonServer) -> None:
    from agents.wiring import build_pipeline
    from streams.settings import Settings

    settings = Settings(segmenter="triton", triton_url=triton.url, triton_model="u2netp", device="cpu")
    pipeline, version = build_pipeline(settings, "cpu")
    assert version.startswith("u2netp@triton:")
    assert any(isinstance(v, TritonSegmenter) for v in vars(pipeline).values())


def test_unreachable_triton_is_a_segment_error_naming_the_url(tmp_path: Path) -> None:
    url = f"127.0.0.1:{free_port()}"  # nothing listens there
    with pytest.raises(ProcessingFailed) as err:
        TritonSegmenter(url, "u2netp", timeout_s=5)
    assert url in str(err.value) and err.value.stage == "segment"
