"""The output producer: processed events and dead letters through one idempotent producer
(acks=all). Kafka I/O only; what to send is decided in :mod:`agents.process`, when and how
often in :mod:`agents.runner`.

At start the sink reads the output and dead-letter topics' effective ``max.message.bytes``
(``limits``), so the runner never hands it a record the topic would refuse.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Mapping, Sequence
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError, KafkaTimeoutError

from streams.app import max_message_bytes
from streams.clients import new_producer
from streams.records import Outgoing
from streams.security import aiokafka_kwargs, preflight, producer_kwargs
from streams.settings import KafkaSettings, TopicSettings

__all__ = ["KafkaSink"]

class KafkaSink:
    """Outputs and dead letters through one idempotent producer with acks=all."""

    def __init__(self, kafka: KafkaSettings, topics: TopicSettings, *, delivery_timeout_s: float,
                 client_id: str) -> None:
        self.kafka, self.delivery_timeout_s, self.client_id = kafka, delivery_timeout_s, client_id
        self.topics = {"processed": topics.output, "dead_letter": topics.dlq}
        #: the largest record (see :func:`record_size`) each kind's topic accepts; read at start
        self.limits: Mapping[str, int | None] = {kind: None for kind in self.topics}
        self._producer: AIOKafkaProducer | None = None

    async def start(self) -> None:
        await preflight(self.kafka.bootstrap, security := aiokafka_kwargs(self.kafka))
        by_topic = await max_message_bytes(self.kafka, list(self.topics.values()))
        request_max = max(by_topic.values())
        self.limits = {kind: by_topic[topic] for kind, topic in self.topics.items()}
        self._producer = await new_producer(
            self.kafka.bootstrap, security, max_request_size=request_max, **producer_kwargs(self.kafka),
            max_batch_size=min(16384, *by_topic.values()),  # batched small records stay under every limit
            request_timeout_ms=int(min(self.delivery_timeout_s, 30.0) * 1000),
            client_id=self.client_id)
        try:
            await self._producer.start()
        except BaseException:  # brokers unreachable: no half-started client left behind for a retry
            await self._producer.stop()
            self._producer = None
            raise

    async def send_batch(self, records: Sequence[Outgoing]) -> list[BaseException | None]:
        """Hand every record to the producer, then wait once for the brokers' acknowledgements.
        One entry per record: None when acknowledged, else the error."""
        assert self._producer is not None, "KafkaSink.start() was not called"
        pending: list[Awaitable[Any] | BaseException] = []
        for out in records:
            try:
                pending.append(await self._producer.send(
                    self.topics[out.kind], out.value, key=out.key, headers=[(k, v or b"") for k, v in out.headers]))
            except KafkaError as exc:  # refused before it left (too large, producer closed, buffer timeout)
                pending.append(exc)
        futures = [p for p in pending if not isinstance(p, BaseException)]
        acked = iter(await asyncio.gather(*futures, return_exceptions=True))
        results: list[BaseException | None] = []
        for p in pending:
            if isinstance(p, BaseException):
                results.append(p)
            else:
                got = next(acked)
                results.append(got if isinstance(got, BaseException) else None)
        return results

    async def reachable(self, timeout_s: float) -> bool:
        """Whether the brokers answer a metadata request within ``timeout_s``, over the producer's own
        connections (what the outputs need): a link that is down or a blackhole both say no."""
        if self._producer is None:
            return False
        try:
            await asyncio.wait_for(self._producer.client.fetch_all_metadata(), timeout_s)
        except (KafkaError, TimeoutError, OSError):
            return False
        return True

    @staticmethod
    def retriable(exc: BaseException) -> bool:
        """Worth sending again: a timeout or an error Kafka marks retriable (leader moved, broker
        restarting, not enough in-sync replicas). Anything else (fenced, too large, auth) is not."""
        return isinstance(exc, KafkaTimeoutError) or bool(getattr(exc, "retriable", False))

    async def stop(self) -> None:
        if self._producer is not None:
            await self._producer.stop()
