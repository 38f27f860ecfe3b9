"""Faults on the wire, through a real fault proxy (Toxiproxy) between a `lightbox worker` and the
servers it talks to: the S3 store blackholed during claim-check writes, the broker link reset
mid-produce, the broker link down and up. Each ends with `lightbox audit`: nothing missing,
duplicates byte-identical, no dead letter the fault caused, the worker still running (it waited:
no fail-stop), and `/readyz` false while the dependency was down and true after.

The longer faults and the measurements (detect time, recovery, memory) are bench/bench_faults.py's.
"""

from __future__ import annotations

import asyncio
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lightbox.devservers.launch import free_port
from streams.settings import Settings
from tests import faultkit as fk

pytestmark = [pytest.mark.kafka, pytest.mark.slow, pytest.mark.faults]

N_IMAGES = 16


@pytest.fixture(scope="module")
def kit(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[Path], dict[str, Path], Path]:
    return fk.make_fault_catalog(tmp_path_factory.mktemp("netfaults"), N_IMAGES)


@pytest.fixture(scope="module")
def proxied_kafka(toxiproxy: Any) -> Iterator[tuple[Any, Any]]:
    """A broker of its own whose PROXIED listener advertises a Toxiproxy port: (broker, proxy).
    Workers bootstrap on ``broker.proxied_bootstrap``; the tests publish and audit directly."""
    from lightbox.devservers.kafka_local import LocalKafka

    port = free_port()
    kafka = LocalKafka.start(proxied_port=port, partitions=4)
    try:
        proxy = toxiproxy.create(f"kafka-{port}", kafka.proxied_upstream, listen=f"127.0.0.1:{port}")
        yield kafka, proxy
    finally:
        kafka.stop()


def _settings(bootstrap: str, tmp_path: Path) -> Settings:
    tag = uuid.uuid4().hex[:8]
    return Settings(kafka_bootstrap=bootstrap, group_id=f"lightbox-net-{tag}", input_topic=f"n-{tag}.images",
                    backfill_topic=f"n-{tag}.backfill", output_topic=f"n-{tag}.processed", dlq_topic=f"n-{tag}.dlq",
                    data_dir=tmp_path / "faust", segmenter="classical", device="cpu")


def _readyz(port: int) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=3) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError as exc:
        return 0, str(exc)


def _plan(good: list[Path], bad: dict[str, Path], prefix: str) -> list[tuple[int | None, fk.Item]]:
    items = fk.images(good, prefix=prefix) + [fk.Item(prefix + i.name, i.path, bad=True) for i in fk.bad_items(bad)
                                               if i.path is not None][:3]
    return fk.spread(items)


def _processed(s: Settings) -> int:
    return sum(r.topic == s.topics.output for r in fk.outputs(s))


def _check(s: Settings, plan: list[tuple[int | None, fk.Item]], worker: fk.Worker, scenario: str,
           notes: dict[str, Any]) -> None:
    rep = fk.audit(s)
    row = fk.Row(scenario).fill(rep)
    row.notes = notes
    row.save()
    images = sum(not it.bad for _, it in plan)
    assert rep.missing == [] and rep.duplicates_identical and rep.conflicts == [], rep.as_dict()
    assert (rep.inputs, rep.processed, rep.dead_letters) == (len(plan), images, len(plan) - images), rep.as_dict()
    assert worker.running(), f"the worker exited instead of waiting:\n{worker.log_tail()}"
    assert "CRITICAL" not in worker.log(), worker.log_tail()


# -- the S3 store blackholed while variants are written out of line ---------------------------------
def test_s3_blackhole_during_claim_check_writes_is_waited_for(kafka_bootstrap: str, s3_server: Any, proxies: Any,
                                                              kit: Any, tmp_path: Path) -> None:
    """Every variant goes to S3 through the proxy. A blackhole (``timeout`` toxic, no end) far
    longer than the store client's retry budget (1 s here): the worker does not exit 70; it pauses
    intake, says not ready, and finishes everything once the link heals."""
    good, bad, presets = kit
    s = _settings(kafka_bootstrap, tmp_path)
    proxy = proxies.create(f"s3-{uuid.uuid4().hex[:6]}", s3_server.endpoint.removeprefix("http://"))
    metrics = free_port()
    env = fk.worker_env(s, presets, output_store=f"s3://{s3_server.bucket}/net-{uuid.uuid4().hex[:6]}",
                        s3_endpoint=f"http://{proxy.address}", store_timeout_s="1", store_retries="0",
                        wait_max_backoff_s="1", metrics_port=str(metrics))
    env.update({"AWS_ACCESS_KEY_ID": s3_server.access_key, "AWS_SECRET_ACCESS_KEY": s3_server.secret_key,
                "AWS_REGION": "us-east-1", "AWS_ALLOW_HTTP": "true"})
    plan = _plan(good, bad, "s3-")
    first, rest = plan[:6], plan[6:]
    w = fk.Worker(env, tmp_path / "w.log").start()
    try:
        placed = asyncio.run(fk.publish(s.kafka.bootstrap, s.topics.input, first))
        fk.wait_for(lambda: _processed(s) >= 2, 180, "2 processed", alive=w.running)
        toxic = proxy.add("timeout", timeout=0)  # a blackhole: bytes go in, nothing comes back
        t_fault = time.monotonic()
        placed += asyncio.run(fk.publish(s.kafka.bootstrap, s.topics.input, rest))
        why = fk.wait_for(lambda: (r := _readyz(metrics))[0] == 503 and "output store" in r[1] and r[1], 120,
                          "/readyz to say the store is down", every_s=0.2, alive=w.running)
        detect_s = time.monotonic() - t_fault
        time.sleep(8)  # many store retry budgets long
        assert w.running(), w.log_tail()
        done_in_fault = _processed(s)
        proxy.remove(toxic)
        t_heal = time.monotonic()
        fk.wait_drained(s, fk.ends_of(placed), 180, alive=w.running)
        drained_s = time.monotonic() - t_heal
        fk.wait_for(lambda: _readyz(metrics)[0] == 200, 30, "/readyz ready again", every_s=0.2)
        _check(s, plan, w, "network: S3 blackhole during claim-check writes", {
            "detect_s": round(detect_s, 1), "heal_to_drained_s": round(drained_s, 1), "readyz_in_fault": why.strip(),
            "processed_during_fault": done_in_fault})
        assert "reachable again" in w.log()
    finally:
        w.stop()


# -- the broker link ----------------------------------------------------------------------------------
def test_broker_link_reset_mid_produce_then_down_and_up(proxied_kafka: Any, kit: Any, tmp_path: Path) -> None:
    """The worker reaches the broker only through the proxy. First every connection is reset as
    outputs are produced (``reset_peer``) for a few seconds; then the link goes down (the proxy
    disabled: connections cut, new ones refused) for longer than the group's session timeout, while
    more inputs arrive. The worker waits and finishes everything after the heal; nothing lost."""
    kafka, proxy = proxied_kafka
    good, bad, presets = kit
    s = _settings(kafka.bootstrap, tmp_path)
    metrics = free_port()
    env = fk.worker_env(s, presets, kafka_bootstrap=kafka.proxied_bootstrap, metrics_port=str(metrics),
                        wait_max_backoff_s="1")
    plan = _plan(good, bad, "k-")
    parts = plan[:6], plan[6:12], plan[12:]
    w = fk.Worker(env, tmp_path / "w.log").start()
    notes: dict[str, Any] = {}
    try:
        placed = asyncio.run(fk.publish(s.kafka.bootstrap, s.topics.input, parts[0]))
        fk.wait_for(lambda: _processed(s) >= 2, 180, "2 processed", alive=w.running)
        # reset mid-produce: every connection the worker has or opens is reset at once
        placed += asyncio.run(fk.publish(s.kafka.bootstrap, s.topics.input, parts[1]))
        toxic = proxy.add("reset_peer", stream="upstream", timeout=0)
        time.sleep(4)
        proxy.remove(toxic)
        fk.wait_drained(s, fk.ends_of(placed), 180, alive=w.running)
        # the link down for longer than the session timeout (6 s), inputs arriving meanwhile
        proxy.disable()
        t_fault = time.monotonic()
        try:
            placed += asyncio.run(fk.publish(s.kafka.bootstrap, s.topics.input, parts[2]))
            why = fk.wait_for(lambda: (r := _readyz(metrics))[0] == 503 and "Kafka brokers" in r[1] and r[1], 30,
                              "/readyz to say the brokers are down", every_s=0.2, alive=w.running)
            notes["detect_s"] = round(time.monotonic() - t_fault, 1)
            notes["readyz_in_fault"] = why.strip()
            time.sleep(max(0.0, 12 - (time.monotonic() - t_fault)))
            assert w.running(), w.log_tail()
        finally:
            proxy.enable()
        t_heal = time.monotonic()
        fk.wait_drained(s, fk.ends_of(placed), 240, alive=w.running)
        notes.update(link_down_s=round(t_heal - t_fault, 1), heal_to_drained_s=round(time.monotonic() - t_heal, 1))
        fk.wait_for(lambda: _readyz(metrics)[0] == 200, 60, "/readyz ready again", every_s=0.2)
        _check(s, plan, w, "network: broker link reset mid-produce, then down 12 s and up", notes)
    finally:
        w.stop()
