"""Every Kafka client lightbox makes (aiokafka's producer, consumer and admin client), from one
place: the security settings (given, or from ``LIGHTBOX_KAFKA_*``), the preflight that turns a
refused password or an untrusted certificate into one error before the client retries it as an
outage, and the options each role needs (an idempotent producer that waits for every in-sync
replica; a consumer with no group that commits nothing and fetches whole inline images).

Faust's own clients (the worker's live input) are configured in :mod:`streams.app`.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

from streams.security import client_kwargs, preflight, producer_kwargs

__all__ = ["FETCH_BYTES", "admin", "consumer", "new_admin", "new_consumer", "new_producer", "producer",
           "topic_partitions"]

FETCH_BYTES = 64 << 20  # a partition's fetch: whole inline images (the brokers return a larger first record anyway)
REQUEST_BYTES = 48 << 20  # the producer's largest request: an event with inline images


async def new_producer(bootstrap: str, security: Mapping[str, Any] | None = None, **options: Any) -> Any:
    """An ``AIOKafkaProducer`` (not started) after the preflight: acks from every in-sync replica,
    idempotent, a 5 ms linger, requests up to :data:`REQUEST_BYTES` and the batches' compression of
    ``LIGHTBOX_KAFKA_COMPRESSION_TYPE``; ``options`` override."""
    from aiokafka import AIOKafkaProducer

    kw = client_kwargs(security)
    await preflight(bootstrap, kw)
    return AIOKafkaProducer(**kw, **{"bootstrap_servers": bootstrap, "acks": "all", "enable_idempotence": True,
                                     "linger_ms": 5, "max_request_size": REQUEST_BYTES, **producer_kwargs(),
                                     **options})


async def new_consumer(bootstrap: str, *topics: str, security: Mapping[str, Any] | None = None,
                       **options: Any) -> Any:
    """An ``AIOKafkaConsumer`` (not started) after the preflight, subscribed to ``topics`` when given:
    by default no group, nothing committed, from the earliest offset, fetches of
    :data:`FETCH_BYTES` a partition; ``options`` override (a ``group_id``, say)."""
    from aiokafka import AIOKafkaConsumer

    kw = client_kwargs(security)
    await preflight(bootstrap, kw)
    return AIOKafkaConsumer(*topics, **kw, **{"bootstrap_servers": bootstrap, "group_id": None,
                                              "enable_auto_commit": False, "auto_offset_reset": "earliest",
                                              "max_partition_fetch_bytes": FETCH_BYTES,
                                              "fetch_max_bytes": 2 * FETCH_BYTES, **options})


@contextlib.asynccontextmanager
async def producer(bootstrap: str, security: Mapping[str, Any] | None = None, **options: Any) -> AsyncIterator[Any]:
    """:func:`new_producer`, started; stopped (what it holds flushed) on the way out."""
    client = await new_producer(bootstrap, security, **options)
    await client.start()
    try:
        yield client
    finally:
        await client.stop()


@contextlib.asynccontextmanager
async def consumer(bootstrap: str, *topics: str, security: Mapping[str, Any] | None = None,
                   **options: Any) -> AsyncIterator[Any]:
    """:func:`new_consumer`, started; stopped on the way out."""
    client = await new_consumer(bootstrap, *topics, security=security, **options)
    await client.start()
    try:
        yield client
    finally:
        await client.stop()


def new_admin(bootstrap: str, security: Mapping[str, Any] | None = None) -> Any:
    """An ``AIOKafkaAdminClient``, not started and without the preflight (for a caller that
    retries both while the broker starts)."""
    from aiokafka.admin import AIOKafkaAdminClient

    return AIOKafkaAdminClient(**client_kwargs(security), bootstrap_servers=bootstrap)


@contextlib.asynccontextmanager
async def admin(bootstrap: str, security: Mapping[str, Any] | None = None) -> AsyncIterator[Any]:
    """A started ``AIOKafkaAdminClient`` after the preflight; closed on the way out."""
    await preflight(bootstrap, client_kwargs(security))
    client = new_admin(bootstrap, security)
    await client.start()
    try:
        yield client
    finally:
        await client.close()


async def topic_partitions(bootstrap: str, topics: Sequence[str],
                           security: Mapping[str, Any] | None = None) -> dict[str, list[int]]:
    """The partitions of each of ``topics`` that exists, from a fresh metadata request (a missing
    topic is left out)."""
    async with admin(bootstrap, security) as client:
        described = await client.describe_topics(list(topics))
    return {t["topic"]: sorted(int(p["partition"]) for p in t["partitions"]) for t in described
            if t["error_code"] == 0}
