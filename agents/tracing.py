"""OpenTelemetry traces of a worker: where each image's milliseconds went, across services.

Off unless the standard ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or ``…_TRACES_ENDPOINT``) is set; then
spans go over OTLP/HTTP through a batching processor (the exporter reads every other
``OTEL_*`` variable itself). Off costs one ``None`` check per call.

Per input, a consumer span (``process <topic>``) that continues the producer's ``traceparent``
from the Kafka headers, with the messaging attributes (system, destination, partition, offset,
consumer group); it ends when the output is acknowledged, and the output event's
``traceparent`` header names it, so a CDN publisher's spans hang under lightbox's. Under it, one
child per stage the image went through (``fetch``, ``decode``, ``segment``, ``preset:<name>``…,
batch size and device as attributes), so each input's own trace shows where its time went. Per
batch, a ``batch`` span linked to every input it holds, with one child per batched stage. All are
re-created from the monotonic per-stage spans every output event carries (no span is open while
a stage runs, so tracing adds nothing inside the lanes). The ``produce`` span (kind PRODUCER)
runs from sealing the output event to the brokers' acknowledgement.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

__all__ = ["Tracing", "tracing_from_env"]

Headers = list[tuple[str, bytes | None]]
RecordKey = tuple[str, int, int]  # topic, partition, offset


class _HeaderGetter:
    """Reads W3C trace context from Kafka headers (a list of (key, bytes))."""

    def get(self, carrier: Mapping[str, str], key: str) -> list[str] | None:
        value = carrier.get(key)
        return None if value is None else [value]

    def keys(self, carrier: Mapping[str, str]) -> list[str]:
        return list(carrier)


def _epoch_ns(monotonic_ns: int) -> int:
    """A monotonic timestamp as wall-clock nanoseconds (OTel wants epoch times)."""
    return time.time_ns() - (time.monotonic_ns() - monotonic_ns)


class Tracing:
    """Spans for one worker. Build with :func:`tracing_from_env`; ``tracer`` is an OTel tracer."""

    def __init__(self, tracer: Any, *, group: str, provider: Any = None, item_stages: bool = True) -> None:
        """``item_stages=False`` leaves out the per-input stage children (about three quarters of
        the spans; the batch span's children still give each stage's time)."""
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.tracer, self.group, self.provider = tracer, group, provider
        self.item_stages = item_stages
        self._propagator = TraceContextTextMapPropagator()
        self._getter = _HeaderGetter()
        self._open: dict[RecordKey, Any] = {}

    # -- per input ---------------------------------------------------------------------------
    def received(self, topic: str, partition: int, offset: int, headers: Iterable[tuple[str, bytes | None]]) -> None:
        from opentelemetry.trace import SpanKind

        carrier = {k: v.decode("latin-1") for k, v in headers if v is not None and k in ("traceparent", "tracestate")}
        parent = self._propagator.extract(carrier, getter=self._getter)  # type: ignore[arg-type]
        span = self.tracer.start_span(
            f"process {topic}", context=parent, kind=SpanKind.CONSUMER,
            attributes={"messaging.system": "kafka", "messaging.operation.type": "process",
                        "messaging.destination.name": topic, "messaging.destination.partition.id": str(partition),
                        "messaging.kafka.offset": offset, "messaging.consumer.group.name": self.group})
        self._open[(topic, partition, offset)] = span

    def output_headers(self, key: RecordKey, headers: Headers) -> Headers:
        """``headers`` with ``traceparent``/``tracestate`` naming this input's span (or unchanged)."""
        span = self._open.get(key)
        if span is None:
            return headers
        from opentelemetry import trace

        carrier: dict[str, str] = {}
        self._propagator.inject(carrier, context=trace.set_span_in_context(span))
        kept = [(k, v) for k, v in headers if k not in ("traceparent", "tracestate")]
        return [*kept, *((k, v.encode()) for k, v in carrier.items())]

    def trace_id(self, key: RecordKey) -> str | None:
        span = self._open.get(key)
        return None if span is None else f"{span.get_span_context().trace_id:032x}"

    def finished(self, key: RecordKey, *, outcome: str, error_code: str | None = None,
                 produce_start_ns: int | None = None) -> None:
        """The output of ``key`` was acknowledged by the brokers: close its spans."""
        span = self._open.pop(key, None)
        if span is None:
            return
        from opentelemetry import trace
        from opentelemetry.trace import SpanKind, Status, StatusCode

        if produce_start_ns is not None and span.is_recording():
            produce = self.tracer.start_span("produce", context=trace.set_span_in_context(span), kind=SpanKind.PRODUCER,
                                             start_time=_epoch_ns(produce_start_ns),
                                             attributes={"messaging.system": "kafka"})
            produce.end()
        span.set_attribute("lightbox.outcome", outcome)
        if error_code:
            span.set_attribute("lightbox.error_code", error_code)
            span.set_status(Status(StatusCode.ERROR, error_code))
        span.end()

    def stages(self, key: RecordKey, stage_spans: Sequence[Mapping[str, Any]], origin_ns: int | None) -> None:
        """One child of ``key``'s consumer span per stage the item went through, from its own
        span records (batched stages carry their batch size): each input's trace shows where
        its milliseconds went without following the batch link."""
        span = self._open.get(key)
        if span is None or origin_ns is None or not stage_spans or not self.item_stages or not span.is_recording():
            return  # a trace the sampler dropped costs no children
        from opentelemetry import trace

        ctx = trace.set_span_in_context(span)
        self._children(ctx, stage_spans, origin_ns)

    def _children(self, ctx: Any, stage_spans: Sequence[Mapping[str, Any]], origin_ns: int) -> None:
        for s in stage_spans:
            name = str(s["stage"])
            begin = origin_ns + int(s["start_us"]) * 1000
            attrs: dict[str, Any] = {"lightbox.batch_size": int(s.get("batch_size") or 1),
                                     "lightbox.device": str(s.get("device") or "cpu")}
            if ":" in name:
                attrs["lightbox.preset"] = name.split(":", 1)[1]
            child = self.tracer.start_span(name, context=ctx, start_time=_epoch_ns(begin), attributes=attrs)
            child.end(end_time=_epoch_ns(begin + int(s["duration_us"]) * 1000))

    def forget(self, keys: Iterable[RecordKey]) -> None:
        """Inputs whose partition was revoked: end their spans unfinished."""
        for key in keys:
            span = self._open.pop(key, None)
            if span is not None:
                span.set_attribute("lightbox.outcome", "revoked")
                span.end()

    # -- per batch -----------------------------------------------------------------------------
    def batch(self, keys: Sequence[RecordKey], stage_spans: Sequence[Mapping[str, Any]], origin_ns: int) -> None:
        """One ``batch`` span linked to each input's span, with a child per stage.

        ``stage_spans`` are one item's per-stage records (``stage``, ``start_us`` from
        ``origin_ns``, ``duration_us``, ``batch_size``, ``device``); batched stages share them."""
        from opentelemetry import trace
        from opentelemetry.trace import Link

        links = [Link(self._open[k].get_span_context()) for k in keys if k in self._open]
        if not stage_spans:
            return
        starts = [origin_ns + int(s["start_us"]) * 1000 for s in stage_spans]
        ends = [b + int(s["duration_us"]) * 1000 for b, s in zip(starts, stage_spans, strict=True)]
        batch = self.tracer.start_span("batch", links=links, start_time=_epoch_ns(min(starts)),
                                       attributes={"lightbox.batch_size": len(keys)})
        self._children(trace.set_span_in_context(batch), stage_spans, origin_ns)
        batch.end(end_time=_epoch_ns(max(ends)))

    def close(self) -> None:
        self.forget(list(self._open))
        if self.provider is not None:
            self.provider.shutdown()  # flushes the batch processor


def tracing_from_env(*, group: str, worker_id: str, environ: Mapping[str, str] = os.environ,
                     item_stages: bool = True) -> Tracing | None:
    """A :class:`Tracing` exporting over OTLP/HTTP when the standard variables ask for it, else None.
    The sampler comes from ``OTEL_TRACES_SAMPLER``/``OTEL_TRACES_SAMPLER_ARG`` as the SDK reads
    them (e.g. ``traceidratio`` and ``0.1`` keeps a tenth of the inputs' traces, whole)."""
    endpoint = environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    if not endpoint or environ.get("OTEL_SDK_DISABLED", "").lower() == "true":
        return None
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    resource = Resource.create({"service.name": environ.get("OTEL_SERVICE_NAME", "lightbox-worker"),
                                "service.instance.id": worker_id})
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    return Tracing(provider.get_tracer("lightbox"), group=group, provider=provider, item_stages=item_stages)
