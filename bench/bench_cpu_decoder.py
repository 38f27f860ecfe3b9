"""What DALI buys a CPU worker: the default CPU decoder (libjpeg-turbo + Pillow, no DALI) against
the same decoder routing through DALI's CPU operators (``DaliDecoder("cpu", dali=True)``).

Usage (from the repository root; needs ``nvidia-dali-cuda130``, a dev dependency)::

    PYTHONPATH=. .venv/bin/python bench/bench_cpu_decoder.py [--n 32] [--rounds 3] [--out PATH]

Sets, decoded at ``max_side=1440`` (the largest preset side: catalog-sized photos decode at full
size, where DALI and libjpeg-turbo do the same work): JPEG q90 photos of 1200x1200 and 1200x900
(skimage photos upscaled, light noise) and 8-bit PNGs of 1000x750. Rounds alternate between the
two decoders; the best round of each is reported with the ratio no-DALI / DALI.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import time
from collections.abc import Sequence
from pathlib import Path

import cv2
import numpy as np
import simplejpeg
from PIL import Image
from skimage import data

from gpu_kernels.codec import DaliDecoder, make_decoder

MAX_SIDE = 1440


def photos(sizes: Sequence[tuple[int, int]], n: int) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    base = [np.asarray(f()) for f in (data.coffee, data.astronaut, data.chelsea, data.rocket)]
    out = []
    for i in range(n):
        w, h = sizes[i % len(sizes)]
        img = cv2.resize(base[i % len(base)], (w, h), interpolation=cv2.INTER_CUBIC)
        out.append(np.clip(img + rng.normal(0, 3, img.shape), 0, 255).astype(np.uint8))
    return out


def rate(decoder: DaliDecoder, blobs: list[bytes]) -> float:
    start = time.perf_counter()
    out = decoder.decode_batch(blobs, max_side=MAX_SIDE)
    took = time.perf_counter() - start
    assert all(isinstance(a, np.ndarray) for a in out), [a for a in out if not isinstance(a, np.ndarray)]
    return len(blobs) / took


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path, default=Path("out/bench_cpu_decoder.json"))
    args = ap.parse_args()
    jpegs = [simplejpeg.encode_jpeg(p, 90, colorsubsampling="420") for p in photos([(1200, 1200), (1200, 900)], args.n)]
    pngs = []
    for p in photos([(1000, 750)], args.n // 2):
        buf = io.BytesIO()
        Image.fromarray(p).save(buf, "PNG", compress_level=6)
        pngs.append(buf.getvalue())
    results: dict[str, dict[str, float]] = {}
    with make_decoder("cpu") as plain, DaliDecoder("cpu", dali=True) as dali:
        for name, blobs in (("jpeg 1200px q90", jpegs), ("png 1000x750", pngs)):
            rate(plain, blobs[:2]), rate(dali, blobs[:2])  # warm-up (DALI builds its pipeline)
            best = {"no-dali": 0.0, "dali": 0.0}
            for _ in range(args.rounds):
                best["no-dali"] = max(best["no-dali"], rate(plain, blobs))
                best["dali"] = max(best["dali"], rate(dali, blobs))
            results[name] = {**best, "ratio no-dali/dali": best["no-dali"] / best["dali"]}
            print(f"{name:18s} no-DALI {best['no-dali']:6.1f} img/s   DALI cpu {best['dali']:6.1f} img/s   "
                  f"ratio {best['no-dali'] / best['dali']:.2f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"results": results, "load1": os.getloadavg()[0], "n": args.n}, indent=1))


if __name__ == "__main__":
    main()
