"""Make the folder the GPU validation run takes to an NVIDIA machine (that may have no network).

    python3 bench/gpu_suite_pack.py FOLDER [--python-version 3.12] [--platform manylinux_2_28_x86_64]
    python3 bench/gpu_suite_pack.py FOLDER --from-installed      # this Python's installed packages

FOLDER gets ``model/`` (u2netp as published and with a symbolic batch, from the model cache,
fetched there first if missing; with the gate images when scikit-image is installed here) and
``wheels/``: lightbox's dependencies as wheels for the target Python and platform, less what a
stock PyTorch GPU image already has (``STOCK``: numpy, Pillow, OpenCV, ONNX Runtime, torch,
torchvision, CuPy and NVIDIA's CUDA packages), plus pytest for the parity step. Run on a machine
that reaches PyPI. ``bench/gpu_suite.sh FOLDER`` installs ``wheels/`` offline
(``pip install --no-index``) and never downloads anything.

``--from-installed`` puts the same distributions, as installed in this Python, under ``site/``
instead of ``wheels/`` (no download): the run then puts ``site/`` on its path as it is.
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# What a stock PyTorch GPU image (plus OpenCV and the CPU ONNX Runtime) already has.
STOCK = ("numpy", "pillow", "opencv-python", "opencv-python-headless", "opencv-contrib-python", "onnxruntime",
         "onnxruntime-gpu", "torch", "torchvision", "triton", "cupy-cuda13x", "cupy-cuda12x", "sympy", "mpmath",
         "flatbuffers", "coloredlogs", "humanfriendly", "packaging", "setuptools", "pip", "wheel")
STOCK_PREFIXES = ("nvidia-", "cuda-")
# lightbox's dependency the run never imports: the CPU model runtime (the parity tests' images
# come from scikit-image, which stays)
NOT_RUN = ("openvino",)
RUN_EXTRA = ("pytest",)  # the parity step


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def is_stock(name: str) -> bool:
    n = norm(name)
    return n in {norm(s) for s in STOCK} or n.startswith(STOCK_PREFIXES)


def run_requirements() -> list[str]:
    """lightbox's own requirements (no extras) the run needs, plus pytest."""
    reqs = [Requirement(r) for r in md.requires("lightbox") or []]
    base = [str(r) for r in reqs if r.marker is None and not is_stock(r.name) and norm(r.name) not in NOT_RUN]
    return base + list(RUN_EXTRA)


def closure(roots: list[str]) -> list[md.Distribution]:
    """The installed distributions ``roots`` need (markers evaluated here), stock ones left out."""
    env = default_environment()
    seen: dict[str, md.Distribution] = {}
    todo = [Requirement(r) for r in roots]
    while todo:
        req = todo.pop()
        name = norm(req.name)
        if name in seen or is_stock(name):
            continue
        try:
            dist = md.distribution(req.name)
        except md.PackageNotFoundError:
            raise SystemExit(f"gpu_suite_pack: {req.name} is not installed here (pip install it, or pack without "
                             "--from-installed)") from None
        seen[name] = dist
        for text in dist.requires or []:
            sub = Requirement(text)
            if sub.marker is None or sub.marker.evaluate({**env, "extra": ""}):
                todo.append(sub)
    return list(seen.values())


def copy_installed(dists: list[md.Distribution], site: Path) -> int:
    """Link each distribution's installed files into ``site`` (same layout as site-packages)."""
    n = 0
    for dist in dists:
        root = Path(str(dist.locate_file("")))
        for rel in dist.files or []:
            if rel.parts and rel.parts[0] == "..":
                continue  # console scripts and data outside site-packages
            src, dst = root / rel, site / rel
            if not src.is_file() or dst.exists():
                continue
            dst.parent.mkdir(parents=True, exist_ok=True)
            os.symlink(src.resolve(), dst)
            n += 1
    return n


def download(reqs: list[str], wheels: Path, python_version: str, platform: str) -> None:
    wheels.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--only-binary=:all:", "--dest", str(wheels),
           "--python-version", python_version, "--platform", platform, "--platform", "linux_x86_64", *reqs]
    subprocess.run(cmd, check=True)
    for whl in wheels.glob("*.whl"):
        if is_stock(whl.name.split("-")[0]):
            whl.unlink()  # the GPU machine's own copy is the one to test with


def pack_model(folder: Path) -> None:
    from gpu_kernels.segment.fetch_model import ensure_u2netp

    files = ensure_u2netp()
    model = folder / "model"
    model.mkdir(parents=True, exist_ok=True)
    for src in (files.original, files.batched, files.notice, Path(files.batched).with_suffix(".json")):
        shutil.copy2(src, model / Path(src).name)  # with the batched copy's sidecar: no rebuild there
    try:
        from bench.gpu_model_grid import export_gate_images

        export_gate_images(model / "gate")
    except ImportError:
        print("gpu_suite_pack: no scikit-image here: no gate images (the fp16 gates report skipped)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("folder", type=Path)
    ap.add_argument("--python-version", default=f"{sys.version_info.major}.{sys.version_info.minor}",
                    help="the GPU machine's Python (default: this one's)")
    ap.add_argument("--platform", default="manylinux_2_28_x86_64")
    ap.add_argument("--from-installed", action="store_true", help="link this Python's installed packages into site/")
    ap.add_argument("--no-model", action="store_true", help="leave model/ as it is")
    args = ap.parse_args(argv)
    args.folder.mkdir(parents=True, exist_ok=True)
    reqs = run_requirements()
    if args.from_installed:
        site = args.folder / "site"
        shutil.rmtree(site, ignore_errors=True)
        dists = closure(reqs)
        print(f"gpu_suite_pack: {len(dists)} distributions, {copy_installed(dists, site)} files linked into {site}")
    else:
        download(reqs, args.folder / "wheels", args.python_version, args.platform)
    if not args.no_model:
        pack_model(args.folder)
    print(f"gpu_suite_pack: {args.folder} is ready: bash bench/gpu_suite.sh {args.folder}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
