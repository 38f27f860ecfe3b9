"""Marketplace compliance over the sample catalog, per image and preset (issue 14 item 4).

Runs the pipeline's own stages (decode → segment → correct → render → shadow → compliance; no
encode) over ``lightbox.samples.make_catalog`` (24 images) with the classical segmenter and/or
u2netp on the CPU, and prints per image: compliant, cut off (and why: the canvas edge or the
photo's frame), fill, white border; then the counts per preset. ``--png DIR`` writes each
amazon_main canvas and its mask (for looking at them).

Usage: ``PYTHONPATH=. python bench/bench_compliance.py [--segmenter classical model] [--png DIR]``
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpu_kernels.backends import RetouchOptions
from gpu_kernels.codec import make_decoder
from gpu_kernels.presets import load_presets
from gpu_kernels.retouch import CpuRetoucher
from gpu_kernels.segment import make_segmenter
from gpu_kernels.spans import SpanRecorder
from gpu_kernels.stages.base import Job, to_host
from gpu_kernels.stages.compliance import ComplianceStage, source_cut
from gpu_kernels.stages.correct import CorrectStage
from gpu_kernels.stages.decode import DecodeStage
from gpu_kernels.stages.render import RenderStage
from gpu_kernels.stages.segment import SegmentStage
from gpu_kernels.stages.shadow import ShadowStage
from lightbox.samples import make_catalog

PRESETS = ("amazon_main", "taobao_main", "shopify")


def run(kind: str, paths: list[Path], png: Path | None) -> dict[str, list[bool]]:
    from gpu_kernels.pipeline import RetouchPipeline

    presets = [load_presets()[p] for p in PRESETS]
    seg = make_segmenter("model" if kind == "model" else "classical")
    retoucher = CpuRetoucher()
    decoder = make_decoder("cpu")
    stages = [DecodeStage(decoder), SegmentStage(seg, None), CorrectStage(retoucher), RenderStage(retoucher),
              ShadowStage("cpu"), ComplianceStage()]
    pipe = RetouchPipeline(decoder, retoucher, None, seg, stages=stages)  # type: ignore[arg-type]
    verdicts: dict[str, list[bool]] = {p: [] for p in PRESETS}
    print(f"\n== segmenter: {kind}")
    print(f"{'image':34s} " + " ".join(f"{p:>30s}" for p in PRESETS))
    for path in paths:
        job = Job(path.read_bytes(), presets, RetouchOptions(), SpanRecorder())
        ctx = pipe.start([job])
        for lane in ("decode", "device", "output"):
            pipe.run_lane(ctx, lane)  # type: ignore[arg-type]
        if ctx.results[0].error is not None:
            print(f"{path.name:34s} ERROR {ctx.results[0].error}")
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
        print(f"{path.name:34s} " + " ".join(f"{s:>30s}" for s in cells))
        if png is not None:
            png.mkdir(parents=True, exist_ok=True)
            canvas = to_host(ctx.rendered[0, "amazon_main"])
            Image.fromarray(canvas).resize((500, 500), Image.Resampling.BOX).save(
                png / f"{kind}-{path.stem}-amazon.png")
            Image.fromarray(canvas).save(png / f"{kind}-{path.stem}-amazon-full.png")
            if mask is not None:
                Image.fromarray(to_host(mask)).save(png / f"{kind}-{path.stem}-mask.png")
    for p in PRESETS:
        print(f"{kind:10s} {p:12s} compliant {sum(verdicts[p]):2d} / {len(verdicts[p])}")
    return verdicts


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--segmenter", nargs="+", choices=("classical", "model"), default=["classical", "model"])
    ap.add_argument("--png", type=Path, default=None)
    ap.add_argument("--count", type=int, default=24)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        paths = make_catalog(Path(tmp), args.count)
        for kind in args.segmenter:
            run(kind, paths, args.png)
    print("\ncut: y = cut_off; F = the mask covers >= 1% of an edge of the source photo; "
          "C = the subject's canvas box touches the canvas edge")
    _ = np
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
