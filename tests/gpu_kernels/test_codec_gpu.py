"""GPU decode (DALI ``mixed``) and nvJPEG encode against their CPU twins.

Skipped without CuPy or a CUDA device. Tolerances: nvJPEG's IDCT and chroma upsampling
(and the hardware decoder's) differ from libjpeg-turbo's by a few levels at edges, so JPEG
parity is "mean |diff| < 1.5 and 99th percentile <= 8"; lossless sources (PNG) must match
exactly.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from PIL import Image
from skimage import data

from gpu_kernels.backends import Decoder, Encoder
from gpu_kernels.codec import CpuEncoder, DecoderChain, make_decoder, make_encoder
from gpu_kernels.presets import Preset
from schemas.errors import ErrorCode
from tests.gpu import cupy_or_skip

pytestmark = pytest.mark.gpu

cp: Any = cupy_or_skip()


def _save(array: np.ndarray, fmt: str, **kw: object) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(array).save(buf, fmt, **kw)
    return buf.getvalue()


def _photos() -> list[np.ndarray]:
    return [np.asarray(f()) for f in (data.coffee, data.astronaut, data.chelsea, data.rocket)]


def _assert_jpeg_parity(gpu: Any, cpu: np.ndarray) -> None:
    assert isinstance(gpu, cp.ndarray) and gpu.dtype == cp.uint8
    host = cp.asnumpy(gpu)
    assert host.shape == cpu.shape
    diff = np.abs(host.astype(np.int16) - cpu.astype(np.int16))
    assert diff.mean() < 1.5, diff.mean()
    assert np.percentile(diff, 99) <= 8, np.percentile(diff, 99)


@pytest.fixture(scope="module")
def cpu_decoder() -> Iterator[DecoderChain]:
    with DecoderChain("cpu", batch_size=8) as d:
        yield d


@pytest.fixture(scope="module", params=[0.0, 0.65, 1.0], ids=lambda v: f"hw{v}")
def gpu_decoder(request: pytest.FixtureRequest) -> Iterator[DecoderChain]:
    with DecoderChain("gpu", batch_size=8, hw_decoder_load=request.param) as d:
        yield d


def test_gpu_decoder_is_a_decoder(gpu_decoder: DecoderChain) -> None:
    assert isinstance(gpu_decoder, Decoder) and gpu_decoder.device == "gpu"
    assert isinstance(make_decoder("gpu"), DecoderChain)


def test_jpeg_decode_parity(gpu_decoder: DecoderChain, cpu_decoder: DecoderChain) -> None:
    exif = Image.Exif()
    exif[0x0112] = 6
    blobs = [_save(p, "JPEG", quality=90) for p in _photos()]
    blobs += [
        _save(_photos()[0], "JPEG", quality=90, progressive=True),
        _save(_photos()[1], "JPEG", quality=90, exif=exif),
        _save(np.asarray(Image.fromarray(_photos()[2]).convert("L")), "JPEG"),
    ]
    for gpu, cpu in zip(
        gpu_decoder.decode_batch(blobs), cpu_decoder.decode_batch(blobs), strict=True
    ):
        _assert_jpeg_parity(gpu, cpu)


def test_lossless_sources_match_exactly(gpu_decoder: DecoderChain, cpu_decoder: DecoderChain) -> None:
    photo = _photos()[0]
    rgba = np.dstack([photo, np.full(photo.shape[:2], 77, np.uint8)])
    blobs = [_save(photo, "PNG"), _save(rgba, "PNG")]
    gpu = gpu_decoder.decode_batch(blobs)
    cpu = cpu_decoder.decode_batch(blobs)
    for g, c in zip(gpu, cpu, strict=True):
        assert isinstance(g, cp.ndarray)
        assert np.array_equal(cp.asnumpy(g), c)
    assert gpu[1].shape == (400, 600, 4)


def test_bad_images_do_not_fail_the_gpu_batch(gpu_decoder: DecoderChain) -> None:
    good = _save(_photos()[1], "JPEG", quality=90)
    no_tables = good.replace(b"\xff\xdb", b"\xff\xef")  # passes sniff; nvJPEG must fail it
    blobs = [good, good[: len(good) // 2], b"", good, no_tables, b"%PDF-1.4 ....", good, no_tables]
    results = gpu_decoder.decode_batch(blobs)
    for i in (0, 3, 6):
        assert isinstance(results[i], cp.ndarray) and results[i].shape == (512, 512, 3)
    assert [getattr(results[i], "code", None) for i in (1, 2, 4, 5, 7)] == [
        ErrorCode.DECODE_FAILED,
        ErrorCode.DECODE_FAILED,
        ErrorCode.DECODE_FAILED,
        ErrorCode.UNSUPPORTED_FORMAT,
        ErrorCode.DECODE_FAILED,
    ]
    assert "DALI" in str(results[4])


def test_reduced_decode_matches_cpu_resize(gpu_decoder: DecoderChain) -> None:
    big = np.asarray(Image.fromarray(_photos()[1]).resize((2400, 1600)))
    blob = _save(big, "JPEG", quality=90)
    with DecoderChain("cpu", reduce="resize") as cpu:
        (c,) = cpu.decode_batch([blob], max_side=600)
    (g,) = gpu_decoder.decode_batch([blob], max_side=600)
    assert g.shape == c.shape == (400, 600, 3)
    _assert_jpeg_parity(g, c)


def test_decoded_arrays_survive_later_batches(gpu_decoder: DecoderChain) -> None:
    """Zero-copy hand-off: an earlier output must not be overwritten by the next run."""
    photos = _photos()
    (first,) = gpu_decoder.decode_batch([_save(photos[0], "JPEG", quality=90)])
    snapshot = first.copy()
    for p in photos[1:]:
        gpu_decoder.decode_batch([_save(p, "JPEG", quality=90)] * 8)
    assert bool((first == snapshot).all())


def test_nvjpeg_encode_reopens_in_pillow() -> None:
    encoder = make_encoder("gpu", gpu_min_pixels=0)
    assert isinstance(encoder, Encoder) and encoder.device == "gpu"
    photo = np.asarray(Image.fromarray(_photos()[1]).resize((1000, 1000)))
    blob = encoder.encode(cp.asarray(photo), Preset("p", 1000, 1000, quality=90))
    im = Image.open(io.BytesIO(blob))
    im.load()
    assert (im.format, im.mode, im.size) == ("JPEG", "RGB", (1000, 1000))
    cpu = np.asarray(Image.open(io.BytesIO(CpuEncoder().encode(photo, Preset("p", 1, 1)))))
    assert np.abs(np.asarray(im).astype(int) - photo).mean() < 3.0
    assert np.abs(cpu.astype(int) - photo).mean() < 3.0
    encoder.close()


def test_gpu_encoder_falls_back_to_cpu_for_png_and_small_jpeg() -> None:
    encoder = make_encoder("gpu", gpu_min_pixels=10**9)
    photo = _photos()[0]
    rgba = np.dstack([photo, np.full(photo.shape[:2], 200, np.uint8)])
    png = encoder.encode(cp.asarray(rgba), Preset("t", 600, 400, format="png"))
    assert np.array_equal(np.asarray(Image.open(io.BytesIO(png))), rgba)
    jpg = encoder.encode(cp.asarray(photo), Preset("j", 600, 400))
    assert jpg == CpuEncoder().encode(photo, Preset("j", 600, 400))
    encoder.close()


def test_every_format_decodes_on_the_gpu_like_on_the_cpu(gpu_decoder: DecoderChain) -> None:
    """Pillow-path formats are decoded on the CPU and uploaded: identical to the CPU twin."""
    from tests.corpus import mixed_folder

    files = mixed_folder()
    names = sorted(files)
    with DecoderChain("cpu", batch_size=8) as cpu_decoder:
        cpu = cpu_decoder.decode_batch([files[n] for n in names])
    gpu = gpu_decoder.decode_batch([files[n] for n in names])
    for name, g, c in zip(names, gpu, cpu, strict=True):
        assert isinstance(g, cp.ndarray) and isinstance(c, np.ndarray), (name, g, c)
        assert g.shape == c.shape, name
        if name.endswith(".jpg") and "p3" not in name:
            _assert_jpeg_parity(cp.asnumpy(g), c)
        else:
            assert np.array_equal(cp.asnumpy(g), c), name


def test_time_budget_applies_on_the_gpu() -> None:
    blob = _save(_photos()[1], "JPEG", quality=90)
    with DecoderChain("gpu", time_budget_s=1e-9) as d:
        (result,) = d.decode_batch([blob])
        assert getattr(result, "code", None) is ErrorCode.DECODE_FAILED and "over time budget" in str(result)
    with DecoderChain("gpu") as d:
        (again,) = d.decode_batch([blob])
    assert isinstance(again, cp.ndarray)
