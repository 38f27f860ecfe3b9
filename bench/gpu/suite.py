"""The GPU validation run's own steps: the folder it brings, its preflight, its rows and its report.

    python3 bench/gpu/suite.py pack FOLDER [--from-installed]    # on a machine that reaches PyPI
    bash bench/gpu/suite.sh FOLDER [OUT]                          # on the NVIDIA machine, offline

``suite.sh`` runs ``suite.py preflight``, then the checks (``bench/gpu/checks.py``), each appending
its rows with :func:`append`, then ``suite.py report``. Top-level imports are the standard
library's only: the preflight must run (and say what is missing) before anything else can.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata as md
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

__all__ = ["append", "copy_installed"]


# --- rows ---------------------------------------------------------------------------------------

ROWS_DOC = """Rows of the GPU validation run, appended to one JSON Lines file as each figure lands.

``bench/gpu/suite.sh`` sets ``GPU_SUITE_ROWS`` (the file) and ``GPU_SUITE_STEP`` (the step
running); :func:`append` then writes one line per row, flushed and synced, so a step cut off by
its time limit keeps every row it finished. Outside the suite (neither variable set) it does
nothing. ``suite.py report`` turns the file into the run's one JSON.
"""


__all__ = ["append"]


def append(row: dict[str, Any], *, kind: str = "row") -> None:
    """Append ``row`` (tagged with the step, ``kind`` and the time) to ``$GPU_SUITE_ROWS``."""
    path = os.environ.get("GPU_SUITE_ROWS")
    if not path:
        return
    line = {"step": os.environ.get("GPU_SUITE_STEP", "?"), "kind": kind, "t": round(time.time(), 3), **row}
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(line, default=str) + "\n")
        fh.flush()
        os.fsync(fh.fileno())


# --- pack --------------------------------------------------------------------------------------

PACK_DOC = """Make the folder the GPU validation run takes to an NVIDIA machine (that may have no network).

    python3 bench/gpu/suite.py pack FOLDER [--python-version 3.12] [--platform manylinux_2_28_x86_64]
    python3 bench/gpu/suite.py pack FOLDER --from-installed      # this Python's installed packages

FOLDER gets ``model/`` (u2netp as published and with a symbolic batch, from the model cache,
fetched there first if missing; with the gate images when scikit-image is installed here) and
``wheels/``: lightbox's dependencies as wheels for the target Python and platform, less what a
stock PyTorch GPU image already has (``STOCK``: numpy, Pillow, OpenCV, ONNX Runtime, torch,
torchvision, CuPy and NVIDIA's CUDA packages), plus pytest for the parity step. Run on a machine
that reaches PyPI. ``bench/gpu/suite.sh FOLDER`` installs ``wheels/`` offline
(``pip install --no-index``) and never downloads anything.

``--from-installed`` puts the same distributions, as installed in this Python, under ``site/``
instead of ``wheels/`` (no download): the run then puts ``site/`` on its path as it is.
"""


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
    from packaging.requirements import Requirement

    reqs = [Requirement(r) for r in md.requires("lightbox") or []]
    base = [str(r) for r in reqs if r.marker is None and not is_stock(r.name) and norm(r.name) not in NOT_RUN]
    return base + list(RUN_EXTRA)


def closure(roots: list[str]) -> list[md.Distribution]:
    """The installed distributions ``roots`` need (markers evaluated here), stock ones left out."""
    from packaging.markers import default_environment
    from packaging.requirements import Requirement

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
            raise SystemExit(f"suite.py pack: {req.name} is not installed here (pip install it, or pack without "
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
        from bench.gpu.checks import export_gate_images

        export_gate_images(model / "gate")
    except ImportError:
        print("suite.py pack: no scikit-image here: no gate images (the fp16 gates report skipped)")


def pack_main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=PACK_DOC, formatter_class=argparse.RawTextHelpFormatter)
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
        print(f"suite.py pack: {len(dists)} distributions, {copy_installed(dists, site)} files linked into {site}")
    else:
        download(reqs, args.folder / "wheels", args.python_version, args.platform)
    if not args.no_model:
        pack_model(args.folder)
    print(f"suite.py pack: {args.folder} is ready: bash bench/gpu/suite.sh {args.folder}")
    return 0


# --- preflight ---------------------------------------------------------------------------------

PREFLIGHT_DOC = """Preflight of the GPU validation run: everything the run needs, checked in seconds.

    python3 bench/gpu/suite.py preflight --model FOLDER/model/u2netp.batched.onnx [--mode auto|gpu|cpu]

Checks, in order, and stops at the first that fails with one line saying what to bring:
every module the run imports (lightbox's own and its dependencies: from the
run's folder where the machine lacks them); the model file; and on a GPU: a CUDA device,
the driver's CUDA version (13: driver 580+), a CuPy kernel compiled at run time (CUDA headers),
a GPU JPEG decoder (DALI or torchvision's nvJPEG) and a model runtime on the device (ONNX
Runtime's CUDA provider or torch with CUDA). Exit 0 prints one JSON line of what it found (the
run's mode: "gpu", or "cpu" where there is no device); exit 1 prints ``preflight: ...``.
"""


# What the run's steps import, at module level or inside the code paths they take.
MODULES = (
    "numpy", "cv2", "PIL", "onnxruntime", "streams.settings", "schemas.events", "agents.wiring", "lightbox.offline",
    "lightbox.report", "gpu_kernels.codec", "gpu_kernels.segment", "gpu_kernels.retouch", "gpu_kernels.pipeline",
    "simplejpeg", "onnx",
)


class Failed(Exception):
    pass


def check_imports() -> None:
    for name in MODULES:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            missing = exc.name or name
            raise Failed(f"Python module {missing!r} is missing (needed by {name}): put its wheel in the run's "
                         "folder (bench/gpu/suite.py pack makes it)") from exc


def check_gpu() -> dict[str, Any]:
    found: dict[str, Any] = {}
    try:
        import cupy
    except ImportError as exc:
        raise Failed("a GPU run needs CuPy (cupy-cuda13x): put its wheel in the run's folder") from exc
    from gpu_kernels.device_probe import cupy_jit, driver_floor

    if (why := driver_floor(cupy)) is not None:
        raise Failed(why)
    if (why := cupy_jit(cupy)) is not None:
        raise Failed(why)
    props = cupy.cuda.runtime.getDeviceProperties(0)
    found["gpu"] = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    found["driver_cuda"] = int(cupy.cuda.runtime.driverGetVersion())
    from gpu_kernels.codec import gpu_decoder_choice

    decoder, why = gpu_decoder_choice()
    if decoder is None:
        raise Failed(why)
    found["decoder"] = decoder
    import onnxruntime as ort

    runtimes = ["onnxruntime-cuda"] if "CUDAExecutionProvider" in ort.get_available_providers() else []
    if not runtimes:  # torch only when needed: its import alone can take seconds of the 15
        from gpu_kernels.segment.machine import torch_cuda_available

        if torch_cuda_available():
            runtimes.append("torch-cuda")
    if not runtimes:
        raise Failed("no model runtime on the GPU: bring onnxruntime-gpu (CUDA 13 build) or torch with CUDA")
    found["model_runtimes"] = runtimes
    return found


def device_count() -> int:
    try:
        import cupy

        return int(cupy.cuda.runtime.getDeviceCount())
    except Exception:  # no CuPy, no driver
        return 0


def preflight(model: Path, mode: str) -> dict[str, Any]:
    check_imports()
    if not model.is_file() or model.stat().st_size < 1_000_000:
        raise Failed(f"no model at {model}: put u2netp.batched.onnx in the run's folder (model/)")
    gpus = device_count()
    if mode == "gpu" and gpus == 0:
        raise Failed("no CUDA device visible (nvidia-smi; in a container: --gpus 1)")
    found: dict[str, Any] = {"mode": "gpu" if gpus and mode != "cpu" else "cpu", "python": sys.version.split()[0],
                             "devices": gpus, "model": str(model)}
    if found["mode"] == "gpu":
        found |= check_gpu()
    import numpy as np
    import onnxruntime as ort

    found |= {"numpy": np.__version__, "onnxruntime": ort.__version__}
    return found


def preflight_main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=PREFLIGHT_DOC, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--mode", choices=("auto", "gpu", "cpu"), default="auto")
    args = ap.parse_args(argv)
    try:
        found = preflight(args.model, args.mode)
    except Failed as exc:
        print(f"preflight: {exc}", flush=True)
        return 1

    append(found, kind="preflight")
    print(json.dumps(found), flush=True)
    mode_file = os.environ.get("GPU_SUITE_MODE_FILE")
    if mode_file:
        Path(mode_file).write_text(found["mode"] + "\n")
    return 0


# --- report ------------------------------------------------------------------------------------

REPORT_DOC = """The GPU validation run's one JSON, one PNG and one archive, from the rows as they landed.

    python3 bench/gpu/suite.py report WORK OUT

Reads ``OUT/gpu_suite.rows.jsonl`` (one line per figure, :func:`append`) and
``WORK/steps.jsonl`` (each step's exit code and seconds), writes ``OUT/gpu_suite.json``
(machine, steps, every row grouped by step, a summary line per step and the GPU goals judged
where the figures exist) and ``OUT/gpu_suite.png`` (end-to-end img/s and p99 by batch, model
img/s by batch, decode img/s by batch, step seconds; matplotlib when installed, else the summary
as text with OpenCV), then ``OUT/gpu_suite.tar.gz`` with both, the rows and every step's log.
The rows file goes into the archive: OUT keeps the three files.
"""


NOT_FIGURES = ("preflight", "setup", "skipped", "error")
STEPS = ("preflight", "e2e", "model", "decode", "retouch", "parity")


def _jsonl(path: Path) -> list[dict[str, Any]]:
    out = []
    if path.is_file():
        for line in path.read_text(errors="replace").splitlines():
            try:
                row = json.loads(line)
            except ValueError:
                continue  # a line cut by a kill: the rows before it stand
            if isinstance(row, dict):
                out.append(row)
    return out


def parity_summary(log: Path) -> dict[str, Any]:
    text = log.read_text(errors="replace") if log.is_file() else ""
    counts = {k: int(v) for v, k in re.findall(r"(\d+) (passed|failed|skipped|error|errors)", text)}
    status = "failed" if counts.get("failed") or counts.get("error") or counts.get("errors") else (
        "skipped" if counts.get("skipped") and not counts.get("passed") else "ok" if counts else "missing")
    reasons = sorted(set(re.findall(r"SKIPPED \[\d+\] [^:]+:\d+: (.*)", text)))
    return {"status": status, "counts": counts, "skip_reasons": reasons[:5]}


def build(work: Path, rows_file: Path) -> dict[str, Any]:
    steps = _jsonl(work / "steps.jsonl")
    rows = _jsonl(rows_file)
    by_step: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by_step.setdefault(str(r.get("step", "?")), []).append(r)
    pre = next((r for r in by_step.get("preflight", []) if r.get("kind") == "preflight"), {})
    summary: dict[str, Any] = {}
    ran = {s["step"]: s for s in steps}
    for name in STEPS:
        s = ran.get(name)
        line: dict[str, Any] = {"status": "not run"}
        if s is not None:
            line = {"status": "skipped" if s.get("skipped") else "ok" if s["rc"] == 0 else
                    f"cut at {s.get('limit_s')} s" if s["rc"] in (124, 137) else f"exit {s['rc']}",
                    "seconds": s.get("seconds", 0),
                    "rows": sum(r.get("kind") not in NOT_FIGURES for r in by_step.get(name, []))}
            if s.get("skipped"):
                line["reason"] = s["skipped"]
        skips = [r["skipped"] for r in by_step.get(name, []) if r.get("kind") == "skipped" and "skipped" in r]
        errors = [str(r.get("error", ""))[-300:] for r in by_step.get(name, []) if r.get("kind") == "error"]
        if skips:
            line["skipped"] = skips[0]
        if errors:
            line["errors"] = errors[:3]
        summary[name] = line
    summary["parity"] |= {"tests": parity_summary(work / "parity.log")}
    if pre.get("mode") == "cpu":  # say so in every line: no figure of a CPU run is a GPU figure
        summary = {k: v | {"mode": "cpu (no CUDA device: dry runs)"} for k, v in summary.items()}
    return {"machine": pre, "mode": pre.get("mode", "unknown"), "steps": steps, "summary": summary,
            "goals": goals(pre, by_step), "rows": by_step}


def goals(pre: dict[str, Any], by_step: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    if pre.get("mode") != "gpu":
        return {"note": "no GPU in this run: the GPU goals are not judged"}
    out: dict[str, Any] = {}
    e2e = [r for r in by_step.get("e2e", []) if r.get("kind") == "row" and "img_per_s" in r]
    if e2e:
        best = max(e2e, key=lambda r: r["img_per_s"])
        out["e2e_3000_img_per_s"] = {"best": best["img_per_s"], "batch": best["batch"],
                                     "met": best["img_per_s"] >= 3000}
        out["e2e_p99_100_ms"] = {"p99_ms_at_best": best["p99_ms"], "met": best["p99_ms"] <= 100,
                                 "note": "closed loop at full load; the goal is at 70 % load"}
    return out or {"note": "no end-to-end rows landed"}


def _series(rows: list[dict[str, Any]], key: Any) -> dict[str, list[tuple[int, float]]]:
    series: dict[str, list[tuple[int, float]]] = {}
    for r in rows:
        if r.get("kind") in ("row", "decode") and "img_per_s" in r and "batch" in r:
            series.setdefault(key(r), []).append((int(r["batch"]), float(r["img_per_s"])))
    return series


def draw(report: dict[str, Any], png: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        _draw_text(report, png)
        return
    rows = report["rows"]
    fig, axes = plt.subplots(2, 2, figsize=(13, 9))
    ax = axes[0][0]
    e2e = sorted((r for r in rows.get("e2e", []) if r.get("kind") == "row" and "img_per_s" in r),
                 key=lambda r: r["batch"])
    if e2e:
        b = [r["batch"] for r in e2e]
        ax.plot(b, [r["img_per_s"] for r in e2e], marker="o", color="C0", label="img/s")
        ax2 = ax.twinx()
        ax2.plot(b, [r["p99_ms"] for r in e2e], marker="s", color="C3", label="p99 ms")
        ax2.plot(b, [r["p50_ms"] for r in e2e], marker="^", color="C1", label="p50 ms")
        ax2.set_ylabel("latency ms")
        ax2.legend(fontsize=8, loc="upper right")
    ax.set(title=f"lightbox process, 3 presets ({report['mode']})", xscale="log", xlabel="batch", ylabel="img/s")
    for ax, step, key, title in (
            (axes[0][1], "model", lambda r: f"{r.get('precision')} {r.get('mode')}", "u2netp img/s by batch"),
            (axes[1][0], "decode", lambda r: f"hw load {r.get('hw_decoder_load', '?')}", "decode img/s by batch")):
        for label, pts in _series(rows.get(step, []), key).items():
            ax.plot(*zip(*sorted(pts), strict=True), marker="o", label=label)
            ax.legend(fontsize=7)
        ax.set(title=f"{title} ({report['mode']})", xscale="log", xlabel="batch", ylabel="img/s")
    ax = axes[1][1]
    steps = report["steps"]
    ax.barh([s["step"] for s in steps], [s.get("seconds", 0) for s in steps],
            color=["C2" if s.get("rc") == 0 else "C3" for s in steps])
    ax.set(title="step seconds (red: non-zero exit, cut or skipped)", xlabel="s")
    machine = report["machine"]
    fig.suptitle(f"lightbox GPU validation run: {machine.get('gpu', 'no GPU')} ({report['mode']} mode)", fontsize=10)
    fig.tight_layout()
    fig.savefig(png, dpi=90)
    plt.close(fig)


def _draw_text(report: dict[str, Any], png: Path) -> None:
    import cv2
    import numpy as np

    lines = [f"lightbox GPU validation run ({report['mode']} mode; matplotlib missing: text only)"]
    lines += [f"{k}: {json.dumps(v)[:110]}" for k, v in report["summary"].items()]
    lines += [f"goal {k}: {json.dumps(v)[:100]}" for k, v in report["goals"].items()]
    img = np.full((30 + 26 * len(lines), 1100, 3), 255, np.uint8)
    for i, ln in enumerate(lines):
        cv2.putText(img, ln, (10, 28 + 26 * i), cv2.FONT_HERSHEY_SIMPLEX, 0.5, (0, 0, 0), 1, cv2.LINE_AA)
    cv2.imwrite(str(png), img)


def report_main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__)
        return 2
    work, out = Path(argv[0]), Path(argv[1])
    rows_file = out / "gpu_suite.rows.jsonl"
    report = build(work, rows_file)
    out_json, out_png = out / "gpu_suite.json", out / "gpu_suite.png"
    out_json.write_text(json.dumps(report, indent=1, default=str) + "\n")
    draw(report, out_png)
    with tarfile.open(out / "gpu_suite.tar.gz", "w:gz") as tar:
        for path in (out_json, out_png, rows_file, *sorted(work.glob("*.log")), *sorted(work.glob("*.json")),
                     work / "steps.jsonl"):
            if path.is_file():
                tar.add(path, arcname=f"gpu_suite/{path.name}")
    rows_file.unlink(missing_ok=True)
    for name, line in report["summary"].items():
        print(f"{name:9s} {json.dumps(line)[:180]}")
    print(f"goals     {json.dumps(report['goals'])[:200]}")
    print(f"wrote {out_json}, {out_png}, {out / 'gpu_suite.tar.gz'}")
    return 0


COMMANDS: dict[str, Any] = {"pack": pack_main, "preflight": preflight_main, "report": report_main}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in COMMANDS:
        print(__doc__)
        print("suite: name one of " + ", ".join(COMMANDS))
        return 2
    sys.argv[0] = f"{sys.argv[0]} {argv[0]}"
    return int(COMMANDS[argv[0]](argv[1:]))


if __name__ == "__main__":
    raise SystemExit(main())
