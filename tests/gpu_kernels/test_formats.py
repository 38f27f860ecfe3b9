"""Every format suppliers send decodes to the right pixels, and every guard
(bytes, pixels, frames, time) applies to each of them."""

from __future__ import annotations

import io
from collections.abc import Iterator

import numpy as np
import pytest
from PIL import Image, ImageCms

from gpu_kernels.codec import DaliDecoder, sniff
from gpu_kernels.codec.pillow_decode import is_srgb, safe_reason
from schemas.errors import DecodeFailed, ErrorCode, LightboxError, TooLarge
from tests.corpus import display_p3_icc, mixed_folder, p3_to_srgb_reference, photo, png, tiff


@pytest.fixture(scope="module")
def files() -> dict[str, bytes]:
    return mixed_folder()


@pytest.fixture(scope="module")
def rgb() -> np.ndarray:
    return photo()


@pytest.fixture(scope="module")
def decoder() -> Iterator[DaliDecoder]:
    with DaliDecoder("cpu", batch_size=4, num_threads=2) as d:
        yield d


def _one(decoder: DaliDecoder, blob: bytes) -> np.ndarray:
    (result,) = decoder.decode_batch([blob])
    assert isinstance(result, np.ndarray), result
    assert result.dtype == np.uint8 and result.flags.c_contiguous
    return result


def _mad(a: np.ndarray, b: np.ndarray) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    return float(np.abs(a.astype(np.int16) - b.astype(np.int16)).mean())


# ---- headers ----------------------------------------------------------------------------------

HEADERS = {
    "jpeg_cmyk.jpg": ("jpeg", 4, 8, 1),
    "jpeg_p3.jpg": ("jpeg", 3, 8, 1),
    "png_16bit.png": ("png", 3, 16, 1),
    "apng.png": ("png", 3, 8, 3),
    "tiff_8bit.tif": ("tiff", 3, 8, 1),
    "tiff_16bit.tif": ("tiff", 3, 16, 1),
    "tiff_multipage.tif": ("tiff", 3, 8, 2),
    "tiff_gray16_be.tif": ("tiff", 1, 16, 1),
    "bmp.bmp": ("bmp", 3, 8, 1),
    "gif_animated.gif": ("gif", 3, 8, 2),
    "heic.heic": ("heif", 3, 8, 1),
    "avif.avif": ("avif", 3, 8, 1),
}


@pytest.mark.parametrize("name", sorted(HEADERS))
def test_sniff_reads_each_format(files: dict[str, bytes], name: str) -> None:
    info = sniff(files[name])
    fmt, components, depth, frames = HEADERS[name]
    size = (64, 64) if name == "apng.png" else (600, 400)
    assert (info.format, info.width, info.height) == (fmt, *size)
    assert (info.components, info.bit_depth, info.frames) == (components, depth, frames)
    assert info.has_icc == (name == "jpeg_p3.jpg")


def test_decoded_nbytes_counts_depth_and_the_pillow_path(files: dict[str, bytes]) -> None:
    plain = sniff(files["jpeg.jpg"])
    assert plain.decoded_nbytes == plain.pixels * 6 + len(files["jpeg.jpg"])  # DALI output, host copy, input
    deep = sniff(png(8000, 8000, depth=16))
    assert deep.decoded_nbytes >= deep.pixels * 7 > deep.pixels * 3  # measured peak: 7 B/px


# ---- pixels -----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["tiff_8bit.tif", "tiff_16bit.tif", "tiff_multipage.tif", "tiff_lzw.tif", "bmp.bmp"])
def test_lossless_formats_decode_exactly(decoder: DaliDecoder, files: dict[str, bytes], rgb: np.ndarray,
                                         name: str) -> None:
    assert np.array_equal(_one(decoder, files[name]), rgb)  # 16-bit: v * 257 >> 8 == v; multi-page: page 1


def test_16bit_png_keeps_the_high_byte(decoder: DaliDecoder, files: dict[str, bytes], rgb: np.ndarray) -> None:
    out = _one(decoder, files["png_16bit.png"])
    assert out.shape == (400, 600, 3)
    assert np.array_equal(out, np.broadcast_to(rgb[200], out.shape))


def test_16bit_gray_tiff_is_scaled_not_clipped(decoder: DaliDecoder, files: dict[str, bytes],
                                               rgb: np.ndarray) -> None:
    out = _one(decoder, files["tiff_gray16_be.tif"])
    # Pillow's own I;16 → L conversion clips at 255: nearly everything would be white.
    assert np.array_equal(out, np.repeat(rgb[..., 1:2], 3, axis=2))


@pytest.mark.parametrize("name", ["bmp_8bit.bmp", "gif.gif", "gif_animated.gif"])
def test_palette_formats_decode_their_first_frame(decoder: DaliDecoder, files: dict[str, bytes], name: str) -> None:
    with Image.open(io.BytesIO(files[name])) as im:
        expected = np.asarray(im.convert("RGB"))  # frame 0
    out = _one(decoder, files[name])
    assert np.array_equal(out, expected)


def test_apng_decodes_its_default_image(decoder: DaliDecoder, files: dict[str, bytes]) -> None:
    assert np.array_equal(_one(decoder, files["apng.png"]), np.zeros((64, 64, 3), np.uint8))  # later frames: 0x7f


@pytest.mark.parametrize(("name", "limit"), [("heic.heic", 4.0), ("avif.avif", 6.0)])
def test_heic_and_avif_decode(decoder: DaliDecoder, files: dict[str, bytes], rgb: np.ndarray, name: str,
                              limit: float) -> None:
    assert _mad(_one(decoder, files[name]), rgb) < limit


def test_alpha_survives_tiff_and_16bit_png(decoder: DaliDecoder, rgb: np.ndarray) -> None:
    rgba = np.dstack([rgb, np.tile(np.arange(600, dtype=np.uint16) * 255 // 599, (400, 1)).astype(np.uint8)])
    assert np.array_equal(_one(decoder, tiff([rgba])), rgba)
    row = (rgba[100].astype(">u2") * 257).tobytes()
    out = _one(decoder, png(600, 400, depth=16, colour=6, row=row))
    assert np.array_equal(out, np.broadcast_to(rgba[100], out.shape))


def test_exif_orientation_of_a_tiff_is_applied(decoder: DaliDecoder, rgb: np.ndarray) -> None:
    buf = io.BytesIO()
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90° clockwise to display
    Image.fromarray(rgb).save(buf, "TIFF", exif=exif)
    info = sniff(buf.getvalue())
    assert info.orientation == 6 and info.oriented_size == (400, 600)
    assert np.array_equal(_one(decoder, buf.getvalue()), np.rot90(rgb, -1))


def test_heic_rotation_is_applied_once(decoder: DaliDecoder) -> None:
    import pillow_heif

    pillow_heif.register_heif_opener()
    small = photo(120, 80)
    exif = Image.Exif()
    exif[0x0112] = 6  # pillow-heif stores it as irot; libheif rotates, EXIF says 1 afterwards
    buf = io.BytesIO()
    Image.fromarray(small).save(buf, "HEIF", quality=95, exif=exif.tobytes())
    assert sniff(buf.getvalue()).oriented_size == (80, 120)
    assert _mad(_one(decoder, buf.getvalue()), np.rot90(small, -1)) < 5.0


# ---- colour -----------------------------------------------------------------------------------


def _swatches() -> np.ndarray:
    """Saturated and mid colours where P3 and sRGB differ most, then a photo strip."""
    levels = np.array([0, 40, 128, 200, 255], np.uint8)
    grid = np.stack(np.meshgrid(levels, levels, levels, indexing="ij"), -1).reshape(-1, 3)
    tiles = np.repeat(np.repeat(grid.reshape(5, 25, 3), 8, axis=0), 8, axis=1)  # (40, 200, 3)
    return np.concatenate([tiles, photo(200, 60)], axis=0)


def test_icc_profiles_are_recognised() -> None:
    srgb = ImageCms.ImageCmsProfile(ImageCms.createProfile("sRGB")).tobytes()
    assert is_srgb(srgb)
    assert not is_srgb(display_p3_icc())
    assert is_srgb(b"not a profile")  # unreadable: ignored, never fatal


def test_display_p3_png_matches_the_reference_conversion(decoder: DaliDecoder) -> None:
    src = _swatches()
    buf = io.BytesIO()
    Image.fromarray(src).save(buf, "PNG", icc_profile=display_p3_icc())
    out = _one(decoder, buf.getvalue())
    ref = p3_to_srgb_reference(src)
    diff = np.abs(out.astype(np.int16) - ref.astype(np.int16))
    assert diff.max() <= 2, diff.max()
    assert np.abs(src.astype(np.int16) - ref.astype(np.int16)).max() > 20  # the conversion is visible


def test_display_p3_jpeg_matches_the_reference_conversion(decoder: DaliDecoder) -> None:
    src = _swatches()
    buf = io.BytesIO()
    Image.fromarray(src).save(buf, "JPEG", quality=100, subsampling=0, icc_profile=display_p3_icc())
    with Image.open(io.BytesIO(buf.getvalue())) as im:
        unmanaged = np.asarray(im.convert("RGB"))
    out = _one(decoder, buf.getvalue())
    diff = np.abs(out.astype(np.int16) - p3_to_srgb_reference(unmanaged).astype(np.int16))
    assert diff.max() <= 2 and _mad(out, unmanaged) > 2


def test_srgb_tagged_jpeg_decodes_like_an_untagged_one(decoder: DaliDecoder, rgb: np.ndarray) -> None:
    srgb = ImageCms.ImageCmsProfile(ImageCms.createProfile("sRGB")).tobytes()
    tagged, plain = io.BytesIO(), io.BytesIO()
    Image.fromarray(rgb).save(tagged, "JPEG", quality=90, icc_profile=srgb)
    Image.fromarray(rgb).save(plain, "JPEG", quality=90)
    assert sniff(tagged.getvalue()).has_icc
    assert np.array_equal(_one(decoder, tagged.getvalue()), _one(decoder, plain.getvalue()))


# ---- every guard, every format ---------------------------------------------------------------

ONE_OF_EACH = ["jpeg.jpg", "png.png", "webp.webp", "tiff_8bit.tif", "bmp.bmp", "gif.gif", "heic.heic", "avif.avif"]
ANIMATED = ["apng.png", "tiff_multipage.tif", "gif_animated.gif"]


def _code(result: object) -> ErrorCode | None:
    return result.code if isinstance(result, LightboxError) else None


@pytest.mark.parametrize("name", ONE_OF_EACH)
def test_byte_and_pixel_guards_apply_to_each_format(files: dict[str, bytes], name: str) -> None:
    blob = files[name]
    info = sniff(blob)
    with pytest.raises(TooLarge, match="bytes"):
        sniff(blob, max_bytes=len(blob) - 1)
    with pytest.raises(TooLarge, match="pixels"):
        sniff(blob, max_pixels=info.pixels - 1)
    with DaliDecoder("cpu", max_pixels=info.pixels - 1) as d:
        assert _code(d.decode_batch([blob])[0]) is ErrorCode.TOO_LARGE


@pytest.mark.parametrize("name", [*ANIMATED, "webp_animated"])
def test_frame_guard_applies_to_each_animated_format(files: dict[str, bytes], rgb: np.ndarray, name: str) -> None:
    if name == "webp_animated":
        buf = io.BytesIO()
        frames = [Image.fromarray(rgb), Image.fromarray(rgb[::-1].copy())]
        frames[0].save(buf, "WEBP", save_all=True, append_images=frames[1:], duration=100)
        blob = buf.getvalue()
    else:
        blob = files[name]
    assert sniff(blob).frames >= 2
    with pytest.raises(TooLarge, match="frames"):
        sniff(blob, max_frames=1)


@pytest.fixture(scope="module")
def large() -> Image.Image:
    return Image.fromarray(photo(1600, 1200))


@pytest.mark.parametrize("fmt", ["JPEG", "PNG", "WEBP", "TIFF", "BMP", "GIF", "HEIF", "AVIF"])
def test_time_budget_applies_to_each_format(large: Image.Image, fmt: str) -> None:
    if fmt == "HEIF":
        import pillow_heif

        pillow_heif.register_heif_opener()
    buf = io.BytesIO()
    (large.quantize(64) if fmt == "GIF" else large).save(buf, fmt)
    # A nanosecond is far below any 2 MP decode (milliseconds even for raw TIFF/BMP), so the
    # item overruns — on the DALI path as on the Pillow path.
    with DaliDecoder("cpu", time_budget_s=1e-9) as d:
        (result,) = d.decode_batch([buf.getvalue()])
    assert isinstance(result, DecodeFailed) and "over time budget" in result.message


def test_a_slow_item_is_isolated_and_its_batch_mates_go_on(files: dict[str, bytes]) -> None:
    from tests.corpus import jpeg_scan_bomb

    slow = jpeg_scan_bomb(1024, 60_000)  # ~3.5 s in libjpeg-turbo with the scan guard lifted: 7x the run budget
    batch = [files["jpeg.jpg"], slow, files["png.png"], files["tiff_8bit.tif"], files["webp.webp"]]
    with DaliDecoder("cpu", batch_size=8, max_scans=10**6, max_markers=10**6, time_budget_s=0.1) as d:
        results = d.decode_batch(batch)
        again = d.decode_batch([files["jpeg.jpg"]])  # the decoder is usable after abandoning a run
    assert isinstance(results[1], DecodeFailed) and "over time budget" in results[1].message
    assert all(isinstance(r, np.ndarray) for i, r in enumerate(results) if i != 1), results
    assert isinstance(again[0], np.ndarray)


def test_safe_reason_drops_bytes_literals() -> None:
    err = SyntaxError("not a TIFF file (header b'root:x:0:0' not valid)")
    assert "root" not in safe_reason(err) and "<bytes>" in safe_reason(err)
