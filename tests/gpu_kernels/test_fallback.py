"""Decoder fallbacks: when DALI (or libjpeg-turbo, or Pillow) refuses a file another decoder
reads, the next one tries before a dead letter; the dead letter names every decoder's reason;
the header guards still stop bombs before any decoder runs; a decoder that sees more pixels
than the guard passed ends the chain."""

from __future__ import annotations

import io
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from PIL import Image

from gpu_kernels.codec import DecoderChain
from gpu_kernels.codec.opencv_decode import decode_opencv
from gpu_kernels.codec.pillow_decode import decode_first_frame
from gpu_kernels.codec.sniff import sniff
from schemas.errors import DecodeFailed, ErrorCode
from tests.corpus import odd_files, pillow_opens


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    paths = odd_files(tmp_path_factory.mktemp("odd"))
    return {p.name: p.read_bytes() for p in paths}


@pytest.fixture(scope="module")
def decoder() -> Iterator[DecoderChain]:
    with DecoderChain("cpu", batch_size=8, num_threads=2) as d:
        yield d


def pillow_rgb(blob: bytes) -> np.ndarray:
    with Image.open(io.BytesIO(blob)) as im:
        return np.asarray(im.convert("RGB"))


@pytest.mark.parametrize("name", ["tiff_1bit_raw.tif", "bmp_16_555.bmp"])
def test_a_file_dali_refuses_is_decoded_by_the_next_decoder(corpus: dict[str, bytes], decoder: DecoderChain,
                                                            name: str) -> None:
    (out,) = decoder.decode_batch([corpus[name]])
    assert isinstance(out, np.ndarray), out
    assert np.array_equal(out, pillow_rgb(corpus[name]))


def test_every_file_pillow_opens_is_decoded(corpus: dict[str, bytes], decoder: DecoderChain) -> None:
    names = sorted(corpus)
    results = decoder.decode_batch([corpus[n] for n in names])
    opened = {n for n in names if pillow_opens(corpus[n])}
    decoded = {n for n, r in zip(names, results, strict=True) if isinstance(r, np.ndarray)}
    assert len(names) >= 60 and opened <= decoded, sorted(opened - decoded)
    for n, r in zip(names, results, strict=True):
        if isinstance(r, np.ndarray):
            assert r.dtype == np.uint8 and r.ndim == 3 and r.shape[2] in (3, 4), n
        else:  # what no decoder reads names each decoder that tried
            assert r.code is ErrorCode.DECODE_FAILED and "Pillow: " in str(r), (n, str(r))


def test_a_bomb_is_stopped_before_any_decoder_runs(decoder: DecoderChain, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []

    def spy(name: str, real: Any) -> Any:
        def run(self: DecoderChain, job: Any) -> Any:
            calls.append(name)
            return real(self, job)
        return run

    for name in list(DecoderChain._DECODERS):
        monkeypatch.setitem(DecoderChain._DECODERS, name, spy(name, DecoderChain._DECODERS[name]))
    real_dali = DecoderChain._run_dali_budgeted

    def dali(self: DecoderChain, jobs: list[Any], *args: Any) -> None:
        calls.extend("dali" for _ in jobs)
        real_dali(self, jobs, *args)

    monkeypatch.setattr(DecoderChain, "_run_dali_budgeted", dali)
    ihdr = b"\x89PNG\r\n\x1a\n" + b"\0\0\0\rIHDR" + (100_000).to_bytes(4, "big") * 2 + b"\x08\x02\0\0\0"
    import zlib

    bomb = ihdr + zlib.crc32(ihdr[12:29]).to_bytes(4, "big") + b"\0\0\0\0IEND\xaeB`\x82"
    (out,) = decoder.decode_batch([bomb])
    assert getattr(out, "code", None) is ErrorCode.TOO_LARGE and calls == []
    # and a plain refusal does walk the chain: DALI, then Pillow, then OpenCV
    (bad,) = decoder.decode_batch([_png(np.zeros((8, 8, 3), np.uint8))[:-30] + b"\0" * 18])
    assert isinstance(bad, DecodeFailed) and calls == ["dali", "pillow", "opencv"], (calls, str(bad))


def test_opencv_refuses_more_pixels_than_the_guard_passed() -> None:
    small = _png(np.zeros((4, 4, 3), np.uint8))
    big = _png(np.zeros((64, 64, 3), np.uint8))
    info = sniff(small)
    with pytest.raises(DecodeFailed, match="header guard passed 4x4") as err:
        decode_opencv(big, info, 10_000)
    assert not hasattr(err.value, "reason")  # final: no further decoder would be tried


def test_the_opencv_path_normalises_like_the_pillow_path(corpus: dict[str, bytes]) -> None:
    for name in ("png_la.png", "png_16bit_grey.png", "bmp_1bit.bmp", "tiff_palette.tif", "png_adam7.png"):
        blob = corpus[name]
        out = decode_opencv(blob, sniff(blob), 1 << 30)
        ref = decode_first_frame(blob, sniff(blob), 1 << 30)  # the Pillow path: same normalisation
        assert out.shape == ref.shape and np.abs(out.astype(int) - ref).max() <= 1, name


def _png(arr: np.ndarray, **kw: Any) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, "PNG", **kw)
    return buf.getvalue()
