"""Image files for the format and hostile-file tests, made here (nothing downloaded).

- :func:`display_p3_icc` — a Display P3 ICC v2 profile built from the primaries (no LittleCMS).
- :func:`tiff`, :func:`png` — small writers for what Pillow cannot write: 16-bit RGB TIFF,
  multi-page TIFF, 16-bit PNG streamed through zlib, APNG with any frame count.
- :func:`mixed_folder` — one file of each format suppliers send (the share-processed probe).
- :func:`hostile_files` — bombs and broken files of each format, each with the outcome it must
  reach (an output, or a dead letter with its code).
- :func:`odd_files` — odd but valid (or slightly damaged) files, written from scikit-image's
  photographs with Pillow, OpenCV and tifffile: BMP variants (1/4/8/16/24/32-bit, top-down, RLE8,
  V5 header), TIFF compressions and layouts (LZW, Deflate, PackBits, JPEG, CCITT G3/G4, tiled,
  planar, predictor, 16-bit, float, CMYK, YCbCr, multi-page), GIFs (animated with transparency
  and each disposal method, first frame smaller than the canvas, interlaced), PNG modes (1/2/4-bit
  palettes, tRNS, LA, 16-bit, Adam7) and mutations of real photos (bit flips inside a JPEG's
  entropy data, trailing garbage, a PNG with a bad CRC, a TIFF strip cut short...);
  :func:`pillow_opens` says which of them Pillow alone opens (``bench/bench_decode.py odd``).

``python -m tests.corpus DIR`` writes the three sets into ``DIR/mixed``, ``DIR/hostile`` and ``DIR/odd``.
"""

from __future__ import annotations

import io
import struct
import sys
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

__all__ = [
    "SRGB_TO_XYZ",
    "Hostile",
    "display_p3_icc",
    "hostile_files",
    "jpeg_scan_bomb",
    "mixed_folder",
    "odd_files",
    "p3_to_srgb_reference",
    "photo",
    "pillow_opens",
    "png",
    "tiff",
]

# ---- colour -----------------------------------------------------------------------------------

_D65 = (0.3127, 0.3290)
_D50_XYZ = np.array([0.9642, 1.0, 0.8249])
_BRADFORD = np.array([[0.8951, 0.2664, -0.1614], [-0.7502, 1.7135, 0.0367], [0.0389, -0.0685, 1.0296]])


def _rgb_to_xyz(primaries: tuple[tuple[float, float], ...], white: tuple[float, float]) -> np.ndarray:
    """The RGB → XYZ matrix (white Y = 1) of a colour space given by its xy primaries."""
    xyz = np.array([[x / y, 1.0, (1 - x - y) / y] for x, y in primaries]).T
    wx, wy = white
    scale = np.linalg.solve(xyz, np.array([wx / wy, 1.0, (1 - wx - wy) / wy]))
    return np.asarray(xyz * scale)


P3_TO_XYZ = _rgb_to_xyz(((0.680, 0.320), (0.265, 0.690), (0.150, 0.060)), _D65)
SRGB_TO_XYZ = _rgb_to_xyz(((0.640, 0.330), (0.300, 0.600), (0.150, 0.060)), _D65)


def _srgb_decode(v: np.ndarray) -> np.ndarray:
    return np.where(v <= 0.04045, v / 12.92, ((v + 0.055) / 1.055) ** 2.4)


def _srgb_encode(v: np.ndarray) -> np.ndarray:
    return np.where(v <= 0.0031308, v * 12.92, 1.055 * np.power(np.maximum(v, 0), 1 / 2.4) - 0.055)


def p3_to_srgb_reference(rgb: np.ndarray) -> np.ndarray:
    """Display P3 uint8 → sRGB uint8 by the textbook formula (same transfer curve, both D65:
    linearise, P3 → XYZ → sRGB, clip, encode) — independent of LittleCMS."""
    lin = _srgb_decode(rgb.astype(np.float64) / 255.0)
    out = lin @ (np.linalg.inv(SRGB_TO_XYZ) @ P3_TO_XYZ).T
    return np.asarray(np.round(_srgb_encode(np.clip(out, 0, 1)) * 255).astype(np.uint8))


def _s15(v: float) -> bytes:
    return struct.pack(">i", round(v * 65536))


def display_p3_icc() -> bytes:
    """A matrix/TRC ICC v2 profile for Display P3: D65 primaries adapted to the D50 PCS with
    Bradford, the sRGB transfer curve as a 1024-entry table."""
    white = np.array([_D65[0] / _D65[1], 1.0, (1 - _D65[0] - _D65[1]) / _D65[1]])
    cone = _BRADFORD @ _D50_XYZ / (_BRADFORD @ white)
    adapt = np.linalg.inv(_BRADFORD) @ np.diag(cone) @ _BRADFORD
    colorants = adapt @ P3_TO_XYZ  # columns: red, green, blue in D50

    def xyz_tag(v: np.ndarray) -> bytes:
        return b"XYZ \x00\x00\x00\x00" + b"".join(_s15(float(c)) for c in v)

    text = b"Display P3 (lightbox test)"
    desc = b"desc\x00\x00\x00\x00" + struct.pack(">I", len(text) + 1) + text + b"\x00" + b"\x00" * 8 + b"\x00" * 70
    curve = np.round(_srgb_decode(np.linspace(0, 1, 1024)) * 65535).astype(">u2").tobytes()
    trc = b"curv\x00\x00\x00\x00" + struct.pack(">I", 1024) + curve
    tags = [
        (b"desc", desc),
        (b"cprt", b"text\x00\x00\x00\x00public domain\x00"),
        (b"wtpt", xyz_tag(_D50_XYZ)),
        (b"rXYZ", xyz_tag(colorants[:, 0])),
        (b"gXYZ", xyz_tag(colorants[:, 1])),
        (b"bXYZ", xyz_tag(colorants[:, 2])),
        (b"rTRC", trc),
        (b"gTRC", trc),
        (b"bTRC", trc),
    ]
    offset = 128 + 4 + 12 * len(tags)
    table, data = b"", b""
    for sig, body in tags:
        body += b"\x00" * (-len(body) % 4)
        table += sig + struct.pack(">II", offset + len(data), len(body))
        data += body
    size = offset + len(data)
    header = (
        struct.pack(">I", size) + b"lcms" + bytes([2, 0x10, 0, 0]) + b"mntrRGB XYZ "
        + struct.pack(">6H", 2026, 1, 1, 0, 0, 0) + b"acsp" + b"\x00" * 24
        + struct.pack(">I", 0) + b"".join(_s15(float(c)) for c in _D50_XYZ) + b"\x00" * 48
    )
    assert len(header) == 128, len(header)
    return header + struct.pack(">I", len(tags)) + table + data


# ---- writers ----------------------------------------------------------------------------------


def tiff(pages: list[np.ndarray], *, big_endian: bool = False) -> bytes:
    """Uncompressed chunky TIFF, one strip a page; uint8 or uint16 ``(H, W)``/``(H, W, C)``."""
    e = ">" if big_endian else "<"
    out = bytearray((b"MM\x00*" if big_endian else b"II*\x00") + struct.pack(e + "I", 8))
    for n, page in enumerate(pages):
        arr = page if page.ndim == 3 else page[..., None]
        h, w, spp = arr.shape
        bits = arr.dtype.itemsize * 8
        pixels = arr.astype(arr.dtype.newbyteorder(e)).tobytes()
        entries = [
            (256, 4, 1, w), (257, 4, 1, h), (258, 3, spp, bits), (259, 3, 1, 1),
            (262, 3, 1, 2 if spp >= 3 else 1), (273, 4, 1, 0), (277, 3, 1, spp), (278, 4, 1, h),
            (279, 4, 1, len(pixels)), (284, 3, 1, 1),
        ]
        if spp in (2, 4):
            entries.append((338, 3, 1, 2))  # unassociated alpha
        ifd_at = len(out)
        extra_at = ifd_at + 2 + 12 * len(entries) + 4
        bits_at = extra_at
        strip_at = extra_at + (2 * spp if spp > 2 else 0)
        ifd = bytearray(struct.pack(e + "H", len(entries)))
        for tag, typ, cnt, val in entries:
            if tag == 258 and spp > 2:
                ifd += struct.pack(e + "HHII", tag, typ, cnt, bits_at)
            elif tag == 273:
                ifd += struct.pack(e + "HHII", tag, typ, cnt, strip_at)
            elif typ == 3:
                ifd += struct.pack(e + "HHIHH", tag, typ, cnt, val, 0)
            else:
                ifd += struct.pack(e + "HHII", tag, typ, cnt, val)
        last = n == len(pages) - 1
        next_at = 0 if last else strip_at + len(pixels) + (len(pixels) & 1)
        ifd += struct.pack(e + "I", next_at)
        out += ifd
        if spp > 2:
            out += struct.pack(e + "H" * spp, *([bits] * spp))
        out += pixels + (b"\x00" if len(pixels) & 1 and not last else b"")
    return bytes(out)


def _chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def png(width: int, height: int, *, depth: int = 8, colour: int = 2, row: bytes | None = None,
        frames: int = 1, declared_frames: int | None = None) -> bytes:
    """A PNG whose every row is ``row`` (default zeros), compressed as a stream (so an 8000²
    16-bit image costs no 384 MB buffer). ``frames > 1`` makes an APNG: the default image is
    frame 0, then ``frames - 1`` 1×1 frames; ``declared_frames`` overrides acTL's count."""
    channels = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}[colour]
    stride = width * channels * depth // 8
    line = b"\x00" + (row if row is not None else b"\x00" * stride)
    assert len(line) == stride + 1
    comp = zlib.compressobj(9)
    data = bytearray()
    for _ in range(height):
        data += comp.compress(line)
    data += comp.flush()
    out = b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, depth, colour, 0, 0, 0))
    if frames > 1 or declared_frames:
        out += _chunk(b"acTL", struct.pack(">II", declared_frames or frames, 0))
        out += _chunk(b"fcTL", struct.pack(">IIIIIHHBB", 0, width, height, 0, 0, 1, 10, 0, 0))
    out += _chunk(b"IDAT", bytes(data))
    tiny = zlib.compress(b"\x00" + b"\x7f" * (channels * depth // 8))
    seq = 1
    for _ in range(frames - 1):
        out += _chunk(b"fcTL", struct.pack(">IIIIIHHBB", seq, 1, 1, 0, 0, 1, 10, 0, 0))
        out += _chunk(b"fdAT", struct.pack(">I", seq + 1) + tiny)
        seq += 2
    return out + _chunk(b"IEND", b"")


def _save(image: Image.Image, fmt: str, **kw: object) -> bytes:
    if fmt == "HEIF":
        import pillow_heif

        pillow_heif.register_heif_opener()
    buf = io.BytesIO()
    image.save(buf, fmt, **kw)
    return buf.getvalue()


def photo(width: int = 600, height: int = 400) -> np.ndarray:
    """A photograph (scikit-image's coffee) resized to ``width`` x ``height``."""
    from skimage import data

    return np.asarray(Image.fromarray(data.coffee()).resize((width, height), Image.Resampling.LANCZOS))


def jpeg_scan_bomb(side: int = 2048, extra_scans: int = 100_000) -> bytes:
    """A progressive JPEG with ``extra_scans`` tiny DC scans (12 bytes each) before its EOI."""
    base = _save(Image.fromarray(photo(side, side)), "JPEG", quality=90, progressive=True)
    scan = b"\xff\xda\x00\x08\x01\x01\x00\x00\x00\x00" + b"\x00\x00"  # Y, DC only, then 2 data bytes
    return base[:-2] + scan * extra_scans + b"\xff\xd9"


def mixed_folder() -> dict[str, bytes]:
    """One file of each kind suppliers send, named ``<kind>.<ext>``."""
    rgb = photo()
    im = Image.fromarray(rgb)
    rgba = np.dstack([rgb, np.full(rgb.shape[:2], 255, np.uint8)])
    rgba[:, :150, 3] = 0
    gif_frames = [im.quantize(64), Image.fromarray(rgb[::-1].copy()).quantize(64)]
    p3 = display_p3_icc()
    return {
        "jpeg.jpg": _save(im, "JPEG", quality=90),
        "jpeg_progressive.jpg": _save(im, "JPEG", quality=90, progressive=True),
        "jpeg_cmyk.jpg": _save(im.convert("CMYK"), "JPEG", quality=90),
        "jpeg_p3.jpg": _save(im, "JPEG", quality=95, icc_profile=p3),
        "png.png": _save(im, "PNG"),
        "png_rgba.png": _save(Image.fromarray(rgba), "PNG"),
        "png_16bit.png": png(600, 400, depth=16, row=(rgb[200].astype(">u2") * 257).tobytes()),
        "apng.png": png(64, 64, frames=3),
        "webp.webp": _save(im, "WEBP", quality=85),
        "tiff_8bit.tif": tiff([rgb]),
        "tiff_16bit.tif": tiff([rgb.astype(np.uint16) * 257]),
        "tiff_multipage.tif": tiff([rgb, rgb[::-1].copy()]),
        "tiff_gray16_be.tif": tiff([rgb[..., 1].astype(np.uint16) * 257], big_endian=True),
        "tiff_lzw.tif": _save(im, "TIFF", compression="tiff_lzw"),
        "bmp.bmp": _save(im, "BMP"),
        "bmp_8bit.bmp": _save(im.quantize(256), "BMP"),
        "gif.gif": _save(gif_frames[0], "GIF"),
        "gif_animated.gif": _save(gif_frames[0], "GIF", save_all=True, append_images=gif_frames[1:]),
        "heic.heic": _save(im, "HEIF", quality=90),
        "avif.avif": _save(im, "AVIF", quality=80),
    }


# ---- hostile ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Hostile:
    name: str
    make: Callable[[], bytes]
    outcome: str  # "output" or an ErrorCode value


def _patch(blob: bytes, at: int, fmt: str, *values: int) -> bytes:
    out = bytearray(blob)
    struct.pack_into(fmt, out, at, *values)
    return bytes(out)


def _heif_ispe_bomb(fmt: str) -> bytes:
    blob = _save(Image.fromarray(photo(64, 64)), fmt, quality=50)
    at = blob.index(b"ispe") + 8  # box type, then version/flags
    return _patch(blob, at, ">II", 100_000, 100_000)


def _gif_frames_bomb(frames: int) -> bytes:
    one = b"\x21\xf9\x04\x00\x01\x00\x00\x00" + b"\x2c\x00\x00\x00\x00\x01\x00\x01\x00\x00" + b"\x02\x02\x44\x01\x00"
    return b"GIF89a\x01\x00\x01\x00\x80\x00\x00" + b"\x00\x00\x00\xff\xff\xff" + one * frames + b"\x3b"


def _png_bomb(width: int, height: int) -> bytes:
    """IHDR claims ``width`` x ``height``; 64 bytes of image data."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    idat = _chunk(b"IDAT", zlib.compress(b"\x00" * 64))
    return b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr) + idat + _chunk(b"IEND", b"")


def _tiff_pixel_bomb() -> bytes:
    blob = tiff([photo(64, 64)])  # IFD at 8: width then height entries, values at +8 of each
    return _patch(_patch(blob, 8 + 2 + 8, "<I", 100_000), 8 + 2 + 12 + 8, "<I", 100_000)


def _tiff_pages_bomb(pages: int) -> bytes:
    return tiff([np.zeros((1, 1), np.uint8)] * pages)


def _tiff_loop() -> bytes:
    blob = bytearray(tiff([photo(64, 64), photo(64, 64)]))
    # Point the second IFD's next-IFD offset back at the first.
    (first,) = struct.unpack_from("<I", blob, 4)
    (count,) = struct.unpack_from("<H", blob, first)
    (second,) = struct.unpack_from("<I", blob, first + 2 + 12 * count)
    (count2,) = struct.unpack_from("<H", blob, second)
    struct.pack_into("<I", blob, second + 2 + 12 * count2, first)
    return bytes(blob)


def _webp_canvas_bomb() -> bytes:
    exif = Image.Exif()
    exif[0x0112] = 1  # an EXIF chunk forces the extended (VP8X) container
    blob = _save(Image.fromarray(photo(64, 64)), "WEBP", lossless=True, exif=exif)
    assert blob[12:16] == b"VP8X"
    out = bytearray(blob)
    out[24:27] = (16383).to_bytes(3, "little")
    out[27:30] = (16383).to_bytes(3, "little")
    return bytes(out)


def hostile_files() -> list[Hostile]:
    """Each case and the outcome the decoder must reach (default guards)."""
    small = Image.fromarray(photo(64, 64))
    jpg = _save(small, "JPEG", quality=90)
    sof = jpg.index(b"\xff\xc0")
    bmp = _save(small, "BMP")
    gif = _save(small.quantize(16), "GIF")
    heic = _save(small, "HEIF", quality=50)
    avif = _save(small, "AVIF", quality=50)
    return [
        Hostile("passwd.jpg", lambda: b"root:*:0:0:root:/root:/bin/sh\ndaemon:*:1:1::/:/sbin/nologin\n",
                "UNSUPPORTED_FORMAT"),
        Hostile("environ.png", lambda: b"PATH=/usr/bin\x00AWS_SECRET_ACCESS_KEY=abc123\x00HOME=/root\x00",
                "UNSUPPORTED_FORMAT"),
        Hostile("random.webp", lambda: bytes(np.random.default_rng(7).integers(0, 256, 4096, np.uint8)),
                "UNSUPPORTED_FORMAT"),
        Hostile("jpeg_pixel_bomb.jpg", lambda: _patch(jpg, sof + 5, ">HH", 60_000, 60_000), "TOO_LARGE"),
        Hostile("jpeg_scan_bomb.jpg", lambda: jpeg_scan_bomb(), "TOO_LARGE"),
        Hostile("jpeg_truncated.jpg", lambda: jpg[: len(jpg) // 2], "DECODE_FAILED"),
        Hostile("png_pixel_bomb.png", lambda: _png_bomb(100_000, 100_000), "TOO_LARGE"),
        Hostile("png_16bit_4000.png", lambda: png(4000, 4000, depth=16), "output"),
        Hostile("apng_1000_frames.png", lambda: png(64, 64, frames=1000), "TOO_LARGE"),
        Hostile("apng_declares_1e6.png", lambda: png(64, 64, frames=2, declared_frames=1_000_000), "TOO_LARGE"),
        Hostile("webp_canvas_bomb.webp", _webp_canvas_bomb, "TOO_LARGE"),
        Hostile("tiff_pixel_bomb.tif", _tiff_pixel_bomb, "TOO_LARGE"),
        Hostile("tiff_pages_bomb.tif", lambda: _tiff_pages_bomb(2000), "TOO_LARGE"),
        Hostile("tiff_ifd_loop.tif", _tiff_loop, "output"),
        Hostile("tiff_16bit_truncated.tif", lambda: tiff([np.zeros((2000, 2000, 3), np.uint16)])[:50_000],
                "DECODE_FAILED"),
        Hostile("bmp_pixel_bomb.bmp", lambda: _patch(bmp, 18, "<ii", 50_000, 50_000), "TOO_LARGE"),
        Hostile("bmp_truncated.bmp", lambda: bmp[:200], "DECODE_FAILED"),
        Hostile("gif_screen_bomb.gif", lambda: _patch(gif, 6, "<HH", 65_535, 65_535), "TOO_LARGE"),
        Hostile("gif_frames_bomb.gif", lambda: _gif_frames_bomb(10_000), "TOO_LARGE"),
        Hostile("gif_lzw_4000.gif", lambda: _save(Image.new("P", (4000, 4000), 3), "GIF"), "output"),
        Hostile("heic_ispe_bomb.heic", lambda: _heif_ispe_bomb("HEIF"), "TOO_LARGE"),
        Hostile("heic_truncated.heic", lambda: heic[: len(heic) // 2], "DECODE_FAILED"),
        Hostile("avif_ispe_bomb.avif", lambda: _heif_ispe_bomb("AVIF"), "TOO_LARGE"),
        Hostile("avif_truncated.avif", lambda: avif[: len(avif) // 2], "DECODE_FAILED"),
    ]


# ---- odd files -------------------------------------------------------------------------------

def _photo(name: str, w: int, h: int) -> np.ndarray:
    import skimage.data

    src = np.asarray(getattr(skimage.data, name)())
    if src.ndim == 2:
        src = np.repeat(src[..., None], 3, axis=2)
    return np.asarray(Image.fromarray(np.ascontiguousarray(src[..., :3])).resize((w, h)))


def _tifffile(arr: np.ndarray, **kw: Any) -> bytes:
    import tifffile

    buf = io.BytesIO()
    tifffile.imwrite(buf, arr, **kw)
    return buf.getvalue()


def _cv2(ext: str, arr: np.ndarray, params: list[int] | None = None) -> bytes:
    import cv2

    ok, enc = cv2.imencode(ext, arr, params or [])
    assert ok
    return enc.tobytes()


def _bmp(bits: int, w: int, h: int, pixels: bytes, *, palette: bytes = b"", compression: int = 0,
         top_down: bool = False, masks: bytes = b"", header: int = 40) -> bytes:
    """A BMP written by hand: headers of ``header`` bytes (40 = INFO, 124 = V5)."""
    colors = len(palette) // 4
    extra = b"" if header == 40 else masks.ljust(header - 40, b"\0")
    info = struct.pack("<IiiHHIIiiII", header, w, -h if top_down else h, 1, bits, compression,
                       len(pixels), 2835, 2835, colors, 0) + extra
    masks_after = masks if header == 40 else b""
    offset = 14 + len(info) + len(masks_after) + len(palette)
    return b"BM" + struct.pack("<IHHI", offset + len(pixels), 0, 0, offset) + info + masks_after + palette + pixels


def _rows(arr: np.ndarray, row_bytes: Callable[[np.ndarray], bytes], top_down: bool = False) -> bytes:
    out = b""
    for y in (range(arr.shape[0]) if top_down else range(arr.shape[0] - 1, -1, -1)):
        r = row_bytes(arr[y])
        out += r + b"\0" * (-len(r) % 4)
    return out


def _rle8(idx: np.ndarray) -> bytes:
    out = bytearray()
    for y in range(idx.shape[0] - 1, -1, -1):
        row = idx[y]
        x = 0
        while x < len(row):
            run = 1
            while x + run < len(row) and run < 255 and row[x + run] == row[x]:
                run += 1
            out += bytes([run, int(row[x])])
            x += run
        out += b"\0\0"
    return bytes(out + b"\0\1")


def _gif_anim(disposal: int, first_smaller: bool, interlace: bool = False) -> bytes:
    frames = []
    base = _photo("chelsea", 80, 60)
    for k in range(3):
        size = (48, 36) if first_smaller and k == 0 else (80, 60)
        im = Image.fromarray(base).resize(size).quantize(64)
        arr = np.asarray(im).copy()
        arr[: 6 + 4 * k] = 0  # index 0 is transparent: a clear band on top that changes per frame
        frames.append(Image.fromarray(arr, "P"))
        frames[-1].putpalette(im.getpalette() or [])
    buf = io.BytesIO()
    frames[0].save(buf, "GIF", save_all=True, append_images=frames[1:], transparency=0, disposal=disposal,
                   duration=60, loop=0, interlace=interlace, optimize=False)
    return buf.getvalue()


def _flip_bits(blob: bytes, seed: int, count: int, start: int) -> bytes:
    rng = np.random.default_rng(seed)
    b = bytearray(blob)
    for pos in rng.integers(start, len(b) - 4, count):
        b[int(pos)] ^= 1 << int(rng.integers(0, 8))
    return bytes(b)


def odd_files(out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    rgb = _photo("astronaut", 96, 72)
    coffee = _photo("coffee", 90, 60)
    im = Image.fromarray(rgb)
    grey = np.asarray(im.convert("L"))
    pal = im.quantize(16)
    pidx = np.asarray(pal)
    entries = (pal.getpalette() or [])[:48]
    pal_bytes = b"".join(bytes([entries[k + 2], entries[k + 1], entries[k], 0]) for k in range(0, 48, 3))
    bits1 = (grey > 128).astype(np.uint8)
    h, w = grey.shape
    files: dict[str, bytes] = {}
    # -- BMP
    files["bmp_24.bmp"] = _save(im, "BMP")
    files["bmp_8_palette.bmp"] = _save(pal, "BMP")
    files["bmp_1bit.bmp"] = _save(im.convert("1"), "BMP")
    files["bmp_32_bgra_pillow.bmp"] = _save(im.convert("RGBA"), "BMP")
    files["bmp_opencv_24.bmp"] = _cv2(".bmp", rgb[..., ::-1])
    files["bmp_opencv_grey.bmp"] = _cv2(".bmp", grey)
    def nibbles(r: np.ndarray) -> bytes:
        return bytes((int(r[i]) << 4) | (int(r[i + 1]) if i + 1 < len(r) else 0) for i in range(0, len(r), 2))

    files["bmp_4bit.bmp"] = _bmp(4, w, h, _rows(pidx, nibbles), palette=pal_bytes)
    files["bmp_1bit_handmade.bmp"] = _bmp(1, w, h, _rows(bits1, lambda r: np.packbits(r).tobytes()),
                                          palette=b"\0\0\0\0\xff\xff\xff\0")
    files["bmp_top_down_24.bmp"] = _bmp(24, w, h, _rows(rgb[..., ::-1], lambda r: r.tobytes(), top_down=True),
                                        top_down=True)
    files["bmp_rle8.bmp"] = _bmp(8, w, h, _rle8(pidx), palette=pal_bytes, compression=1)
    r5 = (rgb[..., 0].astype(np.uint16) >> 3) << 11 | (rgb[..., 1].astype(np.uint16) >> 2) << 5 | rgb[..., 2] >> 3
    files["bmp_16_565_bitfields.bmp"] = _bmp(16, w, h, _rows(r5.astype("<u2"), lambda r: r.tobytes()),
                                             compression=3, masks=struct.pack("<III", 0xF800, 0x07E0, 0x001F))
    bgra = np.dstack([rgb[..., ::-1], np.full((h, w), 255, np.uint8)])
    files["bmp_32_v5_header.bmp"] = _bmp(32, w, h, _rows(bgra, lambda r: r.tobytes()), compression=3, header=124,
                                         masks=struct.pack("<IIII", 0x00FF0000, 0x0000FF00, 0x000000FF, 0xFF000000))
    files["bmp_16_555.bmp"] = _bmp(16, w, h, _rows(((rgb[..., 0].astype(np.uint16) >> 3) << 10
                                                    | (rgb[..., 1].astype(np.uint16) >> 3) << 5
                                                    | rgb[..., 2] >> 3).astype("<u2"), lambda r: r.tobytes()))
    # -- TIFF
    for comp in ("raw", "tiff_lzw", "tiff_adobe_deflate", "packbits", "jpeg"):
        files[f"tiff_{comp}.tif"] = _save(im, "TIFF", compression=comp)
    for comp in ("group3", "group4", "tiff_ccitt"):
        files[f"tiff_1bit_{comp}.tif"] = _save(im.convert("1"), "TIFF", compression=comp)
    files["tiff_1bit_raw.tif"] = _save(im.convert("1"), "TIFF")
    files["tiff_palette.tif"] = _save(pal, "TIFF")
    files["tiff_cmyk.tif"] = _save(im.convert("CMYK"), "TIFF")
    files["tiff_la.tif"] = _save(im.convert("LA"), "TIFF")
    files["tiff_rgba_lzw.tif"] = _save(im.convert("RGBA"), "TIFF", compression="tiff_lzw")
    files["tiff_multipage.tif"] = _save(im, "TIFF", save_all=True, append_images=[Image.fromarray(coffee)])
    files["tiff_16bit_rgb.tif"] = _tifffile((rgb.astype(np.uint16) * 257), photometric="rgb")
    files["tiff_16bit_grey.tif"] = _tifffile(grey.astype(np.uint16) * 257)
    files["tiff_float32_grey.tif"] = _tifffile(grey.astype(np.float32) / 255)
    files["tiff_tiled.tif"] = _tifffile(np.ascontiguousarray(np.pad(rgb, ((0, 96 - h), (0, 0), (0, 0)))), tile=(32, 32),
                                        photometric="rgb")
    files["tiff_planar.tif"] = _tifffile(np.ascontiguousarray(rgb.transpose(2, 0, 1)), photometric="rgb",
                                         planarconfig="separate")
    files["tiff_deflate_predictor.tif"] = _tifffile(rgb, photometric="rgb", compression="zlib", predictor=True)
    files["tiff_minisblack_8.tif"] = _tifffile(grey, photometric="minisblack")
    files["tiff_miniswhite_8.tif"] = _tifffile(255 - grey, photometric="miniswhite")
    files["tiff_opencv.tif"] = _cv2(".tiff", rgb[..., ::-1])
    files["tiff_big_endian.tif"] = _tifffile(rgb, photometric="rgb", byteorder=">")
    files["tiff_ycbcr_jpeg.tif"] = _save(im, "TIFF", compression="jpeg")
    # -- GIF
    for disposal in (0, 1, 2, 3):
        files[f"gif_anim_transparent_disposal{disposal}.gif"] = _gif_anim(disposal, False)
    files["gif_anim_first_frame_smaller.gif"] = _gif_anim(2, True)
    files["gif_interlaced.gif"] = _gif_anim(1, False, interlace=True)
    files["gif_single_transparent.gif"] = _save(pal, "GIF", transparency=0)
    files["gif_grey.gif"] = _save(im.convert("L"), "GIF")
    # -- PNG
    for bits in (1, 2, 4):
        files[f"png_palette_{bits}bit.png"] = _save(im.quantize(2 ** bits), "PNG", bits=bits)
    files["png_trns_palette_alpha_table.png"] = _save(pal, "PNG", transparency=bytes(range(0, 256, 16)))
    files["png_trns_rgb.png"] = _save(im, "PNG", transparency=(0, 0, 0))
    files["png_la.png"] = _save(im.convert("LA"), "PNG")
    bgra8 = np.dstack([rgb[..., ::-1], np.full((h, w), 255, np.uint8)])
    files["png_16bit_rgba.png"] = _cv2(".png", bgra8.astype(np.uint16) * 257)
    files["png_16bit_grey.png"] = _cv2(".png", grey.astype(np.uint16) * 257)
    files["png_1bit_grey.png"] = _save(im.convert("1"), "PNG")
    raw = _save(im, "PNG")
    # -- mutations of real photos
    jpg = _save(Image.fromarray(coffee), "JPEG", quality=90)
    sos = jpg.index(b"\xff\xda")
    for k in range(3):
        files[f"jpeg_bitflips_{k}.jpg"] = _flip_bits(jpg, k, 6, sos + 20)[:-2] + b"\xff\xd9"
    files["jpeg_trailing_garbage.jpg"] = jpg + bytes(range(256)) * 4
    files["jpeg_cmyk.jpg"] = _save(Image.fromarray(coffee).convert("CMYK"), "JPEG")
    files["jpeg_progressive_opencv.jpg"] = _cv2(".jpg", coffee[..., ::-1], [1, 90, 2, 1])  # IMWRITE_JPEG_PROGRESSIVE=2
    files["jpeg_grey_restart.jpg"] = _cv2(".jpg", grey, [1, 90, 4, 4])  # IMWRITE_JPEG_RST_INTERVAL=4
    ihdr_end = raw.index(b"IDAT") - 4
    at = raw.index(b"IDAT") + 8  # a byte inside the first IDAT: its CRC no longer matches
    files["png_bad_crc.png"] = raw[:at] + bytes([raw[at] ^ 0xFF]) + raw[at + 1:]
    files["png_truncated_idat.png"] = raw[: ihdr_end + (len(raw) - ihdr_end) // 2]
    tif = files["tiff_raw.tif"]
    files["tiff_strip_cut_short.tif"] = tif[: len(tif) - 2000]
    files["webp_lossless.webp"] = _save(im, "WEBP", lossless=True)
    files["webp_lossy_alpha.webp"] = _save(im.convert("RGBA"), "WEBP", quality=80)
    files["gif_truncated_frame2.gif"] = files["gif_anim_transparent_disposal2.gif"][:-200]
    files["png_adam7.png"] = _adam7(rgb)  # neither Pillow nor OpenCV writes Adam7
    paths = []
    for name, blob in sorted(files.items()):
        p = out / name
        p.write_bytes(blob)
        paths.append(p)
    return paths


def _adam7(rgb: np.ndarray) -> bytes:
    """An interlaced (Adam7) RGB PNG written by hand (filter 0 on every pass row)."""
    h, w = rgb.shape[:2]
    passes = [(0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2)]
    data = b""
    for x0, y0, dx, dy in passes:
        sub = rgb[y0::dy, x0::dx]
        if sub.size == 0:
            continue
        data += b"".join(b"\0" + row.tobytes() for row in sub)

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 1))
            + chunk(b"IDAT", zlib.compress(data)) + chunk(b"IEND", b""))


def pillow_opens(blob: bytes) -> bool:
    try:
        with Image.open(io.BytesIO(blob)) as im:
            im.seek(0)
            im.load()
        return True
    except Exception:
        return False


def main(argv: list[str]) -> int:
    root = Path(argv[1] if len(argv) > 1 else "corpus")
    for sub, files in (("mixed", mixed_folder()), ("hostile", {h.name: h.make() for h in hostile_files()})):
        (root / sub).mkdir(parents=True, exist_ok=True)
        for name, blob in files.items():
            (root / sub / name).write_bytes(blob)
    odd_files(root / "odd")
    print(f"wrote {root}/mixed, {root}/hostile and {root}/odd")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
