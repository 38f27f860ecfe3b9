"""GPU check for the codec stage: DALI ``mixed`` decode and nvJPEG encode.

Needs CuPy, OpenCV, NumPy, DALI and nvImageCodec; neither Pillow, simplejpeg nor
scikit-image: the test images are synthesised and JPEG-encoded with OpenCV. Writes one JSON
file to ``$OUT/gpu_check_codec.json`` (or ``--out``) and prints a summary.

Measures
- decode: raw DALI pipeline ``external_source → decoders.image(device="mixed")``, img/s and MP/s
  for batch 1, 8, 32, 128 × ``hw_decoder_load`` 0, 0.65, 1.0 on ~1.4 MP JPEGs (goal: >= 4000
  img/s at batch 128 on an H200);
- the project's ``DaliDecoder("gpu")`` at batch 128 (sniff + DLPack hand-off overhead);
- reduced-size decode of 24 MP sources to 800 px: full decode vs fused GPU resize;
- parity: GPU vs CPU decode of the same JPEGs (mean and p99 |diff|);
- encode: nvJPEG (``NvJpegEncoder``) vs CPU libjpeg-turbo (OpenCV, 1 thread) per output size,
  ms per image, bytes, and which wins — the ``gpu_min_pixels`` threshold to use.

``bench/gpu_suite.sh`` runs it as its decode step; alone:
``PYTHONPATH=. python3 bench/gpu_check_codec.py [--out FILE]`` (about 2 minutes on an H200).

Without CuPy or a CUDA device it writes ``{"status": "skipped", ...}`` and exits 0.
``--dry-run-cpu`` runs the decode and parity code paths with DALI on the CPU (tiny sizes) so
the script can be checked on a machine without a GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cv2
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.gpu_rows import append as append_row

BATCHES = (1, 8, 32, 128)
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
    from gpu_kernels.codec import DaliDecoder

    h, w = src
    blobs = [jpeg(synth_photo(h, w, s)) for s in range(batch)]
    with DaliDecoder("gpu" if gpu else "cpu", batch_size=batch, num_threads=threads) as dec:

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
    print(f"  DaliDecoder batch {batch}: {ips:.1f} img/s", flush=True)
    return {
        "batch": batch,
        "img_per_s": round(ips, 1),
        "mp_per_s": round(ips * h * w / 1e6, 1),
        "iterations": iters,
    }


def reduced_decode(gpu: bool, src: tuple[int, int], n: int, min_s: float) -> dict[str, Any]:
    from gpu_kernels.codec import DaliDecoder

    h, w = src
    blobs = [jpeg(synth_photo(h, w, 100 + s)) for s in range(n)]
    out: dict[str, Any] = {
        "source": f"{w}x{h}",
        "n": n,
        "kb_avg": round(sum(map(len, blobs)) / n / 1024),
    }
    for mode in ("off", "resize") + (() if gpu else ("dct",)):
        with DaliDecoder("gpu" if gpu else "cpu", batch_size=n, reduce=mode) as dec:  # type: ignore[arg-type]

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
    from gpu_kernels.codec import DaliDecoder

    h, w = src
    blobs = [jpeg(synth_photo(h, w, 200 + s)) for s in range(8)]
    with (
        DaliDecoder("cpu", batch_size=8) as cpu_dec,
        DaliDecoder("gpu" if gpu else "cpu", batch_size=8) as dec,
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
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
    args = ap.parse_args()
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
        _write(args.out, result)
        return 0
    if "dali_error" in result["env"]:
        result["status"] = "failed"
        _write(args.out, result)
        print("DALI missing:", result["env"]["dali_error"])
        return 1

    src = (1080, 1296) if gpu else (240, 320)  # 1.4 MP on GPU
    big = (4000, 6000) if gpu else (800, 1200)
    batches = BATCHES if gpu else (1, 8)
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
        _write(args.out, result)  # partial results survive a timeout
    if gpu and "decode" in result:
        best = max((r["img_per_s"] for r in result["decode"] if r["batch"] == 128), default=0.0)
        result["goal_4000_img_per_s_at_batch_128"] = {"best": best, "met": best >= 4000}
    if "encode" in result and gpu:
        gpu_wins = [r["mp"] for r in result["encode"] if r.get("winner") == "gpu"]
        result["suggested_gpu_min_pixels"] = int(min(gpu_wins) * 1e6) if gpu_wins else None
    if result["errors"]:
        result["status"] = "partial"
    _write(args.out, result)
    print(f"status {result['status']}; wrote {args.out}")
    return 0 if result["status"] == "ok" else 1


def _write(path: Path, result: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    raise SystemExit(main())
