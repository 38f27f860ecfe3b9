"""Where a one-photo ``lightbox process`` spends its time, beside the naive script's whole run.

    PYTHONPATH=. .venv/bin/python bench/bench_startup.py [--rounds 5] [--out bench/results]

The photo is the peer benchmark's first small one (``bench/peers/peer_photos.py``; class ``start`` of
``bench/bench_peers.py``), into the same three presets. Every round runs, the order alternating:

- ``lightbox process PHOTO``, started as ``bench/bench_peers.py`` starts it: wall and CPU
  seconds of the whole process;
- the naive script (``bench/peers/peer_naive.py``) on the same photo: the same two figures;
- a child that makes ``lightbox process``'s steps one after another with a clock between them:
  importing the CLI (typer, rich, pydantic-settings: the settings), reading the settings,
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
in alternating order with this tree's, that tree's whole ``lightbox process`` and its own step
replay, so a change is read as this tree's steps beside the baseline's on the same load.

Reported: the median of each figure over the rounds. Writes ``OUT/startup.json``. A benchmark,
not a test: it asserts nothing. Run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import os
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

STEPS = ("cli imports", "settings", "model imports", "model + pipeline", "photo", "close")
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


def child(photo: Path, out: Path, presets: str) -> dict[str, Any]:
    """``lightbox process``'s steps for ``photo`` into ``presets`` (comma-separated), each timed
    (wall seconds, ``steps``, and the process's CPU seconds, all threads, ``steps_cpu``: far less
    disturbed by other load on a shared machine), and the photo's stage milliseconds. Run in a
    fresh interpreter (``--child``): the imports are the first ones (so the presets come on the
    command line, not from bench_peers)."""
    marks = [(time.perf_counter(), time.process_time())]
    import lightbox.cli  # noqa: F401 - typer, rich, pydantic-settings, streams.settings
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


def timed(cmd: list[str], env: dict[str, str],
          cwd: Path = ROOT) -> tuple[float, float, subprocess.CompletedProcess[str]]:
    """Wall and CPU seconds of ``cmd`` run to its end (``bench_peers.run_timed``); a failure raises."""
    from bench.bench_peers import run_timed

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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    ap.add_argument("--baseline", type=Path, help="another lightbox checkout to measure beside this one")
    ap.add_argument("--child", nargs=3, metavar=("PHOTO", "OUT", "PRESETS"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child(Path(args.child[0]), Path(args.child[1]), args.child[2])))
        return 0

    from bench.bench_peers import PRESETS, command, compile_packages
    from bench.peers.peer_photos import assemble
    from gpu_kernels.segment import ensure_u2netp

    compile_packages()
    model = ensure_u2netp().original
    photo = assemble(ROOT / "bench" / "results" / "peer-photos")["small"][0]
    work = Path(tempfile.mkdtemp(prefix="lightbox-startup-"))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    lightbox = command("lightbox", [photo], work / "lb", model, None)
    naive = command("naive", [photo], work / "naive", model, None)
    steps = [sys.executable, str(Path(__file__).resolve()), "--child", str(photo), str(work / "steps"), PRESETS]
    whole: dict[str, list[dict[str, float]]] = {"lightbox": [], "naive": []}
    step_runs: list[dict[str, float]] = []
    step_cpu_runs: list[dict[str, float]] = []
    base = args.baseline.resolve() if args.baseline else None
    base_env = {**os.environ, "PYTHONPATH": str(base)}
    base_steps = [sys.executable, str(base / "bench" / "bench_startup.py"), *steps[2:]] if base else []
    base_runs: dict[str, list[dict[str, float]]] = {"whole": [], "steps_s": [], "steps_cpu_s": []}
    if base is not None:
        compile_packages(base)  # both trees byte-compiled, as an installed wheel is
    stage_runs: list[dict[str, float]] = []
    import_runs: list[dict[str, float]] = []
    python_runs: list[float] = []
    try:
        for tool in ("lightbox", "naive"):  # untimed: caches warm (the runtime verdict, the compiled model)
            timed(lightbox if tool == "lightbox" else naive, env)
        if base is not None:
            timed(lightbox, base_env, cwd=base)
        for r in range(args.rounds):
            order: tuple[str, ...] = ("lightbox", "naive") if r % 2 == 0 else ("naive", "lightbox")
            if base is not None:
                order = (*order, "baseline") if r % 2 == 0 else ("baseline", *order)
            for tool in order:
                shutil.rmtree(work / "lb", ignore_errors=True)
                if tool == "baseline" and base is not None:  # cwd: `-c` puts the working folder first on the path
                    wall, cpu, _ = timed(lightbox, base_env, cwd=base)
                    base_runs["whole"].append({"wall_s": wall, "cpu_s": cpu})
                    continue
                wall, cpu, _ = timed(lightbox if tool == "lightbox" else naive, env)
                whole[tool].append({"wall_s": wall, "cpu_s": cpu})
            python_runs.append(timed([sys.executable, "-c", "pass"], env)[0])
            for which in ("this", "baseline") if r % 2 == 0 else ("baseline", "this"):
                if which == "baseline" and base is not None:
                    got = json.loads(timed(base_steps, base_env, cwd=base)[2].stdout)
                    base_runs["steps_s"].append(got["steps"])
                    base_runs["steps_cpu_s"].append(got["steps_cpu"])
                elif which == "this":
                    got = json.loads(timed(steps, env)[2].stdout)
                    step_runs.append(got["steps"])
                    step_cpu_runs.append(got["steps_cpu"])
                    stage_runs.append(got["stages_ms"])
            shutil.rmtree(work / "lb", ignore_errors=True)
            import_runs.append(import_times(timed([sys.executable, "-X", "importtime", *lightbox[1:]], env)[2].stderr))
            print(f"round {r}: lightbox {whole['lightbox'][-1]['wall_s']:.2f} s, "
                  f"naive {whole['naive'][-1]['wall_s']:.2f} s", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report = {"photo": photo.name, "rounds": args.rounds,
              "whole": {tool: median_of(runs) for tool, runs in whole.items()},
              "python_start_s": statistics.median(python_runs), "steps_s": median_of(step_runs),
              "steps_cpu_s": median_of(step_cpu_runs),
              "stages_ms": median_of(stage_runs), "imports_s": median_of(import_runs)}
    if base is not None:
        report["baseline"] = {"tree": str(base), **{k: median_of(v) for k, v in base_runs.items()}}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "startup.json").write_text(json.dumps(report, indent=2))
    print_report(report)
    print(f"wrote {args.out / 'startup.json'}")
    return 0


def print_report(report: dict[str, Any]) -> None:
    w = report["whole"]
    print(f"\none photo ({report['photo']}), whole processes, median of {report['rounds']} rounds:")
    base = report.get("baseline")
    for tool in ("lightbox", "naive"):
        print(f"  {tool:9} {w[tool]['wall_s']:.2f} s wall, {w[tool]['cpu_s']:.2f} s CPU")
    if base:
        print(f"  {'baseline':9} {base['whole']['wall_s']:.2f} s wall, {base['whole']['cpu_s']:.2f} s CPU"
              f"  ({base['tree']})")
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
    imports = report["imports_s"]
    total = sum(imports.values()) or 1.0
    print("import time by package (python -X importtime, own time summed; shares of its total):")
    for group, s in sorted(imports.items(), key=lambda kv: -kv[1]):
        print(f"  {group:36} {100 * s / total:4.0f} %")


if __name__ == "__main__":
    raise SystemExit(main())
