"""Event in, pipeline, event out: the part of a worker that needs no Kafka (it does fetch the
sources and write the output store, through :mod:`blobio`).

:class:`BatchProcessor` has one method per lane of the runner (the ``Processor`` protocol of
:mod:`agents.interfaces`):

    prepare(rec)   prepare lane (CPU threads)   Avro read, presets, fetch + header guards;
                                              a Prepared job or a dead letter. Never raises.
    decode(batch)  decode lane (one thread)   the pipeline's decode stages. Never raises.
    device(state)  device lane (ONE thread)   segment, correct, render, device-side encode.
                                              Never raises.
    output(state)  output lane (CPU threads)  CPU encode, quality, store writes, Avro; one
                                              OutRecord per item, in batch order. Raises only
                                              FatalError (e.g. StoreUnavailable).
    run(batch)     all of them in order (offline use, tests)

The records out are ``ProcessedImageEvent`` s or ``DeadLetterEvent`` s, already serialized. The
runner only moves these records between Kafka and this class.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

from agents.records import (
    InRecord,
    OutRecord,
    created_ms,
    dead_letter_record,
    fits,
    headers_of,
    processed_record,
    shrink_order,
    store_upfront,
    variant_record,
)
from blobio.fetch import Fetcher, FetchPolicy
from blobio.store import make_store, variant_key
from gpu_kernels.backends import RetouchOptions
from gpu_kernels.codec.sniff import DEFAULT_MAX_FRAMES, DEFAULT_MAX_SCANS, ImageInfo, sniff
from gpu_kernels.pipeline import BatchContext, ImagePipeline, Job, JobResult, Variant
from gpu_kernels.presets import PresetBook
from gpu_kernels.spans import SpanRecorder
from gpu_kernels.stages.base import Lane
from schemas.errors import (
    FatalError,
    FetchFailed,
    LightboxError,
    OutputTooLarge,
    ProcessingFailed,
)
from schemas.events import EventCodecs
from streams.records import payload_size

__all__ = ["BatchProcessor", "BatchState", "InRecord", "OutRecord", "Prepared", "VariantStore",
           "resolution_bin"]

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
        """Decoded size, for the batcher's memory budget (bit depth and frames included)."""
        return self.info.decoded_nbytes


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _describe(exc: BaseException) -> str:
    """Type and text of an unexpected exception, bounded (never a payload dump)."""
    return f"{type(exc).__name__}: {exc}"[:300]


class VariantStore(Protocol):
    """Where variant bytes go when they leave the event (``blobio.store.OutputStore`` has
    this shape). ``put`` is idempotent and returns the URI; it raises ``StoreUnavailable`` once
    its retry budget is spent."""

    def put(self, key: str, data: bytes, content_type: str) -> str: ...

    def close(self) -> None: ...


_CONTENT_TYPES = {"jpeg": "image/jpeg", "png": "image/png", "webp": "image/webp"}


@dataclass(slots=True)
class BatchState:
    """A batch between lanes. Opaque to the runner, which may read ``len(state)`` and ``items``.

    ``error`` is a batch-level failure (an exception that was no item's own): every item of the
    batch then becomes a ``PROCESSING_FAILED`` dead letter."""

    items: list[Prepared]
    ctx: BatchContext
    error: LightboxError | None = None

    def __len__(self) -> int:
        return len(self.items)


class BatchProcessor:
    """One method per runner lane (module docstring). ``store`` takes variants out of line:
    ``offload="always"`` sends every variant there (today's ``--output-dir``), ``"oversize"``
    only when an event would exceed ``max_record_bytes``; with ``"always"``, variants up to
    ``inline_max_bytes`` keep their bytes inline too. ``output_dir`` is shorthand for a ``file://``
    store (``blobio.store``) with ``offload="always"``."""

    def __init__(self, pipeline: ImagePipeline, presets: PresetBook, codecs: EventCodecs, *,
                 worker_id: str, pipeline_version: str, model_version: str = "none",
                 max_image_bytes: int = 40 << 20, max_pixels: int = 64_000_000,
                 max_frames: int = DEFAULT_MAX_FRAMES, max_scans: int = DEFAULT_MAX_SCANS,
                 file_roots: Sequence[Path] = (),
                 output_dir: Path | None = None, store: VariantStore | None = None,
                 offload: Literal["always", "oversize"] = "always",
                 wall_ms: Callable[[], int] = _now_ms, fetcher: Fetcher | None = None,
                 inline_max_bytes: int | None = None) -> None:
        self.pipeline, self.presets, self.codecs = pipeline, presets, codecs
        self.worker_id, self.pipeline_version, self.model_version = worker_id, pipeline_version, model_version
        self.max_image_bytes, self.max_pixels = max_image_bytes, max_pixels
        self.max_frames, self.max_scans = max_frames, max_scans
        self.file_roots, self.output_dir = file_roots, output_dir
        self.store: VariantStore | None = store or (make_store(output_dir.resolve().as_uri()) if output_dir else None)
        self.offload = offload
        self.wall_ms = wall_ms
        self.fetcher = fetcher or Fetcher(FetchPolicy(max_bytes=max_image_bytes, file_roots=tuple(file_roots)))
        self.inline_max_bytes = inline_max_bytes or 0

    def close(self) -> None:
        self.pipeline.close()
        if self.store is not None:
            self.store.close()

    # -- fetch lane: one record -> a job or a dead letter ---------------------------------------
    def prepare(self, rec: InRecord) -> Prepared | OutRecord:
        """Raises only :class:`FatalError`: whatever else goes wrong becomes this record's dead letter."""
        try:
            return self._prepare(rec)
        except FatalError:  # e.g. the schema registry refused lightbox's credential: the worker stops
            raise
        except Exception as exc:  # not a LightboxError (those are handled inside): a bug or a library surprise
            return self._last_resort(rec, ProcessingFailed(_describe(exc), stage="prepare"))

    def _prepare(self, rec: InRecord) -> Prepared | OutRecord:
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
                try:
                    data = self.fetcher.fetch(event["source"])
                except LightboxError:
                    raise
                except Exception as exc:  # e.g. a NUL byte in a file:// path (ValueError from the OS layer)
                    raise FetchFailed(_describe(exc), stage="fetch", retriable=False) from exc
                info = sniff(data, self.max_image_bytes, self.max_pixels, max_frames=self.max_frames,
                             max_scans=self.max_scans)
        except LightboxError as exc:
            return self._last_resort(rec, exc, event)
        return Prepared(rec, event, Job(data, presets, options, spans), info)

    def _last_resort(self, rec: InRecord, exc: LightboxError, event: dict[str, Any] | None = None) -> OutRecord:
        """The dead letter; if even that cannot be written (an event id that is not a string...),
        one without the parsed event."""
        try:
            return self.dead_letter(rec, exc, event)
        except Exception as second:
            if event is None:
                raise
            exc.message = f"{exc.message} (and the event could not be echoed: {type(second).__name__})"
            return self.dead_letter(rec, exc, None)

    # -- decode / device lanes ---------------------------------------------------------------
    def decode(self, batch: Sequence[Prepared]) -> BatchState:
        """The decode lane. Never raises: a batch-level exception fails every item of it."""
        items = list(batch)
        try:
            state = BatchState(items, self.pipeline.start([p.job for p in items]))
        except Exception as exc:
            state = BatchState(items, BatchContext([], [], time.monotonic_ns),
                               ProcessingFailed(_describe(exc), stage="decode"))
        return self._lane(state, "decode", fatal_passes=False)

    def device(self, state: BatchState) -> BatchState:
        """The device lane (one thread). Never raises."""
        return self._lane(state, "device", fatal_passes=False)

    def _lane(self, state: BatchState, lane: Lane, *, fatal_passes: bool) -> BatchState:
        if state.error is None:
            try:
                self.pipeline.run_lane(state.ctx, lane)
            except FatalError:
                if fatal_passes:
                    raise
                state.error = ProcessingFailed(f"fatal error in the {lane} lane", stage=lane)
            except Exception as exc:  # the stages catch per item; this is the last line of defence
                state.error = exc if isinstance(exc, LightboxError) else ProcessingFailed(_describe(exc), stage=lane)
        return state

    # -- output lane -------------------------------------------------------------------------
    def output(self, state: BatchState, *, max_record_bytes: int | None = None) -> list[OutRecord]:
        """CPU encode, quality, store writes and Avro: one OutRecord per item, in batch order.
        Raises only :class:`FatalError`."""
        self._lane(state, "output", fatal_passes=True)
        if state.error is not None:
            results = [JobResult(error=state.error) for _ in state.items]
        else:
            results = state.ctx.finalize()
        out = []
        for p, res in zip(state.items, results, strict=True):
            if res.error is not None:
                out.append(self._last_resort(p.record, res.error, p.event))
                continue
            try:
                out.append(self.processed(p, res, max_record_bytes=max_record_bytes))
            except FatalError:
                raise
            except LightboxError as exc:
                out.append(self._last_resort(p.record, exc, p.event))
            except Exception as exc:
                out.append(self._last_resort(p.record, ProcessingFailed(_describe(exc), stage="produce"), p.event))
        batch = tuple((p.record.topic, p.record.partition, p.record.offset) for p in state.items)
        return [dataclasses.replace(o, batch=batch) for o in out]

    def run(self, batch: Sequence[Prepared], *, max_record_bytes: int | None = None) -> list[OutRecord]:
        """Every lane in order (offline use, tests)."""
        return self.output(self.device(self.decode(batch)), max_record_bytes=max_record_bytes)

    # -- records -----------------------------------------------------------------------------
    def processed(self, p: Prepared, res: JobResult, *, max_record_bytes: int | None = None) -> OutRecord:
        """The processed event of ``p``, within ``max_record_bytes`` (key + value + headers;
        :func:`agents.records.value_limit`): variants go to the store as :mod:`agents.records` plans."""
        ev, spans = p.event, p.job.spans
        start = spans.clock()
        variants = [variant_record(v) for v in res.variants]
        for k, keep_inline in store_upfront(res.variants, has_store=self.store is not None, offload=self.offload,
                                            inline_max_bytes=self.inline_max_bytes):
            self._offload(ev, variants[k], res.variants[k], keep_inline=keep_inline)
        record = processed_record(ev, res, variants, worker_id=self.worker_id, model_version=self.model_version,
                                  pipeline_version=self.pipeline_version, now_ms=self.wall_ms())
        key, headers = p.record.key, headers_of(p.record)
        value = self._seal(record, spans, start)
        if not fits(value, key, headers, max_record_bytes):
            first = payload_size(value, key, headers)
            if self.store is None:
                sizes = ", ".join(f"{v.preset} {v.size} B" for v in res.variants)
                raise OutputTooLarge(f"processed event of {first} bytes exceeds the output limit of {max_record_bytes} "
                                     f"bytes (variants: {sizes}); configure an output store to send variants out "
                                     "of line", stage="produce")
            for k in shrink_order(res.variants, [v["data"] is not None for v in variants]):
                self._offload(ev, variants[k], res.variants[k])
                value = self._seal(record, spans, start)
                if fits(value, key, headers, max_record_bytes):
                    break
            else:
                raise OutputTooLarge(f"processed event of {payload_size(value, key, headers)} bytes (variants out of "
                                     f"line; {first} bytes inline) still exceeds the output limit of "
                                     f"{max_record_bytes} bytes", stage="produce")
        return OutRecord("processed", key, value, headers, p.record, spans=tuple(record["spans"]),
                         origin_ns=spans.origin_ns, created_ms=created_ms(ev))

    def _seal(self, record: dict[str, Any], spans: SpanRecorder, start: int) -> bytes:
        # "produce" covers building and serializing this event (store writes included) up to the
        # producer hand-off; the broker's acknowledgement comes after the event is sealed.
        kept = [s for s in spans.spans if s.stage != "produce"]
        spans.spans[:] = kept
        spans.add("produce", start, spans.clock(), device="cpu")
        record["spans"] = [s.as_record() for s in spans.spans]
        return self.codecs.processed.encode(record)

    def _offload(self, ev: dict[str, Any], rec: dict[str, Any], v: Variant, *, keep_inline: bool = False) -> None:
        """Move one variant's bytes into the store (content-addressed key, SKU sanitized), its URI into the event."""
        assert self.store is not None
        key = variant_key(ev["sku"], v.preset, v.sha256, v.format)
        rec["uri"] = self.store.put(key, v.data, _CONTENT_TYPES.get(v.format, "application/octet-stream"))
        rec["data"] = v.data if keep_inline else None

    def dead_letter(self, rec: InRecord, exc: LightboxError, event: dict[str, Any] | None = None) -> OutRecord:
        record = dead_letter_record(rec, exc, event, worker_id=self.worker_id, pipeline_version=self.pipeline_version,
                                    now_ms=self.wall_ms())
        headers = [*headers_of(rec), ("lightbox-error", str(exc.code).encode())]
        return OutRecord("dead_letter", rec.key, self.codecs.dead_letter.encode(record), headers, rec,
                         error_code=str(exc.code), created_ms=created_ms(event))
