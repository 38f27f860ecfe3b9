"""Decode + resize throughput on this CPU: DALI cpu vs Pillow vs simplejpeg + OpenCV, and what
DALI buys a CPU worker's decoder.

Usage (from the repository root)::

    PYTHONPATH=. .venv/bin/python bench/bench_decode.py [--n 32] [--threads 2] [--rounds 3] [--out PATH]

Catalog set: skimage photos (coffee, astronaut, chelsea, rocket) upscaled to catalog sizes
1200x1200 and 1200x900, light noise added so they compress like photos, JPEG q90; each
method decodes them and resizes to 800 px on the longer side, one timed run after one warm-up.
Large set: 6000x4000 (24 MP) sources to 800 px: full decode + resize vs reduced-size decode
(``DaliDecoder`` with libjpeg-turbo DCT scaling, and the fused DALI resize for comparison).
Prints img/s and ratios; writes them as JSON to ``--out``. The machine's 1-minute load
average goes into the JSON: on a shared 2-core box the multi-threaded DALI numbers drop
first when other jobs run.
Decoder set (``decoder`` in the JSON): the CPU worker's decoder (libjpeg-turbo + Pillow, no DALI)
against the same decoder routing through DALI's CPU operators (``DaliDecoder("cpu", dali=True)``),
at ``max_side=1440`` (the largest preset side: catalog photos decode at full size, where DALI and
libjpeg-turbo do the same work), on the catalog JPEGs and 8-bit PNGs of 1000x750; ``--rounds``
rounds alternate the two, the best round of each is reported with the ratio no-DALI / DALI.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import simplejpeg
from PIL import Image
from skimage import data

from gpu_kernels.codec import DaliDecoder, make_decoder

TARGET = 800
DECODER_MAX_SIDE = 1440


def make_jpegs(sizes: Sequence[tuple[int, int]], n: int, seed: int = 0) -> list[bytes]:
    """``n`` JPEGs (q90) cycling through the photos and ``sizes`` ((width, height))."""
    rng = np.random.default_rng(seed)
    photos = [np.asarray(f()) for f in (data.coffee, data.astronaut, data.chelsea, data.rocket)]
    out = []
    for i in range(n):
        w, h = sizes[i % len(sizes)]
        img = cv2.resize(photos[i % len(photos)], (w, h), interpolation=cv2.INTER_CUBIC)
        if i % 2:
            img = img[:, ::-1]
        noisy = np.clip(img + rng.normal(0, 3, img.shape), 0, 255).astype(np.uint8)
        out.append(simplejpeg.encode_jpeg(noisy, 90, colorsubsampling="420"))
    return out


def _fit(h: int, w: int, side: int = TARGET) -> tuple[int, int]:
    s = side / max(h, w)
    return max(1, round(w * s)), max(1, round(h * s))


def pillow(blobs: Sequence[bytes], draft: bool = False) -> list[np.ndarray]:
    out = []
    for b in blobs:
        with Image.open(io.BytesIO(b)) as im:
            size = _fit(im.height, im.width)
            if draft:
                im.draft("RGB", size)  # Pillow's own DCT scaling
            out.append(np.asarray(im.convert("RGB").resize(size, Image.Resampling.BILINEAR)))
    return out


def simplejpeg_cv2(blobs: Sequence[bytes]) -> list[np.ndarray]:
    out = []
    for b in blobs:
        img = simplejpeg.decode_jpeg(b)
        out.append(cv2.resize(img, _fit(*img.shape[:2]), interpolation=cv2.INTER_AREA))
    return out


class DaliResize:
    """The plain DALI pipeline: external_source → decoders.image → resize(resize_longer)."""

    def __init__(self, batch_size: int, threads: int) -> None:
        from nvidia.dali import fn, pipeline, types

        d: Any = fn
        self.pipe: Any = pipeline.Pipeline(
            batch_size=batch_size, num_threads=threads, device_id=None, prefetch_queue_depth=1
        )
        with self.pipe:
            enc = d.external_source(name="encoded", dtype=types.UINT8, ndim=1)
            img = d.decoders.image(enc, device="cpu", output_type=types.RGB)
            self.pipe.set_outputs(d.resize(img, resize_longer=TARGET, antialias=True))
        self.pipe.build()
        self.batch_size = batch_size

    def __call__(self, blobs: Sequence[bytes]) -> list[np.ndarray]:
        out: list[np.ndarray] = []
        for s in range(0, len(blobs), self.batch_size):
            chunk = blobs[s : s + self.batch_size]
            self.pipe.feed_input("encoded", [np.frombuffer(b, np.uint8) for b in chunk])
            (batch,) = self.pipe.run()
            out += [np.array(batch[i]) for i in range(len(chunk))]
        return out


def decoder_then_resize(
    decoder: DaliDecoder, max_side: int | None
) -> Callable[[Sequence[bytes]], list[np.ndarray]]:
    def run(blobs: Sequence[bytes]) -> list[np.ndarray]:
        out = []
        for img in decoder.decode_batch(blobs, max_side=max_side):
            assert isinstance(img, np.ndarray), img
            out.append(cv2.resize(img, _fit(*img.shape[:2]), interpolation=cv2.INTER_AREA))
        return out

    return run


REPEAT = 1


def timed(fn: Callable[[Sequence[bytes]], list[np.ndarray]], blobs: Sequence[bytes]) -> float:
    """img/s of the best of ``REPEAT`` runs (``--repeat``) after a warm-up on two images."""
    fn(blobs[:2])
    best = float("inf")
    for _ in range(REPEAT):
        t0 = time.perf_counter()
        out = fn(blobs)
        best = min(best, time.perf_counter() - t0)
        assert len(out) == len(blobs) and all(max(o.shape[:2]) == TARGET for o in out)
    return len(blobs) / best


def pngs(n: int) -> list[bytes]:
    """``n`` 8-bit PNGs of 1000x750 from the photos."""
    out = []
    for blob in make_jpegs([(1000, 750)], n, seed=2):
        buf = io.BytesIO()
        Image.fromarray(simplejpeg.decode_jpeg(blob)).save(buf, "PNG", compress_level=6)
        out.append(buf.getvalue())
    return out


def decoder_rates(catalog: list[bytes], png: list[bytes], rounds: int) -> dict[str, dict[str, float]]:
    """The CPU worker's decoder with and without DALI's CPU operators: best img/s of ``rounds``."""
    def rate(decoder: DaliDecoder, blobs: list[bytes]) -> float:
        start = time.perf_counter()
        out = decoder.decode_batch(blobs, max_side=DECODER_MAX_SIDE)
        assert all(isinstance(a, np.ndarray) for a in out), [a for a in out if not isinstance(a, np.ndarray)]
        return len(blobs) / (time.perf_counter() - start)

    results: dict[str, dict[str, float]] = {}
    with make_decoder("cpu") as plain, DaliDecoder("cpu", dali=True) as dali:
        for name, blobs in (("jpeg 1200px q90", catalog), ("png 1000x750", png)):
            rate(plain, blobs[:2]), rate(dali, blobs[:2])  # warm-up (DALI builds its pipeline)
            best = {"no-dali": 0.0, "dali": 0.0}
            for _ in range(rounds):
                best["no-dali"] = max(best["no-dali"], rate(plain, blobs))
                best["dali"] = max(best["dali"], rate(dali, blobs))
            results[name] = {**best, "ratio no-dali/dali": best["no-dali"] / best["dali"]}
            print(f"  {name:18s} no-DALI {best['no-dali']:6.1f} img/s   DALI cpu {best['dali']:6.1f} img/s   "
                  f"ratio {best['no-dali'] / best['dali']:.2f}")
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--n", type=int, default=32, help="catalog-size JPEGs (default 32)")
    ap.add_argument("--n-large", type=int, default=4, help="24 MP JPEGs (default 4)")
    ap.add_argument("--threads", type=int, default=2, help="DALI / decoder threads")
    ap.add_argument("--batch", type=int, default=32, help="DALI batch size")
    ap.add_argument("--out", type=Path, default=Path("bench/results/bench_decode.json"))
    ap.add_argument("--repeat", type=int, default=1, help="best of N runs (default 1)")
    ap.add_argument("--rounds", type=int, default=3, help="decoder set: alternating rounds (default 3)")
    args = ap.parse_args()
    global REPEAT
    REPEAT = max(1, args.repeat)

    cv2.setNumThreads(1)
    catalog = make_jpegs([(1200, 1200), (1200, 900)], args.n)
    mp = sum(
        simplejpeg.decode_jpeg_header(b)[0] * simplejpeg.decode_jpeg_header(b)[1] for b in catalog
    )
    print(
        f"catalog: {len(catalog)} JPEGs, {mp / len(catalog) / 1e6:.2f} MP, "
        f"{sum(map(len, catalog)) // len(catalog) // 1024} KB avg → {TARGET} px"
    )
    cat: dict[str, float] = {}
    cat["pillow"] = timed(pillow, catalog)
    cat["simplejpeg_cv2"] = timed(simplejpeg_cv2, catalog)
    cat["dali_cpu_resize"] = timed(DaliResize(args.batch, args.threads), catalog)
    with DaliDecoder("cpu", batch_size=args.batch, num_threads=args.threads) as dec:
        cat["daliDecoder_then_cv2"] = timed(decoder_then_resize(dec, TARGET), catalog)
    for k, v in cat.items():
        print(
            f"  {k:24s} {v:7.1f} img/s  {v / cat['pillow']:.2f}x Pillow  "
            f"{v / cat['simplejpeg_cv2']:.2f}x simplejpeg+cv2"
        )

    large = make_jpegs([(6000, 4000)], args.n_large, seed=1)
    print(
        f"large: {len(large)} JPEGs 6000x4000, "
        f"{sum(map(len, large)) // len(large) // 1024} KB avg → {TARGET} px"
    )
    big: dict[str, float] = {}
    with DaliDecoder("cpu", batch_size=args.batch, num_threads=args.threads, reduce="off") as d:
        big["full_decode_then_cv2"] = timed(decoder_then_resize(d, TARGET), large)
    with DaliDecoder("cpu", batch_size=args.batch, num_threads=args.threads, reduce="dct") as d:
        big["dct_reduced_then_cv2"] = timed(decoder_then_resize(d, TARGET), large)
    with DaliDecoder("cpu", batch_size=args.batch, num_threads=args.threads, reduce="resize") as d:
        big["dali_fused_resize"] = timed(decoder_then_resize(d, TARGET), large)
    big["pillow_draft"] = timed(lambda b: pillow(b, draft=True), large)
    for k, v in big.items():
        print(f"  {k:24s} {v:7.2f} img/s  {v / big['full_decode_then_cv2']:.2f}x full decode")

    print(f"decoder: the CPU worker's decoder with and without DALI at max_side {DECODER_MAX_SIDE}")
    decoder = decoder_rates(catalog, pngs(max(2, args.n // 2)), args.rounds)

    result = {
        "machine": {"cpu_count": os.cpu_count(), "platform": platform.platform()},
        "threads": args.threads,
        "repeat": REPEAT,
        "load_average_1min": os.getloadavg()[0],
        "batch": args.batch,
        "catalog": {
            "n": len(catalog),
            "mp_avg": mp / len(catalog) / 1e6,
            "img_per_s": cat,
            "ratio_vs_pillow": {k: v / cat["pillow"] for k, v in cat.items()},
            "ratio_vs_simplejpeg_cv2": {k: v / cat["simplejpeg_cv2"] for k, v in cat.items()},
        },
        "large_24mp": {
            "n": len(large),
            "img_per_s": big,
            "ratio_vs_full_decode": {k: v / big["full_decode_then_cv2"] for k, v in big.items()},
        },
        "decoder": decoder,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
