"""The CPU decode path for what DALI does not take: Pillow (+ pillow-heif for HEIF/HEIC).

:func:`decode_first_frame` turns a payload that :func:`~gpu_kernels.codec.sniff.sniff` accepted
into an ``(H, W, 3|4)`` uint8 array:

- first frame / page only (GIF, APNG, animated WebP and AVIF, multi-page TIFF);
- orientation applied (EXIF, TIFF Orientation; HEIF ``irot``/``imir`` by libheif);
- 16-bit samples reduced to 8 bits by keeping the high byte (Pillow's own conversion of
  ``I;16`` to ``L`` clips at 255 instead);
- an embedded ICC profile that is not sRGB (Display P3, Adobe RGB, CMYK press profiles…)
  converted to sRGB with LittleCMS (Pillow ImageCms), in the profile's default rendering
  intent; alpha is carried over untouched;
- RGBA when the first frame has transparency (an alpha channel that is not all 255), RGB
  otherwise.

The size Pillow opens must not exceed the size the header guard passed (otherwise a header walk
that disagrees with the decoder could slip a bomb past the pixel limit); smaller is fine (a HEIF
``clap`` crop) — that refusal is final, no other decoder tries. Library errors come back as
``DecodeFailed`` whose text has any bytes literal removed: messages never echo payload bytes;
their ``reason`` attribute (the library's words) marks them as refusals another decoder may
retry (see :mod:`.chain`).
"""

from __future__ import annotations

import hashlib
import io
import re
import struct
import threading
from functools import lru_cache
from typing import Any

import numpy as np

from gpu_kernels.codec.sniff import ImageInfo, fingerprint
from schemas.errors import DecodeFailed

__all__ = ["PILLOW_FORMATS", "decode_first_frame", "icc_profile", "is_srgb", "refusal", "safe_reason"]

STAGE = "decode"
PILLOW_FORMATS = {
    "jpeg": "JPEG",
    "png": "PNG",
    "webp": "WEBP",
    "tiff": "TIFF",
    "bmp": "BMP",
    "gif": "GIF",
    "heif": "HEIF",
    "avif": "AVIF",
}
# Display P3 is ~0.08 away from sRGB in its red colorant; matrix round-off is ~1e-4.
_COLORANT_TOLERANCE = 0.01
_BYTES_LITERAL = re.compile(r"""b(['"]).*?(?<!\\)\1""")
_heif_lock = threading.Lock()
_heif_registered = False


def _register_heif() -> None:
    global _heif_registered
    with _heif_lock:
        if not _heif_registered:
            import pillow_heif

            pillow_heif.register_heif_opener()
            _heif_registered = True


def safe_reason(err: BaseException | str, limit: int = 160) -> str:
    """A library error's text with bytes literals (``b'…'``) removed, cut to ``limit`` chars."""
    text = _BYTES_LITERAL.sub("<bytes>", str(err)).replace("\n", " ").strip()
    if len(text) > limit:
        return text[: limit - 1] + "…"
    return text or type(err).__name__


def refusal(decoder: str, info: ImageInfo, blob: bytes, err: BaseException | str) -> DecodeFailed:
    """``decoder`` could not read ``blob``: a ``DecodeFailed`` that carries its ``reason``, so that
    a decoder chain (:mod:`.chain`) may try the next decoder and name every refusal."""
    reason = safe_reason(err)
    failed = DecodeFailed(f"{decoder} could not decode the {info.format} image ({info.width}x{info.height}, "
                          f"{fingerprint(blob)}): {reason}", stage=STAGE)
    failed.reason = reason  # type: ignore[attr-defined]
    return failed


def icc_profile(blob: bytes, info: ImageInfo) -> bytes | None:
    """The embedded ICC profile, read by Pillow from the headers only (no pixel decoded)."""
    from PIL import Image

    if info.format in ("heif", "avif"):
        return None  # always on the Pillow path: read when decoding
    try:
        with Image.open(io.BytesIO(blob), formats=[PILLOW_FORMATS[info.format]]) as im:
            icc = im.info.get("icc_profile")
    except Exception:  # the decoder reports a broken file; an unreadable profile is "none"
        return None
    return icc if isinstance(icc, bytes) and icc else None


def is_srgb(icc: bytes) -> bool:
    """Whether ``icc`` describes sRGB (or needs no conversion): an RGB matrix/TRC profile whose
    colorants are sRGB's, or a gray profile. Unreadable profiles count as sRGB (ignored)."""
    return _is_srgb_cached(hashlib.sha256(icc).digest(), icc)


@lru_cache(maxsize=256)
def _is_srgb_cached(_digest: bytes, icc: bytes) -> bool:
    from PIL import ImageCms

    srgb = ImageCms.ImageCmsProfile(ImageCms.createProfile("sRGB")).profile
    try:
        prof = ImageCms.ImageCmsProfile(io.BytesIO(icc)).profile
    except (OSError, ImageCms.PyCMSError, ValueError):
        return True
    space = prof.xcolor_space.strip()
    if space == "GRAY":
        return True
    if space != "RGB":
        return False  # CMYK, Lab…: convert
    for ours, ref in (
        (prof.red_colorant, srgb.red_colorant),
        (prof.green_colorant, srgb.green_colorant),
        (prof.blue_colorant, srgb.blue_colorant),
    ):
        if ours is None or ref is None:
            return False
        if max(abs(a - b) for a, b in zip(ours[0], ref[0], strict=True)) > _COLORANT_TOLERANCE:
            return False
    return True


def decode_first_frame(blob: bytes, info: ImageInfo, max_pixels: int) -> np.ndarray:
    """Decode the first frame of ``blob`` to ``(H, W, 3|4)`` uint8; raises ``DecodeFailed``."""
    from PIL import Image, ImageOps

    if info.format == "heif":
        _register_heif()
    try:
        with Image.open(io.BytesIO(blob), formats=[PILLOW_FORMATS[info.format]]) as im:
            w, h = im.size
            if w * h > min(max_pixels, info.pixels):  # smaller is fine: HEIF clean-aperture crops
                raise DecodeFailed(
                    f"{info.format}: the decoder sees {w}x{h}, the header guard passed "
                    f"{info.width}x{info.height} ({fingerprint(blob)})",
                    stage=STAGE,
                )
            im.seek(0)
            im.load()
            icc = im.info.get("icc_profile")
            if im.getexif().get(0x0112, 1) != 1:  # exif_transpose copies even when there is nothing to do
                ImageOps.exif_transpose(im, in_place=True)
            return _to_rgb8(im, icc if isinstance(icc, bytes) and icc else None)
    except DecodeFailed:
        raise
    except (OSError, ValueError, SyntaxError, EOFError, TypeError, KeyError, IndexError,
            MemoryError, RuntimeError, Image.DecompressionBombError, struct.error) as err:
        raise refusal("Pillow", info, blob, err) from None


_RAW_LAYOUT: dict[str, tuple[str, int]] = {
    "L": ("u1", 1),
    "RGB": ("u1", 3),
    "RGBA": ("u1", 4),
    "I;16": ("<u2", 1),
    "I;16L": ("<u2", 1),
    "I;16B": (">u2", 1),
    "I;16N": ("=u2", 1),
    "I": ("=i4", 1),
}


def _pixels(im: Any) -> np.ndarray:
    """An 8-bit L/RGB/RGBA Pillow image as a writeable, contiguous NumPy array, copied once.
    ``np.asarray(im)`` goes through ``tobytes()``, which joins a list of chunks: two extra
    copies at the peak (a 64 MP RGB image: +384 MB); this streams the same raw encoder's
    output straight into the array."""
    from PIL import Image

    dtype, channels = _RAW_LAYOUT[im.mode]
    w, h = im.size
    arr = np.empty((h, w, channels) if channels > 1 else (h, w), dtype)
    flat = arr.reshape(-1).view(np.uint8).data
    encoder = Image._getencoder(im.mode, "raw", im.mode)
    try:
        encoder.setimage(im.im, (0, 0, w, h))
        pos = 0
        while True:
            _consumed, errcode, data = encoder.encode(max(65536, w * 4))
            flat[pos : pos + len(data)] = data
            pos += len(data)
            if errcode:
                break
    finally:
        encoder.cleanup()
    if errcode < 0 or pos != arr.nbytes:
        raise DecodeFailed(f"could not read the decoded pixels (encoder status {errcode})", stage=STAGE)
    return arr


def _to_rgb8(im: Any, icc: bytes | None) -> np.ndarray:
    """Any Pillow mode → uint8 RGB or RGBA (alpha only when the image has transparency)."""
    from PIL import Image, ImageCms

    if im.mode in _RAW_LAYOUT and im.mode.startswith("I"):
        # 16-bit gray: the high byte, straight to RGB (a gray profile needs no conversion).
        # Mode "I" holds 16-bit PNG/TIFF samples in an int32.
        arr = _pixels(im)
        if arr.dtype.kind == "i":
            np.clip(arr, 0, 65535, out=arr)
        gray = (arr >> 8).astype(np.uint8)
        del arr
        out = np.empty((*gray.shape, 3), np.uint8)
        out[...] = gray[..., None]
        return out
    elif im.mode == "F":
        arr = np.asarray(im, dtype=np.float32)
        scale = 255.0 if float(np.nanmax(arr, initial=0.0)) <= 1.0 else 1.0
        im = Image.fromarray(np.clip(np.nan_to_num(arr) * scale, 0, 255).round().astype(np.uint8))
    alpha = bool(im.has_transparency_data)
    out_mode = "RGBA" if alpha else "RGB"
    if icc is not None and not is_srgb(icc):
        try:
            src = ImageCms.ImageCmsProfile(io.BytesIO(icc))
            space = src.profile.xcolor_space.strip()
            in_mode = {"RGB": "RGB", "CMYK": "CMYK", "GRAY": "L"}.get(space)
            if in_mode is not None:
                rgba = im.convert("RGBA") if alpha else None
                base = im if im.mode == in_mode else im.convert(in_mode)
                srgb = ImageCms.ImageCmsProfile(ImageCms.createProfile("sRGB"))
                intent = ImageCms.Intent(ImageCms.getDefaultIntent(src))
                converted = ImageCms.profileToProfile(
                    base, src, srgb, renderingIntent=intent, outputMode="RGB"
                )
                assert converted is not None
                if rgba is not None and rgba.getchannel("A").getextrema() != (255, 255):
                    converted.putalpha(rgba.getchannel("A"))
                return _pixels(converted)
        except ImageCms.PyCMSError:
            pass  # a profile LittleCMS cannot use: fall through to the plain conversion
    if im.mode != out_mode:
        im = im.convert(out_mode)
    if alpha and im.getchannel("A").getextrema() == (255, 255):
        im = im.convert("RGB")  # alpha declared but fully opaque (animated WebP, RGBA TIFF…): RGB
    return _pixels(im)
