"""Codecs for the three lightbox events over one schema store, plus deterministic ids. Pure."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from schemas.codec import AvroCodec, FileSchemaStore, load_schema

__all__ = ["EventCodecs", "dead_letter_id", "processed_event_id"]

_NS = uuid.UUID("6f1c0b55-8a53-4c52-9a8e-0c6c2f4d7a10")


def processed_event_id(source_event_id: str, pipeline_version: str, model_version: str) -> str:
    """Same source event + same pipeline and model → same output id, on any worker, any replay."""
    return str(uuid.uuid5(_NS, f"processed|{source_event_id}|{pipeline_version}|{model_version}"))


def dead_letter_id(topic: str, partition: int, offset: int, pipeline_version: str) -> str:
    return str(uuid.uuid5(_NS, f"dlq|{topic}|{partition}|{offset}|{pipeline_version}"))


@dataclass(frozen=True)
class EventCodecs:
    store: FileSchemaStore
    product: AvroCodec
    processed: AvroCodec
    dead_letter: AvroCodec

    @classmethod
    def create(cls, store: FileSchemaStore | None = None) -> EventCodecs:
        """Readers and writers on the schemas this code was built with (``schemas/*.avsc``)."""
        store = store or FileSchemaStore()

        def codec(subject: str, file: str) -> AvroCodec:
            own = load_schema(file)
            return AvroCodec(store, subject, reader_schema=own, writer_schema=own)

        return cls(store,
                   codec("ProductImageEvent", "product_image_event"),
                   codec("ProcessedImageEvent", "processed_image_event"),
                   codec("DeadLetterEvent", "dead_letter_event"))
