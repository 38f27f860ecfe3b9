"""Which formats decode, and what hostile files cost: one code tree against another.

Usage (from the repository root)::

    PYTHONPATH=. .venv/bin/python bench/bench_formats.py [--baseline REF] [--out PATH]
    PYTHONPATH=. .venv/bin/python bench/bench_formats.py odd --out DIR [--json FILE] [--worker]

Writes the mixed-format folder and the probe files (``tests/corpus.py``) once, then for each
tree (this one, and the commit ``--baseline REF`` names, ``git archive``d) decodes them with that tree's
``DecoderChain("cpu")``, each probe in a fresh subprocess so its CPU time (``resource.getrusage``)
and peak RSS (``VmHWM`` after a reset through ``/proc/self/clear_refs``; ``ru_maxrss`` starts at
the parent's peak after exec) are its own:

- share: how many files of the mixed folder come out as images;
- probes: a 2048² progressive JPEG padded with 100 000 tiny scans, a 0.5 MB 16-bit
  8000×8000 PNG, an APNG of 1000 frames — outcome, wall and CPU seconds, peak RSS over a
  warmed-up baseline, and the header's ``decoded_nbytes`` where the tree has it.

Compare trees side by side in one run: the machine is shared and timings drift.

``odd``: how many of the odd-file corpus (``tests.corpus.odd_files``) lightbox processes against
how many Pillow alone opens (see :data:`ODD_DOC`).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.corpus import jpeg_scan_bomb, mixed_folder, odd_files, pillow_opens, png

ODD_DOC = """How many odd files lightbox processes against how many Pillow alone opens.

"Processed" = every stage of the default stage list ran and a variant came out (CPU backends,
one small preset, batches of 8 as a worker forms them; with ``--worker``, also through a real
``lightbox worker`` on a local Kafka, every file published as an event). "Pillow opens" =
``Image.open`` + ``load()`` of the first frame raised nothing. The corpus is
``tests.corpus.odd_files`` (also the one the decoder fallback tests read)."""

CHILD = r"""
import json, resource, sys, time
import numpy as np
from gpu_kernels.codec import DecoderChain
paths = sys.argv[1:]
dec = DecoderChain("cpu", batch_size=4)
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


def lightbox_processes(paths: list[Path], batch: int = 8) -> dict[str, str]:
    """{file: "ok" or the dead letter's code and message} through the default CPU stage list."""
    from gpu_kernels.backends import RetouchOptions
    from gpu_kernels.codec import CpuEncoder, make_decoder
    from gpu_kernels.pipeline import Job, RetouchPipeline
    from gpu_kernels.presets import Preset
    from gpu_kernels.retouch import CpuRetoucher
    from gpu_kernels.spans import SpanRecorder

    pipe = RetouchPipeline(make_decoder("cpu"), CpuRetoucher(), CpuEncoder())
    preset = Preset("odd", 128, 128, "jpeg", 85)
    out: dict[str, str] = {}
    for k in range(0, len(paths), batch):
        chunk = paths[k:k + batch]
        results = pipe.run_batch([Job(p.read_bytes(), [preset], RetouchOptions(), SpanRecorder()) for p in chunk])
        for p, r in zip(chunk, results, strict=True):
            out[p.name] = "ok" if r.ok else str(r.error)
    pipe.close()
    return out


def worker_processes(paths: list[Path], out: Path) -> dict[str, str]:
    """{file: "ok" or the dead letter's code and message} from a real CPU worker on a local broker."""
    import asyncio
    import uuid

    from lightbox.demo import WorkerProcess, collect_outputs
    from lightbox.devservers.kafka_local import LocalKafka
    from streams.app import ensure_topics
    from streams.producer import ImageProducer
    from streams.settings import Settings

    out.mkdir(parents=True, exist_ok=True)
    presets = out / "presets.toml"
    presets.write_text('[odd]\nwidth = 128\nheight = 128\nformat = "jpeg"\nquality = 85\nfill = 0.8\n')
    kafka = LocalKafka.start()
    tag = uuid.uuid4().hex[:6]
    s = Settings(kafka_bootstrap=kafka.bootstrap, group_id=f"odd-{tag}", input_topic=f"odd-{tag}.images",
                 backfill_topic=f"odd-{tag}.backfill", output_topic=f"odd-{tag}.processed",
                 dlq_topic=f"odd-{tag}.dlq", data_dir=out / f"worker-{tag}")
    names: dict[object, str] = {}

    async def publish() -> None:
        await ensure_topics(s)
        async with ImageProducer(s.kafka.bootstrap, s.topics.input) as prod:
            futs = []
            for p in paths:
                ev = prod.event_for_file(p, presets=["odd"])
                futs.append((p.name, ev["event_id"], await prod.publish(ev)))
            for name, eid, fut in futs:
                meta = await fut
                names[eid] = names[(meta.partition, meta.offset)] = name

    env = {"LIGHTBOX_KAFKA_BOOTSTRAP": s.kafka.bootstrap, "LIGHTBOX_GROUP_ID": s.kafka.group_id,
           "LIGHTBOX_INPUT_TOPIC": s.topics.input, "LIGHTBOX_OUTPUT_TOPIC": s.topics.output,
           "LIGHTBOX_DLQ_TOPIC": s.topics.dlq, "LIGHTBOX_BACKFILL_TOPIC": s.topics.backfill,
           "LIGHTBOX_DATA_DIR": str(s.worker.data_dir), "LIGHTBOX_DEVICE": "cpu", "LIGHTBOX_SEGMENTER": "classical",
           "LIGHTBOX_PRESETS_FILE": str(presets), "LIGHTBOX_METRICS_PORT": "0"}
    worker = None
    try:
        asyncio.run(publish())
        worker = WorkerProcess(env, out / "worker.log").start()
        processed, dead = asyncio.run(collect_outputs(kafka.bootstrap, [s.topics.output, s.topics.dlq], len(paths),
                                                      600, worker.running))
    finally:
        if worker is not None:
            worker.stop()
        kafka.stop()
    verdict = {names[p["source_event_id"]]: "ok" for p in processed}
    for d in dead:
        verdict[names[(d["original"]["partition"], d["original"]["offset"])]] = f"[{d['error_code']}] {d['message']}"
    return {p.name: verdict.get(p.name, "no output") for p in paths}


def odd_main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="bench_formats.py odd", description=ODD_DOC)
    ap.add_argument("--out", type=Path, required=True, help="folder for the corpus")
    ap.add_argument("--json", type=Path, help="write the per-file verdicts here")
    ap.add_argument("--worker", action="store_true", help="also through a real worker on a local Kafka")
    args = ap.parse_args(argv)
    paths = odd_files(args.out / "corpus")
    lb = lightbox_processes(paths)
    pil = {p.name: pillow_opens(p.read_bytes()) for p in paths}
    wk = worker_processes(paths, args.out / "worker") if args.worker else {}
    if wk:
        print(f"worker: {sum(v == 'ok' for v in wk.values())} of {len(paths)} processed")
        for name in sorted(wk):
            if wk[name] != "ok":
                print(f"  {name:40s} worker={wk[name][:150]}")
    both = sum(pil[n] and lb[n] == "ok" for n in lb)
    print(f"{len(paths)} files; Pillow alone opens {sum(pil.values())}; lightbox processes "
          f"{sum(v == 'ok' for v in lb.values())} (both: {both})")
    for name in sorted(lb):
        if lb[name] != "ok" or not pil[name]:
            print(f"  {name:40s} pillow={'yes' if pil[name] else 'no ':3s} lightbox={lb[name][:150]}")
    if args.json:
        args.json.write_text(json.dumps({"files": len(paths), "pillow_opens": sum(pil.values()),
                                         "lightbox_processed": sum(v == "ok" for v in lb.values()),
                                         "worker_processed": sum(v == "ok" for v in wk.values()) if wk else None,
                                         "pillow": pil, "lightbox": lb, "worker": wk}, indent=1))
    return 0


def main() -> None:
    if sys.argv[1:2] == ["odd"]:
        raise SystemExit(odd_main(sys.argv[2:]))
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
