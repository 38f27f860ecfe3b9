"""Event in, pure pipeline call, event out: the part of the agent that needs no Kafka.

``BatchProcessor.prepare`` turns one consumed record into a :class:`Prepared` job (Avro read,
presets resolved, image fetched) or a dead letter; ``run`` takes a batch of prepared jobs
through the :class:`~gpu_kernels.pipeline.RetouchPipeline` and returns one :class:`OutRecord`
per input: a ``ProcessedImageEvent`` or a ``DeadLetterEvent``, already serialized. The Faust
agent only moves these records between Kafka and this class.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

from gpu_kernels.backends import RetouchOptions
from gpu_kernels.codec.sniff import ImageInfo, sniff
from gpu_kernels.fetch import fetch_source
from gpu_kernels.pipeline import Decoded, Job, JobResult, RetouchPipeline, Variant
from gpu_kernels.presets import PresetBook
from gpu_kernels.spans import SpanRecorder
from schemas.errors import LightboxError, ProcessingFailed
from schemas.events import EventCodecs, dead_letter_id, processed_event_id
from schemas.headers import attempts_of

__all__ = ["BatchProcessor", "InRecord", "OutRecord", "Prepared", "resolution_bin"]

Headers = list[tuple[str, bytes | None]]
PASS_HEADERS = ("traceparent", "tracestate")


@dataclass(frozen=True, slots=True)
class InRecord:
    """A consumed Kafka record, as the agent saw it."""

    topic: str
    partition: int
    offset: int
    value: bytes | None
    key: bytes | None = None
    headers: Headers | None = None
    timestamp_ms: int | None = None


@dataclass(frozen=True, slots=True)
class OutRecord:
    kind: Literal["processed", "dead_letter"]
    key: bytes | None
    value: bytes
    headers: Headers
    source: InRecord
    error_code: str | None = None


def resolution_bin(width: int, height: int) -> int:
    """The longer side's bin: 0 up to 1024 px, 1 up to 2048, 2 up to 4096, 3 beyond."""
    longer = max(width, height)
    return next((i for i, edge in enumerate((1024, 2048, 4096)) if longer <= edge), 3)


@dataclass(slots=True)
class Prepared:
    record: InRecord
    event: dict[str, Any]
    job: Job
    info: ImageInfo

    @property
    def shape_class(self) -> tuple[int, tuple[str, ...]]:
        """Items that may share a batch: same resolution bin and same preset set."""
        return resolution_bin(self.info.width, self.info.height), tuple(p.name for p in self.job.presets)

    @property
    def nbytes(self) -> int:
        """Decoded size, for the batcher's memory budget."""
        return self.info.pixels * (4 if self.info.has_alpha else 3)


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class BatchProcessor:
    def __init__(self, pipeline: RetouchPipeline, presets: PresetBook, codecs: EventCodecs, *,
                 worker_id: str, pipeline_version: str, model_version: str = "none",
                 max_image_bytes: int = 40 << 20, max_pixels: int = 64_000_000, file_roots: Sequence[Path] = (),
                 output_dir: Path | None = None, wall_ms: Callable[[], int] = _now_ms) -> None:
        self.pipeline, self.presets, self.codecs = pipeline, presets, codecs
        self.worker_id, self.pipeline_version, self.model_version = worker_id, pipeline_version, model_version
        self.max_image_bytes, self.max_pixels = max_image_bytes, max_pixels
        self.file_roots, self.output_dir = file_roots, output_dir
        self.wall_ms = wall_ms

    # -- one record -> a job or a dead letter ------------------------------------------------
    def prepare(self, rec: InRecord) -> Prepared | OutRecord:
        spans = SpanRecorder()
        event: dict[str, Any] | None = None
        try:
            if rec.value is None:
                raise ProcessingFailed("record has no value (tombstone)", stage="deserialize")
            event = self.codecs.product.decode(rec.value)
            presets = self.presets.resolve(event["presets"])
            if not presets:
                raise ProcessingFailed("event requests no presets", stage="presets")
            opts = event["retouch"]
            options = RetouchOptions(background=opts["background"].lower(), lighting=opts["lighting"].lower(),
                                     segmentation=opts["segmentation"].lower())
            with spans.span("fetch"):  # the bytes, and what their header says (guards run here)
                data = fetch_source(event["source"], max_bytes=self.max_image_bytes, file_roots=self.file_roots)
                info = sniff(data, self.max_image_bytes, self.max_pixels)
        except LightboxError as exc:
            return self.dead_letter(rec, exc, event)
        return Prepared(rec, event, Job(data, presets, options, spans), info)

    # -- a batch of jobs -> one output per job --------------------------------------------------
    def run(self, batch: Sequence[Prepared]) -> list[OutRecord]:
        return self.finish(batch, self.decode(batch))

    def decode(self, batch: Sequence[Prepared]) -> Decoded | ProcessingFailed:
        """The decode half of :meth:`run` (a runner overlaps it with the previous batch's finish)."""
        try:
            return self.pipeline.decode([p.job for p in batch])
        except Exception as exc:  # the pipeline catches per item; this is the last line of defence
            return ProcessingFailed(f"{type(exc).__name__}: {exc}", stage="decode")

    def finish(self, batch: Sequence[Prepared], decoded: Decoded | ProcessingFailed) -> list[OutRecord]:
        """Everything after decode, and one serialized output per item."""
        try:
            if isinstance(decoded, ProcessingFailed):
                raise decoded
            results = self.pipeline.finish(decoded)
        except Exception as exc:
            err = exc if isinstance(exc, LightboxError) else ProcessingFailed(f"{type(exc).__name__}: {exc}",
                                                                              stage="pipeline")
            results = [JobResult(error=err) for _ in batch]
        out = []
        for p, res in zip(batch, results, strict=True):
            if res.error is not None:
                out.append(self.dead_letter(p.record, res.error, p.event))
            else:
                out.append(self.processed(p, res))
        return out

    def processed(self, p: Prepared, res: JobResult) -> OutRecord:
        ev, spans = p.event, p.job.spans
        start = spans.clock()
        now = self.wall_ms()
        created = ev["created_at"]
        created_ms = int(created.timestamp() * 1000) if isinstance(created, datetime) else int(created)
        q = res.quality
        record = {
            "event_id": processed_event_id(ev["event_id"], self.pipeline_version, self.model_version),
            "source_event_id": ev["event_id"],
            "sku": ev["sku"], "image_id": ev["image_id"], "merchant_id": ev["merchant_id"],
            "variants": [self._variant(v) for v in res.variants],
            "quality": {"subject_coverage": q.subject_coverage if q else 0.0,
                        "background_whiteness": q.background_whiteness if q else 0.0,
                        "sharpness": q.sharpness if q else 0.0},
            "spans": [],
            "latency_us": max(0, (now - created_ms) * 1000),
            "worker_id": self.worker_id, "model_version": self.model_version,
            "pipeline_version": self.pipeline_version, "processed_at": now,
        }
        # "produce" covers building and serializing this event up to the producer hand-off;
        # the broker's acknowledgement comes after the event is sealed (see metrics for it).
        spans.add("produce", start, spans.clock(), device="cpu")
        record["spans"] = [s.as_record() for s in spans.spans]
        value = self.codecs.processed.encode(record)
        return OutRecord("processed", p.record.key, value, self._headers(p.record), p.record)

    def _variant(self, v: Variant) -> dict[str, Any]:
        rec: dict[str, Any] = {"preset": v.preset, "width": v.width, "height": v.height, "format": v.format,
                               "data": v.data, "uri": None, "sha256": v.sha256, "size": v.size}
        if self.output_dir is not None:  # content-addressed: same bytes, same path, on any replay
            ext = {"jpeg": "jpg"}.get(v.format, v.format)
            path = self.output_dir / v.sha256[:2] / f"{v.sha256}.{ext}"
            if not path.exists():
                path.parent.mkdir(parents=True, exist_ok=True)
                tmp = path.with_suffix(".tmp")
                tmp.write_bytes(v.data)
                tmp.replace(path)
            rec["data"], rec["uri"] = None, path.resolve().as_uri()
        return rec

    def dead_letter(self, rec: InRecord, exc: LightboxError, event: dict[str, Any] | None = None) -> OutRecord:
        record = {
            "event_id": dead_letter_id(rec.topic, rec.partition, rec.offset, self.pipeline_version),
            "source_event_id": event.get("event_id") if event else None,
            "original": {
                "topic": rec.topic, "partition": rec.partition, "offset": rec.offset,
                "timestamp_ms": rec.timestamp_ms, "key": rec.key, "value": rec.value,
                "headers": [{"key": k, "value": v} for k, v in (rec.headers or [])],
            },
            "error_code": str(exc.code), "message": exc.message, "stage": exc.stage or "unknown",
            "attempts": attempts_of(rec.headers), "worker_id": self.worker_id, "failed_at": self.wall_ms(),
        }
        headers = [*self._headers(rec), ("lightbox-error", str(exc.code).encode())]
        return OutRecord("dead_letter", rec.key, self.codecs.dead_letter.encode(record), headers, rec,
                         error_code=str(exc.code))

    @staticmethod
    def _headers(rec: InRecord) -> Headers:
        kept = [(k, v) for k, v in (rec.headers or []) if k in PASS_HEADERS]
        src = f"{rec.topic}:{rec.partition}:{rec.offset}".encode()
        return [*kept, ("lightbox-source", src)]
