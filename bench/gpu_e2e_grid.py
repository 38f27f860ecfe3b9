"""End to end through ``lightbox process``'s engine by batch size: throughput and p50/p99.

``lightbox.offline.process_files`` (what ``lightbox process`` runs) over N synthetic product
photos (JPEG, ``--size`` px square, written with OpenCV so the GPU machine needs no
scikit-image), 3 presets (taobao_main, xiaohongshu_cover, thumb_webp), segmentation by the
model, lighting on, for each batch size in ``--batches``: images/s (first file read to last
result written, one untimed warm-up pass first) and p50/p99 of the per-image latency (event
built to result, as ``results.jsonl`` records it), plus the mean ms per stage.

    python3 bench/gpu_e2e_grid.py [--device gpu] [--n 512] [--batches 1,4,16,64] [--out FILE]

``--device cpu`` (the default without a GPU) is the dry run: it says the GPU grid was skipped
and runs a small CPU grid so the code path is exercised.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import cv2
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PRESETS = ("taobao_main", "xiaohongshu_cover", "thumb_webp")


def synth_photos(folder: Path, n: int, size: int) -> list[Path]:
    """``n`` JPEGs: a shaded, textured object with a cap on a light, slightly graded backdrop."""
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for k in range(n):
        rng = np.random.default_rng(k)
        h, w = size, int(size * (1.0 + 0.25 * (k % 3)))
        ramp = np.linspace(236, 250, h, dtype=np.float32)[:, None, None]
        img = np.broadcast_to(ramp, (h, w, 3)).copy()
        field = cv2.resize(rng.integers(0, 256, (6, 6, 3), dtype=np.uint8), (w, h), interpolation=cv2.INTER_CUBIC)
        mask = np.zeros((h, w), np.uint8)
        cv2.ellipse(mask, (w // 2, int(h * 0.55)), (int(w * 0.22), int(h * 0.33)), float(k * 11 % 40), 0, 360, 1, -1)
        cv2.rectangle(mask, (int(w * 0.45), int(h * 0.1)), (int(w * 0.55), int(h * 0.25)), 1, -1)
        obj = field.astype(np.float32) * 0.85 + rng.normal(0, 5, (h, w, 3))
        img[mask > 0] = obj[mask > 0]
        path = folder / f"SKU-{k:05d}.jpg"
        cv2.imwrite(str(path), np.clip(img, 0, 255).astype(np.uint8), [cv2.IMWRITE_JPEG_QUALITY, 90])
        out.append(path)
    return out


def run_grid(device: str, n: int, size: int, batches: list[int], runtime: str,
             segmenter: str = "model") -> dict[str, Any]:
    from agents.wiring import build_processor
    from lightbox.offline import process_files
    from lightbox.report import stage_table
    from streams.settings import Settings

    tmp = Path(tempfile.mkdtemp(prefix="lightbox-e2e-grid-"))
    files = synth_photos(tmp / "in", n, size)
    t0 = time.perf_counter()
    settings = Settings(device=device, segmenter=segmenter, segment_runtime=runtime, max_batch=max(batches),
                        cuda_graphs=device == "gpu")
    processor = build_processor(settings)
    out: dict[str, Any] = {"device": device, "n": n, "size": size, "presets": PRESETS, "segmenter": segmenter,
                           "model_version": processor.model_version, "setup_s": round(time.perf_counter() - t0, 2),
                           "rows": []}
    process_files(files[: max(batches)], processor, tmp / "warm", presets=PRESETS, batch_size=max(batches))
    for b in batches:
        summary = process_files(files, processor, tmp / f"out-b{b}", presets=PRESETS, batch_size=b)
        lat = np.array([r.line["latency_ms"] for r in summary.results if r.ok] or [0.0])
        rows, _ = stage_table(summary.processed)
        row = {"batch": b, "img_per_s": round(len(files) / summary.seconds, 2),
               "p50_ms": round(float(np.percentile(lat, 50)), 1), "p99_ms": round(float(np.percentile(lat, 99)), 1),
               "dead_letters": summary.dead_letters,
               "stage_ms_per_image": {r.stage: round(r.per_image_ms, 2) for r in rows}}
        out["rows"].append(row)
        print(json.dumps(row), flush=True)
    processor.close()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--device", choices=("auto", "gpu", "cpu"), default="auto")
    ap.add_argument("--n", type=int, default=512)
    ap.add_argument("--size", type=int, default=1200, help="image height in px (widths 1x-1.5x)")
    ap.add_argument("--batches", default="1,4,16,64")
    ap.add_argument("--runtime", default="auto", help="segment runtime (auto, fp32, fp16, ...)")
    ap.add_argument("--segmenter", default="auto", choices=("auto", "model", "classical"),
                    help="auto: the model when ONNX Runtime has a CUDA provider on a GPU, else the classical "
                         "segmenter (CuPy on the GPU)")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")) / "gpu_e2e_grid.json")
    args = ap.parse_args(argv)
    from streams.settings import Settings

    device = Settings(device=args.device).resolved_device()
    result: dict[str, Any] = {"status": "ok"}
    batches = [int(b) for b in args.batches.split(",")]
    n, size = args.n, args.size
    if device == "cpu":
        result["skipped"] = "no GPU: the GPU grid was skipped; a small CPU grid ran instead (8 images, batch 1 and 4)"
        print(result["skipped"], flush=True)
        n, size, batches = 8, 480, [1, 4]
    segmenter = args.segmenter
    if segmenter == "auto":
        import onnxruntime as ort

        cuda = "CUDAExecutionProvider" in ort.get_available_providers()
        segmenter = "model" if device == "cpu" or cuda else "classical"
        if segmenter == "classical":
            result["segmenter_note"] = "ONNX Runtime has no CUDA provider here: the classical segmenter (CuPy) ran"
    try:
        result |= run_grid(device, n, size, batches, args.runtime if device == "gpu" else "fp32", segmenter)
    except Exception:
        result |= {"status": "failed", "error": traceback.format_exc(limit=8)}
        print(result["error"], flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"status {result['status']}; wrote {args.out}")
    return 0 if result["status"] == "ok" else 1


if __name__ == "__main__":
    raise SystemExit(main())
