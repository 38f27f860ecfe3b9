"""The GPU checks: one subcommand per step of the GPU validation run (``bench/gpu/suite.sh``).

    PYTHONPATH=. python3 bench/gpu/checks.py {codec,observe,retouch,e2e,model} [options]

Each writes one JSON of figures and exits 0 without a GPU (``"status": "skipped"``) unless told
to take its CPU dry run; each appends its rows to ``$GPU_SUITE_ROWS`` as they land when the suite
runs it. What each measures is in its section below and in ``--help``. Top-level imports are the
stock GPU image's (NumPy, OpenCV) and the standard library; the rest is imported where used.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import cv2
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.gpu.suite import append as append_row

# --- codec -------------------------------------------------------------------------------------

CODEC_DOC = """GPU check for the codec stage: DALI ``mixed`` decode and nvJPEG encode.

Needs CuPy, OpenCV, NumPy, DALI and nvImageCodec; neither Pillow, simplejpeg nor
scikit-image: the test images are synthesised and JPEG-encoded with OpenCV. Writes one JSON
file to ``$OUT/gpu_check_codec.json`` (or ``--out``) and prints a summary.

Measures
- decode: raw DALI pipeline ``external_source → decoders.image(device="mixed")``, img/s and MP/s
  for batch 1, 8, 32, 128 × ``hw_decoder_load`` 0, 0.65, 1.0 on ~1.4 MP JPEGs (goal: >= 4000
  img/s at batch 128 on an H200);
- the project's ``DecoderChain("gpu")`` at batch 128 (sniff + DLPack hand-off overhead);
- reduced-size decode of 24 MP sources to 800 px: full decode vs fused GPU resize;
- parity: GPU vs CPU decode of the same JPEGs (mean and p99 |diff|);
- encode: nvJPEG (``NvJpegEncoder``) vs CPU libjpeg-turbo (OpenCV, 1 thread) per output size,
  ms per image, bytes, and which wins — the ``gpu_min_pixels`` threshold to use.

``bench/gpu/suite.sh`` runs it as its decode step; alone:
``PYTHONPATH=. python3 bench/gpu/checks.py codec [--out FILE]`` (about 2 minutes on an H200).

Without CuPy or a CUDA device it writes ``{"status": "skipped", ...}`` and exits 0.
``--dry-run-cpu`` runs the decode and parity code paths with DALI on the CPU (tiny sizes) so
the script can be checked on a machine without a GPU.
"""


CODEC_BATCHES = (1, 8, 32, 128)
HW_LOADS = (0.0, 0.65, 1.0)
ENCODE_SIZES = ((400, 400), (800, 800), (1080, 1350), (2000, 2000), (2048, 2048))


def synth_photo(h: int, w: int, seed: int) -> np.ndarray:
    """A photo-like ``(h, w, 3)`` uint8 RGB image: smooth colour field, hard-edged shapes and
    sensor-like noise, so that it compresses like a product photo (~150–250 KB/MP at q90)."""
    rng = np.random.default_rng(seed)
    field = rng.integers(0, 256, (6, 8, 3), dtype=np.uint8)
    img = cv2.resize(field, (w, h), interpolation=cv2.INTER_CUBIC).astype(np.float32)
    for _ in range(12):
        colour = rng.integers(0, 256, 3).tolist()
        cx, cy = int(rng.integers(0, w)), int(rng.integers(0, h))
        r = int(rng.integers(min(h, w) // 20, min(h, w) // 4))
        if rng.random() < 0.5:
            cv2.circle(img, (cx, cy), r, colour, -1, lineType=cv2.LINE_AA)
        else:
            cv2.rectangle(img, (cx - r, cy - r // 2), (cx + r, cy + r // 2), colour, -1)
    tex = cv2.resize(rng.normal(0, 12, (h // 4 + 1, w // 4 + 1, 3)).astype(np.float32), (w, h))
    img += tex + rng.normal(0, 3, img.shape).astype(np.float32)
    return np.clip(img, 0, 255).astype(np.uint8)


def jpeg(rgb: np.ndarray, quality: int = 90) -> bytes:
    ok, buf = cv2.imencode(
        ".jpg", cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR), [cv2.IMWRITE_JPEG_QUALITY, quality]
    )
    assert ok
    return buf.tobytes()


def rate(
    run: Callable[[], int], min_s: float, min_iters: int, warmup: int = 3
) -> tuple[float, int]:
    """(items/s, iterations) of ``run`` (returns items done, blocks until done)."""
    for _ in range(warmup):
        run()
    n = items = 0
    t0 = time.perf_counter()
    while n < min_iters or time.perf_counter() - t0 < min_s:
        items += run()
        n += 1
    return items / (time.perf_counter() - t0), n


class RawPipe:
    """``external_source → decoders.image → [resize]`` on ``device`` (mixed or cpu)."""

    def __init__(
        self, batch: int, hw: float, gpu: bool, threads: int, depth: int = 1, resize_longer: int = 0
    ) -> None:
        from nvidia.dali import fn, pipeline, types

        self.pipe: Any = pipeline.Pipeline(
            batch_size=batch,
            num_threads=threads,
            device_id=0 if gpu else None,
            prefetch_queue_depth=depth,
        )
        self.depth = depth
        self.primed = False
        with self.pipe:
            enc = fn.external_source(name="encoded", dtype=types.UINT8, ndim=1)
            kw: dict[str, Any] = {"hw_decoder_load": hw} if gpu else {}
            img = fn.decoders.image(
                enc, device="mixed" if gpu else "cpu", output_type=types.RGB, **kw
            )
            if resize_longer:
                img = fn.resize(img, resize_longer=resize_longer, antialias=True)
            self.pipe.set_outputs(img)
        self.pipe.build()
        self.gpu = gpu

    def __call__(self, blobs: list[np.ndarray]) -> Any:
        if not self.primed:  # depth > 1: keep depth batches queued so stages overlap
            for _ in range(self.depth - 1):
                self.pipe.feed_input("encoded", blobs)
            self.primed = True
        self.pipe.feed_input("encoded", blobs)
        (out,) = self.pipe.run()
        if self.gpu:
            import cupy as cp

            # Touch the outputs through DLPack so the timing includes the hand-off and sync.
            arrays = [cp.from_dlpack(out[i]) for i in range(len(blobs))]
            cp.cuda.get_current_stream().synchronize()
            return arrays
        return out


def decode_grid(
    gpu: bool,
    batches: tuple[int, ...],
    loads: tuple[float, ...],
    src: tuple[int, int],
    min_s: float,
    threads: int,
) -> tuple[list[dict[str, Any]], float]:
    h, w = src
    photos = [jpeg(synth_photo(h, w, s)) for s in range(16)]
    mp = h * w / 1e6
    rows = []
    for batch in batches:
        blobs = [np.frombuffer(photos[i % len(photos)], np.uint8) for i in range(batch)]
        for hw in loads:
            pipe = RawPipe(batch, hw, gpu, threads)
            ips, iters = rate(lambda p=pipe, b=blobs: len(p(b)), min_s, 5)
            rows.append(
                {
                    "batch": batch,
                    "hw_decoder_load": hw,
                    "img_per_s": round(ips, 1),
                    "mp_per_s": round(ips * mp, 1),
                    "iterations": iters,
                }
            )
            print(
                f"  decode batch {batch:4d} hw {hw:4.2f}: {ips:8.1f} img/s {ips * mp:8.1f} MP/s",
                flush=True,
            )
            del pipe
    batch = batches[-1]
    blobs = [np.frombuffer(photos[i % len(photos)], np.uint8) for i in range(batch)]
    queued = RawPipe(batch, 0.65 if gpu else 0.0, gpu, threads, depth=2)
    ips, iters = rate(lambda p=queued, b=blobs: len(p(b)), min_s, 5)
    rows.append(
        {
            "batch": batch,
            "hw_decoder_load": 0.65 if gpu else 0.0,
            "prefetch_queue_depth": 2,
            "img_per_s": round(ips, 1),
            "mp_per_s": round(ips * mp, 1),
            "iterations": iters,
        }
    )
    print(f"  decode batch {batch:4d} prefetch 2: {ips:8.1f} img/s", flush=True)
    del queued
    kb_per_mp = sum(map(len, photos)) / len(photos) / 1024 / mp
    return rows, kb_per_mp


def project_decoder(
    gpu: bool, batch: int, src: tuple[int, int], min_s: float, threads: int
) -> dict[str, Any]:
    from gpu_kernels.codec import DecoderChain

    h, w = src
    blobs = [jpeg(synth_photo(h, w, s)) for s in range(batch)]
    with DecoderChain("gpu" if gpu else "cpu", batch_size=batch, num_threads=threads) as dec:

        def run() -> int:
            out = dec.decode_batch(blobs)
            if gpu:
                import cupy as cp

                cp.cuda.get_current_stream().synchronize()
            assert all(hasattr(o, "shape") for o in out), [
                o for o in out if not hasattr(o, "shape")
            ][:1]
            return len(out)

        ips, iters = rate(run, min_s, 5)
    print(f"  DecoderChain batch {batch}: {ips:.1f} img/s", flush=True)
    return {
        "batch": batch,
        "img_per_s": round(ips, 1),
        "mp_per_s": round(ips * h * w / 1e6, 1),
        "iterations": iters,
    }


def reduced_decode(gpu: bool, src: tuple[int, int], n: int, min_s: float) -> dict[str, Any]:
    from gpu_kernels.codec import DecoderChain

    h, w = src
    blobs = [jpeg(synth_photo(h, w, 100 + s)) for s in range(n)]
    out: dict[str, Any] = {
        "source": f"{w}x{h}",
        "n": n,
        "kb_avg": round(sum(map(len, blobs)) / n / 1024),
    }
    for mode in ("off", "resize") + (() if gpu else ("dct",)):
        with DecoderChain("gpu" if gpu else "cpu", batch_size=n, reduce=mode) as dec:  # type: ignore[arg-type]

            def run(d: Any = dec) -> int:
                res = d.decode_batch(blobs, max_side=800)
                if gpu:
                    import cupy as cp

                    cp.cuda.get_current_stream().synchronize()
                return len(res)

            ips, _ = rate(run, min_s, 3, warmup=1)
        out[f"{mode}_img_per_s"] = round(ips, 2)
        print(f"  24 MP → 800 px, reduce={mode}: {ips:.2f} img/s", flush=True)
    out["gain"] = round(out["resize_img_per_s"] / out["off_img_per_s"], 2)
    return out


def parity(gpu: bool, src: tuple[int, int]) -> dict[str, Any]:
    """GPU (or CPU in dry runs) vs CPU decode of the same JPEGs."""
    from gpu_kernels.codec import DecoderChain

    h, w = src
    blobs = [jpeg(synth_photo(h, w, 200 + s)) for s in range(8)]
    with (
        DecoderChain("cpu", batch_size=8) as cpu_dec,
        DecoderChain("gpu" if gpu else "cpu", batch_size=8) as dec,
    ):
        ref = cpu_dec.decode_batch(blobs)
        got = dec.decode_batch(blobs)
    diffs = []
    for g, c in zip(got, ref, strict=True):
        host = g.get() if hasattr(g, "get") else np.asarray(g)
        diffs.append(np.abs(host.astype(np.int16) - np.asarray(c).astype(np.int16)))
    d = np.concatenate([x.ravel() for x in diffs])
    res = {
        "mean_abs_diff": round(float(d.mean()), 3),
        "p99_abs_diff": float(np.percentile(d, 99)),
        "max_abs_diff": int(d.max()),
    }
    print(f"  parity GPU vs CPU: {res}", flush=True)
    return res


def encode_sizes(gpu: bool, min_s: float) -> list[dict[str, Any]]:
    from gpu_kernels.codec.encode import NvJpegEncoder

    rows = []
    enc = NvJpegEncoder("gpu", gpu_min_pixels=0) if gpu else None
    cv2.setNumThreads(1)
    for w, h in ENCODE_SIZES:
        img = synth_photo(h, w, 300)
        bgr = cv2.cvtColor(img, cv2.COLOR_RGB2BGR)
        params = [cv2.IMWRITE_JPEG_QUALITY, 90]
        cpu_ips, _ = rate(lambda b=bgr, p=params: int(cv2.imencode(".jpg", b, p)[0]), min_s, 5)
        row: dict[str, Any] = {
            "size": f"{w}x{h}",
            "mp": round(w * h / 1e6, 3),
            "cpu_ms": round(1000 / cpu_ips, 3),
            "cpu_kb": round(len(cv2.imencode(".jpg", bgr, params)[1]) / 1024, 1),
        }
        if enc is not None:
            import cupy as cp

            from gpu_kernels.presets import Preset

            dev = cp.asarray(img)
            preset = Preset("check", w, h, quality=90)
            gpu_ips, _ = rate(lambda d=dev, p=preset: len(enc.encode(d, p)) > 0, min_s, 5)
            blob = enc.encode(dev, preset)
            decoded = cv2.cvtColor(
                cv2.imdecode(np.frombuffer(blob, np.uint8), cv2.IMREAD_COLOR), cv2.COLOR_BGR2RGB
            )
            row.update(
                gpu_ms=round(1000 / gpu_ips, 3),
                gpu_kb=round(len(blob) / 1024, 1),
                gpu_reopens=decoded.shape == img.shape,
                gpu_mean_abs_err=round(float(np.abs(decoded.astype(np.int16) - img).mean()), 3),
                winner="gpu" if gpu_ips > cpu_ips else "cpu",
            )
        rows.append(row)
        print(f"  encode {row}", flush=True)
    if enc is not None:
        enc.close()
    return rows


def environment() -> dict[str, Any]:
    env: dict[str, Any] = {"python": platform.python_version(), "cpu_count": os.cpu_count()}
    try:
        import nvidia.dali as dali

        env["dali"] = dali.__version__
    except Exception as err:  # report, don't crash: the JSON says what was missing
        env["dali_error"] = repr(err)
    try:
        import cupy as cp

        env["cupy"] = cp.__version__
        env["gpu_count"] = cp.cuda.runtime.getDeviceCount()
        if env["gpu_count"]:
            env["gpu"] = cp.cuda.runtime.getDeviceProperties(0)["name"].decode()
    except Exception as err:
        env["cupy_error"] = repr(err)
    return env


def codec_main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=CODEC_DOC, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument(
        "--out", type=Path, default=Path(os.environ.get("OUT", ".")) / "gpu_check_codec.json"
    )
    ap.add_argument(
        "--min-seconds", type=float, default=1.0, help="timed seconds per configuration"
    )
    ap.add_argument(
        "--dry-run-cpu",
        action="store_true",
        help="exercise the code paths with DALI on the CPU (tiny)",
    )
    ap.add_argument("--threads", type=int, default=8, help="DALI CPU threads (GPU runs)")
    args = ap.parse_args(argv)
    threads = args.threads if not args.dry_run_cpu else 2

    result: dict[str, Any] = {
        "env": environment(),
        "status": "ok",
        "errors": {},
        "dali_threads": threads,
    }
    gpu = not args.dry_run_cpu
    if gpu and not result["env"].get("gpu_count"):
        result["status"] = "skipped"
        result["reason"] = "no CUDA device or CuPy: " + str(
            result["env"].get("cupy_error", "0 devices")
        )
        print(result["reason"])
        append_row({"skipped": result["reason"]}, kind="skipped")
        _write_json(args.out, result)
        return 0
    if "dali_error" in result["env"]:
        result["status"] = "failed"
        _write_json(args.out, result)
        print("DALI missing:", result["env"]["dali_error"])
        return 1

    src = (1080, 1296) if gpu else (240, 320)  # 1.4 MP on GPU
    big = (4000, 6000) if gpu else (800, 1200)
    batches = CODEC_BATCHES if gpu else (1, 8)
    loads = HW_LOADS if gpu else (0.0,)
    min_s = args.min_seconds if gpu else 0.05
    steps: list[tuple[str, Callable[[], Any]]] = [
        ("parity", lambda: parity(gpu, src)),
        ("decode", lambda: decode_grid(gpu, batches, loads, src, min_s, threads)),
        ("project_decoder", lambda: project_decoder(gpu, batches[-1], src, min_s, threads)),
        ("reduced_decode", lambda: reduced_decode(gpu, big, 8 if gpu else 2, min_s)),
        ("encode", lambda: encode_sizes(gpu, min_s)),
    ]
    for name, step in steps:
        t0 = time.perf_counter()
        try:
            value = step()
        except Exception:
            result["errors"][name] = traceback.format_exc(limit=6)
            append_row({"part": name, "error": result["errors"][name][-600:]}, kind="error")
            print(f"[{name}] FAILED\n{result['errors'][name]}", flush=True)
            continue
        if name == "decode":
            assert isinstance(value, tuple)
            result["decode"], result["decode_kb_per_mp"] = value
        else:
            result[name] = value
        rows = result[name] if isinstance(result[name], list) else [result[name]]
        for row in rows:
            append_row({"part": name, **row} if isinstance(row, dict) else {"part": name, "value": row}, kind=name)
        result.setdefault("step_seconds", {})[name] = round(time.perf_counter() - t0, 1)
        _write_json(args.out, result)  # partial results survive a timeout
    if gpu and "decode" in result:
        best = max((r["img_per_s"] for r in result["decode"] if r["batch"] == 128), default=0.0)
        result["goal_4000_img_per_s_at_batch_128"] = {"best": best, "met": best >= 4000}
    if "encode" in result and gpu:
        gpu_wins = [r["mp"] for r in result["encode"] if r.get("winner") == "gpu"]
        result["suggested_gpu_min_pixels"] = int(min(gpu_wins) * 1e6) if gpu_wins else None
    if result["errors"]:
        result["status"] = "partial"
    _write_json(args.out, result)
    print(f"status {result['status']}; wrote {args.out}")
    return 0 if result["status"] == "ok" else 1


def _write_json(path: Path, result: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")


# --- observe -----------------------------------------------------------------------------------

OBSERVE_DOC = """GPU check of the worker's GPU-only metric, ``lightbox_device_memory_bytes`` (issue 12).

    PYTHONPATH=. python bench/gpu/checks.py observe        # writes $OUT/gpu_check_observe.json

Needs only CuPy and prometheus-client (both in the GPU machine's image): ``agents.telemetry``
imports nothing else at run time. Without CuPy or a CUDA device it writes
``{"status": "skipped", ...}`` and exits 0. Reports:

* ``device_memory``: what :func:`agents.telemetry.device_memory_bytes` (the function the worker's
  5-second refresh calls) reads from CuPy's memory pool before an allocation, while 256 MiB are
  held, and after they are freed, and the gauge's line in the Prometheus exposition;
* ``metrics_observer_us_per_image``: CPU microseconds per image of the metrics half of the
  runner's observer on this host's CPU (unshared, unlike the development machine), for outputs
  shaped like a GPU worker's (11 stage spans, batches of 8).
"""


OBSERVE_REPORT = "gpu_check_observe.json"


def emit(report: dict[str, Any], name: str) -> None:
    """Print ``report`` and write it to ``$OUT/name`` (the observe and retouch checks)."""
    text = json.dumps(report, indent=2, default=str)
    print(text)
    out_dir = Path(os.environ.get("OUT") or ".")
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / name).write_text(text + "\n")


def metrics_observer_cost(n: int = 20000, batch: int = 8) -> float:
    from agents.telemetry import Health, Metrics, Telemetry

    names = ["fetch", "decode", "segment", "correct", "preset:jd_main", "preset:thumb_webp", "encode:jd_main",
             "encode:thumb_webp", "quality", "compliance", "produce"]
    spans = tuple({"stage": s, "start_us": 100 * k, "duration_us": 90, "batch_size": batch, "device": "gpu"}
                  for k, s in enumerate(names))
    outs = []
    for i in range(n):
        src = SimpleNamespace(topic="images", partition=0, offset=i, headers=[])
        keys = tuple(("images", 0, j) for j in range(i - i % batch, i - i % batch + batch))
        outs.append(SimpleNamespace(kind="processed", source=src, spans=spans, batch=keys, error_code=None,
                                    origin_ns=time.monotonic_ns(), created_ms=time.time_ns() // 1_000_000))
    tel = Telemetry(Metrics(), Health())
    t0 = time.process_time()
    for k in range(0, n, batch):
        for out in outs[k:k + batch]:
            tel.received(out.source)  # type: ignore[arg-type]
        tel.lane_progress("device", 0)
        tel.batch_done("device", batch, 0.001)
        for out in outs[k:k + batch]:
            tel.output_acked(tel.sending(out))  # type: ignore[arg-type]
    return 1e6 * (time.process_time() - t0) / n


def observe_main() -> int:
    report: dict[str, Any] = {"check": "observe"}
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() < 1:
            raise RuntimeError("no CUDA device")
    except Exception as exc:
        emit({**report, "status": "skipped", "reason": f"{type(exc).__name__}: {exc}"}, OBSERVE_REPORT)
        return 0
    try:
        from prometheus_client import generate_latest

        from agents.telemetry import Metrics, device_memory_bytes

        report["device"] = cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()
        pool = cupy.get_default_memory_pool()
        before = device_memory_bytes()
        held = cupy.zeros(256 << 20, dtype=cupy.uint8)
        held += 1  # a kernel ran on it
        cupy.cuda.Device(0).synchronize()
        during = device_memory_bytes()
        metrics = Metrics()
        metrics.device_memory.set(during or 0)
        line = next(ln for ln in generate_latest(metrics.registry).decode().splitlines()
                    if ln.startswith("lightbox_device_memory_bytes "))
        del held
        pool.free_all_blocks()
        after = device_memory_bytes()
        report["device_memory"] = {"before": before, "holding_256MiB": during, "after_free": after,
                                   "exposition": line, "ok": during is not None and during >= 256 << 20
                                   and (after or 0) < (during or 0)}
        report["metrics_observer_us_per_image"] = metrics_observer_cost()
        report["cpu_count"] = os.cpu_count()
        report["status"] = "ok" if report["device_memory"]["ok"] else "failed"
    except Exception as exc:
        report.update(status="error", error=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc())
    emit(report, OBSERVE_REPORT)
    return 0


# --- retouch -----------------------------------------------------------------------------------

RETOUCH_DOC = """GPU check of the retouch kernels: parity with the CPU twin, throughput, bandwidth.

    PYTHONPATH=. python bench/gpu/checks.py retouch        # writes $OUT/gpu_check_retouch.json

Needs only NumPy and CuPy (synthetic images; no scikit-image, no OpenCV). Without CuPy or a
CUDA device it writes ``{"status": "skipped", ...}`` and exits 0. Reports:

* ``parity``: max |GPU - CPU| (uint8 LSB) of pass (a) and (b) over modes and odd shapes, and
  of the fused kernels vs the unfused CuPy chains (goal: <= 1);
* ``colour_pass``: per-stage MP/s of the unfused CuPy chain, the fused kernel's MP/s and
  achieved bandwidth (7 bytes per pixel: RGB in, mask in, RGB out) against a measured
  device-to-device copy (goal: >= 50 %), parameter estimation time;
* ``geometry_pass``: per preset, one batched launch over N images vs the unfused CuPy chain
  image by image (goal: >= 3x), and the chain's per-stage times;
* ``measures``: the quality/compliance counts taken on the device for a batch (one copy back)
  equal the CPU twin's on host copies (goal: equal), with the canvases rendered on the device
  lane's stream in one thread and measured on the output lane's stream in another after waiting
  on the hand-off event; the bytes the batch copied back.

Timings are CUDA-event times, best of ``--repeat`` after a warm-up.
"""


RETOUCH_REPORT = "gpu_check_retouch.json"


def synthetic(h: int, w: int, seed: int, channels: int = 3) -> tuple[np.ndarray, np.ndarray]:
    """A product-like photo: textured subject (ellipse) on a tinted, unevenly lit backdrop,
    and its feathered mask. ``channels`` 1, 3 or 4 (4: the mask as alpha)."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    u, v = xx / max(w - 1, 1), yy / max(h - 1, 1)
    r = np.sqrt(((u - 0.55) / 0.32) ** 2 + ((v - 0.5) / 0.38) ** 2)
    alpha = np.clip((1.0 - r) * 12.0, 0.0, 1.0)
    texture = 0.5 + 0.25 * np.sin(xx / 7.0 + 3 * np.sin(yy / 23.0)) * np.cos(yy / 11.0)
    subject = np.stack([texture * 200, texture * 120 + 40, 90 - texture * 60], axis=-1)
    backdrop = np.full((h, w, 3), 200.0, np.float32) * np.array([1.1, 1.0, 0.85], np.float32)
    light = (0.55 + 0.45 * u)[..., None]
    img = (alpha[..., None] * subject + (1 - alpha[..., None]) * backdrop) * light
    img += rng.normal(0.0, 3.0, img.shape)
    rgb = np.clip(img, 0, 255).astype(np.uint8)
    mask = (alpha * 255 + 0.5).astype(np.uint8)
    if channels == 1:
        return np.ascontiguousarray(rgb[..., 1]), mask
    if channels == 4:
        return np.dstack([rgb, mask]), mask
    return rgb, mask


class Timer:
    """CUDA-event timing of a callable, and of the stages of a chain."""

    def __init__(self, cp: Any, repeat: int) -> None:
        self.cp, self.repeat = cp, repeat

    def best(self, fn: Callable[[], Any]) -> float:
        cp = self.cp
        fn()
        cp.cuda.Device().synchronize()
        start, end = cp.cuda.Event(), cp.cuda.Event()
        times = []
        for _ in range(self.repeat):
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(float(cp.cuda.get_elapsed_time(start, end)) / 1e3)
        return min(times)

    def stages(self, fn: Callable[[Callable[[str], None]], Any]) -> dict[str, float]:
        """Best seconds per stage of ``fn(mark)``; ``mark(name)`` ends a stage."""
        cp = self.cp
        best: dict[str, float] = {}
        fn(lambda name: None)
        cp.cuda.Device().synchronize()
        for _ in range(self.repeat):
            events: list[tuple[str, Any]] = [("", cp.cuda.Event())]
            events[0][1].record()

            def mark(name: str, events: list[tuple[str, Any]] = events) -> None:
                ev = cp.cuda.Event()
                ev.record()
                events.append((name, ev))

            fn(mark)
            events[-1][1].synchronize()
            for (_, a), (name, b) in itertools.pairwise(events):
                t = cp.cuda.get_elapsed_time(a, b) / 1e3
                best[name] = min(best.get(name, float("inf")), t)
        return best


def max_diff(cp: Any, a: Any, b: Any) -> int:
    a, b = cp.asnumpy(a), cp.asnumpy(b)
    if a.shape != b.shape:
        return 999
    return int(np.abs(a.astype(np.int16) - b.astype(np.int16)).max())


def check_parity(cp: Any) -> dict[str, Any]:
    from gpu_kernels.backends import RetouchOptions
    from gpu_kernels.presets import Preset, load_presets
    from gpu_kernels.retouch import CpuRetoucher, CupyRetoucher

    cpu, gpu, book = CpuRetoucher(), CupyRetoucher(), load_presets()
    cases = {
        "rgb+mask": synthetic(480, 640, 1),
        "rgba": (synthetic(400, 300, 2, channels=4)[0], None),
        "gray+mask": synthetic(333, 517, 3, channels=1),
        "rgb": (synthetic(256, 256, 4)[0], None),
        "1x1": (np.full((1, 1, 3), 77, np.uint8), None),
        "10000x10": (synthetic(10000, 10, 5)[0], None),
    }
    presets = [book["taobao_main"], book["amazon_main"], book["transparent_png"],
               Preset("tiny", 37, 53, format="png", background="transparent", fill=0.5)]
    out: dict[str, Any] = {"correct": {}, "render": {}, "correct_fused_vs_unfused": {},
                           "render_fused_vs_unfused": {}}
    for name, (image, mask) in cases.items():
        dev_image = cp.asarray(image)
        dev_mask = None if mask is None else cp.asarray(mask)
        worst = worst_chain = 0
        for bg in ("white", "transparent", "keep"):
            for lighting in ("auto", "off"):
                options = RetouchOptions(bg, lighting)
                g = gpu.correct([dev_image], [dev_mask], options)[0]
                c = cpu.correct([image], [mask], options)[0]
                worst = max(worst, max_diff(cp, g, c))
                worst_chain = max(worst_chain, max_diff(cp, g, gpu.correct_unfused(
                    dev_image, dev_mask, options)))
        out["correct"][name] = worst
        out["correct_fused_vs_unfused"][name] = worst_chain
        worst = worst_chain = 0
        for preset in presets:
            g = gpu.render(dev_image, dev_mask, preset)
            worst = max(worst, max_diff(cp, g, cpu.render(image, mask, preset)))
            worst_chain = max(worst_chain, max_diff(cp, g, gpu.render_unfused(
                dev_image, dev_mask, preset)))
        out["render"][name] = worst
        out["render_fused_vs_unfused"][name] = worst_chain
    items = [(cp.asarray(i), None if m is None else cp.asarray(m)) for i, m in cases.values()]
    batch = gpu.render_batch([i for i, _ in items], [m for _, m in items], presets[0])
    out["render_batch_vs_single"] = max(max_diff(cp, b, gpu.render(i, m, presets[0]))
                                        for b, (i, m) in zip(batch, items, strict=True))
    values = [v for k, d in out.items() if isinstance(d, dict) for v in d.values()]
    out["max_lsb"] = max([*values, out["render_batch_vs_single"]])
    out["ok"] = out["max_lsb"] <= 1
    return out


def check_measures(cp: Any, retoucher: Any = None, streams: Any = None) -> dict[str, Any]:
    """Device counts vs host counts over GPU-rendered canvases, across a lane hand-off
    (``retoucher``/``streams``: default the CuPy retoucher and CUDA lane streams; the CPU dry run
    passes NumPy, the CPU twin and the host's no-op streams)."""
    from concurrent.futures import ThreadPoolExecutor

    from gpu_kernels.lane_streams import LaneStreams
    from gpu_kernels.presets import load_presets
    from gpu_kernels.stages.base import to_host
    from gpu_kernels.stages.measure import device_counts, host_counts

    if retoucher is None:
        from gpu_kernels.retouch import CupyRetoucher

        retoucher = CupyRetoucher()
    gpu, book, streams = retoucher, load_presets(), streams or LaneStreams("gpu")
    presets = [book["taobao_main"], book["transparent_png"]]
    cases = [synthetic(480, 640, 1), synthetic(333, 517, 3), synthetic(480, 640, 6), synthetic(1, 1, 7)]

    def render() -> tuple[list[Any], list[list[Any]], Any]:
        with streams.run("device") as s:
            masks = [cp.asarray(m) for _, m in cases]
            canvases = [[gpu.render(cp.asarray(i), m, p) for p in presets]
                        for (i, _), m in zip(cases, masks, strict=True)]
            return masks, canvases, s.record()

    def measure(masks: list[Any], canvases: list[list[Any]], event: Any) -> list[Any]:
        with streams.run("output", event):
            return device_counts(cp, masks, canvases)

    with ThreadPoolExecutor(1) as device, ThreadPoolExecutor(1) as output:
        masks, canvases, event = device.submit(render).result()
        counts = output.submit(measure, masks, canvases, event).result()
    host = [host_counts(to_host(m), [to_host(c) for c in cs]) for m, cs in zip(masks, canvases, strict=True)]
    rows = 5 * len(masks) + 3 * len(canvases) + 6 * sum(len(cs) for cs in canvases)
    return {"equal": counts == host, "items": len(counts), "bytes_back": 8 * rows,
            "canvas_bytes": int(sum(c.nbytes for cs in canvases for c in cs)), "ok": counts == host}


def copy_bandwidth(cp: Any, timer: Timer, nbytes: int) -> dict[str, float]:
    src = cp.arange(nbytes, dtype=cp.uint8)
    dst = cp.empty_like(src)
    memcpy = timer.best(lambda: dst.data.copy_from_device(src.data, nbytes))
    kernel = timer.best(lambda: cp.copyto(dst, src))
    return {"bytes": nbytes, "memcpy_gbps": 2 * nbytes / memcpy / 1e9,
            "copy_kernel_gbps": 2 * nbytes / kernel / 1e9}


def colour_pass(cp: Any, timer: Timer, h: int, w: int, copy_gbps: float) -> dict[str, Any]:
    from gpu_kernels.backends import RetouchOptions
    from gpu_kernels.retouch import CupyRetoucher

    gpu = CupyRetoucher()
    image, mask = synthetic(h, w, 11)
    dev_image, dev_mask = cp.asarray(image), cp.asarray(mask)
    mp = h * w / 1e6
    out: dict[str, Any] = {"image": f"{w}x{h} RGB + mask", "megapixels": mp}
    modes = (RetouchOptions("white", "auto"), RetouchOptions("transparent", "auto"),
             RetouchOptions("keep", "off"))
    for options in modes:
        bg, lighting = options.background, options.lighting
        out[f"{bg}/{lighting}"] = colour_mode(cp, timer, gpu, dev_image, dev_mask, options,
                                              copy_gbps)
    out["goal_fused_vs_copy"] = 0.5
    return out


def colour_mode(cp: Any, timer: Timer, gpu: Any, image: Any, mask: Any, options: Any,
                copy_gbps: float) -> dict[str, Any]:
    """Fused kernel (given its plan) vs plan estimation vs the unfused CuPy chain."""
    from gpu_kernels.retouch.correction import correct_reference

    h, w = image.shape[:2]
    mp = h * w / 1e6
    plan = gpu.plan(image, mask, options)

    def fused() -> Any:
        return gpu.launch_correct(image, mask, False, plan, options.background)

    def estimate() -> Any:
        return gpu.plan(image, mask, options)

    def end_to_end() -> Any:
        return gpu.correct([image], [mask], options)

    def chain(mark: Callable[[str], None]) -> Any:
        return correct_reference(cp, image, mask, plan, options.background, mark)

    t_fused = timer.best(fused)
    bytes_per_px = 3 + 1 + (4 if options.background == "transparent" else 3)
    gbps = bytes_per_px * h * w / t_fused / 1e9
    entry: dict[str, Any] = {
        "fused_mps": mp / t_fused, "fused_gbps": gbps, "fused_vs_copy": gbps / copy_gbps,
        "plan_ms": timer.best(estimate) * 1e3, "end_to_end_mps": mp / timer.best(end_to_end),
    }
    if options.lighting == "auto":
        stages = timer.stages(chain)
        total = sum(stages.values())
        entry.update(unfused_stage_mps={k: mp / v for k, v in stages.items()},
                     unfused_mps=mp / total, fused_vs_unfused=total / t_fused)
    return entry


def geometry_pass(cp: Any, timer: Timer, n: int, h: int, w: int) -> dict[str, Any]:
    from gpu_kernels.backends import RetouchOptions
    from gpu_kernels.presets import load_presets
    from gpu_kernels.retouch import CupyRetoucher

    gpu, book = CupyRetoucher(), load_presets()
    sources = [synthetic(h, w, 100 + i) for i in range(n)]
    masks = [cp.asarray(m) for _, m in sources]
    white = [gpu.correct([cp.asarray(i)], [m], RetouchOptions("white"))[0]
             for (i, _), m in zip(sources, masks, strict=True)]
    clear = [gpu.correct([cp.asarray(i)], [m], RetouchOptions("transparent"))[0]
             for (i, _), m in zip(sources, masks, strict=True)]
    out: dict[str, Any] = {"batch": n, "source": f"{w}x{h}", "goal_fused_vs_unfused": 3.0}
    for name in ("taobao_main", "amazon_main", "transparent_png"):
        preset = book[name]
        images = clear if preset.background == "transparent" else white
        out[name] = render_preset(cp, timer, gpu, preset, images, masks)
    return out


def render_preset(cp: Any, timer: Timer, gpu: Any, preset: Any, images: list[Any],
                  masks: list[Any]) -> dict[str, Any]:
    """Batched fused launch vs the unfused CuPy chain, image by image, for one preset."""
    from gpu_kernels.retouch.gpu import render_launch
    from gpu_kernels.retouch.render import render_reference

    out_mp = len(images) * preset.width * preset.height / 1e6
    coeffs = gpu.config.geometry.cubic_coefficients()
    params = [gpu.placement(i, m, preset) for i, m in zip(images, masks, strict=True)]
    host = [cp.asnumpy(q) for q in params]

    def fused() -> Any:
        return gpu.render_batch(images, masks, preset)

    def kernel_only() -> None:
        launch = render_launch(cp, list(zip(images, params, strict=True)), preset, gpu._coeffs,
                               gpu._pointer)
        gpu._render_kernel(*launch[:3])

    def unfused() -> Any:
        return [gpu.render_unfused(i, m, preset) for i, m in zip(images, masks, strict=True)]

    def chain(mark: Callable[[str], None]) -> Any:
        return [render_reference(cp, i, q, preset.width, preset.height,
                                 preset.background == "transparent", preset.sharpen, coeffs, mark)
                for i, q in zip(images, host, strict=True)]

    t_fused, t_kernel, t_unfused = timer.best(fused), timer.best(kernel_only), timer.best(unfused)
    return {
        "canvas": f"{preset.width}x{preset.height}",
        "fused_batch_ms": t_fused * 1e3, "fused_kernel_ms": t_kernel * 1e3,
        "fused_out_mps": out_mp / t_fused, "unfused_ms": t_unfused * 1e3,
        "unfused_out_mps": out_mp / t_unfused, "fused_vs_unfused": t_unfused / t_fused,
        "unfused_stage_ms_per_image": {k: v * 1e3 for k, v in timer.stages(chain).items()},
    }


def retouch_main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=RETOUCH_DOC)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--colour-size", default="4000x3000", help="WxH of the colour-pass image")
    parser.add_argument("--batch", type=int, default=16, help="images per render batch")
    parser.add_argument("--source-size", default="3000x2000", help="WxH of the render sources")
    parser.add_argument("--copy-mib", type=int, default=1024)
    args = parser.parse_args(argv)
    report: dict[str, Any] = {"script": "bench/gpu/checks.py retouch", "status": "skipped"}
    try:
        import cupy as cp
    except ImportError as exc:
        report["reason"] = f"CuPy is not installed ({exc}); nothing to check on this machine"
        append_row({"skipped": report["reason"]}, kind="skipped")
        emit(report, RETOUCH_REPORT)
        return 0
    try:
        devices = cp.cuda.runtime.getDeviceCount()
    except Exception as exc:  # no driver: CUDARuntimeError
        devices, report["reason"] = 0, f"no CUDA device ({type(exc).__name__}: {exc})"
    if devices == 0:
        report.setdefault("reason", "no CUDA device")
        append_row({"skipped": report["reason"]}, kind="skipped")
        emit(report, RETOUCH_REPORT)
        return 0
    t0 = time.perf_counter()
    props = cp.cuda.runtime.getDeviceProperties(0)
    report.update(status="running", device=props["name"].decode(errors="replace"),
                  cupy=cp.__version__, numpy=np.__version__)
    timer = Timer(cp, args.repeat)
    sections: list[tuple[str, Callable[[], Any]]] = [
        ("parity", lambda: check_parity(cp)),
        ("measures", lambda: check_measures(cp)),
        ("copy", lambda: copy_bandwidth(cp, timer, args.copy_mib << 20)),
    ]
    cw, ch = (int(v) for v in args.colour_size.split("x"))
    sw, sh = (int(v) for v in args.source_size.split("x"))
    for name, fn in sections:
        try:
            report[name] = fn()
        except Exception:
            report[name] = {"error": traceback.format_exc()}
        append_row({"part": name, "value": report[name]}, kind=name)
    copy_gbps = float(report.get("copy", {}).get("memcpy_gbps", float("nan")))
    passes: list[tuple[str, Callable[[], Any]]] = [
        ("colour_pass", lambda: colour_pass(cp, timer, ch, cw, copy_gbps)),
        ("geometry_pass", lambda: geometry_pass(cp, timer, args.batch, sh, sw)),
    ]
    for name, fn in passes:
        try:
            report[name] = fn()
        except Exception:
            report[name] = {"error": traceback.format_exc()}
        append_row({"part": name, "value": report[name]}, kind=name)
        cp.get_default_memory_pool().free_all_blocks()
    errors = [k for k, v in report.items() if isinstance(v, dict) and "error" in v]
    report["status"] = "error" if errors else "ok"
    report["seconds"] = time.perf_counter() - t0
    emit(report, RETOUCH_REPORT)
    return 1 if errors else 0


# --- e2e ---------------------------------------------------------------------------------------

E2E_DOC = """End to end through ``lightbox process``'s engine by batch size: throughput and p50/p99.

``lightbox.offline.process_files`` (what ``lightbox process`` runs) over N synthetic product
photos (JPEG, ``--size`` px square, written with OpenCV so the GPU machine needs no
scikit-image), 3 presets (taobao_main, xiaohongshu_cover, thumb_webp), segmentation by the
model, lighting on, for each batch size in ``--batches``: images/s (processed images only, first
file read to last result written, one untimed warm-up pass first; dead letters are counted
apart and never in the rate) and p50/p99 of the per-image latency (event built to result, as
``results.jsonl`` records it), plus the mean ms per stage. Each row names the segment runtime
that made its masks; the model always makes them (a run that cannot load the model on the
device fails, it never falls back to the classical segmenter).

    python3 bench/gpu/checks.py e2e --model DIR/u2netp.batched.onnx [--device gpu] [--n 512]
                                  [--batches 8,32,64] [--out FILE]

``--model``: the u2netp copy with a symbolic batch (``lightbox model fetch``
writes one); without it the model cache (``$LIGHTBOX_MODEL_DIR``) is used, never a download.
``--device cpu`` (the default without a GPU) is the dry run: a small CPU grid so the code path
is exercised.
"""


PRESETS = ("taobao_main", "xiaohongshu_cover", "thumb_webp")


def synth_photos(folder: Path, n: int, size: int) -> list[Path]:
    """``n`` JPEGs: a shaded, textured object with a cap on a light, slightly graded backdrop."""
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for k in range(n):
        rng = np.random.default_rng(k)
        h, w = size, int(size * (1.0 + 0.25 * (k % 3)))
        ramp = np.linspace(236, 250, h, dtype=np.float32)[:, None, None]
        img = np.broadcast_to(ramp, (h, w, 3)).copy()
        field = cv2.resize(rng.integers(0, 256, (6, 6, 3), dtype=np.uint8), (w, h), interpolation=cv2.INTER_CUBIC)
        mask = np.zeros((h, w), np.uint8)
        cv2.ellipse(mask, (w // 2, int(h * 0.55)), (int(w * 0.22), int(h * 0.33)), float(k * 11 % 40), 0, 360, 1, -1)
        cv2.rectangle(mask, (int(w * 0.45), int(h * 0.1)), (int(w * 0.55), int(h * 0.25)), 1, -1)
        obj = field.astype(np.float32) * 0.85 + rng.normal(0, 5, (h, w, 3))
        img[mask > 0] = obj[mask > 0]
        path = folder / f"SKU-{k:05d}.jpg"
        cv2.imwrite(str(path), np.clip(img, 0, 255).astype(np.uint8), [cv2.IMWRITE_JPEG_QUALITY, 90])
        out.append(path)
    return out


def local_model(model: Path | None) -> Path:
    """``model``, else the cached batched u2netp; raises FileNotFoundError (never downloads)."""
    if model is None:
        cache = Path(os.environ.get("LIGHTBOX_MODEL_DIR") or Path.home() / ".cache" / "lightbox" / "models")
        model = cache / "u2netp" / "u2netp.batched.onnx"
    if not model.is_file():
        raise FileNotFoundError(f"no model at {model}: pass --model (the run never downloads it)")
    return model


def rate_row(batch: int, summary: Any, stage_rows: list[Any], runtime: str) -> dict[str, Any]:
    """One figure: images/s over the processed images only, p50/p99 of their latency."""
    ok = [r for r in summary.results if r.ok]
    lat = np.array([r.line["latency_ms"] for r in ok] or [0.0])
    return {"batch": batch, "segment_runtime": runtime, "processed": len(ok),
            "dead_letters": summary.dead_letters,
            "img_per_s": round(len(ok) / summary.seconds, 2) if summary.seconds > 0 else 0.0,
            "p50_ms": round(float(np.percentile(lat, 50)), 1), "p99_ms": round(float(np.percentile(lat, 99)), 1),
            "stage_ms_per_image": {r.stage: round(r.per_image_ms, 2) for r in stage_rows}}


def run_grid(device: str, n: int, size: int, batches: list[int], runtime: str, model: Path,
             segmenter: str = "model", cuda_graphs: bool = False) -> dict[str, Any]:
    from agents.wiring import build_processor
    from lightbox.offline import process_files
    from lightbox.report import stage_table
    from streams.settings import Settings

    tmp = Path(tempfile.mkdtemp(prefix="lightbox-e2e-grid-"))
    files = synth_photos(tmp / "in", n, size)
    t0 = time.perf_counter()
    settings = Settings(device=device, segmenter=segmenter, segment_runtime=runtime, max_batch=max(batches),
                        model_path=model, cuda_graphs=cuda_graphs and device == "gpu")
    processor = build_processor(settings)
    label = "classical" if segmenter == "classical" else processor.model_version
    out: dict[str, Any] = {"device": device, "n": n, "size": size, "presets": PRESETS, "segmenter": segmenter,
                           "cuda_graphs": settings.segment.cuda_graphs,
                           "model_version": processor.model_version, "setup_s": round(time.perf_counter() - t0, 2),
                           "rows": []}
    append_row({k: v for k, v in out.items() if k != "rows"}, kind="setup")
    process_files(files[: max(batches)], processor, tmp / "warm", presets=PRESETS, batch_size=max(batches))
    for b in batches:
        summary = process_files(files, processor, tmp / f"out-b{b}", presets=PRESETS, batch_size=b)
        rows, _ = stage_table(summary.processed)
        row = {"device": device, **rate_row(b, summary, rows, label)}
        out["rows"].append(row)
        append_row(row)
        print(json.dumps(row), flush=True)
    processor.close()
    return out


def e2e_main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=E2E_DOC, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--device", choices=("auto", "gpu", "cpu"), default="auto")
    ap.add_argument("--model", type=Path, default=None, help="u2netp with a symbolic batch (default: the cache)")
    ap.add_argument("--n", type=int, default=512)
    ap.add_argument("--size", type=int, default=1200, help="image height in px (widths 1x-1.5x)")
    ap.add_argument("--batches", default="8,32,64")
    ap.add_argument("--runtime", default="auto", help="segment runtime (auto, fp32, fp16, torch-fp16, ...)")
    ap.add_argument("--segmenter", default="model", choices=("model", "classical"),
                    help="model (default): every mask from the model; classical: the border-colour segmenter, "
                         "labelled so in every row")
    ap.add_argument("--cuda-graphs", action="store_true",
                    help="capture the model's CUDA graphs at start (one per bucket up to the largest batch: "
                         "adds their capture to the set-up time; bench/gpu/checks.py model measures their gain)")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")) / "gpu_e2e_grid.json")
    args = ap.parse_args(argv)
    from streams.settings import Settings

    device = Settings(device=args.device).resolved_device()
    result: dict[str, Any] = {"status": "ok"}
    batches = [int(b) for b in args.batches.split(",")]
    n, size = args.n, args.size
    if device == "cpu":
        result["skipped"] = "no GPU: the GPU grid was skipped; a small CPU grid ran instead (4 images, batch 1 and 4)"
        print(result["skipped"], flush=True)
        n, size, batches = 4, 320, [1, 4]
    try:
        model = local_model(args.model)
        result |= run_grid(device, n, size, batches, args.runtime if device == "gpu" else "fp32", model,
                           args.segmenter, args.cuda_graphs)
    except Exception:
        result |= {"status": "failed", "error": traceback.format_exc(limit=8)}
        append_row({"error": result["error"][-600:]}, kind="error")
        print(result["error"], flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"status {result['status']}; wrote {args.out}")
    return 0 if result["status"] == "ok" else 1


# --- model -------------------------------------------------------------------------------------

MODEL_DOC = """Model throughput by batch on the GPU: fp32 / fp16, CUDA graphs off / on, TensorRT when present.

For each precision (fp32; fp16 = the ``make_fp16`` copy) and each mode (plain IO binding,
CUDA graphs: one captured graph per bucket), ``OnnxSegmenter._infer`` on a prepared
``(B, 3, 320, 320)`` CuPy batch, B = 1, 2, 4, ..., 64: median ms per batch and images/s
(CUDA-synchronised). With TensorRT in onnxruntime, a TensorRT row too. Each row names the
provider that ran it (the first provider of its ONNX Runtime InferenceSession): a configuration that runs on
another provider than its mode names (TensorRT that fell back to CUDA) writes a skipped line
with the reason instead of rows. Then the FP16 fidelity
gate on this GPU: fp16 masks vs fp32 masks on the gate images (``--gate-images`` DIR of PNGs
written here by ``--export-gate-images DIR``, as scikit-image is not on the GPU machine).

    python3 bench/gpu/checks.py model MODEL.onnx [--gate-images DIR] [--out FILE]
    python3 bench/gpu/checks.py model MODEL.onnx --dry-run-cpu     # the code paths on the CPU
    python3 bench/gpu/checks.py model MODEL.onnx --torch [--dry-run-cpu]   # the PyTorch runtime

``--torch``: the same grid with ``TorchSegmenter`` (needs only torch's CUDA build and CuPy, no
onnxruntime-gpu): fp16 / bf16 / fp32 (autocast), eager and with CUDA graphs per bucket, then
fp16 + ``torch.compile`` + CUDA graphs while time is left (``--deadline``), and the torch-fp16
gate against ONNX Runtime fp32 masks (the CPU provider when onnxruntime has no CUDA).

Without CuPy and a CUDA device (and without ``--dry-run-cpu``) it writes
``{"status": "skipped", "reason": ...}`` and exits 0. ``--dry-run-cpu`` runs fp32 and fp16 on
ONNX Runtime's CPU provider at batch 1 and 2; CUDA graphs and TensorRT are reported skipped.
"""


MODEL_BATCHES = (1, 2, 4, 8, 16, 32, 64)


def gpu_count() -> tuple[int, str]:
    try:
        import cupy

        return int(cupy.cuda.runtime.getDeviceCount()), ""
    except Exception as exc:  # no CuPy, no driver, no device
        return 0, f"{type(exc).__name__}: {exc}"


def median_s(fn: Callable[[], object], sync: Callable[[], None], budget_s: float, max_iters: int = 40) -> float:
    for _ in range(min(2, max_iters)):
        fn()
    sync()
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < max_iters and (time.perf_counter() - start < budget_s or len(times) < 3):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def export_gate_images(folder: Path) -> None:
    """Here (scikit-image needed): the gate set as PNGs."""
    from gpu_kernels.segment.runtime import gate_images

    folder.mkdir(parents=True, exist_ok=True)
    for k, img in enumerate(gate_images()):
        cv2.imwrite(str(folder / f"gate-{k:02d}.png"), np.ascontiguousarray(img[..., ::-1]))


def load_gate_images(folder: Path | None) -> list[np.ndarray]:
    if folder is None:
        try:
            from gpu_kernels.segment.runtime import gate_images

            return gate_images()
        except ImportError:
            return []
    out = []
    for f in sorted(folder.glob("gate-*.png")):
        img = cv2.imread(str(f))
        if img is not None:
            out.append(np.ascontiguousarray(img[..., ::-1]))
    return out


def _array_module(gpu: bool) -> tuple[Any, Callable[[], None]]:
    """(CuPy and a device synchronize) on a GPU, else (NumPy and a no-op)."""
    if gpu:
        import cupy

        return cupy, lambda: cupy.cuda.Device().synchronize()
    return np, lambda: None


def batch_rows(seg: Any, batches: tuple[int, ...], xp: Any, sync: Callable[[], None], budget_s: float,
               base: dict[str, Any], deadline: float | None = None, max_iters: int = 40) -> list[dict[str, Any]]:
    """One row per batch size: ``seg._infer``'s median ms per batch and images/s (or the error),
    each printed as it lands; stops at ``deadline`` (a perf_counter time) when given."""
    rows: list[dict[str, Any]] = []
    for b in batches:
        if deadline is not None and time.perf_counter() > deadline:
            break
        x = xp.asarray(np.random.default_rng(b).random((b, 3, 320, 320), dtype=np.float32))
        row: dict[str, Any] = {**base, "batch": b}
        try:
            s = median_s(lambda x=x: seg._infer(x), sync, budget_s, max_iters)
            row |= {"ms_per_batch": round(s * 1000, 3), "img_per_s": round(b / s, 1)}
        except Exception as exc:
            row["error"] = f"{type(exc).__name__}: {exc}"[:400]
        rows.append(row)
        append_row(row)
        print(json.dumps(row), flush=True)
    return rows


WANTED_PROVIDER = {"tensorrt": "TensorrtExecutionProvider", "plain": "CUDAExecutionProvider",
                   "cuda_graphs": "CUDAExecutionProvider"}


def provider_mismatch(mode: str, gpu: bool, providers: list[str]) -> str | None:
    """Why no ``mode`` row may be written for a session that runs on ``providers`` (its
    ``get_providers()``), or None when the row's label is true. ONNX Runtime drops a provider it
    cannot start and builds the session on the next one in the list (TensorRT, then CUDA, then the
    CPU) with no more than a warning, so asking for a provider proves nothing: the first provider
    the session reports is the one that runs the model."""
    wanted = WANTED_PROVIDER.get(mode, "CUDAExecutionProvider") if gpu else "CPUExecutionProvider"
    ran = providers[0] if providers else "no provider"
    if ran == wanted:
        return None
    return f"asked for {wanted}, the session runs on {ran}: no {mode} row"


def fp16_copy(model: Path) -> Path:
    """The fp16 copy of ``model`` (converted once, cached in the temp folder); raises what the
    conversion raises (onnxconverter-common missing, an op it cannot convert)."""
    from gpu_kernels.segment.variants import derived_path, make_fp16

    fp16 = derived_path(model, "fp16", Path(tempfile.gettempdir()) / "lightbox-variants")
    if not fp16.is_file():
        make_fp16(model, fp16)
    return fp16


def grid(model: Path, gpu: bool, batches: tuple[int, ...], budget_s: float) -> list[dict[str, Any]]:
    """fp32 then fp16 by mode; the fp16 rows say why when the fp16 copy cannot be made."""
    from gpu_kernels.segment import OnnxSegmenter

    rows: list[dict[str, Any]] = []
    paths: list[tuple[str, Path | None, str]] = [("fp32", model, "")]
    try:
        paths.append(("fp16", fp16_copy(model), ""))
    except Exception as exc:
        paths.append(("fp16", None, f"fp16 copy failed: {type(exc).__name__}: {exc}"[:400]))
    xp, sync = _array_module(gpu)
    modes = [("plain", {"cuda_graphs": False, "use_tensorrt": False})]
    if gpu:
        modes.append(("cuda_graphs", {"cuda_graphs": True, "use_tensorrt": False}))
        import onnxruntime as ort

        if "TensorrtExecutionProvider" in ort.get_available_providers():
            modes.append(("tensorrt", {"cuda_graphs": False, "use_tensorrt": True}))
    # TensorRT last: its engine build may take minutes, and it builds its own fp16 engine from fp32
    order = [(p, m) for m in modes if m[0] != "tensorrt" for p in paths] + \
        [(paths[0], m) for m in modes if m[0] == "tensorrt"]
    for (precision, path, why), (mode, opts) in order:
        if path is None:
            rows.append(_noted({"precision": precision, "mode": mode, "error": why}))
            continue
        t0 = time.perf_counter()
        try:
            seg = OnnxSegmenter(path, device="gpu" if gpu else "cpu", max_batch=max(batches), **opts) \
                if gpu else OnnxSegmenter(path, max_batch=max(batches), threads=2)
        except Exception as exc:
            rows.append(_noted({"precision": precision, "mode": mode,
                                "error": f"{type(exc).__name__}: {exc}"[:400]}))
            continue
        rows += configuration_rows(seg, precision, mode, gpu, batches, xp, sync, budget_s,
                                   time.perf_counter() - t0)
        seg.close()
    return rows


def configuration_rows(seg: Any, precision: str, mode: str, gpu: bool, batches: tuple[int, ...], xp: Any,
                       sync: Callable[[], None], budget_s: float, setup_s: float) -> list[dict[str, Any]]:
    """One configuration's rows, each labelled with the provider that ran it; none but a skipped
    line (kind ``skipped``) when the session does not run on the provider ``mode`` names."""
    why = provider_mismatch(mode, gpu, seg.providers)
    if why is not None:
        return [_noted({"precision": precision, "mode": mode, "providers": seg.providers, "skipped": why},
                       "skipped")]
    rows = batch_rows(seg, batches, xp, sync, budget_s,
                      {"precision": precision, "mode": mode, "provider": seg.providers[0]},
                      max_iters=40 if gpu else 1)
    extra = {"precision": precision, "mode": mode, "setup_s": round(setup_s, 2), "providers": seg.providers}
    if mode == "cuda_graphs":
        extra |= {"graph_buckets": list(seg.cuda_graph_buckets), "graph_errors": seg.cuda_graph_errors}
    return [*rows, _noted(extra, "setup")]


def _noted(row: dict[str, Any], kind: str = "row") -> dict[str, Any]:
    append_row(row, kind=kind)
    return row


def torch_grid(model: Path, gpu: bool, batches: tuple[int, ...], budget_s: float,
               deadline: float) -> list[dict[str, Any]]:
    """TorchSegmenter._infer by batch: precision x (eager, CUDA graphs), then compiled fp16 while
    ``deadline`` (a perf_counter time) allows."""
    from gpu_kernels.segment.torch_runner import TorchSegmenter

    xp, sync = _array_module(gpu)
    configs: list[tuple[str, str, dict[str, Any]]] = [("fp16", "eager", {}), ("fp16", "cuda_graphs", {})]
    if gpu:
        configs += [("bf16", "eager", {}), ("bf16", "cuda_graphs", {}), ("fp32", "eager", {}),
                    ("fp32", "cuda_graphs", {}), ("fp16", "compile+cuda_graphs", {"compile": True})]
    else:
        configs = [("fp32", "eager", {})]
    rows: list[dict[str, Any]] = []
    for precision, mode, opts in configs:
        if time.perf_counter() > deadline:
            rows.append({"runtime": "torch", "precision": precision, "mode": mode, "skipped": "out of time"})
            continue
        t0 = time.perf_counter()
        try:
            seg = TorchSegmenter(model, device="gpu" if gpu else "cpu", precision=precision, max_batch=max(batches),
                                 cuda_graphs="cuda_graphs" in mode, threads=None if gpu else 2, **opts)
        except Exception as exc:
            rows.append({"runtime": "torch", "precision": precision, "mode": mode,
                         "error": f"{type(exc).__name__}: {exc}"[:400]})
            continue
        rows += batch_rows(seg, batches, xp, sync, budget_s,
                           {"runtime": "torch", "precision": f"torch-{precision}", "mode": mode}, deadline,
                           max_iters=40 if gpu else 1)
        rows.append(_noted({"runtime": "torch", "precision": f"torch-{precision}", "mode": mode,
                            "setup_and_run_s": round(time.perf_counter() - t0, 2), "providers": seg.providers,
                            "graph_buckets": list(seg.cuda_graph_buckets), "graph_errors": seg.cuda_graph_errors,
                            "compile_error": seg.compile_error}, "setup"))
        seg.close()
    return rows


def torch_gate(model: Path, gpu: bool, images: list[np.ndarray]) -> dict[str, Any]:
    """torch fp16 (GPU; fp32 on a CPU dry run) masks against ONNX Runtime fp32 masks."""
    from dataclasses import asdict

    import onnxruntime as ort

    from gpu_kernels.segment import OnnxSegmenter
    from gpu_kernels.segment.runtime import run_gate
    from gpu_kernels.segment.torch_runner import TorchSegmenter

    if not images:
        return {"status": "skipped", "reason": "no gate images (pass --gate-images DIR)"}
    ort_gpu = gpu and "CUDAExecutionProvider" in ort.get_available_providers()
    ref = OnnxSegmenter(model, device="gpu", use_tensorrt=False) if ort_gpu else OnnxSegmenter(model)
    imgs: list[Any] = list(images if gpu else images[:3])
    if ort_gpu:
        import cupy

        imgs = [cupy.asarray(i) for i in imgs]
    cand = TorchSegmenter(model, device="gpu", precision="fp16") if gpu else TorchSegmenter(model, threads=2)
    result = asdict(run_gate("torch-fp16" if gpu else "torch-fp32", cand, ref, imgs))
    result["reference"] = "onnxruntime fp32 on the " + ("GPU" if ort_gpu else "CPU")
    result["device"] = "gpu" if gpu else "cpu (dry run, 3 images)"
    return result


def fp16_gate(model: Path, fp16: Path, gpu: bool, images: list[np.ndarray]) -> dict[str, Any]:
    from dataclasses import asdict

    from gpu_kernels.segment import OnnxSegmenter
    from gpu_kernels.segment.runtime import run_gate

    if not images:
        return {"status": "skipped", "reason": "no gate images (pass --gate-images DIR)"}
    if gpu:
        import cupy

        imgs: list[Any] = [cupy.asarray(i) for i in images]
        ref = OnnxSegmenter(model, device="gpu", max_batch=1, use_tensorrt=False)
        cand = OnnxSegmenter(fp16, device="gpu", max_batch=1, use_tensorrt=False)
    else:
        imgs = list(images[:1])
        ref, cand = OnnxSegmenter(model, threads=2), OnnxSegmenter(fp16, threads=2)
    result = asdict(run_gate("fp16", cand, ref, imgs))
    result["device"] = "gpu" if gpu else "cpu (dry run, 1 image)"
    return result


def model_main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=MODEL_DOC, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("model", type=Path, nargs="?", help="u2netp with a symbolic batch dimension")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")) / "gpu_model_grid.json")
    ap.add_argument("--gate-images", type=Path, default=None)
    ap.add_argument("--export-gate-images", type=Path, default=None, help="write the gate PNGs here and exit")
    ap.add_argument("--budget", type=float, default=0.6, help="timed seconds per configuration")
    ap.add_argument("--dry-run-cpu", action="store_true")
    ap.add_argument("--torch", action="store_true", help="the PyTorch runtime's grid and gate instead")
    ap.add_argument("--deadline", type=float, default=70.0, help="--torch: seconds before no new row starts")
    args = ap.parse_args(argv)
    if args.export_gate_images:
        export_gate_images(args.export_gate_images)
        print(f"wrote the gate images to {args.export_gate_images}")
        return 0
    if args.model is None:
        ap.error("MODEL is required")
    n, why = gpu_count()
    gpu = n > 0 and not args.dry_run_cpu
    result: dict[str, Any] = {"status": "ok", "device": "gpu" if gpu else "cpu", "errors": {}}
    if not gpu and not args.dry_run_cpu:
        result |= {"status": "skipped", "reason": f"no CUDA device ({why or '0 devices'})"}
        _write_json(args.out, result)
        print(result["reason"])
        return 0
    if args.torch:
        return _torch_main(args, gpu, result)
    if not gpu:
        result["skipped"] = "CPU dry run: CUDA graphs and TensorRT need a GPU; batch 1, one timed run"
    steps: list[tuple[str, Callable[[], Any]]] = [
        ("grid", lambda: grid(args.model, gpu, MODEL_BATCHES if gpu else (1,), args.budget if gpu else 0.0)),
        ("fp16_gate", lambda: fp16_gate(args.model, fp16_copy(args.model), gpu, load_gate_images(args.gate_images))),
    ]
    return _run_steps(steps, args.out, result)


def _torch_main(args: argparse.Namespace, gpu: bool, result: dict[str, Any]) -> int:
    from gpu_kernels.segment.machine import torch_available, torch_cuda_available

    deadline = time.perf_counter() + args.deadline
    result["runtime"] = "torch"
    if not torch_available() or (gpu and not torch_cuda_available()):
        result |= {"status": "skipped", "reason": "torch (with CUDA on a GPU) is not installed here"}
        _write_json(args.out, result)
        print(result["reason"])
        return 0
    if not gpu:
        result["skipped"] = "CPU dry run: torch fp32 eager at batches 1 and 2; CUDA graphs and compile need a GPU"
    from gpu_kernels.segment.onnx_torch import import_torch

    result["torch"] = import_torch().__version__
    steps: list[tuple[str, Callable[[], Any]]] = [
        ("grid", lambda: torch_grid(args.model, gpu, MODEL_BATCHES if gpu else (1, 2), args.budget if gpu else 0.05,
                                    deadline)),
        ("gate", lambda: torch_gate(args.model, gpu, load_gate_images(args.gate_images))),
    ]
    return _run_steps(steps, args.out, result)


def _run_steps(steps: list[tuple[str, Callable[[], Any]]], out: Path, result: dict[str, Any]) -> int:
    """Each step in turn, its result (or its traceback) written to ``out`` as soon as it ends; the
    exit code: 0 when every step ran."""
    for name, step in steps:
        try:
            result[name] = step()
            if name != "grid":
                append_row({"part": name, **result[name]} if isinstance(result[name], dict) else {"part": name},
                           kind=name)
        except Exception:
            result["errors"][name] = traceback.format_exc(limit=6)
            append_row({"part": name, "error": result["errors"][name][-600:]}, kind="error")
            print(f"[{name}] FAILED\n{result['errors'][name]}", flush=True)
        _write_json(out, result)
    if result["errors"]:
        result["status"] = "partial"
    _write_json(out, result)
    print(f"status {result['status']}; wrote {out}")
    return 0 if result["status"] == "ok" else 1




COMMANDS: dict[str, Callable[[list[str]], int]] = {
    "codec": codec_main, "observe": lambda argv: observe_main(), "retouch": retouch_main, "e2e": e2e_main,
    "model": model_main,
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in COMMANDS:
        print(__doc__)
        print("checks: name one of " + ", ".join(COMMANDS))
        return 2
    sys.argv[0] = f"{sys.argv[0]} {argv[0]}"
    return COMMANDS[argv[0]](argv[1:])


if __name__ == "__main__":
    raise SystemExit(main())
