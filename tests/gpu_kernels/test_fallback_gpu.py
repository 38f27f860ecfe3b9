"""The decoder fallbacks on the GPU decoder: what DALI's mixed decode refuses is read by Pillow
(then OpenCV) on the CPU and uploaded; the pixels equal the CPU decoder's. Skips without a GPU."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from gpu_kernels.codec import DecoderChain
from tests.corpus import odd_files, pillow_opens
from tests.gpu import cupy_or_skip

pytestmark = pytest.mark.gpu

cp: Any = cupy_or_skip()


def test_the_gpu_decoder_falls_back_like_the_cpu_one(tmp_path: Any) -> None:
    paths = odd_files(tmp_path)
    blobs = [p.read_bytes() for p in paths]
    with DecoderChain("gpu", batch_size=8) as gpu, DecoderChain("cpu", batch_size=8) as cpu:
        g, c = gpu.decode_batch(blobs), cpu.decode_batch(blobs)
    opened = {p.name for p, b in zip(paths, blobs, strict=True) if pillow_opens(b)}
    decoded = {p.name for p, r in zip(paths, g, strict=True) if isinstance(r, cp.ndarray)}
    assert opened <= decoded, sorted(opened - decoded)
    for p, gr, cr in zip(paths, g, c, strict=True):
        if p.name in ("tiff_1bit_raw.tif", "bmp_16_555.bmp"):  # DALI refuses both on the CPU
            assert isinstance(gr, cp.ndarray) and isinstance(cr, np.ndarray), p.name
            host = cp.asnumpy(gr)  # 5-bit channels: another decoder may widen them differently
            assert host.shape == cr.shape and np.abs(host.astype(int) - cr).max() <= 8, p.name
