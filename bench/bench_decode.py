"""Decode + resize throughput on this CPU: DALI cpu vs Pillow vs simplejpeg + OpenCV, and what
DALI buys a CPU worker's decoder.

Usage (from the repository root)::

    PYTHONPATH=. .venv/bin/python bench/bench_decode.py [--n 32] [--threads 2] [--rounds 3] [--out PATH]

Catalog set: skimage photos (coffee, astronaut, chelsea, rocket) upscaled to catalog sizes
1200x1200 and 1200x900, light noise added so they compress like photos, JPEG q90; each
method decodes them and resizes to 800 px on the longer side, one timed run after one warm-up.
Large set: 6000x4000 (24 MP) sources to 800 px: full decode + resize vs reduced-size decode
(``DecoderChain`` with libjpeg-turbo DCT scaling, and the fused DALI resize for comparison).
Prints img/s and ratios; writes them as JSON to ``--out``. The machine's 1-minute load
average goes into the JSON: on a shared 2-core box the multi-threaded DALI numbers drop
first when other jobs run.
Decoder set (``decoder`` in the JSON): the CPU worker's decoder (libjpeg-turbo + Pillow, no DALI)
against the same decoder routing through DALI's CPU operators (``DecoderChain("cpu", dali=True)``),
at ``max_side=1440`` (the largest preset side: catalog photos decode at full size, where DALI and
libjpeg-turbo do the same work), on the catalog JPEGs and 8-bit PNGs of 1000x750; ``--rounds``
rounds alternate the two, the best round of each is reported with the ratio no-DALI / DALI.

``formats``: which formats decode and what hostile files cost, this tree beside ``--baseline REF``;
``odd``: how many odd files lightbox processes against how many Pillow alone opens
(:data:`FORMATS_DOC`, :data:`ODD_DOC`)::

    PYTHONPATH=. .venv/bin/python bench/bench_decode.py formats [--baseline REF] [--out PATH]
    PYTHONPATH=. .venv/bin/python bench/bench_decode.py odd --out DIR [--json FILE] [--worker]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import simplejpeg
from PIL import Image
from skimage import data

from gpu_kernels.codec import DecoderChain, make_decoder

TARGET = 800
DECODER_MAX_SIDE = 1440


def make_jpegs(sizes: Sequence[tuple[int, int]], n: int, seed: int = 0) -> list[bytes]:
    """``n`` JPEGs (q90) cycling through the photos and ``sizes`` ((width, height))."""
    rng = np.random.default_rng(seed)
    photos = [np.asarray(f()) for f in (data.coffee, data.astronaut, data.chelsea, data.rocket)]
    out = []
    for i in range(n):
        w, h = sizes[i % len(sizes)]
        img = cv2.resize(photos[i % len(photos)], (w, h), interpolation=cv2.INTER_CUBIC)
        if i % 2:
            img = img[:, ::-1]
        noisy = np.clip(img + rng.normal(0, 3, img.shape), 0, 255).astype(np.uint8)
        out.append(simplejpeg.encode_jpeg(noisy, 90, colorsubsampling="420"))
    return out


def _fit(h: int, w: int, side: int = TARGET) -> tuple[int, int]:
    s = side / max(h, w)
    return max(1, round(w * s)), max(1, round(h * s))


def pillow(blobs: Sequence[bytes], draft: bool = False) -> list[np.ndarray]:
    out = []
    for b in blobs:
        with Image.open(io.BytesIO(b)) as im:
            size = _fit(im.height, im.width)
            if draft:
                im.draft("RGB", size)  # Pillow's own DCT scaling
            out.append(np.asarray(im.convert("RGB").resize(size, Image.Resampling.BILINEAR)))
    return out


def simplejpeg_cv2(blobs: Sequence[bytes]) -> list[np.ndarray]:
    out = []
    for b in blobs:
        img = simplejpeg.decode_jpeg(b)
        out.append(cv2.resize(img, _fit(*img.shape[:2]), interpolation=cv2.INTER_AREA))
    return out


class DaliResize:
    """The plain DALI pipeline: external_source → decoders.image → resize(resize_longer)."""

    def __init__(self, batch_size: int, threads: int) -> None:
        from nvidia.dali import fn, pipeline, types

        d: Any = fn
        self.pipe: Any = pipeline.Pipeline(
            batch_size=batch_size, num_threads=threads, device_id=None, prefetch_queue_depth=1
        )
        with self.pipe:
            enc = d.external_source(name="encoded", dtype=types.UINT8, ndim=1)
            img = d.decoders.image(enc, device="cpu", output_type=types.RGB)
            self.pipe.set_outputs(d.resize(img, resize_longer=TARGET, antialias=True))
        self.pipe.build()
        self.batch_size = batch_size

    def __call__(self, blobs: Sequence[bytes]) -> list[np.ndarray]:
        out: list[np.ndarray] = []
        for s in range(0, len(blobs), self.batch_size):
            chunk = blobs[s : s + self.batch_size]
            self.pipe.feed_input("encoded", [np.frombuffer(b, np.uint8) for b in chunk])
            (batch,) = self.pipe.run()
            out += [np.array(batch[i]) for i in range(len(chunk))]
        return out


def decoder_then_resize(
    decoder: DecoderChain, max_side: int | None
) -> Callable[[Sequence[bytes]], list[np.ndarray]]:
    def run(blobs: Sequence[bytes]) -> list[np.ndarray]:
        out = []
        for img in decoder.decode_batch(blobs, max_side=max_side):
            assert isinstance(img, np.ndarray), img
            out.append(cv2.resize(img, _fit(*img.shape[:2]), interpolation=cv2.INTER_AREA))
        return out

    return run


REPEAT = 1


def timed(fn: Callable[[Sequence[bytes]], list[np.ndarray]], blobs: Sequence[bytes]) -> float:
    """img/s of the best of ``REPEAT`` runs (``--repeat``) after a warm-up on two images."""
    fn(blobs[:2])
    best = float("inf")
    for _ in range(REPEAT):
        t0 = time.perf_counter()
        out = fn(blobs)
        best = min(best, time.perf_counter() - t0)
        assert len(out) == len(blobs) and all(max(o.shape[:2]) == TARGET for o in out)
    return len(blobs) / best


def pngs(n: int) -> list[bytes]:
    """``n`` 8-bit PNGs of 1000x750 from the photos."""
    out = []
    for blob in make_jpegs([(1000, 750)], n, seed=2):
        buf = io.BytesIO()
        Image.fromarray(simplejpeg.decode_jpeg(blob)).save(buf, "PNG", compress_level=6)
        out.append(buf.getvalue())
    return out


def decoder_rates(catalog: list[bytes], png: list[bytes], rounds: int) -> dict[str, dict[str, float]]:
    """The CPU worker's decoder with and without DALI's CPU operators: best img/s of ``rounds``."""
    def rate(decoder: DecoderChain, blobs: list[bytes]) -> float:
        start = time.perf_counter()
        out = decoder.decode_batch(blobs, max_side=DECODER_MAX_SIDE)
        assert all(isinstance(a, np.ndarray) for a in out), [a for a in out if not isinstance(a, np.ndarray)]
        return len(blobs) / (time.perf_counter() - start)

    results: dict[str, dict[str, float]] = {}
    with make_decoder("cpu") as plain, DecoderChain("cpu", dali=True) as dali:
        for name, blobs in (("jpeg 1200px q90", catalog), ("png 1000x750", png)):
            rate(plain, blobs[:2]), rate(dali, blobs[:2])  # warm-up (DALI builds its pipeline)
            best = {"no-dali": 0.0, "dali": 0.0}
            for _ in range(rounds):
                best["no-dali"] = max(best["no-dali"], rate(plain, blobs))
                best["dali"] = max(best["dali"], rate(dali, blobs))
            results[name] = {**best, "ratio no-dali/dali": best["no-dali"] / best["dali"]}
            print(f"  {name:18s} no-DALI {best['no-dali']:6.1f} img/s   DALI cpu {best['dali']:6.1f} img/s   "
                  f"ratio {best['no-dali'] / best['dali']:.2f}")
    return results


# --- formats and odd files ---------------------------------------------------------------------

FORMATS_DOC = """Which formats decode, and what hostile files cost: one code tree against another.

Usage (from the repository root)::

    PYTHONPATH=. .venv/bin/python bench/bench_decode.py formats [--baseline REF] [--out PATH]
    PYTHONPATH=. .venv/bin/python bench/bench_decode.py odd --out DIR [--json FILE] [--worker]

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

ODD_DOC = """How many odd files lightbox processes against how many Pillow alone opens.

"Processed" = every stage of the default stage list ran and a variant came out (CPU backends,
one small preset, batches of 8 as a worker forms them; with ``--worker``, also through a real
``lightbox worker`` on a local Kafka, every file published as an event). "Pillow opens" =
``Image.open`` + ``load()`` of the first frame raised nothing. The corpus is
``tests.corpus.odd_files`` (also the one the decoder fallback tests read). Against another tree:
write the corpus here, then read it there (``PYTHONPATH`` at that checkout)::

    PYTHONPATH=. python bench/bench_decode.py odd --out out/odd --json after.json --worker
    PYTHONPATH=<checkout> python bench/bench_decode.py odd --corpus out/odd/corpus --out out/odd-before --worker
"""

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
    from gpu_kernels.pipeline import ImagePipeline, Job
    from gpu_kernels.presets import Preset
    from gpu_kernels.retouch import CpuRetoucher
    from gpu_kernels.spans import SpanRecorder

    pipe = ImagePipeline(make_decoder("cpu"), CpuRetoucher(), CpuEncoder())
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


def pillow_opens(blob: bytes) -> bool:
    """``Image.open`` + ``load()`` of the first frame raised nothing (as ``tests.corpus.pillow_opens``,
    here so that ``--corpus`` runs against another tree's ``tests``)."""
    try:
        with Image.open(io.BytesIO(blob)) as im:
            im.seek(0)
            im.load()
        return True
    except Exception:
        return False


def odd_main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="bench_decode.py odd", description=ODD_DOC,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, help="folder for the corpus (OUT/corpus) and the worker")
    ap.add_argument("--corpus", type=Path, help="a corpus written by an earlier run (with PYTHONPATH at another tree)")
    ap.add_argument("--json", type=Path, help="write the per-file verdicts here")
    ap.add_argument("--worker", action="store_true", help="also through a real worker on a local Kafka")
    args = ap.parse_args(argv)
    if args.corpus is not None:
        paths = sorted(p for p in args.corpus.iterdir() if p.is_file())
    else:
        from tests.corpus import odd_files

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


def formats_main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="bench_decode.py formats", description=FORMATS_DOC,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline", default="", metavar="REF",
                    help="git ref of a tree to run beside this one (default: none; bench.harness)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    from bench.harness import ROOT, baseline_tree
    from tests.corpus import jpeg_scan_bomb, mixed_folder, png

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
    return 0


def main() -> None:
    if sys.argv[1:2] == ["formats"]:
        raise SystemExit(formats_main(sys.argv[2:]))
    if sys.argv[1:2] == ["odd"]:
        raise SystemExit(odd_main(sys.argv[2:]))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--n", type=int, default=32, help="catalog-size JPEGs (default 32)")
    ap.add_argument("--n-large", type=int, default=4, help="24 MP JPEGs (default 4)")
    ap.add_argument("--threads", type=int, default=2, help="DALI / decoder threads")
    ap.add_argument("--batch", type=int, default=32, help="DALI batch size")
    ap.add_argument("--out", type=Path, default=Path("bench/results/bench_decode.json"))
    ap.add_argument("--repeat", type=int, default=1, help="best of N runs (default 1)")
    ap.add_argument("--rounds", type=int, default=3, help="decoder set: alternating rounds (default 3)")
    args = ap.parse_args()
    global REPEAT
    REPEAT = max(1, args.repeat)

    cv2.setNumThreads(1)
    catalog = make_jpegs([(1200, 1200), (1200, 900)], args.n)
    mp = sum(
        simplejpeg.decode_jpeg_header(b)[0] * simplejpeg.decode_jpeg_header(b)[1] for b in catalog
    )
    print(
        f"catalog: {len(catalog)} JPEGs, {mp / len(catalog) / 1e6:.2f} MP, "
        f"{sum(map(len, catalog)) // len(catalog) // 1024} KB avg → {TARGET} px"
    )
    cat: dict[str, float] = {}
    cat["pillow"] = timed(pillow, catalog)
    cat["simplejpeg_cv2"] = timed(simplejpeg_cv2, catalog)
    cat["dali_cpu_resize"] = timed(DaliResize(args.batch, args.threads), catalog)
    with DecoderChain("cpu", batch_size=args.batch, num_threads=args.threads) as dec:
        cat["daliDecoder_then_cv2"] = timed(decoder_then_resize(dec, TARGET), catalog)
    for k, v in cat.items():
        print(
            f"  {k:24s} {v:7.1f} img/s  {v / cat['pillow']:.2f}x Pillow  "
            f"{v / cat['simplejpeg_cv2']:.2f}x simplejpeg+cv2"
        )

    large = make_jpegs([(6000, 4000)], args.n_large, seed=1)
    print(
        f"large: {len(large)} JPEGs 6000x4000, "
        f"{sum(map(len, large)) // len(large) // 1024} KB avg → {TARGET} px"
    )
    big: dict[str, float] = {}
    with DecoderChain("cpu", batch_size=args.batch, num_threads=args.threads, reduce="off") as d:
        big["full_decode_then_cv2"] = timed(decoder_then_resize(d, TARGET), large)
    with DecoderChain("cpu", batch_size=args.batch, num_threads=args.threads, reduce="dct") as d:
        big["dct_reduced_then_cv2"] = timed(decoder_then_resize(d, TARGET), large)
    with DecoderChain("cpu", batch_size=args.batch, num_threads=args.threads, reduce="resize") as d:
        big["dali_fused_resize"] = timed(decoder_then_resize(d, TARGET), large)
    big["pillow_draft"] = timed(lambda b: pillow(b, draft=True), large)
    for k, v in big.items():
        print(f"  {k:24s} {v:7.2f} img/s  {v / big['full_decode_then_cv2']:.2f}x full decode")

    print(f"decoder: the CPU worker's decoder with and without DALI at max_side {DECODER_MAX_SIDE}")
    decoder = decoder_rates(catalog, pngs(max(2, args.n // 2)), args.rounds)

    result = {
        "machine": {"cpu_count": os.cpu_count(), "platform": platform.platform()},
        "threads": args.threads,
        "repeat": REPEAT,
        "load_average_1min": os.getloadavg()[0],
        "batch": args.batch,
        "catalog": {
            "n": len(catalog),
            "mp_avg": mp / len(catalog) / 1e6,
            "img_per_s": cat,
            "ratio_vs_pillow": {k: v / cat["pillow"] for k, v in cat.items()},
            "ratio_vs_simplejpeg_cv2": {k: v / cat["simplejpeg_cv2"] for k, v in cat.items()},
        },
        "large_24mp": {
            "n": len(large),
            "img_per_s": big,
            "ratio_vs_full_decode": {k: v / big["full_decode_then_cv2"] for k, v in big.items()},
        },
        "decoder": decoder,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
