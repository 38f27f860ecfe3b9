"""Retouch quality before/after, side by side in one run.

``wb``: the a*, b* (CIELAB medians) of the neutral objects of synthetic product shots (a white
box and a grey photograph on wood, green cloth, blue paper and a grey backdrop, with and without
a warm cast; ``gpu_kernels.retouch.scenes``) and of skimage's espresso cup (brightest subject
pixels, u2netp mask), in the input, after the CPU retoucher's pass (a) of an earlier
commit (``--baseline REF``, e.g. 96ff878, unpacked by ``bench.harness.baseline_tree`` and run in a
subprocess: white balance from the
background's mean, gains up to 2x) and after the current one. The cup also goes through
``taobao_main``; ``--png DIR`` writes those images.

``mask``: IoU, boundary F and enclosed holes of u2netp masks with the previous post-processing
(threshold + drop small islands + inward feather) and the current one, on composites with holes
and thin parts (``lightbox.datasets.hole_samples``), and on the first 8 images of the sample
catalog: subject components, enclosed holes, enclosed white islands in taobao_main.

``set``: the cut-out quality set with true alpha (:mod:`lightbox.datasets.quality_set`, 46
items in six classes) through the default path (u2netp + post-processing, pass (a) on white,
``transparent_png``), with the code of ``--baseline REF`` and the current code, each in a
subprocess. Per class: mask IoU and boundary F (alpha >= 128 against true alpha >= 0.3, so a
glass's translucent body counts as product), alpha
SAD (sum of |alpha - true alpha| over the frame, alpha in [0, 1], in thousands, at 640x480), the
pale products' colour shift (median a*, b* of the product's inner pixels after pass (a) minus the
input's; mean |shift| and the worst), and of ``transparent_png``: IoU of its alpha with the true
alpha rendered alike and the share of the canvas's true background that it paints opaque
(alpha >= 128, a band of 3 px around the true outline left out). ``--sheet PNG`` writes a
before/after contact sheet (``lightbox.contact_sheet``: input | mask | cut-out, before then after,
then ``transparent_png`` over a coloured page).

``review``: the real-photo review set (``bench/review/review_set.py``, 123 images of 41
photographs shipped in packages) through lightbox and rembg, a contact sheet to judge by eye and
the table of the kept verdicts (``bench/review/review_judgement.toml``; for ``--model
.../u2net.onnx``, ``review_judgement_u2net.toml``; for ``.../isnet.onnx``,
``review_judgement_isnet.toml``). Per image: lightbox's
default path (u2netp, or ``--model FILE``: a fetched model such as u2net or isnet, run with its
own spec;
post-processing, pass (a) on white, ``taobao_main``) run with the code of this checkout (or of
``--baseline REF``) in a subprocess, and rembg 2.0.86 (u2netp, in its own virtualenv:
``bench/peers/peer_rembg.py``; its outputs cached beside the photos) on the same file. The
sheet's rows: input | lightbox's taobao_main | rembg's taobao_main | lightbox's mask over the
input (red: dropped, the outline of rembg's mask in cyan). The table: each output's kept verdict
(accept/reject, and why) and whether lightbox's mask has changed since it was judged (a 24 x 24
fingerprint of the mask kept with the verdict: below 0.9 IoU with it the row says ``look
again``), the accepted count per class, and the framing consistency: each photo's framings mapped
back onto the photo, the masks' IoU where the framings overlap (worst pair), for lightbox and
rembg. ``--template FILE`` writes a judgement file with the current fingerprints and the verdicts
kept so far (new items marked ``"?"``), to be filled in by looking at the sheet.
``PYTHONPATH=. python bench/bench_quality.py review [--model FILE] [--sheet docs/img/review.png]``

``speed --model FILE``: u2netp against another U²-Net ONNX file on CPU, the CPU time of the
process per image of ``segment_batch`` (model and post-processing, ONNX Runtime on one thread),
18 review images, four rounds (``--rounds``) alternating in one process; a fetched model runs with
its own spec (``isnet/isnet.onnx``: IS-Net's).
``PYTHONPATH=. python bench/bench_quality.py speed --model ~/.cache/lightbox/models/u2net/u2net.onnx``

Usage: ``PYTHONPATH=. python bench/bench_quality.py [wb] [mask] [set] --baseline 96ff878 [--png DIR] [--sheet PNG]``
(``set`` compares with any older commit, e.g. ``--baseline a378c6f``).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import tomllib
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

ROOT = Path(__file__).resolve().parents[1]

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
    from gpu_kernels.segment.samples import BACKGROUNDS, OBJECTS
    from lightbox.datasets.hole_samples import HOLED_SHAPES, holed_composite
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
import os, sys, time, numpy as np
from gpu_kernels.backends import RetouchOptions
from gpu_kernels.presets import load_presets
from gpu_kernels.retouch import CpuRetoucher
from gpu_kernels.segment import KNOWN_SPECS, OnnxSegmenter, ensure_u2netp
data = np.load(sys.argv[1])
r, out = CpuRetoucher(), {}
name = os.environ.get("QUALITY_PRESET") or "transparent_png"
preset = load_presets()[name]
seg_s = 0.0
model = os.environ.get("QUALITY_MODEL") or ""
spec = KNOWN_SPECS.get(os.path.basename(model).split(".")[0], KNOWN_SPECS["u2netp"])
with OnnxSegmenter(model or ensure_u2netp().original, spec, threads=2) as seg:
    for key in data.files:
        image = data[key]
        t0 = time.perf_counter()
        alpha = np.asarray(seg.segment_batch([image])[0])
        seg_s += time.perf_counter() - t0
        corrected = np.asarray(r.correct([image], [alpha], RetouchOptions("white"))[0])
        out["alpha_" + key] = alpha
        out["render_" + key] = np.asarray(r.render(corrected, alpha, preset))
        if name == "transparent_png":
            out["white_" + key] = corrected
            out["params_" + key] = np.asarray(r.placement(image, alpha, preset))
out["seconds"] = np.asarray([seg_s / max(1, len(data.files))])
np.savez(sys.argv[2], **out)
"""


def run_pipeline(tree: Path, images: dict[str, np.ndarray], model: Path | None = None,
                 preset: str = "transparent_png") -> dict[str, np.ndarray]:
    """Segment (u2netp, or ``model``: another U2-Net ONNX file), pass (a) on white and ``preset``
    (``render_*``; ``seconds``: segmentation per image) with the code of ``tree``, in a subprocess."""
    with tempfile.TemporaryDirectory() as tmp:
        src, dst = Path(tmp) / "in.npz", Path(tmp) / "out.npz"
        np.savez(src, **images)  # type: ignore[arg-type]
        env = dict(os.environ, PYTHONPATH=str(tree), QUALITY_MODEL=str(model or ""), QUALITY_PRESET=preset)
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
    clear = res["render_" + key]
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
    from lightbox.datasets.quality_set import CLASSES, quality_set

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
                tile = cv2.resize(on_page(runs[w][f"render_i{k:02d}"]), (rh, rh), interpolation=cv2.INTER_AREA)
                y = GAP + k * (rh + GAP)
                col[y:y + rh, GAP:GAP + rh] = tile
            columns.append(col)
        grid = np.concatenate([halves[0], halves[1], *columns], axis=1)
        sheet.parent.mkdir(parents=True, exist_ok=True)
        cv2.imwrite(str(sheet), cv2.cvtColor(grid, cv2.COLOR_RGB2BGR))
        print(f"contact sheet: {sheet}")


# ``review``: the real-photo review set (bench/review/review_set.py) beside rembg

JUDGEMENT = ROOT / "bench" / "review" / "review_judgement.toml"


def spec_for(model: Path) -> Any:
    """The pre/post-processing of a fetched model file, by its name (``isnet/isnet.onnx``:
    IS-Net's; a name lightbox does not know: U2-Net's)."""
    from gpu_kernels.segment import KNOWN_SPECS

    return KNOWN_SPECS.get(model.name.split(".")[0], KNOWN_SPECS["u2netp"])


def judgement_for(model: Path | None) -> Path:
    """The kept verdicts for ``model``'s masks: ``review_judgement_<stem>.toml`` beside the
    default file where one was judged for that model (u2net), else the default (u2netp)."""
    own = JUDGEMENT.with_name(f"{JUDGEMENT.stem}_{model.stem}.toml") if model is not None else JUDGEMENT
    return own if own.is_file() else JUDGEMENT


def run_rembg(images: dict[str, np.ndarray], venv: Path) -> dict[str, np.ndarray]:
    """rembg's full-size masks and taobao_main outputs (``bench/peers/peer_rembg.py`` in its venv),
    kept beside the review photos (``review_set.cache_dir()``) by the inputs' sha256: rembg
    does not change between runs."""
    import hashlib

    from bench.review.review_set import cache_dir

    h = hashlib.sha256()
    for key, image in images.items():
        h.update(key.encode())
        h.update(image.tobytes())
    cached = cache_dir() / f"rembg-{h.hexdigest()[:16]}.npz"
    if cached.is_file():
        with np.load(cached) as kept:
            return {k: kept[k] for k in kept.files}
    out = _run_rembg(images, venv)
    cached.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(cached, **out)  # type: ignore[arg-type]
    return out


def _run_rembg(images: dict[str, np.ndarray], venv: Path) -> dict[str, np.ndarray]:
    from PIL import Image

    from bench.bench_peers import model_file, rembg_python

    model_file()  # u2netp verified at ~/.u2net, where rembg looks: nothing downloads
    py = rembg_python(venv)
    out: dict[str, np.ndarray] = {}
    with tempfile.TemporaryDirectory() as tmp:
        files = []
        for key, image in images.items():
            path = Path(tmp) / "in" / f"{key}.png"
            path.parent.mkdir(exist_ok=True)
            Image.fromarray(image).save(path)
            files.append(str(path))
        peer = str(ROOT / "bench" / "peers" / "peer_rembg.py")
        subprocess.run([str(py), peer, f"{tmp}/cut", *files, "--masks", f"{tmp}/masks"], check=True,
                       capture_output=True)
        subprocess.run([str(py), peer, f"{tmp}/cut", *files], check=True, capture_output=True)
        for key in images:
            out["alpha_" + key] = np.asarray(Image.open(f"{tmp}/masks/{key}.png").convert("L"))
            out["shop_" + key] = np.asarray(Image.open(f"{tmp}/cut/{key}.taobao_main.jpg").convert("RGB"))
    return out


def fingerprint(alpha: np.ndarray) -> str:
    """The mask (alpha >= 128) at 24 x 24 (area-averaged, >= one half), as hex."""
    small = cv2.resize((alpha >= 128).astype(np.float32), (24, 24), interpolation=cv2.INTER_AREA) >= 0.5
    return np.packbits(small.ravel()).tobytes().hex()


def fingerprint_iou(a: str, b: str) -> float:
    x = np.unpackbits(np.frombuffer(bytes.fromhex(a), np.uint8)).astype(bool)
    y = np.unpackbits(np.frombuffer(bytes.fromhex(b), np.uint8)).astype(bool)
    union = (x | y).sum()
    return 1.0 if union == 0 else float((x & y).sum() / union)


def framing_consistency(items: list[Any], alphas: dict[str, np.ndarray]) -> dict[str, float]:
    """Per photo: the worst IoU, over pairs of its framings, of the masks mapped onto the photo
    and compared where both framings cover it (1.0: the same cut-out wherever they overlap)."""
    from bench.review.review_set import to_photo

    by_photo: dict[str, list[Any]] = {}
    for it in items:
        by_photo.setdefault(it.photo.name, []).append(it)
    out = {}
    for name, group in by_photo.items():
        shape = (max(i.box[3] for i in group), max(i.box[2] for i in group))
        mapped = [to_photo(i, alphas[i.name], shape) for i in group]
        worst = 1.0
        for j in range(len(mapped)):
            for k in range(j + 1, len(mapped)):
                (ma, ca), (mb, cb) = mapped[j], mapped[k]
                both = ca & cb
                a, b = (ma >= 128) & both, (mb >= 128) & both
                union = (a | b).sum()
                if union:
                    worst = min(worst, float((a & b).sum() / union))
        out[name] = worst
    return out


def overlay(image: np.ndarray, alpha: np.ndarray, peer: np.ndarray | None) -> np.ndarray:
    """The input with what lightbox drops tinted red, and the outline of ``peer`` (rembg's mask) in cyan."""
    a = alpha.astype(np.float32)[..., None] / 255.0
    red = np.array([220, 40, 40], np.float32)
    out = image.astype(np.float32) * (0.35 + 0.65 * a) + red * 0.65 * (1.0 - a)
    out = np.clip(out, 0, 255).astype(np.uint8)
    if peer is not None:
        edge = cv2.morphologyEx((peer >= 128).astype(np.uint8), cv2.MORPH_GRADIENT, np.ones((3, 3), np.uint8))
        out[edge > 0] = (0, 230, 230)
    return out


def sheet_tile(img: np.ndarray, size: int) -> np.ndarray:
    h, w = img.shape[:2]
    s = size / max(h, w)
    small = cv2.resize(img[..., :3], (max(1, round(w * s)), max(1, round(h * s))), interpolation=cv2.INTER_AREA)
    out = np.full((size, size, 3), 224, np.uint8)
    y, x = (size - small.shape[0]) // 2, (size - small.shape[1]) // 2
    out[y:y + small.shape[0], x:x + small.shape[1]] = small
    return out


def write_sheets(items: list[Any], lb: dict[str, np.ndarray], rb: dict[str, np.ndarray] | None,
                 verdicts: dict[str, Any], folder: Path, stem: str, per_page: int, size: int) -> list[Path]:
    gap = 6
    paths = []
    for p in range(0, len(items), per_page):
        rows = []
        for it in items[p:p + per_page]:
            peer = None if rb is None else rb["alpha_" + it.name]
            blank = np.full((size, size, 3), 224, np.uint8)
            cells = [sheet_tile(it.image, size), sheet_tile(lb["render_" + it.name], size),
                     sheet_tile(rb["shop_" + it.name], size) if rb is not None else blank,
                     sheet_tile(overlay(it.image, lb["alpha_" + it.name], peer), size)]
            row = np.full((size, 4 * size + 3 * gap, 3), 255, np.uint8)
            for c, cell in enumerate(cells):
                row[:, c * (size + gap):c * (size + gap) + size] = cell
            v = verdicts.get(it.name, {})
            label = f"{it.name}  lightbox:{v.get('lightbox', '?')}  rembg:{v.get('rembg', '?')}"
            cv2.putText(row, label, (4, 14), cv2.FONT_HERSHEY_SIMPLEX, 0.42, (0, 0, 0), 3, cv2.LINE_AA)
            cv2.putText(row, label, (4, 14), cv2.FONT_HERSHEY_SIMPLEX, 0.42, (255, 255, 255), 1, cv2.LINE_AA)
            rows.append(row)
        sheet = np.full((len(rows) * (size + gap) + gap, rows[0].shape[1] + 2 * gap, 3), 255, np.uint8)
        for k, row in enumerate(rows):
            sheet[gap + k * (size + gap):gap + k * (size + gap) + size, gap:gap + row.shape[1]] = row
        path = folder / f"{stem}-{p // per_page + 1}.png"
        folder.mkdir(parents=True, exist_ok=True)
        cv2.imwrite(str(path), cv2.cvtColor(sheet, cv2.COLOR_RGB2BGR), [cv2.IMWRITE_PNG_COMPRESSION, 9])
        paths.append(path)
    return paths


def load_judgement(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    with path.open("rb") as fh:
        return dict(tomllib.load(fh).get("items", {}))


def write_template(path: Path, items: list[Any], lb: dict[str, np.ndarray], kept: dict[str, Any],
                   source: Path = JUDGEMENT) -> None:
    def q(s: str) -> str:
        return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'

    lines = ["# Verdicts on the review set's cut-outs, judged by looking at the contact sheet",
             "# (bench/bench_quality.py review --sheet DIR). lightbox/rembg: accept or reject, *_why: what was seen.",
             "# fingerprint: lightbox's mask when judged (24 x 24); a later run flags rows whose mask moved."]
    if source.is_file():  # the kept file's notes on when and how it was judged
        lines += [ln for ln in source.read_text().splitlines() if ln.startswith("# judged")]
    lines.append("")
    for it in items:
        v = kept.get(it.name, {})
        lines.append(f"[items.{q(it.name)}]")
        lines.append(f"class = {q(it.cls)}")
        for who in ("lightbox", "rembg"):
            lines.append(f"{who} = {q(v.get(who, '?'))}")
            lines.append(f"{who}_why = {q(v.get(who + '_why', ''))}")
        lines.append(f"fingerprint = {q(fingerprint(lb['alpha_' + it.name]))}")
        lines.append("")
    path.write_text("\n".join(lines))


def bench_review(tree: Path, model: Path | None, sheet: Path | None, rembg_venv: Path | None,
                 judgement: Path, template: Path | None, per_page: int = 12, size: int = 150) -> None:
    from bench.review.review_set import review_set

    items = review_set()
    images = {it.name: it.image for it in items}
    lb = run_pipeline(tree, images, model, preset="taobao_main")
    rb = run_rembg(images, rembg_venv) if rembg_venv is not None else None
    kept = load_judgement(judgement)
    print(f"review set: {len(items)} images of {len({i.photo.name for i in items})} photographs; lightbox "
          f"({model.name if model else 'u2netp'}, code of {tree}) segment {float(lb['seconds'][0]) * 1000:.0f} ms "
          "per image (model + post-processing, CPU, 2 threads)")
    print(f"{'image':<24} {'class':<12} {'lightbox':<9} {'rembg':<9} {'moved':>6}  why (lightbox | rembg)")
    counts: dict[str, dict[str, list[int]]] = {}
    for it in items:
        v = kept.get(it.name, {})
        fp = v.get("fingerprint")
        moved = "" if not fp else f"{fingerprint_iou(fp, fingerprint(lb['alpha_' + it.name])):.2f}"
        flag = " look again" if moved and float(moved) < 0.9 else ""
        print(f"{it.name:<24} {it.cls:<12} {v.get('lightbox', '?'):<9} {v.get('rembg', '?'):<9} {moved:>6}{flag}  "
              f"{v.get('lightbox_why', '')} | {v.get('rembg_why', '')}")
        c = counts.setdefault(it.cls, {"lightbox": [0, 0], "rembg": [0, 0]})
        for who in ("lightbox", "rembg"):
            c[who][0] += v.get(who) == "accept"
            c[who][1] += 1
    print(f"\naccepted per class (kept verdicts)\n{'class':<12} {'lightbox':>9} {'rembg':>9}")
    tot = {"lightbox": 0, "rembg": 0}
    for cls, c in counts.items():
        print(f"{cls:<12} {c['lightbox'][0]:>4}/{c['lightbox'][1]:<4} {c['rembg'][0]:>4}/{c['rembg'][1]:<4}")
        for who in tot:
            tot[who] += c[who][0]
    print(f"{'all':<12} {tot['lightbox']:>4}/{len(items):<4} {tot['rembg']:>4}/{len(items):<4}")
    cons = framing_consistency(items, {k[6:]: v for k, v in lb.items() if k.startswith("alpha_")})
    peer = framing_consistency(items, {k[6:]: v for k, v in rb.items() if k.startswith("alpha_")}) if rb else {}
    print("\nframing consistency: worst IoU of the masks where a photo's framings overlap (lightbox / rembg)")
    for name, v in cons.items():
        print(f"  {name:<14} {v:.3f} / {peer.get(name, float('nan')):.3f}")
    print(f"  mean           {np.mean(list(cons.values())):.3f} / "
          f"{np.mean(list(peer.values())) if peer else float('nan'):.3f}")
    if sheet is not None:
        for p in write_sheets(items, lb, rb, kept, sheet.parent, sheet.stem, per_page, size):
            print(f"contact sheet: {p} ({p.stat().st_size / 1e6:.2f} MB)")
    if template is not None:
        write_template(template, items, lb, kept, judgement)
        print(f"judgement template: {template}")


SPEED_PHOTOS = ("smarties", "stuff", "coffee", "chelsea", "astronaut", "coins")


def bench_speed(model: Path, rounds: int = 4) -> None:
    """u2netp against ``model``: CPU time of this process per image of ``segment_batch`` (model and
    post-processing; ONNX Runtime on one thread, so the figure is the work done, not spinning) on
    six review photographs in their three framings, rounds alternating in one process."""
    from bench.review.review_set import PHOTOS, review_set
    from gpu_kernels.segment import OnnxSegmenter, ensure_u2netp

    items = review_set(photos=tuple(p for p in PHOTOS if p.name in SPEED_PHOTOS))
    segs = {"u2netp": OnnxSegmenter(ensure_u2netp().original, threads=1),
            model.stem: OnnxSegmenter(model.expanduser(), spec_for(model), threads=1)}
    for seg in segs.values():
        seg.segment_batch([items[0].image])  # warm-up
    cpu: dict[str, list[float]] = {k: [] for k in segs}
    wall: dict[str, list[float]] = {k: [] for k in segs}
    for r in range(rounds):
        for k in (list(segs) if r % 2 == 0 else list(segs)[::-1]):
            c0, w0 = time.process_time(), time.perf_counter()
            for it in items:
                segs[k].segment_batch([it.image])
            cpu[k].append((time.process_time() - c0) / len(items) * 1000)
            wall[k].append((time.perf_counter() - w0) / len(items) * 1000)
    for k in segs:
        print(f"{k:<8} CPU per image {np.median(cpu[k]):6.0f} ms (rounds {', '.join(f'{x:.0f}' for x in cpu[k])}); "
              f"wall {np.median(wall[k]):.0f} ms; {len(items)} images, 1 ONNX Runtime thread")
    print(f"{model.stem} / u2netp CPU: {np.median(cpu[model.stem]) / np.median(cpu['u2netp']):.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("parts", nargs="*", default=["wb", "mask"])
    parser.add_argument("--png", type=Path, default=None)
    parser.add_argument("--sheet", type=Path, default=None,
                        help="set: before/after contact sheet (PNG); review: the sheets DIR/STEM-N.png "
                             "(review runs alone)")
    parser.add_argument("--baseline", default="", metavar="REF",
                        help="wb, set: git ref of the earlier code to compare with, e.g. 96ff878 (bench.harness); "
                             "review: a ref whose code to run instead of this tree's")
    parser.add_argument("--model", type=Path, default=None,
                        help="review, set (its 'after' run), speed: a fetched model file, e.g. "
                             "~/.cache/lightbox/models/u2net/u2net.onnx (lightbox model fetch u2net; "
                             "isnet/isnet.onnx runs with IS-Net's spec)")
    parser.add_argument("--rembg-venv", type=Path, default=Path.home() / ".cache" / "lightbox" / "rembg-venv",
                        help="review: rembg's virtualenv (made from PyPI on first use)")
    parser.add_argument("--no-rembg", action="store_true", help="review: leave rembg out")
    parser.add_argument("--judgement", type=Path, default=None, help="review: the kept verdicts (default "
                        "bench/review/review_judgement.toml; with --model u2net.onnx, review_judgement_u2net.toml, "
                        "and so on)")
    parser.add_argument("--rounds", type=int, default=4, help="speed: rounds alternating the two models")
    parser.add_argument("--template", type=Path, default=None,
                        help="review: write a judgement file with the current fingerprints to fill in")
    args = parser.parse_args()
    if not args.baseline and {"wb", "set"} & set(args.parts):
        parser.error("wb and set need --baseline REF (a git ref of the older code, e.g. 96ff878)")
    from bench.harness import baseline_tree

    before = baseline_tree(args.baseline)
    if "speed" in args.parts:
        if args.model is None:
            parser.error("speed needs --model FILE (e.g. ~/.cache/lightbox/models/u2net/u2net.onnx)")
        bench_speed(args.model, args.rounds)
        return
    if "review" in args.parts:
        bench_review(before or Path(__file__).resolve().parents[1], args.model, args.sheet,
                     None if args.no_rembg else args.rembg_venv, args.judgement or judgement_for(args.model),
                     args.template)
        return
    if "wb" in args.parts:
        bench_wb(before, args.png)  # not None: checked above
    if "mask" in args.parts:
        bench_mask(args.png)
    if "set" in args.parts:
        bench_set(before, args.sheet, args.model)


if __name__ == "__main__":
    main()
