"""Decode guards, DALI CPU decode and CPU encode (gpu_kernels.codec) on real photos."""

from __future__ import annotations

import io
import struct
import zlib
from collections.abc import Iterator

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image, ImageOps
from skimage import data

from gpu_kernels.backends import Decoder, Encoder
from gpu_kernels.codec import (
    CpuEncoder,
    DecoderChain,
    flatten_alpha,
    make_decoder,
    make_encoder,
    orient,
    reduced_size,
    sniff,
)
from gpu_kernels.presets import Preset
from schemas.errors import (
    DecodeFailed,
    ErrorCode,
    LightboxError,
    ProcessingFailed,
    TooLarge,
    UnsupportedFormat,
)

# ---- fixtures -----------------------------------------------------------------------------


def _save(image: Image.Image, fmt: str, **kw: object) -> bytes:
    buf = io.BytesIO()
    image.save(buf, fmt, **kw)
    return buf.getvalue()


def _jpeg(array: np.ndarray, **kw: object) -> bytes:
    return _save(Image.fromarray(array), "JPEG", quality=92, **kw)


def _with_orientation(array: np.ndarray, orientation: int) -> bytes:
    exif = Image.Exif()
    exif[0x0112] = orientation
    return _jpeg(array, exif=exif)


def _png_chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def _png_bomb(width: int, height: int) -> bytes:
    """A valid-looking 70-byte PNG whose IHDR claims ``width`` x ``height`` RGB pixels."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    idat = zlib.compress(b"\x00" * 64)
    return (
        b"\x89PNG\r\n\x1a\n"
        + _png_chunk(b"IHDR", ihdr)
        + _png_chunk(b"IDAT", idat)
        + _png_chunk(b"IEND", b"")
    )


def _mad(a: np.ndarray, b: np.ndarray) -> float:
    """Mean absolute difference of two same-shape uint8 images."""
    assert a.shape == b.shape, (a.shape, b.shape)
    return float(np.abs(a.astype(np.int16) - b.astype(np.int16)).mean())


def _pillow_decode(blob: bytes, mode: str = "RGB") -> np.ndarray:
    with Image.open(io.BytesIO(blob)) as im:
        return np.asarray(ImageOps.exif_transpose(im).convert(mode))


@pytest.fixture(scope="module")
def coffee() -> np.ndarray:
    return np.asarray(data.coffee())  # (400, 600, 3)


@pytest.fixture(scope="module")
def rgba(coffee: np.ndarray) -> np.ndarray:
    h, w = coffee.shape[:2]
    alpha = np.zeros((h, w), np.uint8)
    alpha[:, w // 3 :] = 255
    alpha[:, w // 3 : w // 2] = np.linspace(0, 255, w // 2 - w // 3, dtype=np.uint8)
    return np.dstack([coffee, alpha])


@pytest.fixture(scope="module")
def decoder() -> Iterator[DecoderChain]:
    with DecoderChain("cpu", batch_size=4, num_threads=2) as d:
        yield d


def _one(decoder: DecoderChain, blob: bytes, **kw: object) -> np.ndarray:
    (result,) = decoder.decode_batch([blob], **kw)  # type: ignore[arg-type]
    assert isinstance(result, np.ndarray), result
    assert result.dtype == np.uint8 and result.flags.c_contiguous
    return result


# ---- sniff: header guards ---------------------------------------------------------------


def test_sniff_reads_jpeg_png_webp_headers(coffee: np.ndarray, rgba: np.ndarray) -> None:
    img = Image.fromarray(coffee)
    base = sniff(_jpeg(coffee))
    assert (base.format, base.width, base.height, base.components) == ("jpeg", 600, 400, 3)
    assert not base.progressive and base.orientation == 1
    assert sniff(_jpeg(coffee, progressive=True)).progressive
    assert sniff(_save(img.convert("CMYK"), "JPEG")).components == 4
    assert sniff(_save(img.convert("L"), "JPEG")).components == 1
    rot = sniff(_with_orientation(coffee, 6))
    assert rot.orientation == 6 and rot.oriented_size == (400, 600)

    png = sniff(_save(Image.fromarray(rgba), "PNG"))
    assert (png.format, png.width, png.height, png.has_alpha) == ("png", 600, 400, True)
    assert not sniff(_save(img, "PNG")).has_alpha
    pal = img.convert("P")
    pal.info["transparency"] = 0
    assert sniff(_save(pal, "PNG")).has_alpha  # tRNS chunk

    lossy = sniff(_save(img, "WEBP", quality=80))
    assert (lossy.format, lossy.width, lossy.height, lossy.has_alpha) == ("webp", 600, 400, False)
    lossless = sniff(_save(Image.fromarray(rgba), "WEBP", lossless=True))
    assert (lossless.width, lossless.height, lossless.has_alpha) == (600, 400, True)
    exif = Image.Exif()
    exif[0x0112] = 1
    extended = sniff(_save(Image.fromarray(rgba), "WEBP", exif=exif))  # VP8X container
    assert (extended.width, extended.height, extended.has_alpha) == (600, 400, True)


def test_zero_bytes_is_decode_failed() -> None:
    with pytest.raises(DecodeFailed, match="empty payload"):
        sniff(b"")


def test_text_file_named_jpg_is_unsupported() -> None:
    with pytest.raises(UnsupportedFormat, match="HTML") as err:
        sniff(b"<html><body>404 Not Found</body></html>")
    assert err.value.code is ErrorCode.UNSUPPORTED_FORMAT
    assert "404" not in str(err.value) and "body" not in str(err.value)


@pytest.mark.parametrize(
    ("blob", "name"),
    [
        (b"%PDF-1.7\n" + b"\x00" * 40, "PDF"),
        (b"PK\x03\x04" + b"\x00" * 40, "ZIP"),
        (b"\x00\x00\x00\x0cjP  \r\n\x87\n" + b"\x00" * 20, "JPEG 2000"),
        (b"\x00\x00\x00\x1cftypmp42" + b"\x00" * 20, "ISO media"),
        (bytes(range(7, 40)), "unknown binary"),
    ],
)
def test_non_images_are_unsupported(blob: bytes, name: str) -> None:
    with pytest.raises(UnsupportedFormat, match=name):
        sniff(blob)


@pytest.mark.parametrize(
    ("blob", "name"),
    [
        (b"GIF89a\x01\x00\x01\x00\x00\x00\x00;", "GIF"),
        (b"BM" + b"\x00" * 40, "BMP"),
        (b"II*\x00" + b"\x00" * 20, "TIFF"),
        (b"\x00\x00\x00\x1cftypheic" + b"\x00" * 20, "heif"),
    ],
)
def test_broken_headers_of_supported_formats_are_decode_failed(blob: bytes, name: str) -> None:
    with pytest.raises(DecodeFailed, match=name):
        sniff(blob)


def test_byte_limit_is_too_large(coffee: np.ndarray) -> None:
    blob = _jpeg(coffee)
    with pytest.raises(TooLarge, match="bytes"):
        sniff(blob, max_bytes=len(blob) - 1)
    assert sniff(blob, max_bytes=len(blob)).width == 600


def test_png_pixel_bomb_is_too_large_from_the_header() -> None:
    bomb = _png_bomb(100_000, 100_000)
    assert len(bomb) < 100
    with pytest.raises(TooLarge, match="100000x100000"):
        sniff(bomb)


def test_jpeg_pixel_bomb_is_too_large(coffee: np.ndarray) -> None:
    blob = bytearray(_jpeg(coffee))
    sof = blob.index(b"\xff\xc0")
    struct.pack_into(">HH", blob, sof + 5, 60_000, 60_000)  # height, width
    with pytest.raises(TooLarge, match="60000x60000"):
        sniff(bytes(blob))
    with pytest.raises(TooLarge):
        sniff(_jpeg(coffee), max_pixels=600 * 400 - 1)


def test_truncated_headers_are_decode_failed(coffee: np.ndarray) -> None:
    jpg = _jpeg(coffee)
    sof = jpg.index(b"\xff\xc0")
    for cut in (3, 10, sof + 4):
        with pytest.raises(DecodeFailed, match="truncated"):
            sniff(jpg[:cut])
    png = _save(Image.fromarray(coffee), "PNG")
    with pytest.raises(DecodeFailed, match="truncated"):
        sniff(png[:20])
    with pytest.raises(DecodeFailed):
        sniff(b"RIFF\x00\x00\x00\x00WEBPVP8X")


def test_animated_webp_decodes_its_first_frame(decoder: DecoderChain, coffee: np.ndarray) -> None:
    frames = [Image.fromarray(coffee), Image.fromarray(coffee[::-1].copy())]
    blob = _save(frames[0], "WEBP", save_all=True, append_images=frames[1:], duration=100, lossless=True)
    info = sniff(blob)
    assert info.frames == 2 and info.animated
    assert np.array_equal(_one(decoder, blob), coffee)


# ---- decode -------------------------------------------------------------------------------


def test_decoder_satisfies_the_protocol(decoder: DecoderChain) -> None:
    assert isinstance(decoder, Decoder) and decoder.device == "cpu"
    assert isinstance(make_decoder("cpu", max_pixels=10), DecoderChain)


def test_jpeg_decode_matches_pillow(decoder: DecoderChain, coffee: np.ndarray) -> None:
    blob = _jpeg(coffee)
    out = _one(decoder, blob)
    assert out.shape == (400, 600, 3)
    assert _mad(out, _pillow_decode(blob)) < 1.0
    assert _mad(out, coffee) < 4.0


def test_bad_images_do_not_fail_their_batch_mates(decoder: DecoderChain, coffee: np.ndarray) -> None:
    good = [_jpeg(np.asarray(f())) for f in (data.coffee, data.astronaut, data.chelsea)]
    jpg = good[0]
    png = _save(Image.fromarray(coffee), "PNG")
    no_tables = jpg.replace(b"\xff\xdb", b"\xff\xef")  # DQT → APP15: passes sniff, DALI fails
    blobs = [
        good[0],
        jpg[: len(jpg) // 2],  # truncated body
        good[1],
        b"",
        b"this is not an image",
        _png_bomb(100_000, 100_000),
        no_tables,  # DALI names the failed sample: it alone is dropped from the run
        good[2],
        png[:-12],  # no IEND: DALI names no sample, so the run is redone one by one; Pillow reads it
        good[0],
        no_tables,
    ]
    results = decoder.decode_batch(blobs)  # batch_size=4: three DALI runs
    expected = {0: good[0], 2: good[1], 7: good[2], 9: good[0]}
    for i, blob in expected.items():
        assert isinstance(results[i], np.ndarray), (i, results[i])
        assert np.array_equal(results[i], _one(decoder, blob))
    codes = [getattr(r, "code", None) for r in results]
    assert codes[1] is ErrorCode.DECODE_FAILED and "truncated" in str(results[1])
    assert codes[3] is ErrorCode.DECODE_FAILED
    assert codes[4] is ErrorCode.UNSUPPORTED_FORMAT
    assert codes[5] is ErrorCode.TOO_LARGE
    for i in (6, 10):  # every decoder refuses a JPEG without quantization tables, each one named
        assert codes[i] is ErrorCode.DECODE_FAILED, results[i]
        assert all(f"{who}: " in str(results[i]) for who in ("DALI", "Pillow", "OpenCV")), results[i]
        assert "jpeg image (600x400" in str(results[i])
    # DALI refuses a PNG without its end chunk; the next decoder reads every pixel of it
    assert isinstance(results[8], np.ndarray) and np.array_equal(results[8], coffee)
    # The pipeline stays usable after the failures.
    assert _one(decoder, good[1]).shape == (512, 512, 3)


def test_jpeg_without_end_marker_fails_in_sniff(coffee: np.ndarray) -> None:
    jpg = _jpeg(coffee)
    for cut in (len(jpg) // 2, len(jpg) - 2):
        with pytest.raises(DecodeFailed, match="no end-of-image marker"):
            sniff(jpg[:cut])
    assert sniff(jpg + b"SEFT" * 100).width == 600  # data appended after EOI is fine


def test_corrupt_jpeg_fails_in_the_reduced_decode_path_too(coffee: np.ndarray) -> None:
    big = np.asarray(Image.fromarray(coffee).resize((1200, 800)))
    jpg = _jpeg(big)
    no_tables = jpg.replace(b"\xff\xdb", b"\xff\xef")
    with DecoderChain("cpu", reduce="dct") as d:
        results = d.decode_batch([jpg[: len(jpg) * 2 // 3], no_tables, jpg], max_side=600)
    assert isinstance(results[0], DecodeFailed) and "end-of-image" in str(results[0])
    assert isinstance(results[1], DecodeFailed) and "libjpeg-turbo" in str(results[1])
    assert isinstance(results[2], np.ndarray) and results[2].shape == (400, 600, 3)  # 1/2 scale


@pytest.mark.parametrize("orientation", range(1, 9))
def test_orient_matches_pillow_exif_transpose(coffee: np.ndarray, orientation: int) -> None:
    img = Image.fromarray(coffee)
    exif = img.getexif()
    exif[0x0112] = orientation
    img.info["exif"] = exif.tobytes()
    expected = np.asarray(
        ImageOps.exif_transpose(Image.open(io.BytesIO(_save(img, "PNG", exif=exif))))
    )
    assert np.array_equal(orient(coffee, orientation), expected)


@pytest.mark.parametrize("orientation", [3, 6, 8])
def test_exif_orientation_is_applied(
    decoder: DecoderChain, coffee: np.ndarray, orientation: int
) -> None:
    blob = _with_orientation(coffee, orientation)
    out = _one(decoder, blob)
    expected = _pillow_decode(blob)
    assert out.shape == expected.shape == ((600, 400, 3) if orientation != 3 else (400, 600, 3))
    assert _mad(out, expected) < 1.0


def test_cmyk_jpeg_decodes_to_rgb(decoder: DecoderChain, coffee: np.ndarray) -> None:
    blob = _save(Image.fromarray(coffee).convert("CMYK"), "JPEG", quality=95)
    out = _one(decoder, blob)
    assert out.shape == (400, 600, 3)
    assert _mad(out, coffee) < 6.0


def test_grayscale_jpeg_decodes_to_rgb(decoder: DecoderChain, coffee: np.ndarray) -> None:
    gray = np.asarray(Image.fromarray(coffee).convert("L"))
    out = _one(decoder, _jpeg(gray))
    assert out.shape == (400, 600, 3)
    assert np.array_equal(out[..., 0], out[..., 1]) and np.array_equal(out[..., 1], out[..., 2])
    assert _mad(out[..., 0], gray) < 3.0


def test_progressive_jpeg_decodes_like_baseline(decoder: DecoderChain, coffee: np.ndarray) -> None:
    prog = _one(decoder, _jpeg(coffee, progressive=True))
    base = _one(decoder, _jpeg(coffee))
    assert prog.shape == base.shape and _mad(prog, base) < 1.0


def test_png_with_alpha_keeps_alpha_exactly(decoder: DecoderChain, rgba: np.ndarray) -> None:
    out = _one(decoder, _save(Image.fromarray(rgba), "PNG"))
    assert np.array_equal(out, rgba)


def test_png_without_alpha_is_rgb_exactly(decoder: DecoderChain, coffee: np.ndarray) -> None:
    assert np.array_equal(_one(decoder, _save(Image.fromarray(coffee), "PNG")), coffee)


def test_gray_alpha_and_palette_transparency_pngs_give_rgba(
    decoder: DecoderChain, rgba: np.ndarray
) -> None:
    la = Image.fromarray(rgba).convert("LA")
    out = _one(decoder, _save(la, "PNG"))
    assert out.shape == (400, 600, 4)
    assert np.array_equal(out[..., 3], rgba[..., 3])
    pal = Image.fromarray(rgba[..., :3]).convert("P")
    pal.info["transparency"] = int(np.asarray(pal)[0, 0])
    out = _one(decoder, _save(pal, "PNG"))
    assert out.shape == (400, 600, 4) and out[0, 0, 3] == 0


def test_webp_decodes(decoder: DecoderChain, coffee: np.ndarray, rgba: np.ndarray) -> None:
    lossy = _one(decoder, _save(Image.fromarray(coffee), "WEBP", quality=90))
    assert lossy.shape == (400, 600, 3) and _mad(lossy, coffee) < 5.0
    lossless = _one(decoder, _save(Image.fromarray(rgba), "WEBP", lossless=True, exact=True))
    assert np.array_equal(lossless, rgba)


# ---- reduced-size decode ------------------------------------------------------------------


def test_reduced_size_keeps_the_longer_side_at_max_side() -> None:
    info = sniff(_png_bomb(6000, 4000), max_pixels=10**9)
    assert reduced_size(info, 800) == (533, 800)
    assert reduced_size(info, 3000) == (2000, 3000)
    assert reduced_size(info, 3001) is None  # more than half: full decode
    assert reduced_size(info, None) is None


@pytest.mark.parametrize("mode", ["dct", "resize"])
@pytest.mark.parametrize("orientation", [1, 6])
def test_reduced_decode_is_never_smaller_than_needed(mode: str, orientation: int) -> None:
    big = np.asarray(Image.fromarray(np.asarray(data.astronaut())).resize((2400, 1600)))
    blob = _with_orientation(big, orientation)
    full = _pillow_decode(blob)
    with DecoderChain("cpu", reduce=mode) as d:  # type: ignore[arg-type]
        out = _one(d, blob, max_side=500)
        untouched = _one(d, blob, max_side=1300)  # > half of 2400: full size
    assert max(out.shape[:2]) >= 500 and max(out.shape[:2]) < max(full.shape[:2]) // 2
    assert (out.shape[0] > out.shape[1]) == (full.shape[0] > full.shape[1])
    assert abs(out.shape[0] / out.shape[1] - full.shape[0] / full.shape[1]) < 0.01
    small = np.asarray(Image.fromarray(full).resize(out.shape[1::-1], Image.Resampling.BOX))
    assert _mad(out, small) < 4.0
    assert untouched.shape == full.shape


def test_reduced_decode_leaves_png_full_size_and_chunks_batches(coffee: np.ndarray) -> None:
    png = _save(Image.fromarray(coffee), "PNG")
    with DecoderChain("cpu", batch_size=2) as d:
        results = d.decode_batch([png] * 5, max_side=100)
    assert all(isinstance(r, np.ndarray) and r.shape == (400, 600, 3) for r in results)


# ---- encode -------------------------------------------------------------------------------


def _reopen(blob: bytes) -> Image.Image:
    im = Image.open(io.BytesIO(blob))
    im.load()
    return im


@pytest.fixture(scope="module")
def encoder() -> CpuEncoder:
    return CpuEncoder("cpu")


def test_encoder_satisfies_the_protocol(encoder: CpuEncoder) -> None:
    assert isinstance(encoder, Encoder) and encoder.device == "cpu"
    assert isinstance(make_encoder("cpu"), CpuEncoder)


def test_jpeg_round_trip_and_quality(encoder: CpuEncoder, coffee: np.ndarray) -> None:
    hi = encoder.encode(coffee, Preset("hi", 600, 400, quality=95))
    lo = encoder.encode(coffee, Preset("lo", 600, 400, quality=60))
    im = _reopen(hi)
    assert (im.format, im.mode, im.size) == ("JPEG", "RGB", (600, 400))
    assert len(lo) < len(hi)
    assert _mad(np.asarray(im), coffee) < 3.0
    assert hi == encoder.encode(coffee.copy(), Preset("hi", 600, 400, quality=95))  # deterministic


def test_rgba_to_jpeg_is_flattened_over_white(encoder: CpuEncoder, rgba: np.ndarray) -> None:
    before = rgba.copy()
    im = _reopen(encoder.encode(rgba, Preset("j", 600, 400)))
    assert (im.mode, im.size) == ("RGB", (600, 400))
    out = np.asarray(im)
    assert out[:, :150].mean() > 250  # alpha 0 → white
    assert _mad(out[:, 350:], rgba[:, 350:, :3]) < 4.0
    assert np.array_equal(rgba, before)  # input untouched
    assert np.array_equal(flatten_alpha(rgba)[:, 350:], rgba[:, 350:, :3])


@pytest.mark.parametrize("channels", [3, 4])
def test_png_round_trip_is_exact(encoder: CpuEncoder, rgba: np.ndarray, channels: int) -> None:
    image = np.ascontiguousarray(rgba[..., :channels])
    preset = Preset("p", 600, 400, format="png", background="transparent")
    im = _reopen(encoder.encode(image, preset))
    assert (im.format, im.mode, im.size) == ("PNG", "RGBA" if channels == 4 else "RGB", (600, 400))
    assert np.array_equal(np.asarray(im), image)


@pytest.mark.parametrize("channels", [3, 4])
def test_webp_round_trip(encoder: CpuEncoder, rgba: np.ndarray, channels: int) -> None:
    image = np.ascontiguousarray(rgba[..., :channels])
    im = _reopen(encoder.encode(image, Preset("w", 600, 400, format="webp", quality=90)))
    assert (im.format, im.mode, im.size) == ("WEBP", "RGBA" if channels == 4 else "RGB", (600, 400))
    out = np.asarray(im)
    assert _mad(out[..., :3][:, 350:], image[..., :3][:, 350:]) < 6.0
    if channels == 4:
        assert np.abs(out[..., 3].astype(int) - image[..., 3]).max() <= 2


def test_gray_image_encodes(encoder: CpuEncoder, coffee: np.ndarray) -> None:
    gray = np.ascontiguousarray(coffee[..., 1])
    im = _reopen(encoder.encode(gray, Preset("g", 600, 400)))
    assert (im.mode, im.size) == ("L", (600, 400))


def test_bad_encoder_input_is_processing_failed(encoder: CpuEncoder, coffee: np.ndarray) -> None:
    with pytest.raises(ProcessingFailed, match="uint8"):
        encoder.encode(coffee.astype(np.float32), Preset("x", 1, 1))
    with pytest.raises(ProcessingFailed, match=r"\(H, W, 3\)"):
        encoder.encode(coffee[..., :2], Preset("x", 1, 1))


# ---- robustness ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def samples(coffee: np.ndarray, rgba: np.ndarray) -> list[bytes]:
    img = Image.fromarray(coffee)
    return [
        _with_orientation(coffee, 6),
        _jpeg(coffee, progressive=True),
        _save(Image.fromarray(rgba), "PNG"),
        _save(img, "WEBP", quality=80),
        _save(Image.fromarray(rgba), "WEBP", lossless=True),
    ]


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    which=st.integers(0, 4),
    cut=st.integers(0, 400),
    flips=st.lists(st.tuples(st.integers(0, 399), st.integers(0, 255)), max_size=6),
)
def test_sniff_only_raises_project_errors(
    samples: list[bytes], which: int, cut: int, flips: list[tuple[int, int]]
) -> None:
    blob = bytearray(samples[which][: cut or None])
    for pos, value in flips:
        if pos < len(blob):
            blob[pos] = value
    try:
        info = sniff(bytes(blob))
    except LightboxError:
        return
    assert info.width > 0 and info.height > 0 and info.pixels <= 64_000_000


def test_mutated_files_never_raise_from_decode_batch(
    decoder: DecoderChain, samples: list[bytes]
) -> None:
    rng = np.random.default_rng(7)
    blobs = []
    for i in range(30):
        blob = bytearray(samples[i % len(samples)])
        if i % 3 == 0:
            blob = blob[: int(rng.integers(1, len(blob)))]
        for pos in rng.integers(0, len(blob), size=int(rng.integers(1, 8))):
            blob[int(pos)] = int(rng.integers(0, 256))
        blobs.append(bytes(blob))
    results = decoder.decode_batch([*blobs, samples[0]])
    assert len(results) == 31
    assert all(isinstance(r, np.ndarray | LightboxError) for r in results)
    assert isinstance(results[-1], np.ndarray) and results[-1].shape == (600, 400, 3)
