"""The CPU default decoder without DALI (``make_decoder("cpu")``: libjpeg-turbo + Pillow) against the
DALI CPU decoder it replaced as the default (``DecoderChain("cpu", dali=True)``): the same images to
within rounding, the same outcome for every hostile file, and messages that never echo payload bytes.
DALI is in the ``gpu`` extra (and in ``dev``, for this comparison); a CPU install decodes without it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from gpu_kernels.codec import DecoderChain, make_decoder
from schemas.errors import DecodeFailed, LightboxError
from tests.corpus import Hostile, _save, hostile_files, jpeg_scan_bomb, mixed_folder, photo
from tests.gpu_kernels.test_hostile_files import _assert_no_echo


def test_make_decoder_on_cpu_needs_no_dali() -> None:
    d = make_decoder("cpu")
    assert d.dali is False and d.version == "cpu-decode-1"
    assert make_decoder("gpu").dali is True
    with pytest.raises(ValueError, match="CPU only"):
        DecoderChain("gpu", dali=False)


def test_same_pixels_as_dali_on_the_catalog_and_every_format(catalog: list[Path]) -> None:
    blobs = {p.name: p.read_bytes() for p in catalog} | mixed_folder()
    with make_decoder("cpu") as plain, DecoderChain("cpu", dali=True) as dali:
        for max_side in (None, 400):
            a = plain.decode_batch(list(blobs.values()), max_side=max_side)
            b = dali.decode_batch(list(blobs.values()), max_side=max_side)
            for name, x, y in zip(blobs, a, b, strict=True):
                if isinstance(y, LightboxError):
                    assert isinstance(x, LightboxError) and x.code == y.code, (name, x, y)
                    continue
                assert isinstance(x, np.ndarray), (name, x)
                assert x.shape == y.shape and x.dtype == y.dtype == np.uint8, (name, x.shape, y.shape)
                diff = np.abs(x.astype(np.int16) - y.astype(np.int16))
                assert int(diff.max()) == 0, (name, float(diff.mean()), int(diff.max()))  # pixel-identical


@pytest.mark.parametrize("case", hostile_files(), ids=lambda h: h.name)
def test_hostile_files_reach_the_same_outcome_without_dali(case: Hostile) -> None:
    blob = case.make()
    with make_decoder("cpu") as d:
        (got,) = d.decode_batch([blob])
    outcome = "output" if isinstance(got, np.ndarray) else got.code.value
    assert outcome == case.outcome, got
    if isinstance(got, LightboxError):
        _assert_no_echo(blob, str(got))


def _thumbs() -> list[bytes]:
    """Thumbnails of every kind the pool decodes (plain and progressive JPEG, PNG, WebP, RGBA)."""
    out = []
    for k, (fmt, kw) in enumerate([("JPEG", {"quality": 90}), ("JPEG", {"progressive": True}), ("PNG", {}),
                                   ("WEBP", {"quality": 85}), ("PNG", {}), ("JPEG", {"quality": 70})]):
        im = Image.fromarray(photo(64 + 16 * k, 48 + 8 * k))
        out.append(_save(im.convert("RGBA") if k == 4 else im, fmt, **kw))
    return out


def test_thumbnails_decoded_in_chunks_equal_one_by_one_and_a_bad_one_fails_alone() -> None:
    thumbs = _thumbs()
    bad = thumbs[2][: len(thumbs[2]) // 2]  # a PNG cut in the middle: its header passes, no decoder reads it
    batch = [*thumbs[:3], bad, mixed_folder()["jpeg.jpg"], *thumbs[3:]]  # one 600x400 photo among them
    with make_decoder("cpu") as d:
        together = d.decode_batch(batch)
        alone = [d.decode_batch([blob])[0] for blob in batch]
    for k, (x, y) in enumerate(zip(together, alone, strict=True)):
        if isinstance(y, LightboxError):
            assert isinstance(x, LightboxError) and x.code == y.code, (k, x, y)
            continue
        assert isinstance(x, np.ndarray) and np.array_equal(x, y), k
    assert isinstance(together[3], DecodeFailed)
    assert all(isinstance(x, np.ndarray) for k, x in enumerate(together) if k != 3)


def test_a_slow_thumbnail_is_isolated_from_its_chunk_mates() -> None:
    slow = jpeg_scan_bomb(256, 50_000)  # ~0.9 s in libjpeg-turbo with the scan guard lifted
    thumbs = _thumbs()
    batch = [*thumbs[:3], slow, *thumbs[3:]]
    with DecoderChain("cpu", dali=False, max_scans=10**6, max_markers=10**6, time_budget_s=0.1) as d:
        results = d.decode_batch(batch)
        again = d.decode_batch(thumbs[:2])  # the decoder is usable after abandoning a chunk
    assert isinstance(results[3], DecodeFailed) and "over time budget" in results[3].message
    assert all(isinstance(r, np.ndarray) for k, r in enumerate(results) if k != 3), results
    assert all(isinstance(r, np.ndarray) for r in again)


def test_a_chunk_over_budget_fails_each_thumbnail_as_over_budget() -> None:
    with DecoderChain("cpu", dali=False, time_budget_s=1e-9) as d:  # below any decode
        results = d.decode_batch(_thumbs())
    assert all(isinstance(r, DecodeFailed) and "over time budget" in r.message for r in results), results
