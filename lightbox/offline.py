"""The pipeline offline: image files in, variants and a JSONL of results out, no Kafka.

``process_files`` wraps each file in a ``ProductImageEvent`` (SKU = file stem, the file's bytes
inline, read up to one byte past the size limit so the fetch stage's guard refuses a file that is
too large, then the usual header and pixel guards; ``file://`` fetching stays closed), sends it through
the same :class:`~agents.process.BatchProcessor` the worker uses (``prepare`` then ``run``), in
fixed batches of one shape class each (same resolution bin and preset set, as the worker's
micro-batcher groups them), and for every input writes one JSON line:

    {"path": ..., "sku": ..., "status": "ok", "variants": [{"preset", "path", "width", ...}],
     "quality": {...}, "stages_ms": {...}, "stages_ms_per_image": {...}, "latency_ms": ...}

(``stages_ms``: how long this image waited on each stage, a batched stage lasting as long as its
batch; ``stages_ms_per_image``: that divided by the batch size, the image's share of the work.)
    {"path": ..., "sku": ..., "status": "dead_letter", "error_code": ..., "stage": ..., "message": ...}

Variants land in ``out_dir`` as ``<sku>.<preset>.<ext>``. Files are read ahead on a thread, and
the batches go through the processor's three lanes (decode, device, output) on their own
threads, as the worker runs them (:class:`LanePipeline`), the device lane on ``device_threads``
threads (``lightbox process`` gives it two with OpenVINO on a CPU: two images on the model's two
streams) and the output lane on the worker's output threads (``LIGHTBOX_OUTPUT_THREADS``, 2 by
default; on a CPU the model's mask refinement runs there, beside the next batch's model). Pure of
Kafka: no broker, no Faust.
"""

from __future__ import annotations

import json
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agents.interfaces import RunnerConfig
from agents.process import BatchProcessor, InRecord, OutRecord, Prepared
from lightbox.report import per_event_stage_ms
from lightbox.show import save_variants

__all__ = ["OFFLINE_TOPIC", "OUTPUT_THREADS", "LanePipeline", "OfflineResult", "OfflineSummary", "file_event",
           "process_files", "unique_skus"]

OFFLINE_TOPIC = "offline"
OUTPUT_THREADS = RunnerConfig().output_threads  # the worker's output lane, by default


@dataclass(frozen=True, slots=True)
class OfflineResult:
    """One input's outcome: its JSONL line (``line``) and, when processed, the decoded event."""

    path: Path
    line: dict[str, Any]
    event: dict[str, Any] | None = None

    @property
    def ok(self) -> bool:
        return bool(self.line["status"] == "ok")


@dataclass(slots=True)
class OfflineSummary:
    results: list[OfflineResult] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def processed(self) -> list[dict[str, Any]]:
        """The processed events (for ``lightbox.show.print_latency_table``)."""
        return [r.event for r in self.results if r.event is not None]

    @property
    def dead_letters(self) -> int:
        return sum(not r.ok for r in self.results)


def unique_skus(files: Sequence[Path]) -> list[str]:
    """The file stems, made unique in order (``a``, ``a-2``, ``a-3``) so outputs never collide."""
    seen: dict[str, int] = {}
    out = []
    for f in files:
        n = seen.get(f.stem, 0) + 1
        seen[f.stem] = n
        out.append(f.stem if n == 1 else f"{f.stem}-{n}")
    return out


def file_event(path: Path, sku: str, presets: Sequence[str], *, max_bytes: int, background: str = "WHITE",
               lighting: str = "AUTO", segmentation: str = "AUTO") -> dict[str, Any]:
    """A ProductImageEvent carrying at most ``max_bytes + 1`` bytes of ``path`` inline (raises OSError)."""
    with open(path, "rb") as fh:
        data = fh.read(max_bytes + 1)
    return {"event_id": f"offline:{sku}", "sku": sku, "image_id": path.name, "merchant_id": "offline",
            "source": {"data": data}, "content_type": None,
            "presets": list(presets),
            "retouch": {"background": background.upper(), "lighting": lighting.upper(),
                        "segmentation": segmentation.upper()},
            "priority": 0, "created_at": time.time_ns() // 1_000_000}


def _line(path: Path, sku: str, out: OutRecord, processor: BatchProcessor, out_dir: Path) -> OfflineResult:
    codecs = processor.codecs
    if out.kind == "dead_letter":
        dl = codecs.dead_letter.decode(out.value)
        return OfflineResult(path, {"path": str(path), "sku": sku, "status": "dead_letter",
                                    "error_code": dl["error_code"], "stage": dl["stage"], "message": dl["message"]})
    ev = codecs.processed.decode(out.value)
    written = save_variants(ev, out_dir)
    by_preset = {p.name.split(".")[-2]: p for p in written}
    variants = [{"preset": v["preset"], "path": str(by_preset.get(v["preset"], "")), "width": v["width"],
                 "height": v["height"], "format": v["format"], "size": v["size"], "sha256": v["sha256"]}
                for v in ev["variants"]]
    line = {"path": str(path), "sku": sku, "status": "ok", "variants": variants, "quality": ev["quality"],
            "stages_ms": {k: round(v, 3) for k, v in per_event_stage_ms(ev).items()},
            "stages_ms_per_image": {k: round(v, 3) for k, v in per_event_stage_ms(ev, amortized=True).items()},
            "latency_ms": ev["latency_us"] / 1000.0}
    for v in ev["variants"]:  # the bytes are on disk now; keep the event light for the latency table
        v["data"] = None
    return OfflineResult(path, line, ev)


def default_batch(device: str) -> int:
    """``lightbox process``'s batch size: 4 on a GPU; 1 on a CPU, where the model's time grows with
    each image and OpenVINO runs two batches side by side (small batches keep the lanes overlapping)."""
    return 4 if device == "gpu" else 1


def process_files(
    files: Sequence[Path],
    processor: BatchProcessor,
    out_dir: Path,
    *,
    presets: Sequence[str],
    batch_size: int = 4,
    background: str = "WHITE",
    lighting: str = "AUTO",
    segmentation: str = "AUTO",
    jsonl: Path | None = None,
    on_result: Callable[[OfflineResult], None] | None = None,
    device_threads: int = 1,
    output_threads: int = OUTPUT_THREADS,
) -> OfflineSummary:
    """Run ``files`` through ``processor`` (see the module docstring); one result per file, in
    completion order. ``jsonl`` defaults to ``out_dir/results.jsonl``; ``output_threads``: the
    output lane's (``lightbox process`` passes the worker's setting, ``LIGHTBOX_OUTPUT_THREADS``)."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    out_dir.mkdir(parents=True, exist_ok=True)
    jsonl = jsonl or out_dir / "results.jsonl"
    skus = unique_skus(files)
    summary = OfflineSummary()
    t0 = time.perf_counter()

    max_bytes = int(getattr(processor, "max_image_bytes", 40 << 20))

    def prepare(i: int) -> tuple[int, Prepared | OutRecord | OfflineResult]:
        try:
            ev = file_event(files[i], skus[i], presets, max_bytes=max_bytes, background=background,
                            lighting=lighting, segmentation=segmentation)
        except OSError as exc:
            return i, OfflineResult(files[i], {"path": str(files[i]), "sku": skus[i], "status": "dead_letter",
                                               "error_code": "FETCH_FAILED", "stage": "fetch",
                                               "message": f"cannot read {files[i].name}: {exc.strerror or exc}"})
        rec = InRecord(OFFLINE_TOPIC, 0, i, processor.codecs.product.encode(ev), key=skus[i].encode())
        return i, processor.prepare(rec)

    # the model then takes calls from that many threads; offline, one image's latency counts for nothing
    processor.pipeline.device_callers(device_threads, lone_latency=False)
    with open(jsonl, "w", encoding="utf-8") as sink, ThreadPoolExecutor(1, thread_name_prefix="offline-read") as pool, \
            LanePipeline(processor, device_threads=device_threads, output_threads=output_threads) as lanes:
        def emit(out: OutRecord | OfflineResult) -> None:
            if isinstance(out, OfflineResult):
                res = out
            else:
                i = out.source.offset
                res = _line(files[i], skus[i], out, processor, out_dir)
            sink.write(json.dumps(res.line) + "\n")
            summary.results.append(res)
            if on_result is not None:
                on_result(res)

        def run(batch: list[Prepared]) -> None:
            for outs in lanes.submit(batch):
                for out in outs:
                    emit(out)

        buckets: dict[Any, list[Prepared]] = {}
        for _, prepared in _prefetch(pool, prepare, len(files), ahead=2 * batch_size):
            if isinstance(prepared, OutRecord | OfflineResult):
                emit(prepared)
                continue
            bucket = buckets.setdefault(prepared.shape_class, [])
            bucket.append(prepared)
            if len(bucket) >= batch_size:
                run(buckets.pop(prepared.shape_class))
        for bucket in buckets.values():
            run(bucket)
        for outs in lanes.drain():
            for out in outs:
                emit(out)
    summary.seconds = time.perf_counter() - t0
    return summary


class LanePipeline:
    """A :class:`BatchProcessor`'s decode, device and output lanes, each on its own thread, as
    the worker runs them: while one batch is on the device lane the next one decodes and the one
    before is encoded, so one batch's single-threaded steps (decode, mask refinement, render,
    encode) run beside another's model, whose threads would otherwise leave cores idle in
    between. ``device_threads`` > 1 runs that many batches on the device lane at once (the model
    must take calls from several threads: see ``ImagePipeline.device_callers``); the output
    lane has the worker's ``output_threads`` (on a CPU it refines the model's masks, then
    colours, renders and encodes). Batches come out in the order they went in; at most
    ``depth + device_threads - 1`` are in flight."""

    def __init__(self, processor: BatchProcessor, depth: int = 3, device_threads: int = 1,
                 output_threads: int = OUTPUT_THREADS) -> None:
        self.processor, self.depth = processor, depth + device_threads - 1
        self._lanes = [ThreadPoolExecutor(n, thread_name_prefix=f"offline-{name}")
                       for name, n in (("decode", 1), ("device", device_threads), ("output", output_threads))]
        self._pending: deque[Future[list[OutRecord]]] = deque()

    def submit(self, batch: list[Prepared]) -> list[list[OutRecord]]:
        """Start ``batch``; returns the outputs of the batches that had to finish to make room."""
        p = self.processor
        decode, device, output = self._lanes
        decoded = decode.submit(p.decode, batch)
        done = device.submit(lambda: p.device(decoded.result()))  # never raise (BatchProcessor)
        self._pending.append(output.submit(lambda: p.output(done.result())))  # raises FatalError only
        out = []
        while len(self._pending) > self.depth:
            out.append(self._pending.popleft().result())
        return out

    def drain(self) -> list[list[OutRecord]]:
        """The outputs of every batch still in flight, in order."""
        out = []
        while self._pending:
            out.append(self._pending.popleft().result())
        return out

    def __enter__(self) -> LanePipeline:
        return self

    def __exit__(self, *exc: object) -> None:
        for lane in self._lanes:
            lane.shutdown(wait=True, cancel_futures=True)


Item = tuple[int, Prepared | OutRecord | OfflineResult]


def _prefetch(pool: ThreadPoolExecutor, fn: Callable[[int], Item], n: int, ahead: int) -> Iterator[Item]:
    """``fn(0..n-1)`` in order, at most ``ahead`` running before they are consumed."""
    pending: deque[Future[Item]] = deque()
    nxt = 0
    while nxt < n or pending:
        while nxt < n and len(pending) < ahead:
            pending.append(pool.submit(fn, nxt))
            nxt += 1
        yield pending.popleft().result()
