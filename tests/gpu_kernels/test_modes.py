"""Every Pillow mode, in every format that stores it, at any small size (1x1 up to 300 px), through
the whole stage list in batches: each image decodes to what the later stages expect ((H, W, 3|4)
uint8, alpha only where there is transparency) and comes out as a variant — none is lost.

Also the shapes that broke a stage before: a palette with a transparent index, an animated GIF
with transparency and a disposal method whose first frame is smaller than the canvas, and a
one-row band holding a single opaque column (OpenCV's ``-209`` in ``compare``)."""

from __future__ import annotations

import io
from datetime import timedelta

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from gpu_kernels.backends import RetouchOptions
from gpu_kernels.codec import CpuEncoder, make_decoder
from gpu_kernels.pipeline import ImagePipeline, Job
from gpu_kernels.presets import Preset
from gpu_kernels.retouch import CpuRetoucher
from gpu_kernels.spans import SpanRecorder

PRESETS = [Preset("m_jpeg", 64, 64, "jpeg", 80), Preset("m_png_t", 48, 32, "png", background="transparent")]
# mode -> formats Pillow writes it in (and reads back)
WRITES: dict[str, tuple[str, ...]] = {
    "1": ("PNG", "BMP", "TIFF", "GIF"),
    "L": ("PNG", "BMP", "TIFF", "GIF", "WEBP"),
    "LA": ("PNG", "TIFF", "WEBP"),
    "P": ("PNG", "BMP", "TIFF", "GIF"),
    "PA": ("PNG",),  # a palette with an alpha table
    "RGB": ("PNG", "BMP", "TIFF", "GIF", "WEBP", "JPEG"),
    "RGBA": ("PNG", "BMP", "TIFF", "GIF", "WEBP"),
    "CMYK": ("TIFF", "JPEG"),
    "YCbCr": ("TIFF", "JPEG"),
    "LAB": ("TIFF",),
    "I;16": ("PNG", "TIFF"),
    "I;16B": ("TIFF",),
    "I": ("TIFF",),
    "F": ("TIFF",),
}
COMBOS = [(m, f) for m, fs in WRITES.items() for f in fs]


@pytest.fixture(scope="module")
def pipe() -> ImagePipeline:
    return ImagePipeline(make_decoder("cpu", batch_size=4), CpuRetoucher(), CpuEncoder())


def make_image(mode: str, w: int, h: int, seed: int, transparent: bool) -> Image.Image:
    rng = np.random.default_rng(seed)
    rgba = rng.integers(0, 256, (h, w, 4), dtype=np.uint8)
    if transparent:  # a clear frame around an opaque block, soft values inside
        rgba[..., 3] = 0
        rgba[h // 4: h - h // 4, w // 4: w - w // 4, 3] = rng.integers(1, 256, dtype=np.uint8)
    else:
        rgba[..., 3] = 255
    im = Image.fromarray(rgba, "RGBA")
    if mode in ("I;16", "I;16B", "I"):
        grey = (rng.integers(0, 65536, (h, w))).astype(np.uint16)
        im16 = Image.fromarray(grey.astype(">u2" if mode == "I;16B" else "<u2"))
        return im16.convert("I") if mode == "I" else im16
    if mode == "F":
        return Image.fromarray(rng.random((h, w), dtype=np.float32), "F")
    if mode == "P":
        return im.convert("RGB").quantize(16)
    if mode == "PA":  # stored as a palette with one alpha per entry (PNG tRNS), read back as P
        return im.convert("RGB").quantize(16)
    return im.convert(mode)


def encode(im: Image.Image, fmt: str, transparent: bool) -> bytes:
    buf = io.BytesIO()
    extra: dict[str, object] = {}
    if fmt == "GIF" and transparent and im.mode in ("P", "L"):
        extra["transparency"] = 0
    if fmt == "PNG" and im.mode == "P" and transparent:
        extra["transparency"] = bytes(range(0, 256, 17))  # an alpha per palette entry (PA)
    if fmt == "WEBP":
        extra["lossless"] = True
    im.save(buf, fmt, **extra)
    return buf.getvalue()


image_spec = st.tuples(st.sampled_from(COMBOS),
                       st.one_of(st.integers(1, 8), st.integers(1, 300)),
                       st.integers(1, 7) | st.integers(1, 300),
                       st.integers(0, 2**16), st.booleans())


def assert_all_processed(pipe: ImagePipeline, blobs: list[tuple[str, bytes]]) -> None:
    jobs = [Job(b, PRESETS, RetouchOptions(), SpanRecorder()) for _, b in blobs]
    ctx = pipe.start(jobs)
    pipe.run_lane(ctx, "decode")
    for i, (what, _) in enumerate(blobs):
        assert ctx.results[i].ok, (what, str(ctx.results[i].error))
        img = ctx.images[i]
        assert img.dtype == np.uint8 and img.ndim == 3 and img.shape[2] in (3, 4), (what, img.shape, img.dtype)
    pipe.run_lane(ctx, "device")
    pipe.run_lane(ctx, "output")
    for (what, _), res in zip(blobs, ctx.finalize(), strict=True):
        assert res.ok, (what, str(res.error))
        assert [(v.width, v.height) for v in res.variants] == [(64, 64), (48, 32)], what


@settings(max_examples=60, deadline=timedelta(seconds=20),
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(st.lists(image_spec, min_size=1, max_size=4))
def test_any_mode_any_small_size_in_batches(pipe: ImagePipeline,
                                            specs: list[tuple[tuple[str, str], int, int, int, bool]]) -> None:
    blobs = []
    for (mode, fmt), w, h, seed, transparent in specs:
        im = make_image(mode, w, h, seed, transparent)
        blobs.append((f"{mode} {fmt} {w}x{h} t={transparent}", encode(im, fmt, transparent)))
    assert_all_processed(pipe, blobs)


def animated_gif(first_smaller: bool, disposal: int) -> bytes:
    """Three palette frames, index 0 transparent; the first frame can cover only part of the canvas."""
    frames = []
    for k in range(3):
        size = (24, 16) if first_smaller and k == 0 else (40, 30)
        im = Image.new("P", size, 0)
        im.putpalette([0, 0, 0, 220, 30, 30, 30, 200, 30, 30, 30, 220] + [0] * 756)
        im.paste(1 + k, (2 + k, 2, size[0] - 3, size[1] - 3 - k))
        frames.append(im)
    buf = io.BytesIO()
    frames[0].save(buf, "GIF", save_all=True, append_images=frames[1:], transparency=0,
                   disposal=disposal, duration=40, loop=0)
    return buf.getvalue()


def test_the_shapes_that_broke_a_stage(pipe: ImagePipeline) -> None:
    one_col = np.zeros((17, 20, 4), np.uint8)
    one_col[2:12, 3:15] = (200, 30, 30, 255)
    one_col[16, 5] = (200, 30, 30, 255)  # the last 16-row band: one row, one opaque column
    pal = Image.new("P", (33, 21), 0)
    pal.putpalette([255, 255, 255, 200, 0, 0] + [0] * 762)
    pal.paste(1, (5, 3, 20, 15))
    blobs = [(f"gif first_smaller={s} disposal={d}", animated_gif(s, d)) for s in (False, True) for d in (0, 1, 2, 3)]
    blobs += [("one-column band png", encode(Image.fromarray(one_col, "RGBA"), "PNG", True)),
              ("one-column band gif", encode(Image.fromarray(one_col, "RGBA"), "GIF", True)),
              ("palette tRNS png", encode(pal, "PNG", True)),
              ("1x1 transparent", encode(Image.new("RGBA", (1, 1), (9, 9, 9, 0)), "PNG", True)),
              ("1x1 opaque", encode(Image.new("RGBA", (1, 1), (9, 9, 9, 255)), "PNG", True))]
    for k in range(0, len(blobs), 4):
        assert_all_processed(pipe, blobs[k:k + 4])
