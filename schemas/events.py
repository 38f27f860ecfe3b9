"""Codecs for the three lightbox events over one schema store, plus deterministic ids. Pure."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass

from schemas.codec import AvroCodec, FileSchemaStore, SchemaStore, load_schema

__all__ = ["SUBJECTS", "EventCodecs", "dead_letter_id", "processed_event_id"]

#: kind -> (its packaged schema's file stem, its record's full name)
SUBJECTS: dict[str, tuple[str, str]] = {
    "product": ("product_image_event", "io.lightbox.v1.ProductImageEvent"),
    "processed": ("processed_image_event", "io.lightbox.v1.ProcessedImageEvent"),
    "dead_letter": ("dead_letter_event", "io.lightbox.v1.DeadLetterEvent"),
}
#: the subjects of the file store (``schemas/registry.json``): the records' short names
FILE_SUBJECTS = {kind: full.rsplit(".", 1)[-1] for kind, (_, full) in SUBJECTS.items()}

_NS = uuid.UUID("6f1c0b55-8a53-4c52-9a8e-0c6c2f4d7a10")


def processed_event_id(source_event_id: str, pipeline_version: str, model_version: str) -> str:
    """Same source event + same pipeline and model → same output id, on any worker, any replay."""
    return str(uuid.uuid5(_NS, f"processed|{source_event_id}|{pipeline_version}|{model_version}"))


def dead_letter_id(topic: str, partition: int, offset: int, pipeline_version: str) -> str:
    return str(uuid.uuid5(_NS, f"dlq|{topic}|{partition}|{offset}|{pipeline_version}"))


@dataclass(frozen=True)
class EventCodecs:
    store: SchemaStore
    product: AvroCodec
    processed: AvroCodec
    dead_letter: AvroCodec

    @classmethod
    def create(cls, store: SchemaStore | None = None, *, subjects: Mapping[str, str] | None = None) -> EventCodecs:
        """Readers and writers on the schemas this code was built with (``schemas/*.avsc``), each
        registered in (or looked up from) ``store`` under its subject (by kind; the file store's
        subjects by default)."""
        store = store or FileSchemaStore()
        names = {**FILE_SUBJECTS, **(subjects or {})}

        def codec(kind: str) -> AvroCodec:
            own = load_schema(SUBJECTS[kind][0])
            return AvroCodec(store, names[kind], reader_schema=own, writer_schema=own)

        return cls(store, codec("product"), codec("processed"), codec("dead_letter"))
