"""Marketplace compliance over the sample catalog, per image and preset.

Runs the pipeline's own stages (decode → segment → correct → render → shadow → compliance; no
encode) over ``lightbox.samples.make_catalog`` (24 images) with the classical segmenter and/or
u2netp on the CPU, and prints per image: compliant, cut off (and why: the canvas edge or the
photo's frame), fill, white border; then the counts per preset. ``--png DIR`` writes each
amazon_main canvas and its mask (for looking at them).

Usage: ``PYTHONPATH=. python bench/bench_compliance.py [--segmenter classical model] [--png DIR]
[--baseline REF]``; ``--baseline`` runs that commit's code (``git archive``:
``bench.harness.baseline_tree``) with this script instead of this tree's, for before/after counts.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

PRESETS = ("amazon_main", "taobao_main", "shopify")


def cutouts() -> list[tuple[str, bytes]]:
    """RGBA product cut-outs (PNG) as sellers upload them: a red bottle on transparency, clean;
    with a soft drop shadow (alpha <= 100, fading out inside the frame); with alpha-2 dust over
    the transparent area; running off the right edge (truly cut: must be flagged)."""
    import io

    import cv2
    import numpy as np
    from PIL import Image

    h, w = 1000, 1200
    yy, xx = np.mgrid[:h, :w]
    out = []
    for name in ("clean", "shadow", "specks", "off-right"):
        rgba = np.zeros((h, w, 4), np.uint8)
        body = ((xx - (1100 if name == "off-right" else 600)) / 200.0) ** 2 + ((yy - 420) / 300.0) ** 2 <= 1
        if name == "shadow":
            floor = np.zeros((h, w), np.float32)
            cv2.ellipse(floor, (600, 730), (300, 30), 0, 0, 360, 1.0, -1)
            soft = np.asarray(cv2.GaussianBlur(floor, (0, 0), 25), np.float32)
            rgba[..., 3] = np.rint(100 * soft / soft.max()).astype(np.uint8)
        if name == "specks":
            rgba[(np.random.default_rng(0).random((h, w)) < 0.001) & ~body] = (0, 0, 0, 2)
        rgba[body] = (150, 30, 40, 255)
        buf = io.BytesIO()
        Image.fromarray(rgba).save(buf, format="PNG")
        out.append((f"cutout-{name}.png", buf.getvalue()))
    return out


def run(kind: str, items: list[tuple[str, bytes]], png: Path | None) -> dict[str, list[bool]]:
    from PIL import Image

    from gpu_kernels.backends import RetouchOptions
    from gpu_kernels.codec import make_decoder
    from gpu_kernels.pipeline import RetouchPipeline
    from gpu_kernels.presets import load_presets
    from gpu_kernels.retouch import CpuRetoucher
    from gpu_kernels.segment import make_segmenter
    from gpu_kernels.spans import SpanRecorder
    from gpu_kernels.stages.base import LANES, Job, to_host
    from gpu_kernels.stages.compliance import ComplianceStage, source_cut
    from gpu_kernels.stages.correct import CorrectStage
    from gpu_kernels.stages.decode import DecodeStage
    from gpu_kernels.stages.render import RenderStage
    from gpu_kernels.stages.segment import SegmentStage
    from gpu_kernels.stages.shadow import ShadowStage

    presets = [load_presets()[p] for p in PRESETS]
    seg = make_segmenter("model" if kind == "model" else "classical")
    retoucher = CpuRetoucher()
    decoder = make_decoder("cpu")
    stages = [DecodeStage(decoder), SegmentStage(seg, None), CorrectStage(retoucher), RenderStage(retoucher),
              ShadowStage("cpu"), ComplianceStage()]
    none: Any = None  # no encoder: the stage list above has no encode stage
    pipe = RetouchPipeline(decoder, retoucher, none, seg, stages=stages)
    verdicts: dict[str, list[bool]] = {p: [] for p in PRESETS}
    print(f"\n== segmenter: {kind}")
    print(f"{'image':34s} " + " ".join(f"{p:>30s}" for p in PRESETS))
    for name, data in items:
        stem = name.rsplit(".", 1)[0]
        job = Job(data, presets, RetouchOptions(), SpanRecorder())
        ctx = pipe.start([job])
        for lane in LANES:
            pipe.run_lane(ctx, lane)
        if ctx.results[0].error is not None:
            print(f"{name:34s} ERROR {ctx.results[0].error}")
            continue
        mask = ctx.masks.get(0)
        frame = source_cut(mask)
        cells = []
        for p in PRESETS:
            c = ctx.compliance[0, p]
            verdicts[p].append(c.compliant)
            why = ("F" if frame else "") + ("C" if c.cut_off and not frame else "")
            cells.append(f"{'OK ' if c.compliant else 'no '} cut={'y' if c.cut_off else 'n'}{why:2s} "
                         f"fill={c.fill:.3f} wb={c.white_border:.4f}")
        print(f"{name:34s} " + " ".join(f"{s:>30s}" for s in cells))
        if png is not None:
            png.mkdir(parents=True, exist_ok=True)
            canvas = to_host(ctx.rendered[0, "amazon_main"])
            Image.fromarray(canvas).resize((500, 500), Image.Resampling.BOX).save(
                png / f"{kind}-{stem}-amazon.png")
            Image.fromarray(canvas).save(png / f"{kind}-{stem}-amazon-full.png")
            if mask is not None:
                Image.fromarray(to_host(mask)).save(png / f"{kind}-{stem}-mask.png")
    return verdicts


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--segmenter", nargs="+", choices=("classical", "model"), default=["classical", "model"])
    ap.add_argument("--png", type=Path, default=None)
    ap.add_argument("--count", type=int, default=24)
    ap.add_argument("--no-cutouts", action="store_true", help="only the sample catalog")
    ap.add_argument("--baseline", default="", metavar="REF",
                    help="git ref whose code runs instead of this tree's (default: this tree)")
    args = ap.parse_args()
    root = Path(__file__).resolve().parents[1]
    if args.baseline:
        sys.path.insert(0, str(root))
        from bench.harness import baseline_tree

        root = baseline_tree(args.baseline) or root
    sys.path.insert(0, str(root))
    from lightbox.samples import make_catalog

    print(f"code: {root}")
    with tempfile.TemporaryDirectory() as tmp:
        catalog = [(p.name, p.read_bytes()) for p in make_catalog(Path(tmp), args.count)]
    extra = [] if args.no_cutouts else cutouts()
    summary = []
    for kind in args.segmenter:
        verdicts = run(kind, catalog + extra, args.png)
        for p in PRESETS:
            cat, cut = verdicts[p][:len(catalog)], verdicts[p][len(catalog):]
            summary.append(f"{kind:10s} {p:12s} catalog compliant {sum(cat):2d} / {len(cat)}"
                           + (f"   cut-outs compliant {sum(cut)} / {len(cut)}" if cut else ""))
    print("\n" + "\n".join(summary))
    print("\ncut: y = cut_off; F = the mask covers >= 1% of an edge of the source photo; "
          "C = the subject's canvas box touches the canvas edge")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
