"""A worker process's observability, wired to Faust: metrics server, health, traces, lag.

:class:`Observability` builds the parts once per process from settings and the standard
``OTEL_*`` variables (:mod:`agents.telemetry`, :mod:`agents.tracing`), then :meth:`attach`
hooks them to the Faust app: readiness follows the partition assignment, consumer lag
(log end offset minus the consumer's position; the backfill tier's consumer too) and device
memory are refreshed every
``REFRESH_S`` seconds, and revoked partitions' open spans are ended.
"""

from __future__ import annotations

import contextlib
import logging
from typing import TYPE_CHECKING, Any

import faust

from agents.dependencies import dependencies
from agents.telemetry import Health, Metrics, MetricsServer, Telemetry, device_memory_bytes
from agents.tracing import Tracing, tracing_from_env
from streams.settings import Settings

if TYPE_CHECKING:
    from agents.backfill import BackfillConsumer

__all__ = ["REFRESH_S", "Observability", "version"]

log = logging.getLogger(__name__)

REFRESH_S = 5.0


def version() -> str:
    """The installed distribution's version (what ``lightbox --version`` prints)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version("lightbox")
    except PackageNotFoundError:
        return "0+unknown"  # running from a checkout without an install


class Observability:
    """Metrics, health and traces of one worker; ``telemetry`` is the runner's observer.
    The HTTP server starts here (a port in use fails now, before the worker joins its group)."""

    def __init__(self, settings: Settings, *, tracing: Tracing | None = None) -> None:
        self.settings = settings
        self.metrics = Metrics()
        self.dependencies = dependencies(settings.runner)  # the brokers and the store, while they are down
        self.health = Health(stall_after_s=settings.observe.health_stall_s, dependencies=self.dependencies)
        self.tracing = tracing if tracing is not None else tracing_from_env(
            group=settings.kafka.group_id, worker_id=settings.worker.worker_id,
            item_stages=settings.observe.trace_item_stages)
        self.telemetry = Telemetry(self.metrics, self.health, self.tracing)
        self.server = None
        if settings.observe.metrics_port:
            try:
                self.server = MetricsServer(self.metrics, self.health, port=settings.observe.metrics_port).start()
            except OSError as exc:
                raise OSError(exc.errno, f"metrics port {settings.observe.metrics_port}: {exc.strerror} (set "
                                         "LIGHTBOX_METRICS_PORT to a free port, one per worker on a host, or 0 "
                                         "for none)") from exc
        self._device = "cpu"
        self._backfill: BackfillConsumer | None = None
        self._backfill_held: set[tuple[str, int]] = set()

    def describe(self, *, device: str, model: str, version: str,
                 backfill: BackfillConsumer | None = None) -> None:
        """What the process runs (the processor is built, so the model is loaded). ``backfill``:
        the backfill tier's consumer, whose lag is exported beside the live one's."""
        self._device = device
        self._backfill = backfill
        self.metrics.set_info(version=version, model=model, device=device)
        self.health.model_loaded = True
        if device != "gpu":
            self.metrics.registry.unregister(self.metrics.device_memory)  # GPU only

    def attach(self, app: faust.App, *, device: str, model: str, version: str,
               backfill: BackfillConsumer | None = None) -> None:
        """:meth:`describe`, and hook to ``app`` (before it starts)."""
        self.describe(device=device, model=model, version=version, backfill=backfill)

        @app.on_partitions_assigned.connect  # type: ignore[arg-type]
        def on_assigned(sender: Any, *args: Any, signal: Any = None, **kwargs: Any) -> None:
            assignment = app.consumer.assignment()
            self.health.assigned = bool(assignment)
            log.info("partitions assigned: %s", _describe(assignment))

        @app.on_partitions_revoked.connect  # type: ignore[arg-type]
        def on_revoked(sender: Any, *args: Any, signal: Any = None, **kwargs: Any) -> None:
            revoked: set[Any] = args[0] if args else kwargs.get("revoked", set())
            self.telemetry.revoked((tp.topic, tp.partition) for tp in revoked)
            for tp in revoked:
                with contextlib.suppress(KeyError):
                    self.metrics.consumer_lag.remove(tp.topic, str(tp.partition))
            log.info("partitions revoked: %s", _describe(revoked))

        @app.timer(REFRESH_S)  # type: ignore[untyped-decorator]
        async def refresh() -> None:
            await self.refresh(app)

    async def refresh(self, app: faust.App) -> None:
        """Consumer lag per assigned partition, and the device memory pool in use."""
        consumer = app.consumer
        for tp in consumer.assignment():
            try:
                end = consumer.highwater(tp)
                pos = await consumer.position(tp)
            except Exception:  # a partition moving away meanwhile; next round
                continue
            if end is not None and pos is not None:
                self.metrics.consumer_lag.labels(tp.topic, str(tp.partition)).set(max(0, end - pos))
        await self.refresh_backfill()

    async def refresh_backfill(self) -> int:
        """The backfill consumer's lag per partition it holds, and the device memory pool in use
        (what a backfill process refreshes itself, with no Faust app); how many partitions it holds."""
        if self._backfill is not None:
            lags = await self._backfill.lag()
            for topic, part in self._backfill_held - lags.keys():  # moved to another worker
                with contextlib.suppress(KeyError):
                    self.metrics.consumer_lag.remove(topic, str(part))
            for (topic, part), n in lags.items():
                self.metrics.consumer_lag.labels(topic, str(part)).set(n)
            self._backfill_held = set(lags)
        if self._device == "gpu" and (used := device_memory_bytes()) is not None:
            self.metrics.device_memory.set(used)
        return len(self._backfill_held)

    def close(self) -> None:
        """Flush spans and stop serving."""
        if self.tracing is not None:
            self.tracing.close()
        if self.server is not None:
            self.server.stop()


def _describe(tps: Any) -> str:
    return ", ".join(sorted(f"{tp.topic}:{tp.partition}" for tp in tps)) or "none"
