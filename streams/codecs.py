"""lightbox's Avro codecs registered as Faust codecs (``value_serializer="lightbox.processed"``).

The worker's agent itself reads raw bytes and decodes with :mod:`schemas.codec`, so that an
unreadable record becomes a dead letter; these are for other Faust apps that consume or
produce lightbox events (CDN publishers, tools).
"""

from __future__ import annotations

from typing import Any

from faust.serializers import codecs

from schemas.codec import AvroCodec
from schemas.events import EventCodecs
from streams.registry import default_codecs

__all__ = ["FaustAvroCodec", "register_faust_codecs"]


class FaustAvroCodec(codecs.Codec):
    """A Faust codec over one :class:`AvroCodec` (Confluent-framed Avro)."""

    def __init__(self, avro: AvroCodec, **kwargs: Any) -> None:
        self.avro = avro
        super().__init__(**kwargs)

    def _dumps(self, obj: Any) -> bytes:
        return self.avro.encode(obj)

    def _loads(self, s: bytes) -> Any:
        return self.avro.decode(s)


def register_faust_codecs(events: EventCodecs | None = None) -> dict[str, FaustAvroCodec]:
    """Register ``lightbox.product``, ``lightbox.processed`` and ``lightbox.dead_letter``."""
    events = events or default_codecs()
    made = {"lightbox.product": FaustAvroCodec(events.product),
            "lightbox.processed": FaustAvroCodec(events.processed),
            "lightbox.dead_letter": FaustAvroCodec(events.dead_letter)}
    for name, codec in made.items():
        codecs.register(name, codec)
    return made
