"""lightbox's schema store on a real Confluent-compatible registry (Apicurio Registry, started by the
session fixture), against confluent-kafka's own AvroSerializer and AvroDeserializer."""

from __future__ import annotations

import threading
import uuid
from typing import Any

import pytest
from confluent_kafka.serialization import MessageField, SerializationContext

from schemas.codec import load_schema, split_frame
from schemas.errors import SchemaInvalid
from streams.registry import (
    RegistryRefused,
    RegistryRejected,
    RegistrySchemaStore,
    RegistryUnavailable,
    event_codecs,
)
from streams.settings import SchemaRegistrySettings, Settings
from tests.registry_kit import PRODUCT, basic_auth_gate, deserializer, other_subjects, product_v2, serializer

pytestmark = [pytest.mark.registry]


def _settings(url: str, **more: Any) -> Settings:
    tag = uuid.uuid4().hex[:8]
    return Settings(_env_file=None, schema_registry_url=url, input_topic=f"r-{tag}.images",
                    output_topic=f"r-{tag}.processed", dlq_topic=f"r-{tag}.dlq", **more)


def _event(**more: Any) -> dict[str, Any]:
    return {"event_id": str(uuid.uuid4()), "sku": "SKU-1", "image_id": "a.jpg", "merchant_id": "m",
            "source": {"uri": "https://cdn.example/a.jpg", "sha256": None}, "content_type": "image/jpeg",
            "presets": ["thumb_webp"], "retouch": {"background": "WHITE", "lighting": "AUTO", "segmentation": "AUTO"},
            "priority": 0, "created_at": 1_700_000_000_000, **more}


def test_standard_serializer_events_with_unrelated_ids_are_read_and_outputs_decode_with_the_standard_reader(
        schema_registry: Any) -> None:
    url = schema_registry.api_url
    others = other_subjects(url, tag=uuid.uuid4().hex[:6])
    s = _settings(url)
    codecs = event_codecs(s)
    ids = {codecs.product.writer_id, codecs.processed.writer_id, codecs.dead_letter.writer_id}
    assert len(ids) == 3 and not ids & set(others)
    assert codecs.product.subject == f"{s.topics.input}-value"

    # the producer's own registration (v1 already there: the same id) and a compatible v2 (a new id)
    ctx = SerializationContext(s.topics.input, MessageField.VALUE)
    ev = _event()
    v1 = serializer(url, PRODUCT)(ev, ctx)
    v2 = serializer(url, product_v2())({**ev, "campaign": "spring"}, ctx)
    assert split_frame(v1)[0] == codecs.product.writer_id
    assert split_frame(v2)[0] not in ids | set(others)
    for data in (v1, v2):
        got = codecs.product.decode(data)
        assert got["event_id"] == ev["event_id"] and got["source"] == ev["source"] and "campaign" not in got

    # what lightbox writes, read by the standard deserializer, is what lightbox meant
    read = deserializer(url)
    dead = {"event_id": "d1", "source_event_id": None,
            "original": {"topic": s.topics.input, "partition": 0, "offset": 7, "timestamp_ms": None, "key": b"k",
                         "value": b"\x00junk", "headers": [{"key": "traceparent", "value": b"00-x"}]},
            "error_code": "SCHEMA_INVALID", "message": "unknown schema id 9", "stage": "deserialize", "attempts": 1,
            "worker_id": "w", "failed_at": 1_700_000_000_000}
    encoded = codecs.dead_letter.encode(dead)
    assert read(encoded, SerializationContext(s.topics.dlq, MessageField.VALUE)) == codecs.dead_letter.decode(encoded)
    assert compatibility(schema_registry, codecs.product.subject) == "BACKWARD"


def compatibility(registry: Any, subject: str) -> str:
    from lightbox.devservers.registry_local import _request

    got = _request(f"{registry.api_url}/config/{subject}")
    assert isinstance(got, dict)
    return str(got["compatibilityLevel"])


def test_unknown_id_is_schema_invalid_naming_it_and_another_record_is_refused(schema_registry: Any) -> None:
    url = schema_registry.api_url
    codecs = event_codecs(_settings(url))
    with pytest.raises(SchemaInvalid, match="unknown schema id 987654"):
        codecs.product.decode(b"\x00" + (987654).to_bytes(4, "big") + b"\x02")
    other = other_subjects(url, n=1, tag=uuid.uuid4().hex[:6])[0]
    with pytest.raises(SchemaInvalid, match=rf"schema id {other} is 'com.example\w*.Other0', not "
                                            "'io.lightbox.v1.ProductImageEvent'"):
        codecs.product.decode(b"\x00" + other.to_bytes(4, "big") + b"\x02")


def test_concurrent_misses_of_one_id_make_one_request(schema_registry: Any) -> None:
    s = _settings(schema_registry.api_url)
    wanted = event_codecs(s).processed.writer_id
    store = RegistrySchemaStore(s.schema_registry)
    start = threading.Barrier(8)

    def miss() -> None:
        start.wait()
        store.parsed(wanted)

    threads = [threading.Thread(target=miss) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert store.requests == 1


def test_without_auto_registration_a_missing_schema_refuses_clearly_then_is_looked_up(schema_registry: Any) -> None:
    s = _settings(schema_registry.api_url, schema_registry_auto_register=False)
    with pytest.raises(RegistryRejected, match=r"not registered under subject 'r-\w+\.images-value'.*"
                                               "lightbox schemas register"):
        event_codecs(s)
    registered = event_codecs(s.replace(schema_registry_auto_register=True))
    looked_up = event_codecs(s)
    assert looked_up.product.writer_id == registered.product.writer_id


def test_an_incompatible_schema_is_rejected_with_the_registry_reason(schema_registry: Any) -> None:
    s = _settings(schema_registry.api_url)
    codecs = event_codecs(s)
    broken = load_schema("product_image_event")
    broken["fields"].append({"name": "required_now", "type": "string"})  # no default: breaks BACKWARD
    with pytest.raises(RegistryRejected, match=r"rejected io.lightbox.v1.ProductImageEvent .*HTTP 409"):
        codecs.store.register(codecs.product.subject, broken)


def test_record_name_strategy_names_subjects_by_record(schema_registry: Any) -> None:
    codecs = event_codecs(_settings(schema_registry.api_url, schema_registry_subject_strategy="record"))
    assert codecs.processed.subject == "io.lightbox.v1.ProcessedImageEvent"


def test_an_unreachable_registry_is_retried_and_reported_not_ready(schema_registry: Any) -> None:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # nothing listens here
    store = RegistrySchemaStore(SchemaRegistrySettings(url=f"http://127.0.0.1:{port}", timeout_s=1.0),
                                patience_s=1.0)
    with pytest.raises(RegistryUnavailable, match="stayed unreachable"):
        store.schema(1)
    assert store.requests >= 2  # retried, not failed at once
    ready, why = store.readiness()
    assert not ready and "unreachable" in why


def test_a_refused_password_names_the_credential_and_never_the_secret(schema_registry: Any) -> None:
    with basic_auth_gate(schema_registry.api_url, "lightbox", "right-secret") as gated:
        good = event_codecs(_settings(gated, schema_registry_user_info="lightbox:right-secret"))
        assert good.product.writer_id > 0
        with pytest.raises(RegistryRefused) as refused:
            event_codecs(_settings(gated, schema_registry_user_info="lightbox:wrong-secret"))
    text = str(refused.value)
    assert "LIGHTBOX_SCHEMA_REGISTRY_USER_INFO (user 'lightbox')" in text and "HTTP 401" in text
    assert "secret" not in text
