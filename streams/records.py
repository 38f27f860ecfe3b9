"""How many bytes a Kafka record costs against a topic's ``max.message.bytes``. Pure: no Kafka
client is imported, so the runner and the processor can size records without one."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

__all__ = ["RECORD_OVERHEAD", "Outgoing", "payload_size", "record_size"]

#: Bytes a record costs beyond its key, value and headers: the record batch header (61), the
#: record's own varints and attributes, and a varint pair per header — rounded up generously.
RECORD_OVERHEAD = 256


class Outgoing(Protocol):
    """What a sink needs of an output record."""

    @property
    def kind(self) -> str: ...
    @property
    def key(self) -> bytes | None: ...
    @property
    def value(self) -> bytes: ...
    @property
    def headers(self) -> Sequence[tuple[str, bytes | None]]: ...


def payload_size(value: bytes, key: bytes | None, headers: Sequence[tuple[str, bytes | None]]) -> int:
    """Key, value and headers: what the record carries, without Kafka's framing."""
    return len(value) + len(key or b"") + sum(len(k.encode()) + len(v or b"") for k, v in headers)


def record_size(out: Outgoing) -> int:
    """An upper bound of the bytes ``out`` takes on the wire, alone in its batch, uncompressed."""
    return payload_size(out.value, out.key, out.headers) + RECORD_OVERHEAD
