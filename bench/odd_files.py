"""An odd-file corpus of our own, and how many of its files lightbox processes against how many
Pillow alone opens.

The corpus (``make_corpus``) is generated here, deterministically, from scikit-image's
photographs with Pillow, OpenCV and tifffile: BMP variants (1/4/8/16/24/32-bit, top-down, RLE8,
V5 header), TIFF compressions and layouts (LZW, Deflate, PackBits, JPEG, CCITT G3/G4, tiled,
planar, predictor, 16-bit, float, CMYK, YCbCr, multi-page), GIFs (animated with transparency and
each disposal method, first frame smaller than the canvas, interlaced), PNG modes (1/2/4-bit
palettes, tRNS, LA, 16-bit, Adam7) and mutations of real photos (bit flips inside a JPEG's
entropy data, trailing garbage, a PNG with a bad CRC, a TIFF strip cut short...).

    python bench/odd_files.py --out /tmp/odd [--json result.json] [--worker]

"Processed" = every stage of the default stage list ran and a variant came out (CPU backends,
one small preset, batches of 8 as a worker forms them; with ``--worker``, also through a real
``lightbox worker`` on a local Kafka, every file published as an event). "Pillow opens" = ``Image.open`` +
``load()`` of the first frame raised nothing. Run it against another checkout with
``PYTHONPATH=<checkout>`` to compare (the before/after in the report).
"""

from __future__ import annotations

import argparse
import io
import json
import struct
import sys
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image


def _photo(name: str, w: int, h: int) -> np.ndarray:
    import skimage.data

    src = np.asarray(getattr(skimage.data, name)())
    if src.ndim == 2:
        src = np.repeat(src[..., None], 3, axis=2)
    return np.asarray(Image.fromarray(np.ascontiguousarray(src[..., :3])).resize((w, h)))


def _save(im: Image.Image, fmt: str, **kw: Any) -> bytes:
    buf = io.BytesIO()
    im.save(buf, fmt, **kw)
    return buf.getvalue()


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


def make_corpus(out: Path) -> list[Path]:
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


def lightbox_processes(paths: list[Path], batch: int = 8) -> dict[str, str]:
    """{file: "ok" or the dead letter's code and message} through the default CPU stage list."""
    from gpu_kernels.backends import RetouchOptions
    from gpu_kernels.codec import CpuEncoder, make_decoder
    from gpu_kernels.pipeline import Job, RetouchPipeline
    from gpu_kernels.presets import Preset
    from gpu_kernels.retouch import CpuRetoucher
    from gpu_kernels.spans import SpanRecorder

    pipe = RetouchPipeline(make_decoder("cpu"), CpuRetoucher(), CpuEncoder())
    preset = Preset("odd", 128, 128, "jpeg", 85)
    out: dict[str, str] = {}
    for k in range(0, len(paths), batch):
        chunk = paths[k:k + batch]
        results = pipe.run_batch([Job(p.read_bytes(), [preset], RetouchOptions(), SpanRecorder()) for p in chunk])
        for p, r in zip(chunk, results, strict=True):
            out[p.name] = "ok" if r.ok else str(r.error)
    pipe.close()
    return out


def worker_processes(paths: list[Path], out: Path) -> dict[str, str]:
    """{file: "ok" or the dead letter's code and message} from a real CPU worker on a local broker."""
    import asyncio
    import uuid

    from lightbox.demo import WorkerProcess, collect_outputs
    from lightbox.devservers.kafka_local import LocalKafka
    from streams.app import ensure_topics
    from streams.producer import ImageProducer
    from streams.settings import Settings

    out.mkdir(parents=True, exist_ok=True)
    presets = out / "presets.toml"
    presets.write_text('[odd]\nwidth = 128\nheight = 128\nformat = "jpeg"\nquality = 85\nfill = 0.8\n')
    kafka = LocalKafka.start()
    tag = uuid.uuid4().hex[:6]
    s = Settings(kafka_bootstrap=kafka.bootstrap, group_id=f"odd-{tag}", input_topic=f"odd-{tag}.images",
                 backfill_topic=f"odd-{tag}.backfill", output_topic=f"odd-{tag}.processed",
                 dlq_topic=f"odd-{tag}.dlq", data_dir=out / f"worker-{tag}")
    names: dict[object, str] = {}

    async def publish() -> None:
        await ensure_topics(s)
        async with ImageProducer(s.kafka.bootstrap, s.topics.input) as prod:
            futs = []
            for p in paths:
                ev = prod.event_for_file(p, presets=["odd"])
                futs.append((p.name, ev["event_id"], await prod.publish(ev)))
            for name, eid, fut in futs:
                meta = await fut
                names[eid] = names[(meta.partition, meta.offset)] = name

    env = {"LIGHTBOX_KAFKA_BOOTSTRAP": s.kafka.bootstrap, "LIGHTBOX_GROUP_ID": s.kafka.group_id,
           "LIGHTBOX_INPUT_TOPIC": s.topics.input, "LIGHTBOX_OUTPUT_TOPIC": s.topics.output,
           "LIGHTBOX_DLQ_TOPIC": s.topics.dlq, "LIGHTBOX_BACKFILL_TOPIC": s.topics.backfill,
           "LIGHTBOX_DATA_DIR": str(s.worker.data_dir), "LIGHTBOX_DEVICE": "cpu", "LIGHTBOX_SEGMENTER": "classical",
           "LIGHTBOX_PRESETS_FILE": str(presets), "LIGHTBOX_METRICS_PORT": "0"}
    worker = None
    try:
        asyncio.run(publish())
        worker = WorkerProcess(env, out / "worker.log").start()
        processed, dead = asyncio.run(collect_outputs(kafka.bootstrap, [s.topics.output, s.topics.dlq], len(paths),
                                                      600, worker.running))
    finally:
        if worker is not None:
            worker.stop()
        kafka.stop()
    verdict = {names[p["source_event_id"]]: "ok" for p in processed}
    for d in dead:
        verdict[names[(d["original"]["partition"], d["original"]["offset"])]] = f"[{d['error_code']}] {d['message']}"
    return {p.name: verdict.get(p.name, "no output") for p in paths}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="folder for the corpus")
    ap.add_argument("--json", type=Path, help="write the per-file verdicts here")
    ap.add_argument("--worker", action="store_true", help="also through a real worker on a local Kafka")
    args = ap.parse_args()
    paths = make_corpus(args.out / "corpus")
    lb = lightbox_processes(paths)
    pil = {p.name: pillow_opens(p.read_bytes()) for p in paths}
    wk = worker_processes(paths, args.out / "worker") if args.worker else {}
    if wk:
        print(f"worker: {sum(v == 'ok' for v in wk.values())} of {len(paths)} processed")
        for name in sorted(wk):
            if wk[name] != "ok":
                print(f"  {name:40s} worker={wk[name][:150]}")
    both = sum(pil[n] and lb[n] == "ok" for n in lb)
    print(f"{len(paths)} files; Pillow alone opens {sum(pil.values())}; lightbox processes "
          f"{sum(v == 'ok' for v in lb.values())} (both: {both})")
    for name in sorted(lb):
        if lb[name] != "ok" or not pil[name]:
            print(f"  {name:40s} pillow={'yes' if pil[name] else 'no ':3s} lightbox={lb[name][:150]}")
    if args.json:
        args.json.write_text(json.dumps({"files": len(paths), "pillow_opens": sum(pil.values()),
                                         "lightbox_processed": sum(v == "ok" for v in lb.values()),
                                         "worker_processed": sum(v == "ok" for v in wk.values()) if wk else None,
                                         "pillow": pil, "lightbox": lb, "worker": wk}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
