"""The Faust app factory and topic definitions (imports Faust; not a pure module)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import Any

import faust

from streams.security import aiokafka_kwargs, faust_credentials, preflight
from streams.settings import KafkaSettings, Settings

__all__ = ["create_app", "ensure_topics", "input_topic", "live_lag", "max_message_bytes", "topic_configs"]


def create_app(settings: Settings) -> faust.App:
    """A Faust app for one worker process. Values travel as raw bytes: the agent decodes them
    itself so that an unreadable record becomes a dead letter instead of a crashed stream; an
    unreadable batch pauses its partition (:mod:`streams.fetching`)."""
    from streams.fetching import lightbox_transport

    settings.worker.data_dir.mkdir(parents=True, exist_ok=True)
    app = faust.App(
        settings.kafka.group_id,
        broker=[f"kafka://{h.strip()}" for h in settings.kafka.bootstrap.split(",")],
        value_serializer="raw",
        key_serializer="raw",
        topic_partitions=settings.topics.partitions,
        topic_allow_declare=True,
        datadir=str(settings.worker.data_dir / settings.worker.worker_id),
        store="memory://",
        web_enabled=False,
        producer_acks=-1,
        producer_max_request_size=settings.limits.max_image_bytes + (8 << 20),
        consumer_max_fetch_size=settings.limits.max_image_bytes + (8 << 20),
        consumer_auto_offset_reset="earliest",
        stream_buffer_maxsize=max(8, settings.batching.max_in_flight),
        broker_commit_every=64,
        broker_session_timeout=settings.kafka.session_timeout_s,
        broker_heartbeat_interval=min(3.0, settings.kafka.session_timeout_s / 3),
        broker_commit_interval=1.0,
        broker_credentials=faust_credentials(settings.kafka),
    )
    # the input topic read with kafka_isolation_level; a batch no codec reads pauses its partition
    # with one clear line instead of crashing the worker (streams/fetching.py)
    app.transport = lightbox_transport(settings.kafka.isolation_level)(app.conf.broker_consumer, app)
    return app


def input_topic(app: faust.App, settings: Settings) -> faust.TopicT:
    """The input topic as raw bytes. Outputs and dead letters are sent by the agent's own
    idempotent producer (:class:`streams.sink.KafkaSink`), so they need no Faust topic."""
    return app.topic(settings.topics.input, value_type=bytes, key_type=bytes, partitions=settings.topics.partitions)


def live_lag(app: faust.App, topic: str, handed: dict[Any, int]) -> int:
    """Records of ``topic`` in the brokers past the last offset handed on (``handed``, by
    partition), from the app consumer's last fetch's high water; 0 while nothing is known."""
    consumer = app.consumer
    try:
        assigned = consumer.assignment()
    except Exception:  # not started or rebalancing: nothing known
        return 0
    lag = 0
    for tp in assigned:
        if tp.topic != topic:
            continue
        try:
            high = consumer.highwater(tp)
        except Exception:  # AssertionError: not assigned any more
            continue
        if high is not None:
            lag += max(0, high - handed.get(tp, -1) - 1)
    return lag


async def _admin(kafka: KafkaSettings, timeout_s: float) -> Any:
    """A started admin client; retries the connection for ``timeout_s`` (the broker may be starting)."""
    from aiokafka.errors import KafkaConnectionError

    from streams.clients import new_admin

    security = aiokafka_kwargs(kafka)
    admin = new_admin(kafka.bootstrap, security)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        try:
            await preflight(kafka.bootstrap, security)  # a refused password or CA: fail now
            await admin.start()
            return admin
        except KafkaConnectionError:
            if loop.time() > deadline:
                await admin.close()
                raise
            await asyncio.sleep(1.0)


def topic_configs(settings: Settings, name: str) -> dict[str, str]:
    """The configs lightbox sets on a topic it creates (from settings)."""
    configs = {"min.insync.replicas": str(settings.topics.min_insync_replicas)}
    if name == settings.topics.output and settings.topics.output_max_message_bytes is not None:
        configs["max.message.bytes"] = str(settings.topics.output_max_message_bytes)
    return configs


async def ensure_topics(settings: Settings, *, timeout_s: float = 30.0) -> list[str]:
    """Create lightbox's four topics if missing (before Faust subscribes: Faust ignores a topic
    that does not exist yet), with the replication factor, ``min.insync.replicas`` and the output
    topic's ``max.message.bytes`` from settings. Returns the names it created. Existing topics
    are left as they are (change them with Kafka's own tools)."""
    from aiokafka.admin import NewTopic
    from aiokafka.errors import TopicAlreadyExistsError

    names = [settings.topics.input, settings.topics.backfill, settings.topics.output, settings.topics.dlq]
    admin = await _admin(settings.kafka, timeout_s)
    try:
        existing = set(await admin.list_topics())
        missing = [n for n in names if n not in existing]
        if missing:
            with contextlib.suppress(TopicAlreadyExistsError):  # another worker won the race
                await admin.create_topics([
                    NewTopic(n, settings.topics.partitions, settings.topics.replication_factor,
                             topic_configs=topic_configs(settings, n)) for n in missing])
        return missing
    finally:
        await admin.close()


async def max_message_bytes(kafka: KafkaSettings, topics: Sequence[str], *, timeout_s: float = 30.0) -> dict[str, int]:
    """Each topic's effective ``max.message.bytes`` (its own or the broker's default), by name."""
    from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

    admin = await _admin(kafka, timeout_s)
    try:
        responses = await admin.describe_configs(
            [ConfigResource(ConfigResourceType.TOPIC, t, {"max.message.bytes": None}) for t in topics])
    finally:
        await admin.close()
    found: dict[str, int] = {}
    for resp in responses:
        for error_code, error_message, _type, name, entries, *_ in resp.resources:
            if error_code:
                raise RuntimeError(f"describe_configs({name!r}) failed: error {error_code} {error_message}")
            for entry in entries:
                if entry[0] == "max.message.bytes" and entry[1] is not None:
                    found[name] = int(entry[1])
    missing = [t for t in topics if t not in found]
    if missing:
        raise RuntimeError(f"describe_configs gave no max.message.bytes for {missing}")
    return found
