"""Avro codecs with Confluent framing over a file-backed schema store.

Wire format (what Confluent's serializers and registries read)::

    byte 0      magic, always 0
    bytes 1-4   schema id, big-endian unsigned
    bytes 5-    Avro binary body (no container header)

A reader decodes with the *writer's* schema (looked up by id) resolved to its own reader
schema, so a v1 reader reads records written with a v2 schema that added optional fields.
Every failure to read becomes :class:`~schemas.errors.SchemaInvalid`, never a library error.
"""

from __future__ import annotations

import io
import json
import os
import struct
import tempfile
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any, Protocol

import fastavro
from fastavro.schema import to_parsing_canonical_form

from schemas.errors import SchemaInvalid

__all__ = [
    "MAGIC",
    "AvroCodec",
    "FileSchemaStore",
    "IncompatibleSchema",
    "SchemaStore",
    "check_backward",
    "load_schema",
    "record_name",
    "split_frame",
]

MAGIC = 0
_HEADER = struct.Struct(">bI")

Schema = dict[str, Any]


class IncompatibleSchema(ValueError):
    """A new schema version breaks BACKWARD compatibility (new fields must have defaults)."""


def load_schema(name: str) -> Schema:
    """One of the packaged schemas by file stem, e.g. ``"product_image_event"``."""
    text = resources.files("schemas").joinpath(f"{name}.avsc").read_text()
    return json.loads(text)  # type: ignore[no-any-return]


def _fields(schema: Schema) -> dict[str, Schema]:
    return {f["name"]: f for f in schema.get("fields", [])}


def check_backward(old: Schema, new: Schema) -> None:
    """Raise :class:`IncompatibleSchema` unless a reader on ``new`` reads data written with ``old``.

    The rule kept here is the project's: a new version may only add fields that have a default
    (and may not change the type of an existing one), and an enum may only gain symbols (it must
    carry a ``default`` so that older readers map a new symbol to it). Nested records, also as
    array items, are checked recursively.
    """
    if old.get("name") != new.get("name"):
        raise IncompatibleSchema(f"record renamed {old.get('name')!r} -> {new.get('name')!r}")
    old_f, new_f = _fields(old), _fields(new)
    for name, field in new_f.items():
        if name not in old_f:
            if "default" not in field:
                raise IncompatibleSchema(f"{new['name']}.{name}: a new field needs a default")
            continue
        _check_type(f"{new['name']}.{name}", old_f[name]["type"], field["type"])


def _check_type(where: str, ot: Any, nt: Any) -> None:
    if isinstance(ot, dict) and isinstance(nt, dict) and ot.get("type") == nt.get("type"):
        kind = ot.get("type")
        if kind == "record":
            check_backward(ot, nt)
            return
        if kind == "array":
            _check_type(f"{where}[]", ot["items"], nt["items"])
            return
        if kind == "enum" and ot.get("name") == nt.get("name"):
            gone = [s for s in ot["symbols"] if s not in nt["symbols"]]
            if gone:
                raise IncompatibleSchema(f"{where}: enum symbols removed: {', '.join(gone)}")
            if nt["symbols"] != ot["symbols"] and "default" not in nt:
                raise IncompatibleSchema(f"{where}: an enum that gains symbols needs a default for older readers")
            same = ("symbols", "doc")
            if {k: v for k, v in ot.items() if k not in same} == {k: v for k, v in nt.items() if k not in same}:
                return
    if json.dumps(ot, sort_keys=True) != json.dumps(nt, sort_keys=True):
        raise IncompatibleSchema(f"{where}: type changed from {ot!r} to {nt!r}")


def record_name(parsed: Any) -> str:
    """The full name of a parsed schema's record (``io.lightbox.v1.ProductImageEvent``); a schema that
    is not a named type reads as its type (``"string"``, ``"array"``)."""
    if isinstance(parsed, dict):
        return str(parsed.get("name") or parsed.get("type", "?"))
    return str(parsed) if isinstance(parsed, str) else type(parsed).__name__


class SchemaStore(Protocol):
    """Schema ids ↔ schemas: :class:`FileSchemaStore` (packaged or a folder) or a schema registry
    (``streams.registry.RegistrySchemaStore``). ``schema`` and ``parsed`` raise :class:`SchemaInvalid`
    for an id the store does not know."""

    def schema(self, schema_id: int) -> Schema: ...

    def parsed(self, schema_id: int) -> Any: ...

    def latest(self, subject: str) -> tuple[int, Schema]: ...

    def register(self, subject: str, schema: Schema) -> int: ...


def _canonical(schema: Schema) -> str:
    try:
        return str(to_parsing_canonical_form(fastavro.parse_schema(schema)))
    except fastavro.schema.SchemaParseException as exc:
        raise IncompatibleSchema(f"not a valid Avro schema: {exc}") from exc


class FileSchemaStore:
    """Schema ids ↔ schemas, kept as ``registry.json`` + one ``.avsc`` per id in a folder.

    With ``path=None`` it is the read-only store packaged in ``schemas/`` (ids 1-3 for the
    three v1 events). With a folder, the packaged schemas are copied in on first use and new
    versions can be registered (BACKWARD-checked against the subject's latest version).
    """

    def __init__(self, path: str | Path | None = None) -> None:
        self.path = Path(path) if path else None
        self._parsed: dict[int, Any] = {}
        if self.path is not None and not (self.path / "registry.json").exists():
            self._seed(self.path)
        self._entries = self._read_index()

    def _read_index(self) -> dict[int, Mapping[str, str]]:
        if self.path is None:
            raw = resources.files("schemas").joinpath("registry.json").read_text()
        else:
            raw = (self.path / "registry.json").read_text()
        return {int(k): v for k, v in json.loads(raw).items()}

    def _read_schema(self, entry: Mapping[str, str]) -> Schema:
        if self.path is None:
            return json.loads(resources.files("schemas").joinpath(entry["file"]).read_text())  # type: ignore[no-any-return]
        return json.loads((self.path / entry["file"]).read_text())  # type: ignore[no-any-return]

    @staticmethod
    def _seed(path: Path) -> None:
        path.mkdir(parents=True, exist_ok=True)
        builtin = FileSchemaStore(None)
        for entry in builtin._entries.values():
            (path / entry["file"]).write_text(json.dumps(builtin._read_schema(entry), indent=2))
        _atomic_write(path / "registry.json", json.dumps({str(k): v for k, v in builtin._entries.items()}, indent=2))

    def schema(self, schema_id: int) -> Schema:
        try:
            return self._read_schema(self._entries[schema_id])
        except KeyError:
            self._entries = self._read_index()  # another process may have registered it
            if schema_id not in self._entries:
                raise SchemaInvalid(f"unknown schema id {schema_id}", stage="deserialize") from None
            return self._read_schema(self._entries[schema_id])

    def parsed(self, schema_id: int) -> Any:
        if schema_id not in self._parsed:
            self._parsed[schema_id] = fastavro.parse_schema(self.schema(schema_id))
        return self._parsed[schema_id]

    def latest(self, subject: str) -> tuple[int, Schema]:
        ids = [i for i, e in self._entries.items() if e["subject"] == subject]
        if not ids:
            raise KeyError(f"no schema registered for subject {subject!r}")
        return max(ids), self.schema(max(ids))

    def register(self, subject: str, schema: Schema) -> int:
        """Id of ``schema`` under ``subject``; a new id if it is new and BACKWARD compatible."""
        canon = _canonical(schema)
        versions = sorted(i for i, e in self._entries.items() if e["subject"] == subject)
        for i in versions:
            if _canonical(self.schema(i)) == canon:
                return i
        if self.path is None:
            raise PermissionError("the packaged schema store is read-only; give FileSchemaStore a folder")
        if versions:
            check_backward(self.schema(versions[-1]), schema)
        new_id = max(self._entries, default=0) + 1
        fname = f"{subject}-{new_id}.avsc"
        (self.path / fname).write_text(json.dumps(schema, indent=2))
        self._entries[new_id] = {"subject": subject, "file": fname}
        _atomic_write(self.path / "registry.json",
                      json.dumps({str(k): v for k, v in self._entries.items()}, indent=2))
        return new_id


def _atomic_write(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def split_frame(data: bytes) -> tuple[int, memoryview]:
    """``(schema_id, body)`` of a Confluent-framed message; :class:`SchemaInvalid` otherwise."""
    if not isinstance(data, bytes | bytearray | memoryview):
        raise SchemaInvalid(f"expected bytes, got {type(data).__name__}", stage="deserialize")
    if len(data) < _HEADER.size:
        raise SchemaInvalid(f"record of {len(data)} bytes is shorter than the 5-byte Confluent header",
                            stage="deserialize")
    magic, schema_id = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise SchemaInvalid(f"wrong magic byte {magic:#04x} (expected 0x00): not a Confluent-framed Avro record",
                            stage="deserialize")
    return schema_id, memoryview(data)[_HEADER.size:]


class AvroCodec:
    """Encode/decode one record type (``subject``) with Confluent framing.

    ``encode`` writes with the subject's latest schema in the store (or ``writer_schema``);
    ``decode`` resolves whatever schema id the record carries to ``reader_schema``.
    """

    def __init__(self, store: SchemaStore, subject: str, *,
                 reader_schema: Schema | None = None, writer_schema: Schema | None = None) -> None:
        self.store = store
        self.subject = subject
        if writer_schema is not None:
            self.writer_id = store.register(subject, writer_schema)
        else:
            self.writer_id = store.latest(subject)[0]
        self._writer = store.parsed(self.writer_id)
        reader: Any = fastavro.parse_schema(reader_schema or store.schema(self.writer_id))
        self._reader = reader
        self._reader_name: str = reader["name"]

    @property
    def reader_name(self) -> str:
        """The full name of the record this codec reads (``io.lightbox.v1.ProductImageEvent``)."""
        return self._reader_name

    def encode(self, record: Mapping[str, Any]) -> bytes:
        buf = io.BytesIO()
        buf.write(_HEADER.pack(MAGIC, self.writer_id))
        try:
            fastavro.schemaless_writer(buf, self._writer, record)
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise SchemaInvalid(f"{self.subject}: record does not match schema: {exc}",
                                stage="serialize") from exc
        return buf.getvalue()

    def decode(self, data: bytes) -> dict[str, Any]:
        schema_id, body = split_frame(data)
        writer = self.store.parsed(schema_id)
        if record_name(writer) != self._reader_name:
            raise SchemaInvalid(f"schema id {schema_id} is {record_name(writer)!r}, not {self._reader_name!r}",
                                stage="deserialize")
        try:
            stream = io.BytesIO(body)
            record = fastavro.schemaless_reader(stream, writer, self._reader)
        except Exception as exc:  # fastavro raises many types on corrupt input; all mean the same here
            raise SchemaInvalid(f"{self.subject}: cannot read Avro body with schema id {schema_id}: "
                                f"{type(exc).__name__}: {exc}", stage="deserialize") from exc
        if stream.tell() != len(body):
            raise SchemaInvalid(f"{self.subject}: {len(body) - stream.tell()} trailing bytes after the record",
                                stage="deserialize")
        return record  # type: ignore[return-value]
