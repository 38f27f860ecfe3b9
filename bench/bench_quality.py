"""Retouch quality before/after, side by side in one run (issue 14).

``wb``: the a*, b* (CIELAB medians) of the neutral objects of synthetic product shots (a white
box and a grey photograph on wood, green cloth, blue paper and a grey backdrop, with and without
a warm cast; ``gpu_kernels.retouch.scenes``) and of skimage's espresso cup (brightest subject
pixels, u2netp mask), in the input, after the CPU retoucher's pass (a) of the code before
issue 14 (``--before DIR``: a checkout of that commit, run in a subprocess: white balance from the
background's mean, gains up to 2x) and after the current one. The cup also goes through
``taobao_main``; ``--png DIR`` writes those images.

``mask``: IoU, boundary F and enclosed white islands of the mask post-processing, previous
(threshold + drop small islands + inward feather) vs current, on composites with holes.

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
from gpu_kernels.quality import bright_subject_cast, enclosed_white_islands, neutral_cast
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("parts", nargs="*", default=["wb", "mask"])
    parser.add_argument("--png", type=Path, default=None)
    parser.add_argument("--before", type=Path, required=True,
                        help="a checkout of the commit before issue 14 (git worktree add --detach DIR 96ff878)")
    args = parser.parse_args()
    if "wb" in args.parts:
        bench_wb(args.before, args.png)


if __name__ == "__main__":
    main()
