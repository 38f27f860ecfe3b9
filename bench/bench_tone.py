"""Exposure/tone before/after, side by side in one run.

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

Usage: ``PYTHONPATH=. python bench/bench_tone.py [--baseline main] [--png DIR]``
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from skimage.color import deltaE_ciede2000, rgb2lab

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpu_kernels.backends import RetouchOptions
from gpu_kernels.retouch import CpuRetoucher
from tests.gpu_kernels.test_tone import PRODUCTS, lstar_error, mean_lstar, photo, product_scene

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
    base = photo(name).astype(np.float64)
    return {
        "dark45": (base * 0.45).astype(np.uint8),
        "over150": np.clip(base * 1.5, 0, 255).astype(np.uint8),
        "washed": (base * 0.55 + 110).astype(np.uint8),
    }


def tone_scenes() -> dict[str, tuple[np.ndarray, np.ndarray | None]]:
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
    sel = mask == 255
    de = deltaE_ciede2000(rgb2lab(reference[sel][None]), rgb2lab(out[sel][None]))[0]
    newly = ((out[sel] == 255) & (image[sel] < 255)).any(axis=1).mean()
    med = np.median(out[sel], axis=0).astype(int)
    return float(np.median(de)), float(np.percentile(de, 95)), float(newly), str(tuple(med.tolist()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--baseline", default="", metavar="REF",
                        help="git ref of the code to compare with (default: none; bench.harness)")
    parser.add_argument("--png", type=Path, help="write input | before | after strips here")
    args = parser.parse_args()
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


if __name__ == "__main__":
    main()
