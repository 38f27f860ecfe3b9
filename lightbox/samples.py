"""Sample catalog for the demo and the tests: real photographs shipped with scikit-image,
re-encoded at catalog sizes (generated at setup, never committed), and a set of bad inputs.
Pure: no Kafka, no Faust.
"""

from __future__ import annotations

import io
import struct
import zlib
from pathlib import Path

import numpy as np
from PIL import Image

__all__ = ["BAD_INPUTS", "make_bad_inputs", "make_catalog"]

# Photographs in skimage.data that load without a download: (name, is it a product-like object)
PHOTOS = ("coffee", "rocket", "astronaut", "chelsea", "clock", "coins", "camera", "immunohistochemistry")
# Catalog sizes (width, height) suppliers upload at, and how each sample is written.
SIZES = ((1200, 1200), (1600, 1200), (1000, 1500), (1400, 1050))
FORMATS: tuple[tuple[str, dict[str, object]], ...] = (
    ("jpeg", {"quality": 90}), ("jpeg", {"quality": 85, "progressive": True}), ("png", {}), ("webp", {"quality": 90}))


def _photo(name: str) -> Image.Image:
    import skimage.data

    arr = getattr(skimage.data, name)()
    img = Image.fromarray(arr)
    return img.convert("RGB") if img.mode not in ("RGB", "L") else img


def _fit(img: Image.Image, size: tuple[int, int], variant: int) -> Image.Image:
    """Crop to the target aspect (offset by ``variant`` so samples differ), then resize."""
    w, h = img.size
    tw, th = size
    scale = min(w / tw, h / th)
    cw, ch = int(tw * scale), int(th * scale)
    x = (w - cw) * ((variant * 37) % 100) // 100
    y = (h - ch) * ((variant * 61) % 100) // 100
    return img.crop((x, y, x + cw, y + ch)).resize(size, Image.Resampling.LANCZOS)


def make_catalog(out_dir: str | Path, count: int = 24) -> list[Path]:
    """``count`` supplier-like images (JPEG, progressive JPEG, PNG, WebP; colour and grayscale)
    cut from skimage's photographs at catalog sizes. Deterministic: same files every time."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(count):
        name = PHOTOS[i % len(PHOTOS)]
        size = SIZES[(i // len(PHOTOS) + i) % len(SIZES)]
        fmt, opts = FORMATS[i % len(FORMATS)]
        img = _fit(_photo(name), size, i)
        ext = {"jpeg": "jpg"}.get(fmt, fmt)
        path = out / f"SKU-{i:04d}-{name}.{ext}"
        img.save(path, format=fmt.upper(), **opts)
        paths.append(path)
    return paths


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def pixel_bomb_png(width: int = 50_000, height: int = 50_000) -> bytes:
    """A valid PNG header declaring ``width`` x ``height`` with a tiny compressed body: the kind
    of file that must be refused from its header, before any pixel is decoded."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    row = b"\x00" + b"\x00" * width
    comp = zlib.compressobj(9)
    body = comp.compress(row * 4) + comp.flush()
    return b"\x89PNG\r\n\x1a\n" + _png_chunk(b"IHDR", ihdr) + _png_chunk(b"IDAT", body) + _png_chunk(b"IEND", b"")


BAD_INPUTS = {
    "empty.jpg": "DECODE_FAILED",
    "truncated.jpg": "DECODE_FAILED",
    "notes-as-image.jpg": "UNSUPPORTED_FORMAT",
    "pixel-bomb.png": "TOO_LARGE",
}


def make_bad_inputs(out_dir: str | Path) -> dict[str, Path]:
    """Files that must become dead letters, by name; :data:`BAD_INPUTS` gives each one's code."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    Image.fromarray(np.asarray(_photo("coffee"))).save(buf, format="JPEG", quality=90)
    files = {
        "empty.jpg": b"",
        "truncated.jpg": buf.getvalue()[: len(buf.getvalue()) // 3],
        "notes-as-image.jpg": b"These are not pixels: a supplier uploaded their notes as .jpg\n" * 20,
        "pixel-bomb.png": pixel_bomb_png(),
    }
    paths = {}
    for name, data in files.items():
        (out / name).write_bytes(data)
        paths[name] = out / name
    return paths
