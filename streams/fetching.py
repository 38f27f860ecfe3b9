"""How the worker's Faust consumer reads the input topic: ``read_committed`` by default, and a
record batch it cannot read is set aside with one clear line instead of crashing the worker.

Kafka producers compress whole batches (gzip, snappy, lz4, zstd: ``compression.type``; librdkafka
and the Java client commonly use lz4, zstd or snappy). aiokafka reads gzip itself and the other
three through ``cramjam`` (a dependency of lightbox). A batch that still cannot be read — a codec
this aiokafka does not know, a corrupt batch — raises inside Faust's fetcher, whose service then
crashes the worker; a restarted worker meets the same batch, so one producer's setting would stop
the whole consumer group. Here the partition holding that batch is paused on this worker and one
line names the topic, partition and offset and what to do; the worker's other partitions go on,
and nothing is committed past the batch (it is read again once the worker restarts with the fix).

``isolation_level`` (``LIGHTBOX_KAFKA_ISOLATION_LEVEL``): ``read_committed`` (the default) never
hands on records of aborted transactions, nor of transactions still open.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

from aiokafka.errors import CorruptRecordException, UnsupportedCodecError
from faust.transport.drivers import aiokafka as faust_aiokafka

__all__ = ["UNREADABLE", "UnreadableBatch", "find_unreadable", "lightbox_transport", "set_aside",
           "taken_before"]

log = logging.getLogger("lightbox.fetch")

#: what a batch that cannot be read raises inside aiokafka's fetcher
UNREADABLE: tuple[type[BaseException], ...] = (UnsupportedCodecError, CorruptRecordException)


class UnreadableBatch:
    """One batch that could not be read: where, why, and what to do."""

    def __init__(self, topic: str, partition: int, offset: int | None, error: BaseException) -> None:
        self.topic, self.partition, self.offset, self.error = topic, partition, offset, error

    def fix(self) -> str:
        if isinstance(self.error, UnsupportedCodecError):
            return ("install the codec's library in the worker's environment (lightbox installs cramjam for snappy, "
                    "lz4 and zstd: `pip install cramjam`) and restart the worker")
        return ("the batch is corrupt: inspect it with Kafka's kafka-dump-log.sh; to skip it, stop the workers and "
                "move the group past it: kafka-consumer-groups.sh --reset-offsets --to-offset N+1")

    def line(self) -> str:
        at = f"offset {self.offset}" if self.offset is not None else "its current position"
        return (f"cannot read the record batch of {self.topic} partition {self.partition} at {at}: "
                f"{_describe(self.error)}. This partition is paused on this worker (its other "
                f"partitions go on; nothing past the batch is committed). Fix: {self.fix()}")


def _describe(exc: BaseException) -> str:
    """``Type: message`` (aiokafka's errors already start their text with their type)."""
    text, name = str(exc), type(exc).__name__
    return text if text.startswith(name) else f"{name}: {text}"


def find_unreadable(fetcher: Any, error: BaseException) -> tuple[Any, int | None] | None:
    """Which partition's fetched data raised ``error`` (and the offset it stopped at), from an aiokafka
    ``Fetcher``'s buffered results: the one whose record iterator ended by raising."""
    records = getattr(fetcher, "_records", {})
    for tp, result in list(records.items()):
        part = getattr(result, "_partition_records", None)
        it = getattr(part, "_records_iterator", None)
        if part is not None and it is not None and getattr(it, "gi_frame", True) is None:
            return tp, getattr(part, "next_fetch_offset", None)
    tp = getattr(error, "tp", None) or _tp_in_message(records, str(error))
    return (tp, None) if tp is not None else None


def _tp_in_message(records: Any, text: str) -> Any:
    for tp in list(records):
        if str(tp) in text:  # "Invalid CRC - TopicPartition(topic=..., partition=...)"
            return tp
    return None


def taken_before(error: BaseException) -> dict[Any, list[Any]]:
    """The records of other partitions that the failed ``fetched_records`` call had already taken
    when ``error`` was raised (aiokafka's fetcher moved their positions past them, and the error
    dropped them): found in that call's frame, so that they are handed on, not lost."""
    tb = error.__traceback__
    while tb is not None:
        frame = tb.tb_frame
        if frame.f_code.co_name == "fetched_records":
            drained = frame.f_locals.get("drained")
            if isinstance(drained, dict):
                return dict(drained)
        tb = tb.tb_next
    return {}


def set_aside(consumer: Any, error: BaseException, reported: set[tuple[str, int, int | None]],
              say: Callable[[str], None] | None = None) -> UnreadableBatch | None:
    """Pause the partition whose batch raised ``error`` on an aiokafka ``consumer``, drop what was
    fetched for it, and say so once per batch. None when the partition cannot be told (then every
    assigned partition is paused: reading on would only meet the batch again)."""
    fetcher = consumer._fetcher
    found = find_unreadable(fetcher, error)
    tps: Iterable[Any] = [found[0]] if found is not None else consumer.assignment()
    for tp in tps:
        fetcher._records.pop(tp, None)
        consumer.pause(tp)
    if found is None:
        (say or log.critical)(f"cannot read a fetched record batch ({_describe(error)}); every "
                              "partition of this worker is paused; restart it once the cause is fixed")
        return None
    tp, offset = found
    batch = UnreadableBatch(tp.topic, tp.partition, offset, error)
    key = (tp.topic, tp.partition, offset)
    if key not in reported:
        reported.add(key)
        (say or log.critical)(batch.line())
    return batch


def lightbox_transport(isolation_level: str = "read_committed") -> type[faust_aiokafka.Transport]:
    """Faust's aiokafka transport whose worker consumer reads with ``isolation_level`` and sets an
    unreadable batch aside (module docstring). Set it on an app before it starts:
    ``app.transport = lightbox_transport()(app.conf.broker_consumer, app)``."""

    class ConsumerThread(faust_aiokafka.AIOKafkaConsumerThread):
        _reported: set[tuple[str, int, int | None]]

        def _create_worker_consumer(self, transport: Any) -> Any:
            consumer = super()._create_worker_consumer(transport)
            # Faust reads read_committed only inside its own transactions (exactly-once); the
            # consumer builds its fetcher, which holds the level, in start(), after this
            consumer._isolation_level = isolation_level
            return consumer

        async def _fetch_records(self, consumer: Any, active_partitions: Any, timeout: float | None = None,
                                 max_records: int | None = None) -> Any:
            try:
                return await super()._fetch_records(consumer, active_partitions, timeout=timeout,
                                                    max_records=max_records)
            except UNREADABLE as exc:
                if not hasattr(self, "_reported"):
                    self._reported = set()
                set_aside(consumer, exc, self._reported)
                return taken_before(exc)  # the other partitions' records the failed call had taken

    class Consumer(faust_aiokafka.Consumer):
        def _new_consumer_thread(self) -> faust_aiokafka.AIOKafkaConsumerThread:
            return ConsumerThread(self, loop=self.loop, beacon=self.beacon)

    class Transport(faust_aiokafka.Transport):
        pass

    Transport.Consumer = Consumer
    return Transport
