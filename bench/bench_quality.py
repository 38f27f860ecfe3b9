"""Retouch quality before/after, side by side in one run.

``wb``: the a*, b* (CIELAB medians) of the neutral objects of synthetic product shots (a white
box and a grey photograph on wood, green cloth, blue paper and a grey backdrop, with and without
a warm cast; ``gpu_kernels.retouch.scenes``) and of skimage's espresso cup (brightest subject
pixels, u2netp mask), in the input, after the CPU retoucher's pass (a) of an earlier
commit (``--before DIR``: a checkout of it, e.g. 96ff878, run in a subprocess: white balance from the
background's mean, gains up to 2x) and after the current one. The cup also goes through
``taobao_main``; ``--png DIR`` writes those images.

``mask``: IoU, boundary F and enclosed holes of u2netp masks with the previous post-processing
(threshold + drop small islands + inward feather) and the current one, on composites with holes
and thin parts (``gpu_kernels.segment.hole_samples``), and on the first 8 images of the sample
catalog: subject components, enclosed holes, enclosed white islands in taobao_main.

``set``: the cut-out quality set with true alpha (:mod:`gpu_kernels.segment.quality_set`, 46
items in six classes) through the default path (u2netp + post-processing, pass (a) on white,
``transparent_png``), with the code of ``--before DIR`` and the current code, each in a
subprocess. Per class: mask IoU and boundary F (alpha >= 128 against true alpha >= 0.3, so a
glass's translucent body counts as product), alpha
SAD (sum of |alpha - true alpha| over the frame, alpha in [0, 1], in thousands, at 640x480), the
pale products' colour shift (median a*, b* of the product's inner pixels after pass (a) minus the
input's; mean |shift| and the worst), and of ``transparent_png``: IoU of its alpha with the true
alpha rendered alike and the share of the canvas's true background that it paints opaque
(alpha >= 128, a band of 3 px around the true outline left out). ``--sheet PNG`` writes a
before/after contact sheet (``lightbox.contact_sheet``: input | mask | cut-out, before then after,
then ``transparent_png`` over a coloured page).

``review``: the real-photo review set (``bench/review_set.py``, 48 images of 16 photographs
shipped in packages) through lightbox and rembg, a contact sheet to judge by eye and the table of
the kept verdicts (``bench/review_judgement.toml``); see ``bench/quality_review.py``.
``PYTHONPATH=. python bench/bench_quality.py review [--model FILE] [--sheet docs/img/review.png]``

Usage: ``git worktree add --detach /tmp/base 96ff878;
PYTHONPATH=. python bench/bench_quality.py [wb] [mask] [set] --before /tmp/base [--png DIR] [--sheet PNG]``
(``set`` compares with any older checkout: ``git worktree add --detach /tmp/base-set a378c6f``).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import cv2
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpu_kernels.backends import RetouchOptions
from gpu_kernels.presets import load_presets
from gpu_kernels.quality import boundary_f, bright_subject_cast, enclosed_white_islands, mask_iou, neutral_cast
from gpu_kernels.retouch import CpuRetoucher
from gpu_kernels.retouch.scenes import SURFACES, WARM_CAST, make_scene

BEFORE = """
import sys, numpy as np
from gpu_kernels.backends import RetouchOptions
from gpu_kernels.presets import load_presets
from gpu_kernels.retouch import CpuRetoucher
data = np.load(sys.argv[1])
r, out = CpuRetoucher(), {}
for key in data.files:
    if key.startswith("image_"):
        k = key[6:]
        mask = data["mask_" + k]
        fixed = r.correct([data[key]], [mask], RetouchOptions("white" if k.startswith("render") else "keep"))[0]
        out[k] = r.render(fixed, mask, load_presets()["taobao_main"]) if k.startswith("render") else fixed
np.savez(sys.argv[2], **out)
"""


def run_before(tree: Path, items: dict[str, tuple[np.ndarray, np.ndarray]]) -> dict[str, np.ndarray]:
    """Pass (a) (and taobao_main for keys starting with "render") with the code of ``tree`` (a
    checkout of an earlier commit), in a subprocess."""
    with tempfile.TemporaryDirectory() as tmp:
        src, dst = Path(tmp) / "in.npz", Path(tmp) / "out.npz"
        arrays = {f"image_{k}": v[0] for k, v in items.items()} | {f"mask_{k}": v[1] for k, v in items.items()}
        np.savez(src, **arrays)  # type: ignore[arg-type]
        env = dict(os.environ, PYTHONPATH=str(tree))
        subprocess.run([sys.executable, "-c", BEFORE, str(src), str(dst)], check=True, env=env, cwd=tree)
        with np.load(dst) as out:
            return {k: out[k] for k in out.files}


def fmt(ab: tuple[float, float]) -> str:
    return f"{ab[0]:+6.1f} {ab[1]:+6.1f}"


def coffee_mask(image: np.ndarray) -> np.ndarray:
    from gpu_kernels.segment import OnnxSegmenter, ensure_u2netp

    with OnnxSegmenter(ensure_u2netp().original, threads=2) as seg:
        return np.asarray(seg.segment_batch([image])[0])


def rendered_subject(r: CpuRetoucher, mask: np.ndarray, preset: Any) -> np.ndarray:
    """Where the subject lands on ``preset``'s canvas (the inverted mask rendered alike)."""
    inv = np.repeat((255 - mask)[..., None], 3, axis=2)
    return np.asarray(r.render(inv, mask, preset))[..., 0] < 8


def bench_wb(before: Path, png: Path | None) -> None:
    r = CpuRetoucher()
    keep = RetouchOptions("keep")
    scenes = [make_scene(surface, cast) for surface in SURFACES for cast in (None, WARM_CAST)]
    import skimage.data

    cup = np.asarray(skimage.data.coffee())
    cup_mask = coffee_mask(cup)
    items = {s.name: (s.image, s.subject.astype(np.uint8) * 255) for s in scenes}
    items["render_cup"] = (cup, cup_mask)
    old = run_before(before, items)
    print("white balance: median a* b* of the neutral objects (box = the white product, card = grey photo)")
    print(f"{'scene':<12} {'object':<5} {'input':>13} {'before':>13} {'after':>13}")
    for scene in scenes:
        new = np.asarray(r.correct([scene.image], [items[scene.name][1]], keep)[0])
        for obj, region in (("box", scene.box), ("card", scene.card)):
            print(f"{scene.name:<12} {obj:<5} {fmt(neutral_cast(scene.image, region)):>13} "
                  f"{fmt(neutral_cast(old[scene.name], region)):>13} {fmt(neutral_cast(new, region)):>13}")
    preset = load_presets()["taobao_main"]
    where = rendered_subject(r, cup_mask, preset)
    corrected = np.asarray(r.correct([cup], [cup_mask], RetouchOptions("white"))[0])
    outs = {"before": old["render_cup"], "after": np.asarray(r.render(corrected, cup_mask, preset))}
    print("\ncoffee cup, brightest 5 % subject pixels, a* b*:", fmt(bright_subject_cast(cup, cup_mask >= 128)),
          "(input)", "gains now", r.plan(cup, cup_mask, keep).wb)
    for which, out in outs.items():
        print(f"  taobao_main {which:<7} a* b*: {fmt(bright_subject_cast(out, where))}  "
              f"enclosed white islands: {enclosed_white_islands(out)} (>= 16 px: {enclosed_white_islands(out, 16)})")
        if png is not None:
            png.mkdir(parents=True, exist_ok=True)
            cv2.imwrite(str(png / f"coffee_taobao_{which}.png"), cv2.cvtColor(out, cv2.COLOR_RGB2BGR))


def holes_in(mask: np.ndarray) -> int:
    """Background components of a bool mask that do not touch the frame."""
    n, labels = cv2.connectedComponents((~mask).astype(np.uint8), connectivity=4)
    frame = np.unique(np.concatenate([labels[0], labels[-1], labels[:, 0], labels[:, -1]]))
    return len(set(range(1, n)) - set(frame.tolist()))


def bench_mask(png: Path | None) -> None:
    from PIL import Image

    from gpu_kernels.segment import MaskPostprocess, OnnxSegmenter, ensure_u2netp
    from gpu_kernels.segment.hole_samples import HOLED_SHAPES, holed_composite
    from gpu_kernels.segment.samples import BACKGROUNDS, OBJECTS
    from lightbox.samples import make_catalog

    old_post = MaskPostprocess(erode_px=1, far_component=0.0, speck_hole=0.0, max_hole=0.0, guide_sigma=0.0)
    model = ensure_u2netp().original
    segs = {"before": OnnxSegmenter(model, post=old_post), "after": OnnxSegmenter(model)}
    print("masks on composites with holes and thin parts (u2netp): IoU / boundary F (2 px) / holes (truth)")
    print(f"{'composite':<28} {'before':>22} {'after':>22}")
    totals: dict[str, list[tuple[float, float]]] = {"before": [], "after": []}
    for i, shape in enumerate(HOLED_SHAPES):
        for j, bg in enumerate(BACKGROUNDS):
            c = holed_composite(OBJECTS[(i + j) % len(OBJECTS)], shape, bg)
            row = f"{c.name:<28}"
            for which, seg in segs.items():
                m = np.asarray(seg.segment_batch([c.image])[0]) >= 128
                iou, bf = mask_iou(m, c.mask), boundary_f(m, c.mask)
                totals[which].append((iou, bf))
                row += f"  {iou:.3f} / {bf:.3f} / {holes_in(m)} ({holes_in(c.mask)})"
            print(row)
    for which, vals in totals.items():
        arr = np.asarray(vals)
        print(f"  mean {which:<7} IoU {arr[:, 0].mean():.3f}  boundary F {arr[:, 1].mean():.3f}")
    from gpu_kernels.segment.samples import SHAPES, make_composite

    plain = [make_composite(o, SHAPES[(oi + bi) % len(SHAPES)], bg)
             for bi, bg in enumerate(BACKGROUNDS) for oi, o in enumerate(OBJECTS)]
    print("the 16 standard composites (samples.make_composite) and all 28: mean IoU / boundary F / bleed "
          "(alpha > 0 outside the truth, % of the truth's area)")
    for which, seg in segs.items():
        vals = []
        for c in plain + [holed_composite(OBJECTS[(i + j) % len(OBJECTS)], shape, bg)
                          for i, shape in enumerate(HOLED_SHAPES) for j, bg in enumerate(BACKGROUNDS)]:
            alpha = np.asarray(seg.segment_batch([c.image])[0])
            m = alpha >= 128
            bleed = 100 * ((alpha > 0) & ~c.mask).sum() / c.mask.sum()
            vals.append((mask_iou(m, c.mask), boundary_f(m, c.mask), bleed))
        arr = np.asarray(vals)
        std, every = arr[:16].mean(axis=0), arr.mean(axis=0)
        print(f"  {which:<7} standard {std[0]:.4f} / {std[1]:.4f} / {std[2]:.2f} %   all {every[0]:.4f} / "
              f"{every[1]:.4f} / {every[2]:.2f} %")
    import time

    from gpu_kernels.segment import alpha_from_probability
    from gpu_kernels.segment.ops import CpuOps

    c = holed_composite("coffee", "mug", "brick", size=(1200, 1600))
    prob = cv2.GaussianBlur(c.mask.astype(np.float32), (0, 0), 4.0)
    for which, post in (("before", old_post), ("after", MaskPostprocess())):
        best = float("inf")
        for _ in range(5):
            t0 = time.perf_counter()
            alpha_from_probability(prob, post, CpuOps(), c.image)
            best = min(best, time.perf_counter() - t0)
        print(f"  post-processing cost on the CPU, 1600x1200, {which}: {best * 1000:.0f} ms (best of 5)")
    r = CpuRetoucher()
    preset = load_presets()["taobao_main"]
    with tempfile.TemporaryDirectory() as tmp:
        paths = make_catalog(Path(tmp), 8)
        print("\nsample catalog in taobao_main: subject components / enclosed holes in the mask / enclosed white "
              "islands in the output (>= 16 px)")
        for path in paths:
            image = np.asarray(Image.open(path).convert("RGB"))
            row = f"{path.name:<36}"
            for which, seg in segs.items():
                alpha = np.asarray(seg.segment_batch([image])[0])
                out = np.asarray(r.render(r.correct([image], [alpha], RetouchOptions("white"))[0], alpha, preset))
                n = cv2.connectedComponents((alpha >= 128).astype(np.uint8), connectivity=8)[0] - 1
                row += f"  {which}: {n:>2} / {holes_in(alpha >= 128):>2} / {enclosed_white_islands(out):>3} " \
                       f"({enclosed_white_islands(out, 16)})"
                if png is not None:
                    png.mkdir(parents=True, exist_ok=True)
                    cv2.imwrite(str(png / f"{path.stem}_{which}.png"), cv2.cvtColor(out, cv2.COLOR_RGB2BGR))
            print(row)


PIPELINE = """
import os, sys, numpy as np
from gpu_kernels.backends import RetouchOptions
from gpu_kernels.presets import load_presets
from gpu_kernels.retouch import CpuRetoucher
from gpu_kernels.segment import OnnxSegmenter, ensure_u2netp
data = np.load(sys.argv[1])
r, out = CpuRetoucher(), {}
preset = load_presets()["transparent_png"]
with OnnxSegmenter(os.environ.get("QUALITY_MODEL") or ensure_u2netp().original, threads=2) as seg:
    for key in data.files:
        image = data[key]
        alpha = np.asarray(seg.segment_batch([image])[0])
        corrected = np.asarray(r.correct([image], [alpha], RetouchOptions("white"))[0])
        out["alpha_" + key] = alpha
        out["white_" + key] = corrected
        out["clear_" + key] = np.asarray(r.render(corrected, alpha, preset))
        out["params_" + key] = np.asarray(r.placement(image, alpha, preset))
np.savez(sys.argv[2], **out)
"""


def run_pipeline(tree: Path, images: dict[str, np.ndarray], model: Path | None = None) -> dict[str, np.ndarray]:
    """Segment (u2netp, or ``model``: another U2-Net ONNX file), pass (a) on white and
    ``transparent_png`` with the code of ``tree``, in a subprocess."""
    with tempfile.TemporaryDirectory() as tmp:
        src, dst = Path(tmp) / "in.npz", Path(tmp) / "out.npz"
        np.savez(src, **images)  # type: ignore[arg-type]
        env = dict(os.environ, PYTHONPATH=str(tree), QUALITY_MODEL=str(model or ""))
        subprocess.run([sys.executable, "-c", PIPELINE, str(src), str(dst)], check=True, env=env, cwd=tree)
        with np.load(dst) as out:
            return {k: out[k] for k in out.files}


def canvas_truth(alpha: np.ndarray, params: np.ndarray, width: int, height: int) -> np.ndarray:
    """The true alpha ``(H, W)`` float32 [0, 1] placed on a ``width`` x ``height`` canvas by the
    placement ``params`` (rendered as the cut-out is: the inverted alpha on a white canvas)."""
    from gpu_kernels.retouch.geometry import GeometryConfig
    from gpu_kernels.retouch.render import render_reference

    inv = np.rint(255.0 * (1.0 - alpha)).astype(np.uint8)[..., None]
    out = render_reference(np, inv, params.astype(np.float32), width, height, False, 0.0,
                           GeometryConfig().cubic_coefficients())
    return np.asarray(1.0 - np.asarray(out, np.float32)[..., 0] / 255.0, np.float32)


def item_figures(item: Any, res: dict[str, np.ndarray], key: str) -> dict[str, float]:
    """One item's figures (see the module docstring)."""
    from gpu_kernels.quality import lab

    alpha = res["alpha_" + key].astype(np.float32) / 255.0
    truth = item.alpha
    pred, true = alpha >= 0.5, truth >= 0.3  # a translucent body (alpha 0.35) is part of the product
    fig = {"iou": mask_iou(pred, true), "bf": boundary_f(pred, true),
           "sad": float(np.abs(alpha - truth).sum() / 1000.0)}
    if item.product.any():
        before, after = lab(item.image)[item.product], lab(res["white_" + key])[item.product]
        fig["da"] = float(np.median(after[:, 1]) - np.median(before[:, 1]))
        fig["db"] = float(np.median(after[:, 2]) - np.median(before[:, 2]))
    clear = res["clear_" + key]
    ch, cw = clear.shape[:2]
    canvas = canvas_truth(truth, res["params_" + key], cw, ch)
    shown = (clear[..., 3] >= 128) if clear.shape[-1] == 4 else np.ones((ch, cw), bool)
    fig["t_iou"] = mask_iou(shown, canvas >= 0.3)
    band = cv2.dilate((canvas > 0.0).astype(np.uint8), np.ones((7, 7), np.uint8)).astype(bool)
    fig["opaque_bg"] = float(100.0 * (shown & ~band).sum() / max(1, (~band).sum()))
    return fig


def on_page(rgba: np.ndarray, colour: tuple[int, int, int] = (70, 160, 200)) -> np.ndarray:
    """An RGBA canvas over a coloured page with a checker (what a CDN page shows); RGB as is."""
    if rgba.shape[-1] == 3:
        return rgba
    h, w = rgba.shape[:2]
    yy, xx = np.mgrid[0:h, 0:w]
    page = np.where((((yy // 40) + (xx // 40)) % 2 == 0)[..., None], np.array(colour), np.array(colour) * 0.8)
    a = rgba[..., 3:4].astype(np.float32) / 255.0
    return np.asarray(np.rint(rgba[..., :3] * a + page * (1.0 - a)), np.uint8)


def bench_set(before: Path, sheet: Path | None, model: Path | None = None) -> None:
    from gpu_kernels.segment.quality_set import CLASSES, quality_set

    items = quality_set()
    images = {f"i{k:02d}": it.image for k, it in enumerate(items)}
    here = Path(__file__).resolve().parents[1]
    runs = {"before": run_pipeline(before, images), "after": run_pipeline(here, images, model)}
    rows: dict[str, dict[str, list[dict[str, float]]]] = {c: {"before": [], "after": []} for c in CLASSES}
    print(f"cut-out quality set: {len(items)} items with true alpha (640x480), default path (u2netp)")
    print(f"{'item':<34} {'IoU b/a':>13} {'bound F b/a':>13} {'SAD b/a':>13} {'db* b/a':>13} "
          f"{'clear IoU b/a':>13} {'opaque bg % b/a':>16}")
    for k, it in enumerate(items):
        key = f"i{k:02d}"
        figs = {which: item_figures(it, res, key) for which, res in runs.items()}
        for which, f in figs.items():
            rows[it.cls][which].append(f)
        b, a = figs["before"], figs["after"]
        db = f"{b['db']:+5.1f} {a['db']:+5.1f}" if "db" in b else ""
        print(f"{it.name:<34} {b['iou']:.3f} {a['iou']:.3f}  {b['bf']:.3f} {a['bf']:.3f}  "
              f"{b['sad']:5.2f} {a['sad']:5.2f}  {db:>13} {b['t_iou']:.3f} {a['t_iou']:.3f}  "
              f"{b['opaque_bg']:6.2f} {a['opaque_bg']:6.2f}")
    print("\nper class (means; colour: mean |shift| and worst |shift| of median a*, b*)")
    print(f"{'class':<8} {'run':<7} {'IoU':>6} {'bound F':>8} {'SAD':>6} {'|da*|':>6} {'|db*|':>6} "
          f"{'worst':>6} {'clear IoU':>9} {'opaque bg %':>11}")
    for cls, runs_ in rows.items():
        for which, figs_ in runs_.items():
            arr = {k: np.asarray([f[k] for f in figs_]) for k in figs_[0]}
            colour = "" if "db" not in arr else (
                f"{np.abs(arr['da']).mean():6.2f} {np.abs(arr['db']).mean():6.2f} "
                f"{max(np.abs(arr['da']).max(), np.abs(arr['db']).max()):6.2f}")
            print(f"{cls:<8} {which:<7} {arr['iou'].mean():6.3f} {arr['bf'].mean():8.3f} {arr['sad'].mean():6.2f} "
                  f"{colour:>20} {arr['t_iou'].mean():9.3f} {arr['opaque_bg'].mean():11.2f}")
    if sheet is not None:
        from lightbox.contact_sheet import GAP, compose_rows

        n, rh = len(items), 160
        halves = [compose_rows([it.image for it in items], [runs[w][f"alpha_i{k:02d}"] for k in range(n)],
                               [f"{w}: {it.name}" for it in items], row_height=rh) for w in ("before", "after")]
        columns = []
        for w in ("before", "after"):  # transparent_png over a coloured page, one tile a row
            col = np.full((halves[0].shape[0], rh + 2 * GAP, 3), 224, np.uint8)
            for k in range(n):
                tile = cv2.resize(on_page(runs[w][f"clear_i{k:02d}"]), (rh, rh), interpolation=cv2.INTER_AREA)
                y = GAP + k * (rh + GAP)
                col[y:y + rh, GAP:GAP + rh] = tile
            columns.append(col)
        grid = np.concatenate([halves[0], halves[1], *columns], axis=1)
        sheet.parent.mkdir(parents=True, exist_ok=True)
        cv2.imwrite(str(sheet), cv2.cvtColor(grid, cv2.COLOR_RGB2BGR))
        print(f"contact sheet: {sheet}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("parts", nargs="*", default=["wb", "mask"])
    parser.add_argument("--png", type=Path, default=None)
    parser.add_argument("--sheet", type=Path, default=None,
                        help="set: before/after contact sheet (PNG); review: the sheets DIR/STEM-N.png "
                             "(review runs alone)")
    parser.add_argument("--before", type=Path, default=None,
                        help="wb, set: a checkout of an earlier commit to compare with (git worktree add --detach "
                             "DIR 96ff878); review: a checkout whose code to run instead of this one")
    parser.add_argument("--model", type=Path, default=None,
                        help="review, set (its 'after' run): another U2-Net ONNX file, e.g. "
                             "~/.cache/lightbox/models/u2net/u2net.onnx "
                             "(python -m gpu_kernels.segment.fetch_model --model u2net)")
    parser.add_argument("--rembg-venv", type=Path, default=Path.home() / ".cache" / "lightbox" / "rembg-venv",
                        help="review: rembg's virtualenv (made from PyPI on first use)")
    parser.add_argument("--no-rembg", action="store_true", help="review: leave rembg out")
    parser.add_argument("--judgement", type=Path, default=None, help="review: the kept verdicts "
                        "(default bench/review_judgement.toml)")
    parser.add_argument("--template", type=Path, default=None,
                        help="review: write a judgement file with the current fingerprints to fill in")
    args = parser.parse_args()
    if args.before is None and {"wb", "set"} & set(args.parts):
        parser.error("wb and set need --before DIR (a checkout of the older code)")
    if "review" in args.parts:
        from bench.quality_review import JUDGEMENT, bench_review

        bench_review(args.before or Path(__file__).resolve().parents[1], args.model, args.sheet,
                     None if args.no_rembg else args.rembg_venv, args.judgement or JUDGEMENT, args.template)
        return
    if "wb" in args.parts:
        bench_wb(args.before, args.png)
    if "mask" in args.parts:
        bench_mask(args.png)
    if "set" in args.parts:
        bench_set(args.before, args.sheet, args.model)


if __name__ == "__main__":
    main()
