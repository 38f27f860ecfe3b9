"""Header guards: format, size, depth, frames and scans read from container headers, no pixel decoded.

:func:`sniff` is the gate every payload passes before a decoder touches it (docs/architecture.md, step 2).
It reads only container structure — JPEG marker segments (skipping entropy-coded data with a
byte search), PNG chunks up to the first IDAT, WebP RIFF chunks, the TIFF IFD chain, the BMP
and GIF headers and GIF block chain, the ISO-BMFF boxes of HEIF/AVIF (``ispe``, ``pixi``,
``irot``, ``colr`` of the primary item) — so a decompression bomb (a tiny file whose header
claims 100 000 × 100 000 pixels, 100 000 scans or 10 000 frames) is refused before any pixel
buffer is allocated.

Errors, in the order they are checked:

- ``DecodeFailed`` "empty payload" for zero bytes (an empty body is a broken upload);
- ``TooLarge`` when the payload exceeds ``max_bytes``;
- ``UnsupportedFormat`` when the magic bytes are none of JPEG, PNG, WebP, TIFF, BMP, GIF,
  HEIF/HEIC or AVIF (PDF, SVG, JPEG 2000, text… are named when recognised);
- ``DecodeFailed`` when the header is truncated or inconsistent (zero width, no SOF, bad IHDR);
- ``TooLarge`` when width × height exceeds ``max_pixels``, the frame/page count exceeds
  ``max_frames``, or a JPEG holds more than ``max_scans`` scans or ``max_markers`` markers
  (a progressive JPEG padded with tiny scans costs many times its honest decode time;
  docs/robustness.md);
- ``DecodeFailed`` for a JPEG with no end-of-image marker (FFD9) after its frame header: it
  was cut short. Data appended after the EOI (phone trailers, MPF previews) is fine.

Messages never echo payload bytes: they name what was recognised, the payload's size and the
first 12 hex digits of its sha256 (see :func:`fingerprint`), and numbers parsed from the header.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
import struct
from dataclasses import dataclass
from typing import Literal

from schemas.errors import DecodeFailed, LightboxError, TooLarge, UnsupportedFormat

__all__ = [
    "DALI_FORMATS",
    "DEFAULT_MAX_BYTES",
    "DEFAULT_MAX_FRAMES",
    "DEFAULT_MAX_MARKERS",
    "DEFAULT_MAX_PIXELS",
    "DEFAULT_MAX_SCANS",
    "ImageFormat",
    "ImageInfo",
    "exif_orientation",
    "fingerprint",
    "sniff",
]

STAGE = "decode"
DEFAULT_MAX_BYTES = 50 * 1024 * 1024
DEFAULT_MAX_PIXELS = 64_000_000
DEFAULT_MAX_FRAMES = 256  # frames/pages a file may declare (360° spins: 36-120); only the first is decoded
DEFAULT_MAX_SCANS = 256  # encoders write 1 (baseline) to ~10-20 (progressive) scans
DEFAULT_MAX_MARKERS = 4096  # JPEG markers / PNG chunks / RIFF chunks / GIF blocks walked

ImageFormat = Literal["jpeg", "png", "webp", "tiff", "bmp", "gif", "heif", "avif"]
# Formats DALI's decoders.image takes here (TIFF and BMP checked identical to Pillow, first page of
# a multi-page TIFF included); GIF, HEIF and AVIF it refuses: those decode with Pillow (+ pillow-heif).
DALI_FORMATS: frozenset[str] = frozenset({"jpeg", "png", "webp", "tiff", "bmp"})
SUPPORTED = "JPEG, PNG, WebP, TIFF, BMP, GIF, HEIF/HEIC, AVIF"

_PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
# SOF markers carrying the frame size: C0..CF except DHT (C4), JPG (C8) and DAC (CC).
_SOF_MARKERS = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
_PROGRESSIVE_SOF = frozenset({0xC2, 0xC6, 0xCA, 0xCE})
# Markers without a length field: TEM, RSTn, SOI, EOI.
_STANDALONE = frozenset({0x01, *range(0xD0, 0xDA)})
# 0xFF followed by a marker code: not a stuffed 0x00, not RSTn (those live inside scans), not fill.
_JPEG_MARKER = re.compile(rb"\xff[\x01-\xcf\xd8-\xfe]")
_HEIF_BRANDS = frozenset({b"heic", b"heix", b"heim", b"heis", b"hevc", b"hevx", b"mif1", b"msf1", b"mif2"})
_AVIF_BRANDS = frozenset({b"avif", b"avis"})
_OTHER_FORMATS: tuple[tuple[bytes, int, str], ...] = (
    (b"\x00\x00\x00\x0cjP  ", 0, "JPEG 2000"),
    (b"\xff\x4f\xff\x51", 0, "JPEG 2000"),
    (b"%PDF", 0, "PDF"),
    (b"PK\x03\x04", 0, "ZIP archive"),
    (b"\x1f\x8b", 0, "gzip data"),
    (b"\x7fELF", 0, "ELF executable"),
    (b"8BPS", 0, "Photoshop PSD"),
    (b"\x00\x00\x01\x00", 0, "Windows icon"),
    (b"qoif", 0, "QOI"),
    (b"\xff\x0a", 0, "JPEG XL"),
    (b"\x00\x00\x00\x0cJXL ", 0, "JPEG XL"),
)
_TEXT_KINDS: tuple[tuple[bytes, str], ...] = (
    (b"<svg", "SVG"),
    (b"<?xml", "XML/SVG"),
    (b"<!doctype html", "HTML"),
    (b"<html", "HTML"),
    (b"{", "JSON-like text"),
)


@dataclass(frozen=True, slots=True)
class ImageInfo:
    """What the header says about an image.

    ``width`` and ``height`` are as stored (before orientation); ``oriented_size`` gives
    ``(width, height)`` after it. ``components`` is the stored sample count per pixel (JPEG: 1
    gray, 3 YCbCr/RGB, 4 CMYK/YCCK; PNG: 1 gray/palette, 2 gray+alpha, 3 RGB, 4 RGBA; TIFF:
    SamplesPerPixel; …). ``bit_depth`` is bits per sample (16 for 16-bit PNG/TIFF, 10/12 for
    deep HEIF/AVIF). ``frames`` counts frames or pages (counted up to the limit; only the first
    is decoded). ``has_icc``: an embedded ICC profile (the decoder converts non-sRGB ones).
    ``orientation`` is the EXIF/TIFF orientation 1..8 (HEIF ``irot`` mapped to 1/3/6/8).
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
    frames: int = 1
    scans: int = 0  # JPEG SOS segments
    has_icc: bool = False
    payload_bytes: int = 0  # the encoded size (set by sniff)

    @property
    def pixels(self) -> int:
        return self.width * self.height

    @property
    def oriented_size(self) -> tuple[int, int]:
        """``(width, height)`` of the image once orientation is applied."""
        if self.orientation in (5, 6, 7, 8):
            return self.height, self.width
        return self.width, self.height

    @property
    def animated(self) -> bool:
        return self.frames > 1

    @property
    def pillow_path(self) -> bool:
        """Whether the decoder takes this image through Pillow rather than DALI (an ICC
        profile that is not sRGB also sends it there; that needs the profile bytes)."""
        return (
            self.format not in DALI_FORMATS or self.has_alpha or self.bit_depth > 8 or self.animated
        )

    @property
    def decoded_nbytes(self) -> int:
        """Peak bytes while decoding the first frame (frames beyond it are never decoded) —
        the estimate the batcher's memory budget wants; ``pixels * 3`` undercounts.

        DALI path: DALI's copy of the encoded payload, the decoder's output at the stored depth
        and the 8-bit RGB(A) array handed on (measured: JPEG 6.0 B/px, uncompressed TIFF and BMP
        9.0 with their 3 B/px payload). Pillow path: the 8-bit result, Pillow's 4-byte-per-pixel
        image and 3 bytes per pixel for the codec's own buffers (measured peaks over a warmed-up process, bytes/pixel:
        16-bit RGB PNG 7.0, 16-bit gray PNG 7.0, GIF 8.0, RGBA PNG 8.0, TIFF 7.6, HEIC 7.8,
        AVIF 9.2), plus 4 when an ICC profile may be converted. A 16-bit 8000² PNG: 610 MiB.
        """
        out = 4 if self.has_alpha else 3
        if self.pillow_path:
            return self.pixels * (out + 7 + (4 if self.has_icc else 0))
        raw = max(self.components, 1) * (2 if self.bit_depth > 8 else 1)
        return self.pixels * (out + raw) + self.payload_bytes


def fingerprint(blob: bytes | bytearray | memoryview) -> str:
    """``"<n> bytes, sha256 <12 hex digits>"``: how messages refer to a payload's content."""
    return f"{len(blob)} bytes, sha256 {hashlib.sha256(blob).hexdigest()[:12]}"


def sniff(
    blob: bytes | bytearray | memoryview,
    max_bytes: int = DEFAULT_MAX_BYTES,
    max_pixels: int = DEFAULT_MAX_PIXELS,
    *,
    max_frames: int = DEFAULT_MAX_FRAMES,
    max_scans: int = DEFAULT_MAX_SCANS,
    max_markers: int = DEFAULT_MAX_MARKERS,
) -> ImageInfo:
    """Identify ``blob`` and enforce the byte, pixel, frame and scan limits; see the module doc."""
    raw = blob if isinstance(blob, bytes) else bytes(blob)
    n = len(raw)
    if n == 0:
        raise DecodeFailed("empty payload (0 bytes)", stage=STAGE)
    try:
        if n > max_bytes:
            raise TooLarge(f"payload is {n} bytes, limit is {max_bytes}", stage=STAGE)
        info = _parse(raw, max_frames, max_scans, max_markers)
        if info.width <= 0 or info.height <= 0:
            raise DecodeFailed(f"{info.format} header gives an empty size {info.width}x{info.height}", stage=STAGE)
        if info.pixels > max_pixels:
            raise TooLarge(
                f"{info.format} header says {info.width}x{info.height} = {info.pixels} pixels, limit is {max_pixels}",
                stage=STAGE,
            )
        if info.frames > max_frames:
            raise TooLarge(f"{info.format} declares at least {info.frames} frames, limit is {max_frames}", stage=STAGE)
    except LightboxError as err:
        raise type(err)(f"{err.message} ({fingerprint(raw)})", stage=STAGE) from None
    except (struct.error, IndexError, ValueError) as err:
        raise DecodeFailed(f"malformed image header ({type(err).__name__}; {fingerprint(raw)})", stage=STAGE) from None
    return dataclasses.replace(info, payload_bytes=n)


def _parse(raw: bytes, max_frames: int, max_scans: int, max_markers: int) -> ImageInfo:
    head = raw[:32]
    if head.startswith(b"\xff\xd8\xff"):
        return _jpeg_info(raw, max_scans, max_markers)
    if head.startswith(_PNG_MAGIC):
        return _png_info(raw, max_markers)
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return _webp_info(raw, max_frames, max_markers)
    if head[:4] in (b"II*\x00", b"MM\x00*", b"II+\x00", b"MM\x00+"):
        return _tiff_info(raw, max_frames)
    if head[:2] == b"BM" and len(raw) >= 18:
        return _bmp_info(raw)
    if head[:6] in (b"GIF87a", b"GIF89a"):
        return _gif_info(raw, max_frames, max_markers)
    if head[4:8] == b"ftyp":
        return _isobmff_info(raw, max_markers)
    raise UnsupportedFormat(f"not an image: {_describe(head)}; supported: {SUPPORTED}", stage=STAGE)


def _describe(head: bytes) -> str:
    """What the payload looks like, in words only — never its bytes."""
    for magic, offset, name in _OTHER_FORMATS:
        if head[offset : offset + len(magic)] == magic:
            return f"{name} is not supported"
    if head.startswith(b"\xff\xd8"):
        return "JPEG without a marker after SOI"
    text = head.lstrip(b"\xef\xbb\xbf \t\r\n").lower()
    for magic, name in _TEXT_KINDS:
        if text.startswith(magic):
            return f"{name}"
    if all(32 <= c < 127 or c in (9, 10, 13) for c in head):
        return "text"
    return "unknown binary data"


def _truncated(fmt: str, what: str) -> DecodeFailed:
    return DecodeFailed(f"truncated {fmt} header: {what}", stage=STAGE)


def _too_many(fmt: str, what: str, limit: int) -> TooLarge:
    return TooLarge(f"{fmt} has more than {limit} {what}", stage=STAGE)


# ---- JPEG -------------------------------------------------------------------------------------


def _jpeg_info(raw: bytes, max_scans: int, max_markers: int) -> ImageInfo:
    """Walk every marker to the EOI: segments by their length, entropy-coded data by a byte
    search for the next marker (as libjpeg resynchronises). Counts scans and markers."""
    n = len(raw)
    pos = 2
    orientation = 1
    has_icc = False
    frame: tuple[int, int, int, int, bool, int] | None = None  # precision, h, w, comps, prog, end
    markers = scans = 0
    while True:
        m = _JPEG_MARKER.search(raw, pos)
        if m is None:
            break
        marker = raw[m.start() + 1]
        pos = m.end()
        markers += 1
        if markers > max_markers:
            raise _too_many("JPEG", "markers", max_markers)
        if marker in _STANDALONE:
            if marker == 0xD9:
                if frame is None:
                    raise DecodeFailed("JPEG: end of image before any frame header", stage=STAGE)
                return _jpeg_result(frame, orientation, has_icc, scans)
            continue
        if pos + 2 > n:
            raise _truncated("JPEG", f"segment 0xFF{marker:02X} has no length")
        (length,) = struct.unpack_from(">H", raw, pos)
        if length < 2:
            if frame is None:
                raise DecodeFailed(f"JPEG: bad segment length {length}", stage=STAGE)
            continue  # garbage inside a scan: resynchronise on the next marker
        body = raw[pos + 2 : pos + length]
        if marker == 0xDA:
            if frame is None:
                raise DecodeFailed("JPEG: scan data before any frame header", stage=STAGE)
            scans += 1
            if scans > max_scans:
                raise _too_many("JPEG", "scans", max_scans)
        elif marker in _SOF_MARKERS:
            if frame is not None:
                raise DecodeFailed("JPEG: a second frame header (hierarchical JPEG is not supported)", stage=STAGE)
            if len(body) < 6:
                raise _truncated("JPEG", "frame header cut short")
            precision, height, width, comps = struct.unpack_from(">BHHB", body, 0)
            frame = (precision, height, width, comps, marker in _PROGRESSIVE_SOF, pos + length)
        elif frame is None and pos + length > n:
            raise _truncated("JPEG", f"segment 0xFF{marker:02X} runs past the end")
        elif marker == 0xE1 and body[:6] == b"Exif\x00\x00":
            orientation = exif_orientation(body[6:])
        elif marker == 0xE2 and body[:12] == b"ICC_PROFILE\x00":
            has_icc = True
        pos += length
    if frame is None:
        raise _truncated("JPEG", "ended before the frame header (SOF)")
    if raw.rfind(b"\xff\xd9") < frame[5]:
        h, w = frame[1], frame[2]
        raise DecodeFailed(f"truncated JPEG ({w}x{h}): no end-of-image marker", stage=STAGE)
    # An EOI exists but the walk lost it inside a damaged segment: decoders resynchronise too.
    return _jpeg_result(frame, orientation, has_icc, scans)


def _jpeg_result(
    frame: tuple[int, int, int, int, bool, int], orientation: int, has_icc: bool, scans: int
) -> ImageInfo:
    precision, height, width, comps, progressive, end = frame
    return ImageInfo(
        format="jpeg",
        width=width,
        height=height,
        components=comps,
        progressive=progressive,
        orientation=orientation,
        bit_depth=precision,
        header_end=end,
        scans=scans,
        has_icc=has_icc,
    )


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


def _png_info(raw: bytes, max_markers: int) -> ImageInfo:
    n = len(raw)
    if n < 33:
        raise _truncated("PNG", f"{n} bytes, the IHDR chunk needs 33")
    length, ctype = struct.unpack_from(">I4s", raw, 8)
    if ctype != b"IHDR" or length != 13:
        raise DecodeFailed("PNG: first chunk is not a 13-byte IHDR", stage=STAGE)
    width, height, depth, colour = struct.unpack_from(">IIBB", raw, 16)
    if colour not in _PNG_COMPONENTS:
        raise DecodeFailed(f"PNG: invalid colour type {colour}", stage=STAGE)
    has_alpha = colour in (4, 6)
    has_icc = False
    frames = 1
    pos = 33
    # Walk chunk headers up to the first IDAT — no pixel data.
    for _ in range(max_markers):
        if pos + 8 > n:
            break
        length, ctype = struct.unpack_from(">I4s", raw, pos)
        if ctype == b"IDAT":
            break
        if ctype == b"tRNS":
            has_alpha = True
        elif ctype == b"iCCP":
            has_icc = True
        elif ctype == b"acTL" and length >= 8:
            (frames,) = struct.unpack_from(">I", raw, pos + 8)
            frames = max(frames, 1)
        pos += 12 + length
    else:
        raise _too_many("PNG", "chunks before its image data", max_markers)
    return ImageInfo(
        format="png",
        width=width,
        height=height,
        components=_PNG_COMPONENTS[colour],
        has_alpha=has_alpha,
        bit_depth=depth,
        header_end=33,
        frames=frames,
        has_icc=has_icc,
    )


# ---- WebP -------------------------------------------------------------------------------------


def _webp_info(raw: bytes, max_frames: int, max_markers: int) -> ImageInfo:
    n = len(raw)
    if n < 30:
        raise _truncated("WebP", f"{n} bytes")
    chunk = raw[12:16]
    body = 20
    if chunk == b"VP8X":
        flags = raw[body]
        width = 1 + int.from_bytes(raw[body + 4 : body + 7], "little")
        height = 1 + int.from_bytes(raw[body + 7 : body + 10], "little")
        alpha = bool(flags & 0x10)
        frames = _webp_frames(raw, max_frames, max_markers) if flags & 0x02 else 1
        return ImageInfo(
            "webp", width, height, 4 if alpha else 3, has_alpha=alpha, frames=frames, has_icc=bool(flags & 0x20)
        )
    if chunk == b"VP8 ":
        # 3-byte frame tag, start code 9D 01 2A, then 14-bit width and height (2 scale bits).
        if raw[body + 3 : body + 6] != b"\x9d\x01\x2a":
            raise DecodeFailed("WebP: VP8 start code missing", stage=STAGE)
        w, h = struct.unpack_from("<HH", raw, body + 6)
        return ImageInfo("webp", w & 0x3FFF, h & 0x3FFF, 3)
    if chunk == b"VP8L":
        if raw[body] != 0x2F:
            raise DecodeFailed("WebP: VP8L signature missing", stage=STAGE)
        (bits,) = struct.unpack_from("<I", raw, body + 1)
        width = 1 + (bits & 0x3FFF)
        height = 1 + ((bits >> 14) & 0x3FFF)
        alpha = bool((bits >> 28) & 1)
        return ImageInfo("webp", width, height, 4 if alpha else 3, has_alpha=alpha)
    raise DecodeFailed("WebP: unknown first chunk", stage=STAGE)


def _webp_frames(raw: bytes, max_frames: int, max_markers: int) -> int:
    """ANMF chunks of an animated WebP, counted up to ``max_frames + 1``."""
    pos, frames = 12, 0
    for _ in range(max_markers):
        if pos + 8 > len(raw) or frames > max_frames:
            return max(frames, 1)
        ctype = raw[pos : pos + 4]
        (size,) = struct.unpack_from("<I", raw, pos + 4)
        frames += ctype == b"ANMF"
        pos += 8 + size + (size & 1)
    raise _too_many("WebP", "chunks", max_markers)


# ---- TIFF -------------------------------------------------------------------------------------

_TIFF_TYPE_SIZE = {1: 1, 2: 1, 3: 2, 4: 4, 5: 8, 6: 1, 7: 1, 8: 2, 9: 4, 10: 8, 11: 4, 12: 8, 16: 8, 17: 8, 18: 8}
_TIFF_INT = {1: "B", 3: "H", 4: "I", 6: "b", 8: "h", 9: "i", 16: "Q", 17: "q", 18: "Q"}
_TIFF_MAX_ENTRIES = 1024


def _tiff_info(raw: bytes, max_frames: int) -> ImageInfo:
    e = "<" if raw[:2] == b"II" else ">"
    big = struct.unpack_from(e + "H", raw, 2)[0] == 43
    off_fmt, count_fmt, entry, inline = (e + "Q", e + "Q", 20, 8) if big else (e + "I", e + "H", 12, 4)
    first = struct.unpack_from(off_fmt, raw, 8 if big else 4)[0]
    if first < 8 or first >= len(raw):
        raise _truncated("TIFF", "first IFD offset points outside the file")

    def ifd_entries(offset: int) -> tuple[dict[int, tuple[int, int, int]], int]:
        (count,) = struct.unpack_from(count_fmt, raw, offset)
        if count > _TIFF_MAX_ENTRIES:
            raise DecodeFailed(f"TIFF: IFD with {count} entries", stage=STAGE)
        base = offset + struct.calcsize(count_fmt)
        tags: dict[int, tuple[int, int, int]] = {}
        for i in range(count):
            tag, typ = struct.unpack_from(e + "HH", raw, base + entry * i)
            (cnt,) = struct.unpack_from(off_fmt if big else e + "I", raw, base + entry * i + 4)
            tags[tag] = (typ, cnt, base + entry * i + (12 if big else 8))
        (nxt,) = struct.unpack_from(off_fmt, raw, base + entry * count)
        return tags, nxt

    def values(tags: dict[int, tuple[int, int, int]], tag: int, default: int) -> list[int]:
        if tag not in tags:
            return [default]
        typ, cnt, at = tags[tag]
        if typ not in _TIFF_INT or cnt == 0:
            return [default]
        size = _TIFF_TYPE_SIZE[typ]
        cnt = min(cnt, 16)
        if size * cnt > inline:
            (at,) = struct.unpack_from(off_fmt, raw, at)
        return list(struct.unpack_from(e + _TIFF_INT[typ] * cnt, raw, at))

    tags, nxt = ifd_entries(first)
    width, height = values(tags, 256, 0)[0], values(tags, 257, 0)[0]
    spp = values(tags, 277, 1)[0]
    bits = max(values(tags, 258, 1))
    extra = values(tags, 338, 0)
    orientation = values(tags, 274, 1)[0]
    frames, seen = 1, {first}
    while nxt and frames <= max_frames and nxt not in seen and nxt < len(raw):
        seen.add(nxt)
        frames += 1
        _tags, nxt = ifd_entries(nxt)
    return ImageInfo(
        format="tiff",
        width=width,
        height=height,
        components=max(spp, 1),
        has_alpha=spp in (2, 4) and any(x in (1, 2) for x in extra),
        orientation=orientation if 1 <= orientation <= 8 else 1,
        bit_depth=bits,
        frames=frames,
        has_icc=34675 in tags,
    )


# ---- BMP --------------------------------------------------------------------------------------


def _bmp_info(raw: bytes) -> ImageInfo:
    (dib,) = struct.unpack_from("<I", raw, 14)
    if dib == 12:  # OS/2 BITMAPCOREHEADER
        width, height, _planes, bpp = struct.unpack_from("<HHHH", raw, 18)
        compression = 0
    elif 16 <= dib <= 124:
        width, height, _planes, bpp, compression = struct.unpack_from("<iiHHI", raw, 18)
    else:
        raise DecodeFailed(f"BMP: unknown header size {dib}", stage=STAGE)
    alpha = False
    if bpp == 32 and compression in (3, 6) and dib >= 56:
        (alpha_mask,) = struct.unpack_from("<I", raw, 14 + 52)
        alpha = alpha_mask != 0
    return ImageInfo(
        format="bmp",
        width=width,  # negative width is invalid: caught as an empty size
        height=abs(height),  # negative height = rows stored top-down
        components=4 if alpha else 3,
        has_alpha=alpha,
        bit_depth=8,
    )


# ---- GIF --------------------------------------------------------------------------------------


def _gif_info(raw: bytes, max_frames: int, max_markers: int) -> ImageInfo:
    n = len(raw)
    if n < 13:
        raise _truncated("GIF", f"{n} bytes")
    width, height, flags = struct.unpack_from("<HHB", raw, 6)
    pos = 13 + (3 << ((flags & 7) + 1) if flags & 0x80 else 0)
    frames, alpha = 0, False

    def skip_sub_blocks(p: int) -> int:
        while p < n:
            size = raw[p]
            p += 1 + size
            if size == 0:
                return p
        return p

    for _ in range(max_markers):
        if pos >= n or frames > max_frames:
            break
        kind = raw[pos]
        if kind == 0x21:  # extension: label, sub-blocks
            if frames == 0 and pos + 4 < n and raw[pos + 1] == 0xF9 and raw[pos + 3] & 1:
                alpha = True  # graphic control extension of the first frame names a transparent index
            pos = skip_sub_blocks(pos + 2)
        elif kind == 0x2C:  # image descriptor
            left, top, w, h, iflags = struct.unpack_from("<HHHHB", raw, pos + 1)
            if frames == 0:  # Pillow grows the canvas to hold a first frame that overhangs it
                width, height = max(width, left + w), max(height, top + h)
            pos += 10 + (3 << ((iflags & 7) + 1) if iflags & 0x80 else 0)
            pos = skip_sub_blocks(pos + 1)  # LZW minimum code size, then the data
            frames += 1
        else:  # trailer (0x3B) or garbage: decoders stop here too
            break
    else:
        raise _too_many("GIF", "blocks", max_markers)
    if frames == 0:
        raise _truncated("GIF", "no image descriptor")
    return ImageInfo("gif", width, height, 4 if alpha else 3, has_alpha=alpha, frames=frames)


# ---- HEIF / AVIF (ISO base media file format) -------------------------------------------------


def _boxes(raw: bytes, start: int, end: int, budget: list[int]) -> list[tuple[bytes, int, int]]:
    """``(type, body_start, body_end)`` of the boxes in ``raw[start:end]``."""
    out = []
    pos = start
    while pos + 8 <= end:
        budget[0] -= 1
        if budget[0] < 0:
            raise TooLarge("HEIF/AVIF has too many boxes", stage=STAGE)
        size, kind = struct.unpack_from(">I4s", raw, pos)
        header = 8
        if size == 1:
            (size,) = struct.unpack_from(">Q", raw, pos + 8)
            header = 16
        elif size == 0:
            size = end - pos
        if size < header or pos + size > end:
            raise _truncated("HEIF/AVIF", "a box runs past its parent")
        out.append((kind, pos + header, pos + size))
        pos += size
    return out


def _child(boxes: list[tuple[bytes, int, int]], kind: bytes) -> tuple[int, int] | None:
    return next(((s, e) for k, s, e in boxes if k == kind), None)


def _isobmff_info(raw: bytes, max_markers: int) -> ImageInfo:
    budget = [max_markers]
    top = _boxes(raw, 0, len(raw), budget)
    ftyp = _child(top, b"ftyp")
    assert ftyp is not None  # raw[4:8] == b"ftyp"
    major = raw[ftyp[0] : ftyp[0] + 4]
    brands = {major} | {raw[i : i + 4] for i in range(ftyp[0] + 8, ftyp[1] - 3, 4)}
    hevc = brands & (_HEIF_BRANDS - {b"mif1", b"msf1", b"mif2"})
    if major in _AVIF_BRANDS or (brands & _AVIF_BRANDS and not hevc):
        fmt: ImageFormat = "avif"
    elif brands & _HEIF_BRANDS:
        fmt = "heif"
    else:
        raise UnsupportedFormat(
            f"not an image: ISO media file without a HEIF or AVIF brand; supported: {SUPPORTED}", stage=STAGE
        )
    meta = _child(top, b"meta")
    if meta is None:
        raise DecodeFailed(f"{fmt}: no meta box (image sequences without a still image are not supported)", stage=STAGE)
    children = _boxes(raw, meta[0] + 4, meta[1], budget)  # meta is a full box: 4 bytes version/flags
    pitm, iprp = _child(children, b"pitm"), _child(children, b"iprp")
    if pitm is None or iprp is None:
        raise DecodeFailed(f"{fmt}: no primary item or no item properties", stage=STAGE)
    primary = struct.unpack_from(">H" if raw[pitm[0]] == 0 else ">I", raw, pitm[0] + 4)[0]
    iprp_boxes = _boxes(raw, iprp[0], iprp[1], budget)
    ipco = _child(iprp_boxes, b"ipco")
    if ipco is None:
        raise DecodeFailed(f"{fmt}: no item property container", stage=STAGE)
    props = _boxes(raw, ipco[0], ipco[1], budget)
    indices: list[int] = []
    for kind, s, _e in iprp_boxes:
        if kind == b"ipma":
            indices += _ipma(raw, s, primary, budget)
    width = height = 0
    bits, channels, rotation, icc, alpha = 8, 3, 0, False, False
    for kind, s, e in props:
        if kind == b"auxC" and b"alpha" in raw[s:e]:
            alpha = True  # an alpha plane is an auxiliary image; its property names the URN
    for index in indices:
        if not 1 <= index <= len(props):
            continue
        kind, s, e = props[index - 1]
        if kind == b"ispe":
            width, height = struct.unpack_from(">II", raw, s + 4)
        elif kind == b"pixi" and e - s >= 6:
            channels = raw[s + 4]
            bits = max(raw[s + 5 : s + 5 + channels] or b"\x08")
        elif kind == b"irot" and e > s:
            rotation = raw[s] & 3
        elif kind == b"colr" and raw[s : s + 4] in (b"prof", b"rICC"):
            icc = True
    if width == 0 or height == 0:
        raise DecodeFailed(f"{fmt}: primary item has no image size (ispe)", stage=STAGE)
    return ImageInfo(
        format=fmt,
        width=width,
        height=height,
        components=channels + alpha,
        has_alpha=alpha,
        orientation={0: 1, 1: 8, 2: 3, 3: 6}[rotation],  # irot counts anticlockwise quarter turns
        bit_depth=bits,
        has_icc=icc,
    )


def _ipma(raw: bytes, s: int, item: int, budget: list[int]) -> list[int]:
    """Property indices (1-based) associated with ``item`` in an ``ipma`` box at ``s``."""
    version, flags = raw[s], int.from_bytes(raw[s + 1 : s + 4], "big")
    (count,) = struct.unpack_from(">I", raw, s + 4)
    pos = s + 8
    wide = flags & 1
    for _ in range(count):
        budget[0] -= 1
        if budget[0] < 0:
            raise TooLarge("HEIF/AVIF has too many item associations", stage=STAGE)
        item_id = struct.unpack_from(">H" if version < 1 else ">I", raw, pos)[0]
        pos += 2 if version < 1 else 4
        n = raw[pos]
        pos += 1
        size = 2 if wide else 1
        if item_id == item:
            fmt = ">" + ("H" if wide else "B") * n
            return [v & (0x7FFF if wide else 0x7F) for v in struct.unpack_from(fmt, raw, pos)]
        pos += n * size
    return []
