"""Which formats decode, and what hostile files cost: one code tree against another.

Usage (from the repository root)::

    PYTHONPATH=. .venv/bin/python bench/bench_formats.py [--baseline REF] [--out PATH]

Writes the mixed-format folder and the probe files (``tests/corpus.py``) once, then for each
tree (this one, and the commit ``--baseline REF`` names, ``git archive``d) decodes them with that tree's
``DaliDecoder("cpu")``, each probe in a fresh subprocess so its CPU time (``resource.getrusage``)
and peak RSS (``VmHWM`` after a reset through ``/proc/self/clear_refs``; ``ru_maxrss`` starts at
the parent's peak after exec) are its own:

- share: how many files of the mixed folder come out as images;
- probes: a 2048² progressive JPEG padded with 100 000 tiny scans, a 0.5 MB 16-bit
  8000×8000 PNG, an APNG of 1000 frames — outcome, wall and CPU seconds, peak RSS over a
  warmed-up baseline, and the header's ``decoded_nbytes`` where the tree has it.

Compare trees side by side in one run: the machine is shared and timings drift.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.corpus import jpeg_scan_bomb, mixed_folder, png

CHILD = r"""
import json, resource, sys, time
import numpy as np
from gpu_kernels.codec import DaliDecoder
paths = sys.argv[1:]
dec = DaliDecoder("cpu", batch_size=4)
import io
from PIL import Image
for fmt in ("JPEG", "PNG"):  # warm up: DALI pipeline built, Pillow imported
    buf = io.BytesIO(); Image.new("RGB", (64, 64), (9, 99, 199)).save(buf, fmt); dec.decode_batch([buf.getvalue()])
def rss():  # VmHWM, reset before each probe: ru_maxrss starts at the parent's peak after exec
    return next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmHWM"))
def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF); return r.ru_utime + r.ru_stime
out = []
for p in paths:
    blob = open(p, "rb").read()
    open("/proc/self/clear_refs", "w").write("5")
    base_rss, c0, t0 = rss(), cpu(), time.perf_counter()
    (r,) = dec.decode_batch([blob])
    wall, cpu_s = time.perf_counter() - t0, cpu() - c0
    est = old = None
    try:
        from gpu_kernels.codec import sniff
        info = sniff(blob, max_pixels=10**12, max_bytes=10**12)
        est = getattr(info, "decoded_nbytes", None)
        old = info.pixels * (4 if info.has_alpha else 3)  # agents/process.py Prepared.nbytes today
    except Exception:
        pass
    ok = isinstance(r, np.ndarray)
    out.append({"file": p.rsplit("/", 1)[-1], "outcome": "output" if ok else r.code.value,
                "shape": list(r.shape) if ok else None, "message": None if ok else str(r)[:160],
                "wall_s": round(wall, 3), "cpu_s": round(cpu_s, 3),
                "peak_rss_over_base_mib": round((rss() - base_rss) / 2**20, 1),
                "decoded_nbytes_mib": None if est is None else round(est / 2**20, 1),
                "pixels_x_channels_mib": None if old is None else round(old / 2**20, 1)})
print(json.dumps(out))
"""


def run_tree(tree: Path, files: list[Path], one_process: bool) -> list[dict[str, object]]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    groups = [files] if one_process else [[f] for f in files]
    results: list[dict[str, object]] = []
    for group in groups:
        proc = subprocess.run([sys.executable, "-c", CHILD, *map(str, group)], cwd=tree, env=env,
                              capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            results += [{"file": f.name, "outcome": f"crashed rc={proc.returncode}",
                         "stderr": proc.stderr[-300:]} for f in group]
        else:
            results += json.loads(proc.stdout.strip().splitlines()[-1])
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline", default="", metavar="REF",
                    help="git ref of a tree to run beside this one (default: none; bench.harness)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    from bench.harness import ROOT, baseline_tree

    base = baseline_tree(args.baseline)
    trees = [base, ROOT] if base is not None else [ROOT]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "mixed").mkdir()
        (root / "probe").mkdir()
        for name, blob in mixed_folder().items():
            (root / "mixed" / name).write_bytes(blob)
        probes = {
            "jpeg_2048_100k_scans.jpg": jpeg_scan_bomb(2048, 100_000),
            "jpeg_2048_plain.jpg": jpeg_scan_bomb(2048, 0),
            "png16_8000x8000.png": png(8000, 8000, depth=16),
            "apng_1000_frames.png": png(64, 64, frames=1000),
        }
        for name, blob in probes.items():
            (root / "probe" / name).write_bytes(blob)
        report: dict[str, object] = {"load_avg_1m": os.getloadavg()[0]}
        mixed = sorted((root / "mixed").iterdir())
        for tree in trees:
            share = run_tree(tree.resolve(), mixed, one_process=True)
            done = sum(r["outcome"] == "output" for r in share)
            probe = run_tree(tree.resolve(), sorted((root / "probe").iterdir()), one_process=False)
            report[str(tree)] = {"share": f"{done}/{len(mixed)}", "mixed": share, "probes": probe}
            print(f"== {tree}: {done}/{len(mixed)} of the mixed folder decode")
            for r in share:
                if r["outcome"] != "output":
                    print(f"   {r['file']:24s} {r['outcome']}: {r.get('message')}")
            for r in probe:
                print(f"   probe {r['file']:26s} {r['outcome']:18s} wall {r.get('wall_s')} s, "
                      f"cpu {r.get('cpu_s')} s, peak RSS +{r.get('peak_rss_over_base_mib')} MiB, "
                      f"decoded_nbytes {r.get('decoded_nbytes_mib')} MiB "
                      f"(pixels x channels {r.get('pixels_x_channels_mib')} MiB)")
    if args.out:
        args.out.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
