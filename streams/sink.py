"""The output producer: processed events and dead letters through one idempotent producer
(acks=all). Kafka I/O only; what to send is decided in :mod:`agents.process`."""

from __future__ import annotations

from collections.abc import Awaitable, Sequence
from typing import Any, Protocol

from aiokafka import AIOKafkaProducer

from streams.security import aiokafka_kwargs, preflight
from streams.settings import Settings

__all__ = ["KafkaSink", "Outgoing"]


class Outgoing(Protocol):
    """What the sink needs of an output record."""

    @property
    def key(self) -> bytes | None: ...
    @property
    def value(self) -> bytes: ...
    @property
    def headers(self) -> Sequence[tuple[str, bytes | None]]: ...


class KafkaSink:
    """Outputs and dead letters through one idempotent producer with acks=all."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.topics = {"processed": settings.output_topic, "dead_letter": settings.dlq_topic}
        self._producer: AIOKafkaProducer | None = None

    async def start(self) -> None:
        await preflight(self.settings.kafka_bootstrap, security := aiokafka_kwargs(self.settings))
        self._producer = AIOKafkaProducer(**security,
            bootstrap_servers=self.settings.kafka_bootstrap, acks="all", enable_idempotence=True,
            linger_ms=5, max_request_size=self.settings.max_image_bytes + (8 << 20),
            client_id=f"lightbox-{self.settings.worker_id}")
        await self._producer.start()

    async def send(self, kind: str, out: Outgoing) -> Awaitable[Any]:
        assert self._producer is not None, "KafkaSink.start() was not called"
        headers = [(k, v or b"") for k, v in out.headers]
        fut: Awaitable[Any] = await self._producer.send(self.topics[kind], out.value, key=out.key, headers=headers)
        return fut

    async def stop(self) -> None:
        if self._producer is not None:
            await self._producer.stop()
