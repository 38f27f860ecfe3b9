"""Prometheus metrics and health for one worker, served on ``LIGHTBOX_METRICS_PORT``.

One HTTP server (prometheus-client's WSGI app behind the standard library's threaded WSGI
server) answers three paths:

- ``/metrics``: the worker's own registry (OpenMetrics when the scraper asks for it, so
  histogram exemplars carry trace ids);
- ``/healthz``: live while every lane progressed within ``stall_after_s`` or is idle with
  nothing queued; 503 with the stalled lane's name otherwise;
- ``/readyz``: ready once partitions are assigned and the model is loaded, and while no
  dependency (the brokers, the output store) is down; 503 naming the one that is.

While a dependency is down the lanes wait on it, which is not a stall: ``/healthz`` stays live
(a restart would not bring the server back).

:class:`Telemetry` is a :class:`~agents.runner.RunnerObserver`: the runner calls it and never
depends on it. Nothing here imports Kafka or Faust.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, make_wsgi_app

if TYPE_CHECKING:  # at run time this module needs prometheus-client alone (bench/gpu/checks.py observe)
    from agents.dependencies import Dependencies
    from agents.records import InRecord, OutRecord, RecordKey
    from agents.tracing import Tracing

__all__ = ["Health", "Metrics", "MetricsServer", "Telemetry", "device_memory_bytes"]

log = logging.getLogger(__name__)

#: stages each item runs alone (the rest run over the batch)
PER_ITEM_STAGES = ("fetch", "produce")

# per image, batch-amortized: 0.5 ms .. 30 s
STAGE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.15, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 300.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)


class Metrics:
    """The worker's metric families, in a registry of their own (tests make as many as they like)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry(auto_describe=True)
        r = self.registry
        self.stage_seconds = Histogram("lightbox_stage_seconds", "Time per image in each stage (batch-amortized)",
                                       ["stage", "device"], buckets=STAGE_BUCKETS, registry=r)
        self.batch_size = Histogram("lightbox_batch_size", "Images per batch, per stage", ["stage"],
                                    buckets=BATCH_BUCKETS, registry=r)
        self.e2e_seconds = Histogram("lightbox_e2e_seconds", "created_at of the input to its output event",
                                     buckets=LATENCY_BUCKETS, registry=r)
        self.queue_wait_seconds = Histogram("lightbox_queue_wait_seconds",
                                            "From consumption to the image's first batched stage, less its fetch",
                                            buckets=LATENCY_BUCKETS, registry=r)
        self.images = Counter("lightbox_images", "Inputs finished, by outcome (processed, dead_letter)",
                              ["outcome"], registry=r)
        self.dead_letters = Counter("lightbox_dead_letters", "Dead letters by error code", ["code"], registry=r)
        self.in_flight = Gauge("lightbox_in_flight", "Inputs held by this worker", registry=r)
        self.consumer_lag = Gauge("lightbox_consumer_lag", "Log end offset minus the worker's position",
                                  ["topic", "partition"], registry=r)
        self.device_memory = Gauge("lightbox_device_memory_bytes", "GPU memory in use by this process", registry=r)
        self.info = Gauge("lightbox_info", "Constant 1, labelled with what this worker runs",
                          ["version", "model", "device"], registry=r)
        for outcome in ("processed", "dead_letter"):
            self.images.labels(outcome)  # both series exist from the start (rate() needs them)
        self._stage_children: dict[tuple[Any, Any], Any] = {}

    def set_info(self, *, version: str, model: str, device: str) -> None:
        self.info.labels(version, model, device).set(1)

    def observe_spans(self, spans: Iterable[Mapping[str, Any]], exemplar: dict[str, str] | None = None) -> None:
        """One output's per-stage spans (``stage``, ``duration_us``, ``batch_size``, ``device``)."""
        for s in spans:
            size = max(1, int(s.get("batch_size") or 1))
            self._stage_child(s["stage"], s.get("device")).observe(int(s["duration_us"]) / 1e6 / size,
                                                                   exemplar=exemplar)

    def _stage_child(self, span_stage: Any, device: Any) -> Any:
        """The ``stage_seconds`` series of a span's stage (``preset:<name>`` -> ``render``,
        ``encode:<name>`` -> ``encode``) and device, kept per distinct pair: ``labels()`` builds
        and locks per call, ten spans an output."""
        key = (span_stage, device)
        child = self._stage_children.get(key)
        if child is None:
            stage = str(span_stage).split(":", 1)[0]
            stage = "render" if stage == "preset" else stage
            child = self._stage_children[key] = self.stage_seconds.labels(stage, str(device or "cpu"))
        return child

    def observe_output(self, *, kind: str, error_code: str | None, e2e_s: float | None,
                       exemplar: dict[str, str] | None = None) -> None:
        self.images.labels("processed" if kind == "processed" else "dead_letter").inc()
        if kind != "processed":
            self.dead_letters.labels(error_code or "PROCESSING_FAILED").inc()
        if e2e_s is not None and e2e_s >= 0:
            self.e2e_seconds.observe(e2e_s, exemplar=exemplar)


@dataclass
class Health:
    """Liveness from lane progress, readiness from start-up facts. Thread-safe enough: each field
    is replaced whole, and readers tolerate a value one update old."""

    stall_after_s: float = 60.0
    clock: Callable[[], float] = time.monotonic
    lanes: dict[str, tuple[float, int]] = field(default_factory=dict)  # lane -> (last progress, queued)
    assigned: bool = False
    model_loaded: bool = False
    dependencies: Dependencies | None = None  # the brokers and the store: down ones are waited for

    def progress(self, lane: str, queued: int) -> None:
        self.lanes[lane] = (self.clock(), queued)

    def stalled(self) -> list[str]:
        """Lanes with queued work that made no progress within ``stall_after_s``."""
        now = self.clock()
        return sorted(lane for lane, (at, queued) in dict(self.lanes).items()
                      if queued > 0 and now - at > self.stall_after_s)

    def live(self) -> tuple[bool, str]:
        deps = self.dependencies
        if deps is not None and deps.waiting:
            return True, f"waiting: {deps.describe()}"
        bad = self.stalled()
        if bad:
            return False, (f"stalled: {', '.join(bad)} made no progress for over {self.stall_after_s:g} s "
                           "with work queued")
        return True, "ok"

    def ready(self) -> tuple[bool, str]:
        if not self.model_loaded:
            return False, "model not loaded"
        if not self.assigned:
            return False, "no partitions assigned"
        deps = self.dependencies
        if deps is not None and deps.waiting:
            return False, f"waiting: {deps.describe()}"
        return True, "ok"


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass  # scrapes every 15 s are not news


class _ThreadingWSGIServer(WSGIServer):
    daemon_threads = True

    def process_request(self, request: Any, client_address: Any) -> None:
        threading.Thread(target=self._handle, args=(request, client_address), daemon=True).start()

    def _handle(self, request: Any, client_address: Any) -> None:
        try:
            self.finish_request(request, client_address)
        except Exception:
            self.handle_error(request, client_address)
        finally:
            self.shutdown_request(request)


class MetricsServer:
    """``/metrics``, ``/healthz`` and ``/readyz`` on one port, in a daemon thread."""

    def __init__(self, metrics: Metrics, health: Health, *, port: int, host: str = "0.0.0.0") -> None:
        self.metrics, self.health = metrics, health
        metrics_app = make_wsgi_app(metrics.registry)

        def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
            path = environ.get("PATH_INFO", "/")
            if path in ("/healthz", "/readyz"):
                ok, why = health.live() if path == "/healthz" else health.ready()
                start_response("200 OK" if ok else "503 Service Unavailable",
                               [("Content-Type", "text/plain; charset=utf-8")])
                return [why.encode() + b"\n"]
            return metrics_app(environ, start_response)  # type: ignore[no-any-return]

        self._server = make_server(host, port, app, server_class=_ThreadingWSGIServer, handler_class=_QuietHandler)
        self.port = int(self._server.server_port)
        self._thread = threading.Thread(target=self._server.serve_forever, name="lightbox-metrics", daemon=True)

    def start(self) -> MetricsServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def device_memory_bytes() -> int | None:
    """Bytes CuPy's default memory pool holds for this process (None without CuPy or a device)."""
    try:
        import cupy

        return int(cupy.get_default_memory_pool().used_bytes())
    except Exception:  # no CuPy, no driver, no device
        return None


class Telemetry:
    """The runner's observer (:class:`~agents.runner.RunnerObserver`): feeds :class:`Metrics`,
    :class:`Health` and, when on, :class:`~agents.tracing.Tracing`. Called on the event loop.

    Stage times come from each processed output's own span records (batch-amortized), e2e from
    the input's ``created_at`` to the brokers' acknowledgement, queue wait from consumption to
    the first batched stage. A lane counts as busy from taking a batch to finishing it, so a lane
    stuck inside a stage is "queued without progress" for :meth:`Health.live`."""

    def __init__(self, metrics: Metrics, health: Health, tracing: Tracing | None = None, *,
                 clock_ns: Callable[[], int] = time.monotonic_ns, wall_ms: Callable[[], int] | None = None) -> None:
        self.metrics, self.health, self.tracing = metrics, health, tracing
        self.clock_ns = clock_ns
        self.wall_ms = wall_ms or (lambda: time.time_ns() // 1_000_000)
        self._received: dict[RecordKey, int] = {}
        self._sent: dict[RecordKey, int] = {}
        self._in_hand: dict[str, int] = {}
        self._batches: deque[tuple[RecordKey, ...]] = deque(maxlen=1024)  # batches already observed
        self._batch_set: set[tuple[RecordKey, ...]] = set()

    # -- RunnerObserver ----------------------------------------------------------------------
    def received(self, rec: InRecord) -> None:
        key = (rec.topic, rec.partition, rec.offset)
        self._received[key] = self.clock_ns()
        if self.tracing is not None:
            self.tracing.received(rec.topic, rec.partition, rec.offset, rec.headers or [])

    def lane_progress(self, lane: str, queued: int) -> None:
        n = self._in_hand[lane] = self._in_hand.get(lane, 0) + 1
        self.health.progress(lane, queued + n)

    def batch_done(self, lane: str, size: int, seconds: float) -> None:
        n = self._in_hand[lane] = max(0, self._in_hand.get(lane, 0) - 1)
        self.health.progress(lane, n)

    def in_flight(self, n: int) -> None:
        self.metrics.in_flight.set(n)

    def sending(self, out: OutRecord) -> OutRecord:
        key = _key(out.source)
        self._sent[key] = self.clock_ns()
        if out.spans and out.batch and out.batch not in self._batch_set:
            self._observe_batch(out)
        if self.tracing is None:
            return out
        return dataclasses.replace(out, headers=self.tracing.output_headers(key, out.headers))

    def output_acked(self, out: OutRecord) -> None:
        key = _key(out.source)
        received, sent = self._received.pop(key, None), self._sent.pop(key, None)
        trace_id = self.tracing.trace_id(key) if self.tracing is not None else None
        exemplar = {"trace_id": trace_id} if trace_id else None
        if out.spans:
            self.metrics.observe_spans(out.spans, exemplar)
            first = next((s for s in out.spans if s["stage"] not in PER_ITEM_STAGES), None)
            if first is not None and received is not None and out.origin_ns is not None:
                fetch_us = sum(int(s["duration_us"]) for s in out.spans if s["stage"] == "fetch")
                wait_ns = out.origin_ns + (int(first["start_us"]) - fetch_us) * 1000 - received
                self.metrics.queue_wait_seconds.observe(max(0.0, wait_ns / 1e9), exemplar=exemplar)
        e2e = None if out.created_ms is None else (self.wall_ms() - out.created_ms) / 1000
        self.metrics.observe_output(kind=out.kind, error_code=out.error_code, e2e_s=e2e, exemplar=exemplar)
        if out.kind != "processed":
            log.info("dead letter %s for %s:%d:%d", out.error_code, *key,
                     extra={"code": out.error_code, **({"trace_id": trace_id} if trace_id else {})})
        if self.tracing is not None:
            produce = next((s for s in out.spans if s["stage"] == "produce"), None)
            start = (out.origin_ns + int(produce["start_us"]) * 1000
                     if produce is not None and out.origin_ns is not None else sent)
            self.tracing.stages(key, [s for s in out.spans if s["stage"] != "produce"], out.origin_ns)
            self.tracing.finished(key, outcome="processed" if out.kind == "processed" else "dead_letter",
                                  error_code=out.error_code, produce_start_ns=start)

    # -- from the worker -----------------------------------------------------------------------
    def revoked(self, partitions: Iterable[tuple[str, int]]) -> None:
        """Partitions went away: forget their inputs (their spans end as revoked)."""
        gone = set(partitions)
        keys = [k for k in self._received if (k[0], k[1]) in gone]
        for k in keys:
            self._received.pop(k, None)
            self._sent.pop(k, None)
        if self.tracing is not None:
            self.tracing.forget(keys)

    def _observe_batch(self, out: OutRecord) -> None:
        if len(self._batches) == self._batches.maxlen:
            self._batch_set.discard(self._batches[0])
        self._batches.append(out.batch)
        self._batch_set.add(out.batch)
        batched = [s for s in out.spans if s["stage"] not in PER_ITEM_STAGES]
        for s in batched:
            stage = str(s["stage"]).split(":", 1)[0]
            self.metrics.batch_size.labels("render" if stage == "preset" else stage).observe(
                int(s.get("batch_size") or 1))
        if self.tracing is not None and out.origin_ns is not None:
            self.tracing.batch(out.batch, batched, out.origin_ns)


def _key(rec: InRecord) -> RecordKey:
    return rec.topic, rec.partition, rec.offset
