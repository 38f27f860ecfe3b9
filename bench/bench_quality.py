"""Retouch quality before/after, side by side in one run (issue 14).

``wb``: the a*, b* (CIELAB medians) of the neutral objects of synthetic product shots (a white
box and a grey photograph on wood, green cloth, blue paper and a grey backdrop, with and without
a warm cast; ``gpu_kernels.retouch.scenes``) and of skimage's espresso cup (brightest subject
pixels, u2netp mask), in the input, after the CPU retoucher's pass (a) of the code before
issue 14 (``--before DIR``: a checkout of that commit, run in a subprocess: white balance from the
background's mean, gains up to 2x) and after the current one. The cup also goes through
``taobao_main``; ``--png DIR`` writes those images.

``mask``: IoU, boundary F and enclosed holes of u2netp masks with the previous post-processing
(threshold + drop small islands + inward feather) and the current one, on composites with holes
and thin parts (``gpu_kernels.segment.hole_samples``), and on the first 8 images of the sample
catalog: subject components, enclosed holes, enclosed white islands in taobao_main.

Usage: ``git worktree add --detach /tmp/base 96ff878;
PYTHONPATH=. python bench/bench_quality.py [wb] [mask] --before /tmp/base [--png DIR]``
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
    checkout of the commit before issue 14), in a subprocess."""
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("parts", nargs="*", default=["wb", "mask"])
    parser.add_argument("--png", type=Path, default=None)
    parser.add_argument("--before", type=Path, required=True,
                        help="a checkout of the commit before issue 14 (git worktree add --detach DIR 96ff878)")
    args = parser.parse_args()
    if "wb" in args.parts:
        bench_wb(args.before, args.png)
    if "mask" in args.parts:
        bench_mask(args.png)


if __name__ == "__main__":
    main()
