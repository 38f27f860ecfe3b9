"""GPU check of the worker's GPU-only metric, ``lightbox_device_memory_bytes`` (issue 12).

    PYTHONPATH=. python bench/gpu/check_observe.py        # writes $OUT/gpu_check_observe.json

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

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

REPORT_NAME = "gpu_check_observe.json"


def emit(report: dict[str, Any]) -> None:
    text = json.dumps(report, indent=2, default=str)
    print(text)
    out_dir = Path(os.environ.get("OUT") or ".")
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / REPORT_NAME).write_text(text + "\n")


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


def main() -> int:
    report: dict[str, Any] = {"check": "observe"}
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() < 1:
            raise RuntimeError("no CUDA device")
    except Exception as exc:
        emit({**report, "status": "skipped", "reason": f"{type(exc).__name__}: {exc}"})
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
    emit(report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
