"""Every LIGHTBOX_* environment variable sets its setting (the names operators and manifests use).

The names are listed here, not derived from ``Settings``: renaming or regrouping a field must keep
its environment variable, and this test fails when one stops working.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr, ValidationError

from streams.settings import FLAT, Settings

# (environment variable, the value it is given, what the setting reads then)
ENV: list[tuple[str, str, Any]] = [
    ("LIGHTBOX_KAFKA_BOOTSTRAP", "broker:9093", "broker:9093"),
    ("LIGHTBOX_GROUP_ID", "x-group_id", "x-group_id"),
    ("LIGHTBOX_INPUT_TOPIC", "x-input_topic", "x-input_topic"),
    ("LIGHTBOX_BACKFILL_TOPIC", "x-backfill_topic", "x-backfill_topic"),
    ("LIGHTBOX_OUTPUT_TOPIC", "x-output_topic", "x-output_topic"),
    ("LIGHTBOX_DLQ_TOPIC", "x-dlq_topic", "x-dlq_topic"),
    ("LIGHTBOX_TOPIC_PARTITIONS", "7", 7),
    ("LIGHTBOX_DEVICE", "cpu", "cpu"),
    ("LIGHTBOX_PRESETS_FILE", "/srv/x", Path("/srv/x")),
    ("LIGHTBOX_SCHEMA_STORE", "/srv/x", Path("/srv/x")),
    ("LIGHTBOX_SEGMENTER", "classical", "classical"),
    ("LIGHTBOX_MODEL_PATH", "/srv/x", Path("/srv/x")),
    ("LIGHTBOX_MAX_IMAGE_BYTES", "41943043", 41943043),
    ("LIGHTBOX_MAX_PIXELS", "64000003", 64000003),
    ("LIGHTBOX_MAX_FRAMES", "259", 259),
    ("LIGHTBOX_MAX_SCANS", "259", 259),
    ("LIGHTBOX_DECODE_TIME_BUDGET_S", "5.0", 5.0),
    ("LIGHTBOX_FILE_ROOTS", "/srv/a,/srv/b", [Path("/srv/a"), Path("/srv/b")]),
    ("LIGHTBOX_OUTPUT_DIR", "/srv/x", Path("/srv/x")),
    ("LIGHTBOX_MAX_BATCH", "3", 3),
    ("LIGHTBOX_SLO_MS", "0.5", 0.5),
    ("LIGHTBOX_MAX_WAIT_MS", "0.5", 0.5),
    ("LIGHTBOX_FIXED_BATCH", "3", 3),
    ("LIGHTBOX_MAX_IN_FLIGHT", "67", 67),
    ("LIGHTBOX_MAX_IN_FLIGHT_BYTES", "1048576", 1048576),
    ("LIGHTBOX_MALLOC_ARENAS", "3", 3),
    ("LIGHTBOX_MALLOC_MMAP_THRESHOLD", "1048576", 1048576),
    ("LIGHTBOX_SESSION_TIMEOUT_S", "15.0", 15.0),
    ("LIGHTBOX_WORKER_ID", "w-1", "w-1"),
    ("LIGHTBOX_DATA_DIR", "/srv/x", Path("/srv/x")),
    ("LIGHTBOX_LOG_LEVEL", "INFO", "INFO"),
    ("LIGHTBOX_SEGMENT_RUNTIME", "fp32", "fp32"),
    ("LIGHTBOX_SEGMENT_THREADS", "3", 3),
    ("LIGHTBOX_CUDA_GRAPHS", "true", True),
    ("LIGHTBOX_TOPIC_REPLICATION_FACTOR", "4", 4),
    ("LIGHTBOX_TOPIC_MIN_INSYNC_REPLICAS", "4", 4),
    ("LIGHTBOX_OUTPUT_MAX_MESSAGE_BYTES", "2097152", 2097152),
    ("LIGHTBOX_DELIVERY_TIMEOUT_S", "60.0", 60.0),
    ("LIGHTBOX_SHUTDOWN_TIMEOUT_S", "15.0", 15.0),
    ("LIGHTBOX_STAGE_TIMEOUT_S", "150.0", 150.0),
    ("LIGHTBOX_WAIT_BACKOFF_S", "0.25", 0.25),
    ("LIGHTBOX_WAIT_MAX_BACKOFF_S", "10.0", 10.0),
    ("LIGHTBOX_PREPARE_THREADS", "7", 7),
    ("LIGHTBOX_OUTPUT_THREADS", "5", 5),
    ("LIGHTBOX_DEVICE_THREADS", "3", 3),
    ("LIGHTBOX_KAFKA_SECURITY_PROTOCOL", "SSL", "SSL"),
    ("LIGHTBOX_KAFKA_SASL_MECHANISM", "PLAIN", "PLAIN"),
    ("LIGHTBOX_KAFKA_SASL_USERNAME", "x-kafka_sasl_username", "x-kafka_sasl_username"),
    ("LIGHTBOX_KAFKA_SASL_PASSWORD", "s3cret", "s3cret"),
    ("LIGHTBOX_KAFKA_SASL_PASSWORD_FILE", "/srv/x", Path("/srv/x")),
    ("LIGHTBOX_KAFKA_SSL_CAFILE", "/srv/x", Path("/srv/x")),
    ("LIGHTBOX_KAFKA_SSL_CERTFILE", "/srv/x", Path("/srv/x")),
    ("LIGHTBOX_KAFKA_SSL_KEYFILE", "/srv/x", Path("/srv/x")),
    ("LIGHTBOX_KAFKA_SSL_KEY_PASSWORD", "s3cret", "s3cret"),
    ("LIGHTBOX_KAFKA_ALLOW_PLAIN_OVER_PLAINTEXT", "true", True),
    ("LIGHTBOX_MODEL_SPEC", "x-model_spec", "x-model_spec"),
    ("LIGHTBOX_MODEL_CONFIG_FILE", "/srv/x", Path("/srv/x")),
    ("LIGHTBOX_METRICS_PORT", "9500", 9500),
    ("LIGHTBOX_LOG_FORMAT", "json", "json"),
    ("LIGHTBOX_HEALTH_STALL_S", "30.0", 30.0),
    ("LIGHTBOX_TRACE_ITEM_STAGES", "false", False),
    ("LIGHTBOX_BACKFILL_ENABLED", "false", False),
    ("LIGHTBOX_BACKFILL_MAX_BATCH", "3", 3),
    ("LIGHTBOX_BACKFILL_IN_FLIGHT", "19", 19),
    ("LIGHTBOX_BACKFILL_MAX_LIVE_LAG", "3", 3),
    ("LIGHTBOX_BACKFILL_CHECK_MS", "25.0", 25.0),
    ("LIGHTBOX_BACKFILL_IDLE_MS", "10.0", 10.0),
    ("LIGHTBOX_BACKFILL_BUSY_IN_FLIGHT", "5", 5),
    ("LIGHTBOX_BACKFILL_THREADS", "4", 4),
    ("LIGHTBOX_BACKFILL_NICE", "7", 7),
    ("LIGHTBOX_BACKFILL_PROCESS", "true", True),
    ("LIGHTBOX_BACKFILL_METRICS_PORT", "9500", 9500),
    ("LIGHTBOX_BACKFILL_SCHED_IDLE", "false", False),
    ("LIGHTBOX_BACKFILL_DEVICE_SHARE", "0.25", 0.25),
    ("LIGHTBOX_BACKFILL_FILL_TO", "3", 3),
    ("LIGHTBOX_FETCH_ALLOW", "s3://cat,*.example.com", ["s3://cat", "*.example.com"]),
    ("LIGHTBOX_FETCH_TIMEOUT_S", "15.0", 15.0),
    ("LIGHTBOX_FETCH_CONNECT_TIMEOUT_S", "2.5", 2.5),
    ("LIGHTBOX_FETCH_RETRIES", "6", 6),
    ("LIGHTBOX_FETCH_CA_FILE", "x-fetch_ca_file", "x-fetch_ca_file"),
    ("LIGHTBOX_S3_ENDPOINT", "x-s3_endpoint", "x-s3_endpoint"),
    ("LIGHTBOX_OUTPUT_STORE", "x-output_store", "x-output_store"),
    ("LIGHTBOX_INLINE_MAX_BYTES", "3", 3),
    ("LIGHTBOX_STORE_TIMEOUT_S", "15.0", 15.0),
    ("LIGHTBOX_STORE_RETRIES", "8", 8),
    ("LIGHTBOX_TRITON_URL", "x-triton_url", "x-triton_url"),
    ("LIGHTBOX_TRITON_MODEL", "x-triton_model", "x-triton_model"),
    ("LIGHTBOX_TRITON_TIMEOUT_S", "30.0", 30.0),
    ("LIGHTBOX_KAFKA_COMPRESSION_TYPE", "zstd", "zstd"),
    ("LIGHTBOX_KAFKA_ISOLATION_LEVEL", "read_uncommitted", "read_uncommitted"),
    ("LIGHTBOX_SCHEMA_REGISTRY_URL", "http://registry:8081/apis/ccompat/v7", "http://registry:8081/apis/ccompat/v7"),
    ("LIGHTBOX_SCHEMA_REGISTRY_USER_INFO", "user:pw", "user:pw"),
    ("LIGHTBOX_SCHEMA_REGISTRY_BEARER_TOKEN", "tok", "tok"),
    ("LIGHTBOX_SCHEMA_REGISTRY_BEARER_LOGICAL_CLUSTER", "lsrc-1", "lsrc-1"),
    ("LIGHTBOX_SCHEMA_REGISTRY_CA", "/etc/ca.pem", Path("/etc/ca.pem")),
    ("LIGHTBOX_SCHEMA_REGISTRY_CERTFILE", "/etc/c.pem", Path("/etc/c.pem")),
    ("LIGHTBOX_SCHEMA_REGISTRY_KEYFILE", "/etc/k.pem", Path("/etc/k.pem")),
    ("LIGHTBOX_SCHEMA_REGISTRY_AUTO_REGISTER", "false", False),
    ("LIGHTBOX_SCHEMA_REGISTRY_SUBJECT_STRATEGY", "record", "record"),
    ("LIGHTBOX_SCHEMA_REGISTRY_TIMEOUT_S", "3", 3.0),
]


def _value(settings: Settings, env_name: str) -> Any:
    value = settings.flat(env_name.removeprefix("LIGHTBOX_").lower())
    return value.get_secret_value() if isinstance(value, SecretStr) else value


@pytest.mark.parametrize(("name", "text", "expected"), ENV, ids=[name for name, _, _ in ENV])
def test_each_environment_variable_sets_its_setting(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, name: str,
                                                    text: str, expected: Any) -> None:
    monkeypatch.chdir(tmp_path)  # no .env file of the checkout
    for other, _, _ in ENV:  # nor what the machine running the tests has set
        monkeypatch.delenv(other, raising=False)
    default = _value(Settings(), name)
    assert default != expected, f"{name}: pick a value that differs from the default"
    monkeypatch.setenv(name, text)
    assert _value(Settings(), name) == expected


def test_every_setting_has_its_environment_variable_listed() -> None:
    """A new setting is added to ENV too (so its environment name is pinned from the start)."""
    listed = {name.removeprefix("LIGHTBOX_").lower() for name, _, _ in ENV}
    assert listed == set(Settings.flat_names())


def test_every_section_field_is_reached_by_one_environment_variable() -> None:
    """Each field of each section is set by a name of ENV (LIGHTBOX_S3_ENDPOINT sets two: the
    fetches' and the store's endpoint), and ``flat`` reads the section's field."""
    reached = {(section, field) for section, fields in _routes().items() for field in fields}
    every = {(name, field) for name, info in Settings.model_fields.items()
             for field in info.annotation.model_fields}  # type: ignore[union-attr]
    assert reached == every
    s = Settings(s3_endpoint="http://127.0.0.1:1", max_in_flight=3, kafka_bootstrap="b:1")
    assert (s.fetch.s3_endpoint, s.store.s3_endpoint) == ("http://127.0.0.1:1", "http://127.0.0.1:1")
    assert (s.batching.max_in_flight, s.kafka.bootstrap) == (3, "b:1")
    assert s.flat("max_in_flight") == 3 and FLAT["max_in_flight"] == "batching.max_in_flight"


def _routes() -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for name in Settings.flat_names():
        for section, field in Settings.routes(name):
            out.setdefault(section, set()).add(field)
    return out


def test_flat_keywords_win_over_the_environment_and_unknown_ones_are_refused(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LIGHTBOX_MAX_BATCH", "5")
    monkeypatch.setenv("LIGHTBOX_SLO_MS", "40")
    s = Settings(max_batch=7)
    assert (s.batching.max_batch, s.batching.slo_ms) == (7, 40.0)
    with pytest.raises(ValidationError, match="max_batchh"):
        Settings(max_batchh=7)
    with pytest.raises(ValidationError, match="topic_partitions"):  # the flat name in the message
        Settings(topic_partitions=0)


def test_settings_are_frozen() -> None:
    """Read once: a module cannot change what another one sees."""
    settings = Settings()
    with pytest.raises(ValidationError):
        settings.batching.max_in_flight = 1  # type: ignore[misc]
    with pytest.raises(ValidationError):
        settings.batching = settings.batching  # type: ignore[misc]
    assert settings.model_copy(update={"max_in_flight": 1}).batching.max_in_flight == 1
    assert settings.replace(max_in_flight=2).batching.max_in_flight == 2
    with pytest.raises(ValidationError):  # a copy is validated like the environment
        settings.replace(max_in_flight=0)

