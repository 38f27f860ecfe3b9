"""Header guards: format, size and pixel count read from the first bytes, no pixel decoded.

:func:`sniff` is the gate every payload passes before a decoder touches it (DESIGN.md step 2).
It reads only container headers — the JPEG marker segments up to the first SOF (and the EXIF
orientation on the way), the PNG chunks up to the first IDAT, the WebP RIFF chunk headers — so
a decompression bomb (a tiny file whose header claims 100 000 × 100 000 pixels) is refused
before any pixel buffer is allocated.

Errors, in the order they are checked:

- ``DecodeFailed`` "empty payload" for zero bytes (an empty body is a broken upload, not a
  file of some other format);
- ``TooLarge`` when the payload exceeds ``max_bytes``;
- ``UnsupportedFormat`` when the magic bytes are not JPEG, PNG or WebP (GIF, BMP, TIFF,
  HEIF/AVIF, text… are named when recognised), or for animated WebP;
- ``DecodeFailed`` when the header is truncated or inconsistent (zero width, no SOF, bad IHDR);
- ``TooLarge`` when width × height exceeds ``max_pixels``;
- ``DecodeFailed`` for a JPEG with no end-of-image marker (FFD9) after its frame header: it
  was cut short. libjpeg-turbo (DALI's CPU decoder) refuses these too; checking here makes
  the outcome the same on every backend (nvJPEG's hardware decoder may not complain). Data
  appended after the EOI (phone trailers) is fine: only the last FFD9 is looked for.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Literal

from schemas.errors import DecodeFailed, TooLarge, UnsupportedFormat

__all__ = [
    "DEFAULT_MAX_BYTES",
    "DEFAULT_MAX_PIXELS",
    "ImageFormat",
    "ImageInfo",
    "exif_orientation",
    "sniff",
]

STAGE = "decode"
DEFAULT_MAX_BYTES = 50 * 1024 * 1024
DEFAULT_MAX_PIXELS = 64_000_000

ImageFormat = Literal["jpeg", "png", "webp"]

_PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
# SOF markers carrying the frame size: C0..CF except DHT (C4), JPG (C8) and DAC (CC).
_SOF_MARKERS = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
_PROGRESSIVE_SOF = frozenset({0xC2, 0xC6, 0xCA, 0xCE})
# Markers without a length field: TEM, RSTn, SOI, EOI.
_STANDALONE = frozenset({0x01, *range(0xD0, 0xD9)})
_OTHER_FORMATS: tuple[tuple[bytes, int, str], ...] = (
    (b"GIF87a", 0, "GIF"),
    (b"GIF89a", 0, "GIF"),
    (b"BM", 0, "BMP"),
    (b"II*\x00", 0, "TIFF"),
    (b"MM\x00*", 0, "TIFF"),
    (b"ftypheic", 4, "HEIC"),
    (b"ftypheix", 4, "HEIC"),
    (b"ftypmif1", 4, "HEIF"),
    (b"ftypavif", 4, "AVIF"),
    (b"\x00\x00\x00\x0cjP  ", 0, "JPEG 2000"),
    (b"\xff\x4f\xff\x51", 0, "JPEG 2000"),
    (b"%PDF", 0, "PDF"),
    (b"<svg", 0, "SVG"),
    (b"<?xml", 0, "XML/SVG"),
)


@dataclass(frozen=True, slots=True)
class ImageInfo:
    """What the header says about an image.

    ``width`` and ``height`` are as stored (before EXIF orientation); ``oriented_size`` gives
    ``(width, height)`` after it. ``components`` is the stored colour component count (JPEG: 1
    gray, 3 YCbCr/RGB, 4 CMYK/YCCK; PNG: 1 gray/palette, 2 gray+alpha, 3 RGB, 4 RGBA; WebP: 3,
    or 4 with alpha). ``orientation`` is the EXIF orientation 1..8 (1 when absent; only read
    for JPEG).
    """

    format: ImageFormat
    width: int
    height: int
    components: int
    has_alpha: bool = False
    progressive: bool = False
    orientation: int = 1
    bit_depth: int = 8
    header_end: int = 0  # byte offset just past the frame header (JPEG SOF, PNG IHDR)

    @property
    def pixels(self) -> int:
        return self.width * self.height

    @property
    def oriented_size(self) -> tuple[int, int]:
        """``(width, height)`` of the image once EXIF orientation is applied."""
        if self.orientation in (5, 6, 7, 8):
            return self.height, self.width
        return self.width, self.height


def sniff(
    blob: bytes | bytearray | memoryview,
    max_bytes: int = DEFAULT_MAX_BYTES,
    max_pixels: int = DEFAULT_MAX_PIXELS,
) -> ImageInfo:
    """Identify ``blob`` and enforce the byte and pixel limits; see the module doc for errors."""
    raw = blob if isinstance(blob, bytes) else bytes(blob)
    data = memoryview(raw)
    n = len(data)
    if n == 0:
        raise DecodeFailed("empty payload (0 bytes)", stage=STAGE)
    if n > max_bytes:
        raise TooLarge(f"payload is {n} bytes, limit is {max_bytes}", stage=STAGE)
    head = bytes(data[:16])
    if head.startswith(b"\xff\xd8\xff"):
        info = _jpeg_info(data)
    elif head.startswith(_PNG_MAGIC):
        info = _png_info(data)
    elif head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        info = _webp_info(data)
    else:
        raise UnsupportedFormat(f"{_describe(head)}; supported: JPEG, PNG, WebP", stage=STAGE)
    if info.width <= 0 or info.height <= 0:
        raise DecodeFailed(
            f"{info.format} header gives an empty size {info.width}x{info.height}", stage=STAGE
        )
    if info.pixels > max_pixels:
        raise TooLarge(
            f"{info.format} header says {info.width}x{info.height} = {info.pixels} pixels, "
            f"limit is {max_pixels}",
            stage=STAGE,
        )
    if info.format == "jpeg" and raw.rfind(b"\xff\xd9") < info.header_end:
        raise DecodeFailed(
            f"truncated JPEG ({info.width}x{info.height}, {n} bytes): no end-of-image marker",
            stage=STAGE,
        )
    return info


def _describe(head: bytes) -> str:
    for magic, offset, name in _OTHER_FORMATS:
        if head[offset : offset + len(magic)] == magic:
            return f"{name} is not supported"
    if head.startswith(b"\xff\xd8"):
        return "JPEG without a marker after SOI"
    printable = all(32 <= c < 127 or c in (9, 10, 13) for c in head)
    if printable:
        return f"not an image: payload starts with text {head[:12]!r}"
    return f"unknown format, first bytes {head[:8].hex(' ')}"


def _truncated(fmt: str, what: str) -> DecodeFailed:
    return DecodeFailed(f"truncated {fmt} header: {what}", stage=STAGE)


# ---- JPEG -------------------------------------------------------------------------------------


def _jpeg_info(data: memoryview) -> ImageInfo:
    n = len(data)
    pos = 2
    orientation = 1
    while True:
        # Each segment: 0xFF (fill bytes allowed), marker, [2-byte length incl. itself, payload].
        if pos >= n:
            raise _truncated("JPEG", "ended before the frame header (SOF)")
        if data[pos] != 0xFF:
            raise DecodeFailed(f"JPEG: expected a marker at byte {pos}", stage=STAGE)
        while pos < n and data[pos] == 0xFF:
            pos += 1
        if pos >= n:
            raise _truncated("JPEG", "ended inside a marker")
        marker = data[pos]
        pos += 1
        if marker in _STANDALONE:
            if marker == 0xD9:
                raise DecodeFailed("JPEG: end of image before any frame header", stage=STAGE)
            continue
        if pos + 2 > n:
            raise _truncated("JPEG", f"segment 0xFF{marker:02X} has no length")
        (length,) = struct.unpack_from(">H", data, pos)
        if length < 2:
            raise DecodeFailed(f"JPEG: bad segment length {length}", stage=STAGE)
        body = data[pos + 2 : pos + length]
        if marker == 0xDA:
            raise DecodeFailed("JPEG: scan data before any frame header", stage=STAGE)
        if marker in _SOF_MARKERS:
            if len(body) < 6:
                raise _truncated("JPEG", "frame header cut short")
            precision, height, width, comps = struct.unpack_from(">BHHB", body, 0)
            return ImageInfo(
                format="jpeg",
                width=width,
                height=height,
                components=comps,
                progressive=marker in _PROGRESSIVE_SOF,
                orientation=orientation,
                bit_depth=precision,
                header_end=pos + length,
            )
        if pos + length > n:
            raise _truncated("JPEG", f"segment 0xFF{marker:02X} runs past the end")
        if marker == 0xE1 and bytes(body[:6]) == b"Exif\x00\x00":
            orientation = exif_orientation(body[6:])
        pos += length


def exif_orientation(tiff: bytes | memoryview) -> int:
    """The Orientation tag (0x0112) of IFD0 in a TIFF-structured EXIF block; 1 when absent
    or unreadable (a malformed EXIF block never fails a decode)."""
    try:
        order = bytes(tiff[:2])
        if order == b"II":
            e = "<"
        elif order == b"MM":
            e = ">"
        else:
            return 1
        (ifd,) = struct.unpack_from(e + "I", tiff, 4)
        (count,) = struct.unpack_from(e + "H", tiff, ifd)
        for i in range(min(count, 512)):
            tag, typ, _cnt = struct.unpack_from(e + "HHI", tiff, ifd + 2 + 12 * i)
            if tag == 0x0112 and typ == 3:  # SHORT
                (value,) = struct.unpack_from(e + "H", tiff, ifd + 2 + 12 * i + 8)
                return int(value) if 1 <= value <= 8 else 1
    except struct.error:
        return 1
    return 1


# ---- PNG --------------------------------------------------------------------------------------

_PNG_COMPONENTS = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}


def _png_info(data: memoryview) -> ImageInfo:
    n = len(data)
    if n < 33:
        raise _truncated("PNG", f"{n} bytes, the IHDR chunk needs 33")
    length, ctype = struct.unpack_from(">I4s", data, 8)
    if ctype != b"IHDR" or length != 13:
        raise DecodeFailed("PNG: first chunk is not a 13-byte IHDR", stage=STAGE)
    width, height, depth, colour = struct.unpack_from(">IIBB", data, 16)
    if colour not in _PNG_COMPONENTS:
        raise DecodeFailed(f"PNG: invalid colour type {colour}", stage=STAGE)
    has_alpha = colour in (4, 6)
    pos = 33
    # Walk chunk headers up to the first IDAT looking for tRNS (transparency) — no pixel data.
    while not has_alpha and pos + 8 <= n:
        length, ctype = struct.unpack_from(">I4s", data, pos)
        if ctype == b"IDAT":
            break
        if ctype == b"tRNS":
            has_alpha = True
        pos += 12 + length
    return ImageInfo(
        format="png",
        width=width,
        height=height,
        components=_PNG_COMPONENTS[colour],
        has_alpha=has_alpha,
        bit_depth=depth,
        header_end=33,
    )


# ---- WebP -------------------------------------------------------------------------------------


def _webp_info(data: memoryview) -> ImageInfo:
    n = len(data)
    if n < 30:
        raise _truncated("WebP", f"{n} bytes")
    chunk = bytes(data[12:16])
    body = 20
    if chunk == b"VP8X":
        flags = data[body]
        if flags & 0x02:
            raise UnsupportedFormat("animated WebP is not supported", stage=STAGE)
        width = 1 + int.from_bytes(data[body + 4 : body + 7], "little")
        height = 1 + int.from_bytes(data[body + 7 : body + 10], "little")
        alpha = bool(flags & 0x10)
        return ImageInfo("webp", width, height, 4 if alpha else 3, has_alpha=alpha)
    if chunk == b"VP8 ":
        # 3-byte frame tag, start code 9D 01 2A, then 14-bit width and height (2 scale bits).
        if bytes(data[body + 3 : body + 6]) != b"\x9d\x01\x2a":
            raise DecodeFailed("WebP: VP8 start code missing", stage=STAGE)
        w, h = struct.unpack_from("<HH", data, body + 6)
        return ImageInfo("webp", w & 0x3FFF, h & 0x3FFF, 3)
    if chunk == b"VP8L":
        if data[body] != 0x2F:
            raise DecodeFailed("WebP: VP8L signature missing", stage=STAGE)
        (bits,) = struct.unpack_from("<I", data, body + 1)
        width = 1 + (bits & 0x3FFF)
        height = 1 + ((bits >> 14) & 0x3FFF)
        alpha = bool((bits >> 28) & 1)
        return ImageInfo("webp", width, height, 4 if alpha else 3, has_alpha=alpha)
    raise DecodeFailed(f"WebP: unknown first chunk {chunk!r}", stage=STAGE)
