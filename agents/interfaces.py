"""What the runner (:mod:`agents.runner`) talks to, and how it is sized: the processor (the work
of each lane), the sink (where outputs go), the batcher, the observer (metrics and tracing hooks),
:class:`RunnerConfig` and :class:`RunnerStats`. No asyncio, no Kafka: fakes in the unit tests
implement the same protocols.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from agents.batching import Batch
from agents.records import InRecord, OutRecord
from schemas.errors import LightboxError

__all__ = ["Ack", "Batcher", "NullObserver", "OutputSink", "Processor", "RunnerConfig", "RunnerObserver",
           "RunnerStats"]

T_contra = TypeVar("T_contra", contravariant=True)
Ack = Callable[[Any], Awaitable[Any]]  # acknowledges one input to its consumer


class OutputSink(Protocol):
    """Where outputs go (:class:`streams.sink.KafkaSink`; a fake in unit tests)."""

    #: the largest record each kind's topic accepts (None: unknown); valid after ``start``
    limits: Mapping[str, int | None]

    async def start(self) -> None: ...
    async def send_batch(self, records: Sequence[OutRecord]) -> Sequence[BaseException | None]: ...
    def retriable(self, exc: BaseException) -> bool: ...
    async def reachable(self, timeout_s: float) -> bool:
        """Whether the brokers answer now (a small request within ``timeout_s``): the readiness probe."""
        ...
    async def stop(self) -> None: ...


class Processor(Protocol):
    """The work of each lane on a batch; :class:`agents.process.BatchProcessor` is one. ``prepare``
    (one input: fetch, sniff, plan; never raises for an item's own fault: a dead letter instead),
    ``decode`` and ``device`` (a batch's state through the pipeline), ``output`` (records, each
    within ``max_record_bytes``), ``dead_letter`` (the DLQ record of an input and its error)."""

    def prepare(self, rec: InRecord) -> Any: ...  # Prepared | OutRecord
    def decode(self, batch: Sequence[Any]) -> Any: ...
    def device(self, state: Any) -> Any: ...
    def output(self, state: Any, *, max_record_bytes: int | None = None) -> list[OutRecord]: ...
    def dead_letter(self, rec: InRecord, exc: LightboxError, event: dict[str, Any] | None = None) -> OutRecord: ...
    def close(self) -> None: ...


class RunnerObserver(Protocol):
    """Hooks for metrics and tracing; called on the event loop, must be quick and never raise."""

    def received(self, rec: InRecord) -> None: ...
    def batch_done(self, lane: str, size: int, seconds: float) -> None: ...  # failed batches too
    def sending(self, out: OutRecord) -> OutRecord: ...  # just before the send; may return it re-headered
    def output_acked(self, out: OutRecord) -> None: ...  # after the brokers acknowledged it
    def lane_progress(self, lane: str, queued: int) -> None: ...  # a lane took a batch; ``queued`` wait behind
    def in_flight(self, n: int) -> None: ...


class NullObserver:
    """The default :class:`RunnerObserver`: does nothing."""

    def received(self, rec: InRecord) -> None:
        pass

    def batch_done(self, lane: str, size: int, seconds: float) -> None:
        pass

    def sending(self, out: OutRecord) -> OutRecord:
        return out

    def output_acked(self, out: OutRecord) -> None:
        pass

    def lane_progress(self, lane: str, queued: int) -> None:
        pass

    def in_flight(self, n: int) -> None:
        pass


@dataclass(frozen=True, slots=True)
class RunnerConfig:
    """Lane sizes and timeouts. Seconds are on the runner's clock (``delivery_timeout_s``,
    ``stage_timeout_s``) or real time (``watchdog_interval_s``, ``retry_backoff_s``)."""

    max_in_flight: int = 64
    max_in_flight_bytes: int | None = None  # decoded bytes (Prepared.nbytes) past the batcher at once; None: no bound
    prepare_threads: int = 4
    output_threads: int = 2
    device_threads: int = 1  # > 1 only for a model that runs calls side by side (OpenVINO's streams)
    queue_depth: int = 1  # closed batches waiting in front of each of decode, device, output
    delivery_timeout_s: float = 120.0
    stage_timeout_s: float = 300.0
    watchdog_interval_s: float = 1.0
    retry_backoff_s: float = 0.5
    max_send_batch: int = 256
    probe_interval_s: float = 5.0  # how often the brokers are asked whether they answer (readiness)
    probe_timeout_s: float = 5.0  # an answer slower than this counts as none
    backfill_in_flight: int = 16  # backfill-tier inputs held at once, apart from the live tier's max_in_flight
    max_prepare_batch: int = 64  # inputs one prepare call takes
    prepare_linger_s: float = 0.002  # how long a short group waits for more inputs before it goes
    backfill_threads: int = 0  # the backfill tier's own prepare and output threads (0: it shares the live tier's)
    backfill_nice: int = 0  # how much lower those threads' CPU priority is (Linux niceness, per thread)


@dataclass
class RunnerStats:
    processed: int = 0
    dead_letters: int = 0
    batches: int = 0
    batch_items: int = 0
    batch_failures: int = 0
    send_retries: int = 0


class Batcher(Protocol[T_contra]):
    """What the runner drives: :class:`~agents.batching.MicroBatcher`, or :class:`~agents.tiers.TierBatcher`
    for the live and backfill tiers. ``device_done(items)``: a batch left the device lane (done or failed);
    a batcher with a ``device_started(items)`` method is also told when a batch goes onto the device."""

    def add(self, item: Any, shape_class: Hashable, now: float, nbytes: int = 0) -> list[Batch[Any]]: ...
    def poll(self, now: float) -> list[Batch[Any]]: ...
    def next_deadline(self) -> float | None: ...
    def flush(self) -> list[Batch[Any]]: ...
    def record_service(self, batch_size: int, seconds: float) -> None: ...
    def device_done(self, items: Sequence[T_contra]) -> None: ...
