"""Prometheus metrics and health for one worker, served on ``LIGHTBOX_METRICS_PORT``.

One HTTP server (prometheus-client's WSGI app behind the standard library's threaded WSGI
server) answers three paths:

- ``/metrics``: the worker's own registry (OpenMetrics when the scraper asks for it, so
  histogram exemplars carry trace ids);
- ``/healthz``: live while every lane progressed within ``stall_after_s`` or is idle with
  nothing queued; 503 with the stalled lane's name otherwise;
- ``/readyz``: ready once partitions are assigned and the model is loaded.

:class:`Telemetry` is a :class:`~agents.runner.RunnerObserver`: the runner calls it and never
depends on it. Nothing here imports Kafka or Faust.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, make_wsgi_app

__all__ = ["Health", "Metrics", "MetricsServer"]

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
                                            "From consumption to the start of the image's first stage",
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

    def set_info(self, *, version: str, model: str, device: str) -> None:
        self.info.labels(version, model, device).set(1)

    def observe_spans(self, spans: Iterable[Mapping[str, Any]], exemplar: dict[str, str] | None = None) -> None:
        """One output's per-stage spans (``stage``, ``duration_us``, ``batch_size``, ``device``)."""
        for s in spans:
            stage = str(s["stage"]).split(":", 1)[0]
            stage = "render" if stage == "preset" else stage
            size = max(1, int(s.get("batch_size") or 1))
            self.stage_seconds.labels(stage, str(s.get("device") or "cpu")).observe(
                int(s["duration_us"]) / 1e6 / size, exemplar=exemplar)

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

    def progress(self, lane: str, queued: int) -> None:
        self.lanes[lane] = (self.clock(), queued)

    def stalled(self) -> list[str]:
        """Lanes with queued work that made no progress within ``stall_after_s``."""
        now = self.clock()
        return sorted(lane for lane, (at, queued) in dict(self.lanes).items()
                      if queued > 0 and now - at > self.stall_after_s)

    def live(self) -> tuple[bool, str]:
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
