"""Avro events with Confluent framing over the file-backed schema store."""

from __future__ import annotations

import copy
import struct
import time
from pathlib import Path

import pytest

from schemas.codec import AvroCodec, FileSchemaStore, IncompatibleSchema, load_schema
from schemas.errors import ErrorCode, SchemaInvalid
from schemas.events import EventCodecs, processed_event_id
from streams.producer import ImageProducer


def product_event(**over: object) -> dict:
    ev = ImageProducer.event({"data": b"\xff\xd8jpeg"}, sku="SKU-1", image_id="img-1", presets=["jd_main"])
    ev.update(over)
    return ev


def v2_product_schema() -> dict:
    schema = load_schema("product_image_event")
    schema["fields"].append({"name": "supplier_note", "type": ["null", "string"], "default": None})
    return schema


def test_every_event_round_trips_with_confluent_framing() -> None:
    codecs = EventCodecs.create()
    ev = product_event()
    data = codecs.product.encode(ev)
    assert data[0] == 0 and struct.unpack(">I", data[1:5])[0] == codecs.product.writer_id
    back = codecs.product.decode(data)
    assert back["sku"] == "SKU-1" and back["source"] == {"data": b"\xff\xd8jpeg"}
    assert back["retouch"] == {"background": "WHITE", "lighting": "AUTO", "segmentation": "AUTO"}
    assert int(back["created_at"].timestamp() * 1000) == ev["created_at"]


def test_uri_source_is_the_other_branch_of_the_union() -> None:
    codecs = EventCodecs.create()
    back = codecs.product.decode(codecs.product.encode(product_event(source={"uri": "file:///x.jpg", "sha256": None})))
    assert back["source"] == {"uri": "file:///x.jpg", "sha256": None}


def test_v1_reader_decodes_a_record_written_with_v2(tmp_path: Path) -> None:
    store = FileSchemaStore(tmp_path / "store")
    writer = AvroCodec(store, "ProductImageEvent", writer_schema=v2_product_schema())
    assert writer.writer_id not in (1, 2, 3)  # registered as a new version
    data = writer.encode(product_event(supplier_note="shot on white"))
    reader = EventCodecs.create(FileSchemaStore(tmp_path / "store")).product  # a v1 worker
    back = reader.decode(data)
    assert back["sku"] == "SKU-1" and "supplier_note" not in back


def test_v2_reader_fills_the_default_for_v1_records(tmp_path: Path) -> None:
    store = FileSchemaStore(tmp_path / "store")
    v1_bytes = EventCodecs.create(store).product.encode(product_event())
    v2 = AvroCodec(store, "ProductImageEvent", reader_schema=v2_product_schema(), writer_schema=v2_product_schema())
    assert v2.decode(v1_bytes)["supplier_note"] is None


def test_registering_the_same_schema_twice_gives_the_same_id(tmp_path: Path) -> None:
    store = FileSchemaStore(tmp_path / "store")
    a = store.register("ProductImageEvent", v2_product_schema())
    b = FileSchemaStore(tmp_path / "store").register("ProductImageEvent", v2_product_schema())
    assert a == b


def test_a_new_field_without_default_is_refused(tmp_path: Path) -> None:
    schema = load_schema("product_image_event")
    schema["fields"].append({"name": "mandatory", "type": "string"})
    with pytest.raises(IncompatibleSchema, match="mandatory"):
        FileSchemaStore(tmp_path / "store").register("ProductImageEvent", schema)


def test_changing_a_field_type_is_refused(tmp_path: Path) -> None:
    schema = load_schema("product_image_event")
    next(f for f in schema["fields"] if f["name"] == "priority")["type"] = "long"
    with pytest.raises(IncompatibleSchema, match="priority"):
        FileSchemaStore(tmp_path / "store").register("ProductImageEvent", schema)


@pytest.mark.parametrize("data, reason", [
    (b"", "shorter than the 5-byte"),
    (b"\x01\x00\x00\x00\x01abc", "wrong magic byte"),
    (b"\x00\x00\x00\x03\xe7abc", "unknown schema id 999"),
    (b"\x00\x00\x00\x00\x01\x02", "cannot read Avro body"),
    (b"just some text that is not avro at all", "wrong magic byte"),
])
def test_unreadable_records_are_schema_invalid(data: bytes, reason: str) -> None:
    with pytest.raises(SchemaInvalid, match=reason) as exc:
        EventCodecs.create().product.decode(data)
    assert exc.value.code is ErrorCode.SCHEMA_INVALID


def test_a_record_of_another_event_type_is_schema_invalid() -> None:
    codecs = EventCodecs.create()
    dead = {"event_id": "d", "original": {"topic": "t", "partition": 0, "offset": 1}, "error_code": "TOO_LARGE",
            "message": "m", "stage": "s", "worker_id": "w", "failed_at": int(time.time() * 1000)}
    with pytest.raises(SchemaInvalid, match=r"DeadLetterEvent', not 'io\.lightbox\.v1\.ProductImageEvent'"):
        codecs.product.decode(codecs.dead_letter.encode(dead))


def test_encoding_a_record_that_does_not_match_is_schema_invalid() -> None:
    ev = product_event()
    del ev["sku"]
    with pytest.raises(SchemaInvalid, match="does not match"):
        EventCodecs.create().product.encode(ev)


def test_processed_event_id_is_deterministic_and_versioned() -> None:
    a = processed_event_id("src-1", "0.1.0", "u2netp")
    assert a == processed_event_id("src-1", "0.1.0", "u2netp")
    assert a != processed_event_id("src-1", "0.2.0", "u2netp")
    assert a != processed_event_id("src-2", "0.1.0", "u2netp")


def test_faust_codecs_are_registered_and_round_trip() -> None:
    from faust.serializers import codecs as faust_codecs

    from streams.codecs import register_faust_codecs

    register_faust_codecs()
    ev = product_event()
    data = faust_codecs.dumps("lightbox.product", copy.deepcopy(ev))
    assert data[0] == 0
    assert faust_codecs.loads("lightbox.product", data)["event_id"] == ev["event_id"]


def test_dead_letter_v2_adds_output_too_large_and_v1_readers_fall_back_to_the_default(tmp_path: Path) -> None:
    store = FileSchemaStore()
    latest_id, v2 = store.latest("DeadLetterEvent")
    v1 = store.schema(3)  # the frozen v1
    assert latest_id == 4
    assert "OUTPUT_TOO_LARGE" in next(f for f in v2["fields"] if f["name"] == "error_code")["type"]["symbols"]
    codecs = EventCodecs.create()
    assert codecs.dead_letter.writer_id == 4
    dead = {"event_id": "d", "original": {"topic": "t", "partition": 0, "offset": 1}, "error_code": "OUTPUT_TOO_LARGE",
            "message": "m", "stage": "produce", "worker_id": "w", "failed_at": int(time.time() * 1000)}
    data = codecs.dead_letter.encode(dead)
    assert codecs.dead_letter.decode(data)["error_code"] == "OUTPUT_TOO_LARGE"
    old_reader = AvroCodec(store, "DeadLetterEvent", reader_schema=v1, writer_schema=v1)
    assert old_reader.writer_id == 3
    assert old_reader.decode(data)["error_code"] == "PROCESSING_FAILED"  # the enum's default
    old_bytes = old_reader.encode({**dead, "error_code": "TOO_LARGE"})
    assert codecs.dead_letter.decode(old_bytes)["error_code"] == "TOO_LARGE"
    # a store seeded before v2 existed registers it as a new, BACKWARD-checked version
    old_store = tmp_path / "old"
    FileSchemaStore(old_store)
    assert EventCodecs.create(FileSchemaStore(old_store)).dead_letter.writer_id == 4


def test_an_enum_may_gain_symbols_but_not_lose_them(tmp_path: Path) -> None:
    schema = load_schema("dead_letter_event")
    enum = next(f for f in schema["fields"] if f["name"] == "error_code")["type"]
    store = FileSchemaStore(tmp_path / "store")
    grown = copy.deepcopy(schema)
    next(f for f in grown["fields"] if f["name"] == "error_code")["type"]["symbols"].append("NEW_CODE")
    assert store.register("DeadLetterEvent", grown) > max(FileSchemaStore()._entries)  # a new version
    shrunk = copy.deepcopy(grown)
    next(f for f in shrunk["fields"] if f["name"] == "error_code")["type"]["symbols"].remove("TOO_LARGE")
    with pytest.raises(IncompatibleSchema, match="removed: TOO_LARGE"):
        store.register("DeadLetterEvent", shrunk)
    no_default = copy.deepcopy(grown)
    t = next(f for f in no_default["fields"] if f["name"] == "error_code")["type"]
    t["symbols"].append("ANOTHER")
    del t["default"]
    with pytest.raises(IncompatibleSchema, match="needs a default"):
        store.register("DeadLetterEvent", no_default)
    assert enum["default"] == "PROCESSING_FAILED"
