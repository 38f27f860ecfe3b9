"""The GPU decoder chain: DALI, else torchvision's nvJPEG, else a one-line error at start.

torchvision's decoder runs here on its CPU device (same routing and conversion code as on
CUDA), where torchvision is installed; its GPU run is in test_codec_gpu.py's company."""

from __future__ import annotations

import importlib.util

import cv2
import numpy as np
import pytest

import gpu_kernels.codec as codec
from gpu_kernels.codec import make_decoder
from schemas.errors import LightboxError


def test_gpu_mode_without_any_gpu_decoder_fails_at_start_with_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(codec, "_dali_installed", lambda: False)
    monkeypatch.setattr("gpu_kernels.codec.torch_decode.torchvision_gpu_decode_available",
                        lambda: "torchvision is not installed (torchvision)")
    with pytest.raises(ValueError) as err:
        make_decoder("gpu")
    text = str(err.value)
    assert "\n" not in text and "DALI" in text and "torchvision" in text and "lightbox[gpu]" in text


def test_gpu_mode_without_dali_takes_torchvision_where_it_decodes_on_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(codec, "_dali_installed", lambda: False)
    monkeypatch.setattr("gpu_kernels.codec.torch_decode.torchvision_gpu_decode_available", lambda: None)
    assert codec.gpu_decoder_choice() == ("torchvision", "")
    monkeypatch.setattr(codec, "_dali_installed", lambda: True)
    assert codec.gpu_decoder_choice() == ("dali", "")


def _jpeg(h: int, w: int, seed: int, gray: bool = False) -> bytes:
    rng = np.random.default_rng(seed)
    img = cv2.resize(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8), (w, h), interpolation=cv2.INTER_CUBIC)
    if gray:
        img = cv2.cvtColor(img, cv2.COLOR_BGR2GRAY)
    ok, buf = cv2.imencode(".jpg", img, [cv2.IMWRITE_JPEG_QUALITY, 90])
    assert ok
    return buf.tobytes()


def _png_rgba(h: int, w: int) -> bytes:
    img = np.zeros((h, w, 4), np.uint8)
    img[..., 1] = 200
    img[h // 4 :, :, 3] = 255
    ok, buf = cv2.imencode(".png", img)
    assert ok
    return buf.tobytes()


@pytest.mark.skipif(importlib.util.find_spec("torchvision") is None, reason="torchvision is not installed")
def test_torchvision_decoder_matches_the_cpu_decoder() -> None:
    from gpu_kernels.codec.torch_decode import TorchvisionDecoder

    blobs = [_jpeg(120, 160, 1), _jpeg(97, 61, 2, gray=True), _png_rgba(40, 30), b"not an image", _jpeg(64, 64, 3)]
    with TorchvisionDecoder("gpu", torch_device="cpu") as tv, make_decoder("cpu") as ref:
        got, want = tv.decode_batch(blobs), ref.decode_batch(blobs)
    for g, w in zip(got, want, strict=True):
        if isinstance(w, LightboxError):
            assert isinstance(g, LightboxError)
            continue
        assert isinstance(g, np.ndarray) and g.shape == w.shape and g.dtype == np.uint8
        assert int(np.abs(g.astype(np.int16) - w).max()) <= 2  # both libjpeg; IDCT rounding may differ
