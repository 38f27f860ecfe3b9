"""The Faust app factory and topic definitions (imports Faust; not a pure module)."""

from __future__ import annotations

from dataclasses import dataclass

import faust

from streams.settings import Settings

__all__ = ["Topics", "create_app"]


def create_app(settings: Settings) -> faust.App:
    """A Faust app for one worker process. Values travel as raw bytes: the agent decodes them
    itself so that an unreadable record becomes a dead letter instead of a crashed stream."""
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    return faust.App(
        settings.group_id,
        broker=[f"kafka://{h.strip()}" for h in settings.kafka_bootstrap.split(",")],
        value_serializer="raw",
        key_serializer="raw",
        topic_partitions=settings.topic_partitions,
        topic_allow_declare=True,
        datadir=str(settings.data_dir / settings.worker_id),
        store="memory://",
        web_enabled=False,
        producer_acks=-1,
        producer_max_request_size=settings.max_image_bytes + (8 << 20),
        consumer_max_fetch_size=settings.max_image_bytes + (8 << 20),
        consumer_auto_offset_reset="earliest",
        stream_buffer_maxsize=max(8, settings.max_in_flight),
        broker_commit_every=64,
        broker_commit_interval=1.0,
    )


@dataclass(frozen=True)
class Topics:
    input: faust.TopicT
    output: faust.TopicT
    dlq: faust.TopicT

    @classmethod
    def declare(cls, app: faust.App, settings: Settings) -> Topics:
        def topic(name: str) -> faust.TopicT:
            return app.topic(name, value_type=bytes, key_type=bytes, partitions=settings.topic_partitions)

        return cls(topic(settings.input_topic), topic(settings.output_topic), topic(settings.dlq_topic))
