"""The CPU default decoder without DALI (``make_decoder("cpu")``: libjpeg-turbo + Pillow) against the
DALI CPU decoder it replaced as the default (``DaliDecoder("cpu", dali=True)``): the same images to
within rounding, the same outcome for every hostile file, and messages that never echo payload bytes.
DALI is in the ``gpu`` extra (and in ``dev``, for this comparison); a CPU install decodes without it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gpu_kernels.codec import DaliDecoder, make_decoder
from schemas.errors import LightboxError
from tests.corpus import Hostile, hostile_files, mixed_folder
from tests.gpu_kernels.test_hostile_files import _assert_no_echo


def test_make_decoder_on_cpu_needs_no_dali() -> None:
    d = make_decoder("cpu")
    assert d.dali is False and d.version == "cpu-decode-1"
    assert make_decoder("gpu").dali is True
    with pytest.raises(ValueError, match="CPU only"):
        DaliDecoder("gpu", dali=False)


def test_same_pixels_as_dali_on_the_catalog_and_every_format(catalog: list[Path]) -> None:
    blobs = {p.name: p.read_bytes() for p in catalog} | mixed_folder()
    with make_decoder("cpu") as plain, DaliDecoder("cpu", dali=True) as dali:
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
