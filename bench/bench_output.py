"""What the CPU pipeline's outputs look like, counted: tone (products keep their colour) and
marketplace compliance, each against ``--baseline REF`` where asked.

    PYTHONPATH=. .venv/bin/python bench/bench_output.py tone [--baseline REF] [--png DIR]
    PYTHONPATH=. .venv/bin/python bench/bench_output.py compliance [--segmenter classical model] [--count 24]
        [--no-cutouts] [--png DIR] [--baseline REF]

Nothing from the product is imported at the top: ``compliance --baseline`` imports the other
tree's code in this process.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# --- tone ----------------------------------------------------------------------------------------

TONE_DOC = """Exposure/tone before/after, side by side in one run.

Scenes (``tone_scenes``): flat red (150, 30, 40), navy (25, 35, 90), black (20, 20, 22),
white (245, 245, 245) and a saturated orange (240, 120, 20) product on a white (255) backdrop,
with their exact masks, as shot and the whole shot darkened to 45 % (``_dark45``: compared with
the well-exposed shot); skimage photos (astronaut, coffee, chelsea) darkened to 45 % (levels
times 0.45), over-exposed (times 1.5, clipped) and washed out (0.55 x + 110).

Measures, for pass (a) of the CPU retoucher (``keep`` background, default config, Retinex on):

* products: median and 95th percentile CIEDE2000 (skimage) between input and output over the
  subject pixels, the share of subject pixels with a channel at 255 in the output but not in the
  input (newly clipped), and the median subject colour in and out;
* photos: mean L* of the original, the input and each output; and the mean |L*| difference
  between each run's output and the same run's output for the original photo (the white balance
  and Retinex act on both, so this isolates what exposure could not restore), and against the
  original photo itself, beside the input's.

``--baseline REF`` runs the same scenes through the code of another commit (``git archive``, a
subprocess with ``PYTHONPATH`` at it; ``bench.harness.baseline_tree``); ``--png DIR`` writes
input / before / after strips of the products and photos.

Usage: ``PYTHONPATH=. python bench/bench_output.py tone [--baseline main] [--png DIR]``
"""

SIZE = {"h": 480, "w": 640}  # the bench's product shots: twice the test's
PHOTOS = ("astronaut", "coffee", "chelsea")

RUN = """
import sys, numpy as np
from gpu_kernels.backends import RetouchOptions
from gpu_kernels.retouch import CpuRetoucher
data = np.load(sys.argv[1])
r, out = CpuRetoucher(), {}
for key in data.files:
    if key.startswith("image_"):
        k = key[6:]
        mask = data["mask_" + k] if "mask_" + k in data.files else None
        out[k] = r.correct([data[key]], [mask], RetouchOptions("keep"))[0]
np.savez(sys.argv[2], **out)
"""


def photo_variants(name: str) -> dict[str, np.ndarray]:
    from tests.gpu_kernels.test_tone import photo

    base = photo(name).astype(np.float64)
    return {
        "dark45": (base * 0.45).astype(np.uint8),
        "over150": np.clip(base * 1.5, 0, 255).astype(np.uint8),
        "washed": (base * 0.55 + 110).astype(np.uint8),
    }


def tone_scenes() -> dict[str, tuple[np.ndarray, np.ndarray | None]]:
    from tests.gpu_kernels.test_tone import PRODUCTS, photo, product_scene

    items: dict[str, tuple[np.ndarray, np.ndarray | None]] = {}
    for name, rgb in PRODUCTS.items():
        items[f"product_{name}"] = product_scene(rgb, **SIZE)
    for name, rgb in PRODUCTS.items():
        image, mask = product_scene(rgb, **SIZE)
        items[f"product_{name}_dark45"] = ((image * 0.45).astype(np.uint8), mask)
    for name in PHOTOS:
        items[f"photo_{name}_original"] = (photo(name), None)
        for kind, image in photo_variants(name).items():
            items[f"photo_{name}_{kind}"] = (image, None)
    return items


def run_here(items: dict[str, tuple[np.ndarray, np.ndarray | None]]) -> dict[str, np.ndarray]:
    from gpu_kernels.backends import RetouchOptions
    from gpu_kernels.retouch import CpuRetoucher

    r = CpuRetoucher()
    return {k: r.correct([img], [m], RetouchOptions("keep"))[0] for k, (img, m) in items.items()}


def run_tree(tree: Path, items: dict[str, tuple[np.ndarray, np.ndarray | None]]) -> dict[str, np.ndarray]:
    with tempfile.TemporaryDirectory() as tmp:
        arrays = {f"image_{k}": img for k, (img, _) in items.items()}
        arrays.update({f"mask_{k}": m for k, (_, m) in items.items() if m is not None})
        np.savez(Path(tmp) / "in.npz", **arrays)  # type: ignore[arg-type]
        env = {**os.environ, "PYTHONPATH": str(tree)}
        subprocess.run([sys.executable, "-c", RUN, str(Path(tmp) / "in.npz"), str(Path(tmp) / "out.npz")],
                       check=True, env=env, cwd=tree)
        data = np.load(Path(tmp) / "out.npz")
        return {k: data[k] for k in data.files}


def product_measures(
    reference: np.ndarray, mask: np.ndarray, out: np.ndarray, image: np.ndarray
) -> tuple[float, float, float, str]:
    """dE2000 median and p95 of ``out`` against ``reference`` on the subject, the share of subject
    pixels with a channel at 255 in ``out`` but not in the input ``image``, the median colour."""
    from skimage.color import deltaE_ciede2000, rgb2lab

    sel = mask == 255
    de = deltaE_ciede2000(rgb2lab(reference[sel][None]), rgb2lab(out[sel][None]))[0]
    newly = ((out[sel] == 255) & (image[sel] < 255)).any(axis=1).mean()
    med = np.median(out[sel], axis=0).astype(int)
    return float(np.median(de)), float(np.percentile(de, 95)), float(newly), str(tuple(med.tolist()))


def tone_main(argv: list[str]) -> int:
    from tests.gpu_kernels.test_tone import PRODUCTS, lstar_error, mean_lstar, photo, product_scene

    parser = argparse.ArgumentParser(prog="bench_output.py tone", description=TONE_DOC,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", default="", metavar="REF",
                        help="git ref of the code to compare with (default: none; bench.harness)")
    parser.add_argument("--png", type=Path, help="write input | before | after strips here")
    args = parser.parse_args(argv)
    items = tone_scenes()
    runs = {"after": run_here(items)}
    if args.baseline:
        from bench.harness import baseline_tree

        runs = {"before": run_tree(baseline_tree(args.baseline) or Path("."), items), **runs}
    names = list(runs)
    print("products on white (subject pixels): dE2000 median/p95, newly clipped share, median colour")
    for key, (image, mask) in items.items():
        if mask is None:
            continue
        reference = product_scene(PRODUCTS[key.split("_")[1]], **SIZE)[0]  # the well-exposed shot
        cells = []
        for n in names:
            d50, d95, clip, med = product_measures(reference, mask, runs[n][key], image)
            cells.append(f"{n}: dE {d50:5.2f}/{d95:5.2f} clip {clip:5.3f} {med:>15}")
        inp = str(tuple(np.median(image[mask == 255], axis=0).astype(int).tolist()))
        print(f"  {key:22} in {inp:>15} | " + " | ".join(cells))
    print("photos: mean L* (original photo, input, each run's output) | mean |dL*| of each run's output against")
    print("        the same run's output for the original photo | mean |dL*| against the original photo")
    for key, (image, _) in items.items():
        if not key.startswith("photo_") or key.endswith("_original"):
            continue
        original = photo(key.split("_")[1])
        ref = f"photo_{key.split('_')[1]}_original"
        cells = [f"{n} {mean_lstar(runs[n][key]):5.1f}" for n in names]
        errs = [f"{n} {lstar_error(runs[n][ref], runs[n][key]):5.2f}" for n in names]
        abs_errs = [f"{n} {lstar_error(original, runs[n][key]):5.2f}" for n in names]
        print(f"  {key:24} L* orig {mean_lstar(original):5.1f} in {mean_lstar(image):5.1f} " + " ".join(cells)
              + " | vs own-original " + " ".join(errs)
              + f" | vs photo: in {lstar_error(original, image):5.2f} " + " ".join(abs_errs))
    if args.png:
        import cv2

        args.png.mkdir(parents=True, exist_ok=True)
        for key, (image, _) in items.items():
            strip = np.concatenate([image] + [runs[n][key] for n in names], axis=1)
            cv2.imwrite(str(args.png / f"{key}.png"), cv2.cvtColor(strip, cv2.COLOR_RGB2BGR))
        print(f"PNGs (input | {' | '.join(names)}) in {args.png}")
    return 0


# --- compliance ----------------------------------------------------------------------------------

COMPLIANCE_DOC = """Marketplace compliance over the sample catalog, per image and preset.

Runs the pipeline's own stages (decode → segment → correct → render → shadow → compliance; no
encode) over ``lightbox.samples.make_catalog`` (24 images) with the classical segmenter and/or
u2netp on the CPU, and prints per image: compliant, cut off (and why: the canvas edge or the
photo's frame), fill, white border; then the counts per preset. ``--png DIR`` writes each
amazon_main canvas and its mask (for looking at them).

Usage: ``PYTHONPATH=. python bench/bench_output.py compliance [--segmenter classical model] [--png DIR]
[--baseline REF]``; ``--baseline`` runs that commit's code (``git archive``:
``bench.harness.baseline_tree``) with this script instead of this tree's, for before/after counts.
"""

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
    from gpu_kernels.pipeline import ImagePipeline
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
    pipe = ImagePipeline(decoder, retoucher, none, seg, stages=stages)
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


def compliance_main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="bench_output.py compliance", description=COMPLIANCE_DOC,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--segmenter", nargs="+", choices=("classical", "model"), default=["classical", "model"])
    ap.add_argument("--png", type=Path, default=None)
    ap.add_argument("--count", type=int, default=24)
    ap.add_argument("--no-cutouts", action="store_true", help="only the sample catalog")
    ap.add_argument("--baseline", default="", metavar="REF",
                    help="git ref whose code runs instead of this tree's (default: this tree)")
    args = ap.parse_args(argv)
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


COMMANDS = {"tone": tone_main, "compliance": compliance_main}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in COMMANDS:
        print(__doc__)
        return 2
    return COMMANDS[argv[0]](argv[1:])


if __name__ == "__main__":
    raise SystemExit(main())
