"""End to end through ``lightbox process``'s engine by batch size: throughput and p50/p99.

``lightbox.offline.process_files`` (what ``lightbox process`` runs) over N synthetic product
photos (JPEG, ``--size`` px square, written with OpenCV so the GPU machine needs no
scikit-image), 3 presets (taobao_main, xiaohongshu_cover, thumb_webp), segmentation by the
model, lighting on, for each batch size in ``--batches``: images/s (processed images only, first
file read to last result written, one untimed warm-up pass first; dead letters are counted
apart and never in the rate) and p50/p99 of the per-image latency (event built to result, as
``results.jsonl`` records it), plus the mean ms per stage. Each row names the segment runtime
that made its masks; the model always makes them (a run that cannot load the model on the
device fails, it never falls back to the classical segmenter).

    python3 bench/gpu_e2e_grid.py --model DIR/u2netp.batched.onnx [--device gpu] [--n 512]
                                  [--batches 8,32,64] [--out FILE]

``--model``: the u2netp copy with a symbolic batch (``python -m gpu_kernels.segment.fetch_model``
writes one); without it the model cache (``$LIGHTBOX_MODEL_DIR``) is used, never a download.
``--device cpu`` (the default without a GPU) is the dry run: a small CPU grid so the code path
is exercised.
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

from bench.gpu_rows import append as append_row

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


def local_model(model: Path | None) -> Path:
    """``model``, else the cached batched u2netp; raises FileNotFoundError (never downloads)."""
    if model is None:
        cache = Path(os.environ.get("LIGHTBOX_MODEL_DIR") or Path.home() / ".cache" / "lightbox" / "models")
        model = cache / "u2netp" / "u2netp.batched.onnx"
    if not model.is_file():
        raise FileNotFoundError(f"no model at {model}: pass --model (the run never downloads it)")
    return model


def rate_row(batch: int, summary: Any, stage_rows: list[Any], runtime: str) -> dict[str, Any]:
    """One figure: images/s over the processed images only, p50/p99 of their latency."""
    ok = [r for r in summary.results if r.ok]
    lat = np.array([r.line["latency_ms"] for r in ok] or [0.0])
    return {"batch": batch, "segment_runtime": runtime, "processed": len(ok),
            "dead_letters": summary.dead_letters,
            "img_per_s": round(len(ok) / summary.seconds, 2) if summary.seconds > 0 else 0.0,
            "p50_ms": round(float(np.percentile(lat, 50)), 1), "p99_ms": round(float(np.percentile(lat, 99)), 1),
            "stage_ms_per_image": {r.stage: round(r.per_image_ms, 2) for r in stage_rows}}


def run_grid(device: str, n: int, size: int, batches: list[int], runtime: str, model: Path,
             segmenter: str = "model", cuda_graphs: bool = False) -> dict[str, Any]:
    from agents.wiring import build_processor
    from lightbox.offline import process_files
    from lightbox.report import stage_table
    from streams.settings import Settings

    tmp = Path(tempfile.mkdtemp(prefix="lightbox-e2e-grid-"))
    files = synth_photos(tmp / "in", n, size)
    t0 = time.perf_counter()
    settings = Settings(device=device, segmenter=segmenter, segment_runtime=runtime, max_batch=max(batches),
                        model_path=model, cuda_graphs=cuda_graphs and device == "gpu")
    processor = build_processor(settings)
    label = "classical" if segmenter == "classical" else processor.model_version
    out: dict[str, Any] = {"device": device, "n": n, "size": size, "presets": PRESETS, "segmenter": segmenter,
                           "cuda_graphs": settings.segment.cuda_graphs,
                           "model_version": processor.model_version, "setup_s": round(time.perf_counter() - t0, 2),
                           "rows": []}
    append_row({k: v for k, v in out.items() if k != "rows"}, kind="setup")
    process_files(files[: max(batches)], processor, tmp / "warm", presets=PRESETS, batch_size=max(batches))
    for b in batches:
        summary = process_files(files, processor, tmp / f"out-b{b}", presets=PRESETS, batch_size=b)
        rows, _ = stage_table(summary.processed)
        row = {"device": device, **rate_row(b, summary, rows, label)}
        out["rows"].append(row)
        append_row(row)
        print(json.dumps(row), flush=True)
    processor.close()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--device", choices=("auto", "gpu", "cpu"), default="auto")
    ap.add_argument("--model", type=Path, default=None, help="u2netp with a symbolic batch (default: the cache)")
    ap.add_argument("--n", type=int, default=512)
    ap.add_argument("--size", type=int, default=1200, help="image height in px (widths 1x-1.5x)")
    ap.add_argument("--batches", default="8,32,64")
    ap.add_argument("--runtime", default="auto", help="segment runtime (auto, fp32, fp16, torch-fp16, ...)")
    ap.add_argument("--segmenter", default="model", choices=("model", "classical"),
                    help="model (default): every mask from the model; classical: the border-colour segmenter, "
                         "labelled so in every row")
    ap.add_argument("--cuda-graphs", action="store_true",
                    help="capture the model's CUDA graphs at start (one per bucket up to the largest batch: "
                         "adds their capture to the set-up time; bench/gpu_model_grid.py measures their gain)")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")) / "gpu_e2e_grid.json")
    args = ap.parse_args(argv)
    from streams.settings import Settings

    device = Settings(device=args.device).resolved_device()
    result: dict[str, Any] = {"status": "ok"}
    batches = [int(b) for b in args.batches.split(",")]
    n, size = args.n, args.size
    if device == "cpu":
        result["skipped"] = "no GPU: the GPU grid was skipped; a small CPU grid ran instead (4 images, batch 1 and 4)"
        print(result["skipped"], flush=True)
        n, size, batches = 4, 320, [1, 4]
    try:
        model = local_model(args.model)
        result |= run_grid(device, n, size, batches, args.runtime if device == "gpu" else "fp32", model,
                           args.segmenter, args.cuda_graphs)
    except Exception:
        result |= {"status": "failed", "error": traceback.format_exc(limit=8)}
        append_row({"error": result["error"][-600:]}, kind="error")
        print(result["error"], flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"status {result['status']}; wrote {args.out}")
    return 0 if result["status"] == "ok" else 1


if __name__ == "__main__":
    raise SystemExit(main())
