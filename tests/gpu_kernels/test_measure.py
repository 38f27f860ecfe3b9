"""Quality and compliance counts: the device path (whole batch, stacked by shape, one copy back)
run over NumPy as its array module gives the same integers, and so the same measures, as the
CPU twin that measures host arrays one item at a time."""

from __future__ import annotations

import io
from dataclasses import replace

import cv2
import numpy as np
import pytest
from PIL import Image, ImageDraw

from gpu_kernels.backends import RetouchOptions
from gpu_kernels.codec import CpuEncoder, make_decoder
from gpu_kernels.pipeline import ImagePipeline, Job, default_stages
from gpu_kernels.presets import Preset, load_presets
from gpu_kernels.retouch import CpuRetoucher
from gpu_kernels.segment import make_segmenter
from gpu_kernels.spans import SpanRecorder
from gpu_kernels.stages.base import Quality
from gpu_kernels.stages.compliance import ComplianceStage, border_white_share, compliance_from, source_cut
from gpu_kernels.stages.measure import _quality_rows, device_counts, host_counts, quality_of
from gpu_kernels.stages.quality import QualityStage, measure_quality


def _canvas(rng: np.random.Generator, h: int, w: int, channels: int = 3, *, empty: bool = False) -> np.ndarray:
    c = np.full((h, w, channels), 255, np.uint8)
    if channels == 4:
        c[..., 3] = 0
    if not empty:
        y0, y1, x0, x1 = h // 4, max(h // 4 + 1, 3 * h // 4), w // 5, max(w // 5 + 1, w - 1)
        c[y0:y1, x0:x1] = rng.integers(0, 256, (y1 - y0, x1 - x0, channels), dtype=np.uint8)
    return c


def test_device_counts_over_numpy_equal_the_host_counts() -> None:
    rng = np.random.default_rng(7)
    masks = [rng.integers(0, 256, (30, 40), dtype=np.uint8), None,
             np.pad(np.full((20, 40), 255, np.uint8), ((10, 0), (0, 0))),  # subject on three edges
             rng.integers(0, 256, (17, 9), dtype=np.uint8), rng.integers(0, 256, (30, 40), dtype=np.uint8)]
    canvases = [
        [_canvas(rng, 50, 60), _canvas(rng, 20, 20, 4)],
        [_canvas(rng, 50, 60, empty=True)],
        [_canvas(rng, 33, 21), _canvas(rng, 1, 5), _canvas(rng, 20, 20, 4, empty=True)],
        [_canvas(rng, 50, 60), np.full((8, 8, 3), 255, np.uint8)],
        [_canvas(rng, 1, 1), _canvas(rng, 2, 7, 4)],
    ]
    device = device_counts(np, masks, canvases)
    host = [host_counts(m, cs) for m, cs in zip(masks, canvases, strict=True)]
    assert device == host
    assert device[1].canvases[0].box is None and device[0].canvases[0].box is not None
    assert device_counts(np, masks, canvases, variants=False) == [replace(h, canvases=()) for h in host]
    preset = Preset("p", 8, 8, min_side=8)
    for c in device:
        q = quality_of(c)
        assert 0 <= q[0] <= 1 and 0 < q[1] <= 1 and q[2] >= 0
        for cv in c.canvases:
            compliance_from(cv, preset, c.mask)  # defined for every shape, empty canvases too


def test_the_counted_measures_are_the_published_ones() -> None:
    """The counts give what OpenCV and NumPy give on the host: coverage, whiteness, the variance
    of OpenCV's Laplacian of OpenCV's grey level, the border's white share and the frame cut."""
    rng = np.random.default_rng(3)
    img = cv2.GaussianBlur(rng.integers(0, 256, (90, 70, 3), dtype=np.uint8), (5, 5), 1.5)
    mask = rng.integers(0, 256, (40, 30), dtype=np.uint8)
    cov, white, sharp = quality_of(device_counts(np, [mask], [[img]], variants=False)[0])
    lap = cv2.Laplacian(cv2.cvtColor(img, cv2.COLOR_RGB2GRAY), cv2.CV_64F)
    border = np.concatenate([img[0], img[-1], img[:, 0], img[:, -1]]).astype(np.float64)
    assert cov == float((mask > 127).mean()) and white == pytest.approx(border.mean() / 255, rel=1e-12)
    assert sharp == pytest.approx(lap.var(), rel=1e-12)
    assert measure_quality(mask, img) == Quality(cov, white, sharp)
    (c,) = device_counts(np, [mask], [[img]])
    verdict = compliance_from(c.canvases[0], Preset("p", 70, 90), c.mask)
    assert verdict.white_border == border_white_share(img) and verdict.cut_off == source_cut(mask)


def test_the_device_grey_level_and_laplacian_are_opencvs_for_every_colour() -> None:
    r, g, b = np.meshgrid(np.arange(256), np.arange(256), np.arange(256), indexing="ij")
    every = np.stack([r, g, b], -1).astype(np.uint8).reshape(4096, 4096, 3)
    _border, s1, s2 = (int(v[0]) for v in _quality_rows(np, every[None]))
    lap = cv2.Laplacian(cv2.cvtColor(every, cv2.COLOR_RGB2GRAY), cv2.CV_32F).astype(np.int64)
    assert (s1, s2) == (int(lap.sum()), int((lap * lap).sum()))


def _photo(seed: int, size: tuple[int, int], *, cut: bool = False) -> bytes:
    img = Image.new("RGB", size, (232, 232, 228))
    w, h = size
    box = (w // 4, h // 3, 3 * w // 4, h + 50) if cut else (w // 4, h // 4, 3 * w // 4, 3 * h // 4)
    ImageDraw.Draw(img).ellipse(box, fill=(150, 30 + seed * 20, 40))
    buf = io.BytesIO()
    img.save(buf, format="JPEG", quality=95)
    return buf.getvalue()


def test_the_stages_device_path_over_numpy_gives_the_cpu_twins_results() -> None:
    """Two pipelines over the same batch (sources of two sizes, a cut product, a transparent and a
    contact-shadow preset): the default stages (host path) and quality/compliance forced onto the
    device path with NumPy as its array module."""
    book = load_presets()
    presets = [book["jd_main"], book["transparent_png"], book["catalog_shadow"], Preset("small", 300, 200)]
    decoder, retoucher, encoder = make_decoder("cpu"), CpuRetoucher(), CpuEncoder()
    classical = make_segmenter("classical")
    stages = default_stages(decoder, retoucher, encoder, None, classical)
    device = [QualityStage(np) if s.name == "quality" else ComplianceStage(np) if s.name == "compliance" else s
              for s in default_stages(decoder, retoucher, encoder, None, classical)]
    data = [_photo(0, (640, 480)), _photo(1, (640, 480), cut=True), _photo(2, (500, 700))]
    out = []
    for stage_list in (stages, device):
        pipe = ImagePipeline(decoder, retoucher, encoder, None, classical, stages=stage_list)
        jobs = [Job(d, presets, RetouchOptions(), SpanRecorder()) for d in data]
        out.append(pipe.run_batch(jobs))
    host, dev = out
    assert all(r.ok for r in host + dev)
    assert [r.quality for r in dev] == [r.quality for r in host]
    assert [[v.compliance for v in r.variants] for r in dev] == [[v.compliance for v in r.variants] for r in host]
    assert any(v.compliance is not None and v.compliance.cut_off for v in host[1].variants)
