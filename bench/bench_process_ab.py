"""``lightbox process`` (or ``lightbox worker``) of this checkout against another commit's, in
paired, alternated runs.

    PYTHONPATH=. .venv/bin/python bench/bench_process_ab.py [--baseline main] [--rounds 12]
        [--classes start,small,mid,large] [--worker] [--out bench/results/process_ab.json]

The photos are the peer benchmark's (``bench/peer_photos.py``: ``start`` is the first small
photo, then the size classes), into its three presets, each run a whole process started the way
``bench/bench_peers.py`` starts lightbox. The baseline is ``git archive <ref>`` unpacked into a
temporary folder and run with that folder first on the path; both trees are byte-compiled and
run once untimed first. Every round runs both trees once per class, the order alternating from
round to round.

``--worker`` runs each tree's ``lightbox worker`` instead, through a local Apache Kafka broker
the bench starts, as the peer benchmark does (``bench/peer_worker.py``: from the worker's start
to its last output's broker append time); it also reports the steady milliseconds per image (the
time between the first and the last output, per image).

Reported per class: each tree's median seconds (and, for ``process``, the CPU seconds of the
whole process, user + system: time stolen by other virtual machines or processes disturbs them far
less than wall time), and the mean and standard error of each round's difference (current -
baseline). The machine's speed drifts by the hour by more than most
changes are worth; two runs side by side in the same minute drift together, so their difference
resolves a change of a few per cent that medians of separate runs do not. A benchmark, not a
test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.bench_peers import PRESETS, compile_packages, run_timed  # noqa: E402
from bench.peer_photos import assemble  # noqa: E402


def run(tree: Path, files: list[Path], out: Path, bootstrap: str | None = None) -> dict[str, float]:
    """``{"seconds": ...}`` of one whole ``lightbox process`` of ``tree`` (its folder first on the
    path), or of one ``lightbox worker`` run through ``bootstrap`` (``steady_ms`` too)."""
    shutil.rmtree(out, ignore_errors=True)
    if bootstrap is not None:
        from bench.peer_worker import run_worker

        got = run_worker(files, out, bootstrap, PRESETS.split(","), tree=tree)
        return {"seconds": got["seconds"], "steady_ms": got["steady_ms_per_image"]}
    cmd = [sys.executable, "-c", "from lightbox.cli import main; main()", "process", *map(str, files),
           "-o", str(out), "--presets", PRESETS, "--no-table"]
    proc, seconds, cpu = run_timed(cmd, cwd=tree, env={**os.environ, "PYTHONPATH": str(tree)})
    if proc.returncode:
        raise SystemExit(f"lightbox process of {tree} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return {"seconds": seconds, "cpu_s": cpu}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline", default="main", help="git ref of the baseline (default main)")
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--classes", default="start,small", help="comma-separated: start, small, mid, large")
    ap.add_argument("--worker", action="store_true", help="run each tree's lightbox worker through Kafka instead")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "process_ab.json")
    args = ap.parse_args()
    from bench.bench_overhead import extract, git

    if args.rounds < 2:
        raise SystemExit("--rounds must be at least 2 (a standard error needs two differences)")
    sets = assemble(ROOT / "bench" / "results" / "peer-photos")
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
        trees = {"baseline": extract(args.baseline, Path(tmp) / "baseline"), "current": ROOT}
        work = Path(tmp) / "out"
        for name, tree in trees.items():
            compile_packages(tree)
            run(tree, sets["start"], work / name, bootstrap)  # untimed: caches (model copies, compiled models)
        runs: dict[str, dict[str, list[dict[str, float]]]] = {c: {n: [] for n in trees} for c in classes}
        for r in range(args.rounds):
            order = list(trees) if r % 2 == 0 else list(trees)[::-1]
            for c in classes:
                for name in order:
                    runs[c][name].append(run(trees[name], sets[c], work / name, bootstrap))
                last = {n: v[-1] for n, v in runs[c].items()}
                print(f"round {r + 1:2d} {c:5s} " + "  ".join(
                    f"{n} {last[n]['seconds']:.2f} s" + (f" ({last[n]['steady_ms']:.0f} ms/img)" if args.worker
                                                          else f" (CPU {last[n]['cpu_s']:.2f} s)")
                    for n in trees), flush=True)
    print(f"\n{tool}: current against {args.baseline} ({commit}): median, and current - baseline per round")
    report: dict[str, Any] = {"tool": tool, "baseline": args.baseline, "baseline_commit": commit,
                              "rounds": args.rounds, "classes": {}}
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


if __name__ == "__main__":
    main()
