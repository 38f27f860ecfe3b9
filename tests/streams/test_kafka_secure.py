"""Kafka over SASL_SSL with SCRAM-SHA-512 on a real broker (`lightbox kafka up --secure`): the worker,
the output producer, `produce`'s producer and `tail`'s consumer all connect; a wrong password and an
untrusted CA each fail at once with one error naming the cause, not a hang and not a retry loop."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaConnectionError
from pydantic import SecretStr

from lightbox.demo import WorkerProcess
from lightbox.devservers.kafka_local import LocalKafka
from lightbox.devservers.kafka_secure import SecureFiles, secure_setup
from streams.consume import read_events, read_records
from streams.producer import ImageProducer
from streams.security import KafkaSecurityError, aiokafka_kwargs
from streams.settings import Settings

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

PRESETS = ["taobao_main", "thumb_webp"]
BOUND_S = 60  # a hang guard, not a speed assertion: each failure below takes about a second


def worker_env(s: Settings, **over: str) -> dict[str, str]:
    env = {"LIGHTBOX_KAFKA_BOOTSTRAP": s.kafka.bootstrap, "LIGHTBOX_GROUP_ID": s.kafka.group_id,
           "LIGHTBOX_INPUT_TOPIC": s.topics.input, "LIGHTBOX_OUTPUT_TOPIC": s.topics.output,
           "LIGHTBOX_DLQ_TOPIC": s.topics.dlq, "LIGHTBOX_BACKFILL_TOPIC": s.topics.backfill,
           "LIGHTBOX_DATA_DIR": str(s.worker.data_dir), "LIGHTBOX_DEVICE": "cpu", "LIGHTBOX_SEGMENTER": "classical",
           "LIGHTBOX_KAFKA_SECURITY_PROTOCOL": s.kafka.security_protocol,
           "LIGHTBOX_KAFKA_SASL_MECHANISM": s.kafka.sasl_mechanism,
           "LIGHTBOX_KAFKA_SASL_USERNAME": s.kafka.sasl_username or "",
           "LIGHTBOX_KAFKA_SASL_PASSWORD_FILE": str(s.kafka.sasl_password_file),
           "LIGHTBOX_KAFKA_SSL_CAFILE": str(s.kafka.ssl_cafile)}
    return {**env, **over}


@pytest.fixture(scope="module")
def other_ca(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CA the secure broker's certificate does not chain to."""
    folder = tmp_path_factory.mktemp("other-ca")
    secure_setup(folder, 1, 2)
    return SecureFiles(folder / "secure").ca


def wrong_password(s: Settings) -> Settings:
    return s.model_copy(update={"kafka_sasl_password_file": None, "kafka_sasl_password": SecretStr("not-it")})


async def read_all(s: Settings, n: int, timeout_s: float) -> list[tuple[str, dict[str, Any]]]:
    out: list[tuple[str, dict[str, Any]]] = []

    async def go() -> None:
        async for item in read_events(s.kafka.bootstrap, [s.topics.output, s.topics.dlq], limit=n,
                                      security=aiokafka_kwargs(s.kafka)):
            out.append(item)

    await asyncio.wait_for(go(), timeout_s)
    return out


def test_end_to_end_over_sasl_ssl(secure_settings: Settings, catalog: list[Path], bad_files: dict[str, Path],
                                  tmp_path: Path) -> None:
    s = secure_settings
    worker = WorkerProcess(worker_env(s), tmp_path / "worker.log").start()
    try:
        async def publish() -> None:
            async with ImageProducer(s.kafka.bootstrap, s.topics.input, security=aiokafka_kwargs(s.kafka)) as prod:
                futs = [await prod.publish(prod.event_for_file(f, presets=PRESETS))
                        for f in [*catalog[:3], bad_files["truncated.jpg"]]]
                await prod.flush(futs)

        asyncio.run(publish())
        got = asyncio.run(read_all(s, 4, 240))
        assert worker.running(), worker.log_tail()
    finally:
        worker.stop()
    assert Counter(kind for kind, _ in got) == {"processed": 3, "dead_letter": 1}, worker.log_tail()
    processed = [ev for kind, ev in got if kind == "processed"]
    assert sorted(ev["sku"] for ev in processed) == sorted(f.stem for f in catalog[:3])
    assert all(len(ev["variants"]) == len(PRESETS) and all(v["size"] > 0 for v in ev["variants"])
               for ev in processed)
    dead = next(ev for kind, ev in got if kind == "dead_letter")
    assert dead["error_code"] == "DECODE_FAILED" and dead["original"]["topic"] == s.topics.input


def test_the_secure_broker_refuses_plaintext(secure_settings: Settings) -> None:
    async def go() -> None:
        prod = AIOKafkaProducer(bootstrap_servers=secure_settings.kafka.bootstrap)  # PLAINTEXT, no credentials
        try:
            await prod.start()
        finally:
            await prod.stop()

    with pytest.raises(KafkaConnectionError):
        asyncio.run(asyncio.wait_for(go(), BOUND_S))


def test_wrong_password_fails_at_once_with_the_cause(secure_settings: Settings) -> None:
    s = wrong_password(secure_settings)

    async def produce() -> None:
        async with ImageProducer(s.kafka.bootstrap, s.topics.input, security=aiokafka_kwargs(s.kafka)):
            pass

    with pytest.raises(KafkaSecurityError, match=r"SASL authentication failed for user 'lightbox'.*SCRAM-SHA-512"):
        asyncio.run(asyncio.wait_for(produce(), BOUND_S))
    with pytest.raises(KafkaSecurityError, match="SASL authentication failed"):
        asyncio.run(read_all(s, 1, BOUND_S))


def test_untrusted_ca_fails_at_once_with_the_cause(secure_settings: Settings, other_ca: Path) -> None:
    s = secure_settings.model_copy(update={"kafka_ssl_cafile": other_ca})
    with pytest.raises(KafkaSecurityError, match="TLS certificate verification failed"):
        asyncio.run(read_all(s, 1, BOUND_S))

    async def produce() -> None:
        async with ImageProducer(s.kafka.bootstrap, s.topics.input, security=aiokafka_kwargs(s.kafka)):
            pass

    with pytest.raises(KafkaSecurityError, match="not signed by a CA in LIGHTBOX_KAFKA_SSL_CAFILE"):
        asyncio.run(asyncio.wait_for(produce(), BOUND_S))


@pytest.mark.parametrize("case", ["wrong password", "untrusted CA"])
def test_a_worker_with_bad_credentials_exits_with_one_clear_line(case: str, secure_settings: Settings,
                                                                other_ca: Path, tmp_path: Path) -> None:
    if case == "wrong password":
        over, expect = {"LIGHTBOX_KAFKA_SASL_PASSWORD_FILE": str(tmp_path / "pw")}, "SASL authentication failed"
        (tmp_path / "pw").write_text("not-it\n")
    else:
        over, expect = {"LIGHTBOX_KAFKA_SSL_CAFILE": str(other_ca)}, "TLS certificate verification failed"
    worker = WorkerProcess(worker_env(secure_settings, **over), tmp_path / "worker.log").start()
    assert worker.proc is not None
    try:
        rc = worker.proc.wait(BOUND_S)
    except subprocess.TimeoutExpired:
        worker.stop()
        pytest.fail(f"the worker kept running with a {case}:\n{worker.log_tail()}")
    log = worker.log_tail()
    assert rc == 2, log
    assert f"kafka security: Kafka at {secure_settings.kafka.bootstrap}" in log and expect in log, log
    assert "Traceback" not in log and "not-it" not in log, log


def test_the_cli_finds_the_secure_local_broker_on_its_own(kafka_secure_broker: LocalKafka, secure_settings: Settings,
                                                          catalog: list[Path], tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """After `lightbox kafka up --secure`, other lightbox commands connect with no exports: protocol,
    user, CA and password file come from the broker's state, as the bootstrap does for a plain one."""
    state = tmp_path / "kafka-local.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("LIGHTBOX_")}
    env["LIGHTBOX_STATE_FILE"] = str(state)
    monkeypatch.setenv("LIGHTBOX_STATE_FILE", str(state))
    kafka_secure_broker.save_state()
    run = subprocess.run([sys.executable, "-m", "lightbox.cli", "produce", str(catalog[0]), str(catalog[1]),
                          "--topic", secure_settings.topics.input, "--presets", "thumb_webp"],
                         env=env, capture_output=True, text=True, timeout=BOUND_S)
    assert run.returncode == 0, run.stdout + run.stderr

    async def count() -> int:
        records = await read_records(secure_settings.kafka.bootstrap, [secure_settings.topics.input],
                                     security=aiokafka_kwargs(secure_settings.kafka))
        return len(records)

    assert asyncio.run(asyncio.wait_for(count(), BOUND_S)) == 2
