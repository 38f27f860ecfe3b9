"""End to end on the real broker and a real S3 (s3proxy): a producer publishes events with s3:// URIs, a
`lightbox worker` process fetches them and writes every variant to the output store before producing,
and a CDN publisher consumes the processed events and downloads each variant by its URI. Then
`lightbox tail --save` downloads the same URIs. `lightbox s3 up|status|down` has its own lifecycle test."""

from __future__ import annotations

import asyncio
import hashlib
import io
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import obstore
import pytest
from PIL import Image
from typer.testing import CliRunner

from gpu_kernels.presets import load_presets
from lightbox.cli import app
from lightbox.demo import WorkerProcess, collect_outputs
from streams.producer import ImageProducer
from streams.settings import Settings
from tests.agents.test_kafka_e2e import worker_env

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

PRESETS = ["jd_main", "thumb_webp"]
FORMATS = {"jpeg": "JPEG", "webp": "WEBP", "png": "PNG"}


async def publish(s: Settings, sources: dict[str, dict[str, Any]]) -> dict[str, str]:
    """One event per named source; returns {event_id: name}."""
    by_id = {}
    async with ImageProducer(s.kafka.bootstrap, s.topics.input) as prod:
        futs = []
        for name, source in sources.items():
            ev = prod.event(source, sku=name, image_id=f"{name}.jpg", presets=PRESETS)
            by_id[ev["event_id"]] = name
            futs.append(await prod.publish(ev))
        await prod.flush(futs)
    return by_id


def test_s3_uris_in_variants_out_to_a_cdn_publisher(settings: Settings, s3_env: Any, catalog: list[Path],
                                                    tmp_path: Path) -> None:
    tag = uuid.uuid4().hex[:8]
    bucket, client = s3_env.bucket, s3_env.client()
    sources: dict[str, dict[str, Any]] = {}
    for i, f in enumerate(catalog[:6]):
        data = f.read_bytes()
        obstore.put(client, f"in-{tag}/{f.name}", data)
        # half the events carry the source's sha256, which the worker checks
        sources[f"SKU-S3-{i}"] = {"uri": f"s3://{bucket}/in-{tag}/{f.name}",
                                  "sha256": hashlib.sha256(data).hexdigest() if i % 2 else None}
    sources["SKU-MISSING"] = {"uri": f"s3://{bucket}/in-{tag}/no-such.jpg", "sha256": None}
    sources["SKU-FOREIGN"] = {"uri": f"s3://someone-elses-bucket/in-{tag}/x.jpg", "sha256": None}

    store_prefix = f"cdn-{tag}"
    env = {**worker_env(settings), **s3_env.env(), "LIGHTBOX_FETCH_ALLOW": f"s3://{bucket}",
           "LIGHTBOX_OUTPUT_STORE": f"s3://{bucket}/{store_prefix}"}
    worker = WorkerProcess(env, tmp_path / "worker.log").start()
    try:
        by_id = asyncio.run(publish(settings, sources))
        processed, dead = asyncio.run(collect_outputs(
            settings.kafka.bootstrap, [settings.topics.output, settings.topics.dlq], len(sources), 300,
            worker.running))
    finally:
        worker.stop()
    assert len(processed) + len(dead) == len(sources), worker.log_tail()
    assert sorted(by_id[d["source_event_id"]] for d in dead) == ["SKU-FOREIGN", "SKU-MISSING"]
    reasons = {by_id[d["source_event_id"]]: (d["error_code"], d["message"].split(":")[0]) for d in dead}
    assert reasons == {"SKU-FOREIGN": ("FETCH_FAILED", "denied"), "SKU-MISSING": ("FETCH_FAILED", "not found")}

    # the CDN publisher: only URIs in the events; download each with its own S3 client, check it all
    presets = load_presets()
    assert sorted(p["sku"] for p in processed) == [f"SKU-S3-{i}" for i in range(6)]
    cdn = s3_env.client()
    for ev in processed:
        assert [v["preset"] for v in ev["variants"]] == PRESETS
        for v in ev["variants"]:
            assert v["data"] is None, "bytes must not travel inline when a store is set"
            prefix = f"s3://{bucket}/{store_prefix}/{ev['sku']}/{v['preset']}/"
            assert v["uri"].startswith(prefix) and v["uri"].endswith(v["sha256"] + ("." + {
                "jpeg": "jpg"}.get(v["format"], v["format"])))
            data = bytes(obstore.get(cdn, v["uri"].removeprefix(f"s3://{bucket}/")).bytes())
            assert hashlib.sha256(data).hexdigest() == v["sha256"] and len(data) == v["size"]
            img = Image.open(io.BytesIO(data))
            assert img.format == FORMATS[v["format"]]
            assert img.size == (v["width"], v["height"]) == (presets[v["preset"]].width, presets[v["preset"]].height)

    # `lightbox tail --save` downloads the same URIs (the output store's bucket is allowed for reading)
    save = tmp_path / "saved"
    tail_env = {**s3_env.env(), "LIGHTBOX_OUTPUT_TOPIC": settings.topics.output,
                "LIGHTBOX_OUTPUT_STORE": f"s3://{bucket}/{store_prefix}", "COLUMNS": "160"}
    old = {k: os.environ.get(k) for k in tail_env}
    os.environ.update(tail_env)  # obstore reads the AWS_* variables from the process environment
    try:
        result = CliRunner().invoke(app, ["tail", "--from-beginning", "-n", str(len(processed)), "--save", str(save),
                                          "--bootstrap", settings.kafka.bootstrap])
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    assert result.exit_code == 0, result.output
    saved = {p.name: p.read_bytes() for p in save.iterdir()}
    assert len(saved) == len(processed) * len(PRESETS)
    for ev in processed:
        for v in ev["variants"]:
            ext = {"jpeg": "jpg"}.get(v["format"], v["format"])
            assert hashlib.sha256(saved[f"{ev['sku']}.{v['preset']}.{ext}"]).hexdigest() == v["sha256"]


def test_s3_up_status_down(tmp_path: Path) -> None:
    env = {**os.environ, "LIGHTBOX_S3_STATE_FILE": str(tmp_path / "state.json"), "COLUMNS": "200"}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "lightbox.cli", "s3", *args], env=env, capture_output=True,
                              text=True, timeout=120)

    up = cli("up", "--bucket", "photos", "--bucket", "variants")
    assert up.returncode == 0, up.stdout + up.stderr
    try:
        exports = dict(line.removeprefix("export ").split("=", 1) for line in up.stdout.splitlines()
                       if line.startswith("export "))
        status = cli("status")
        assert status.returncode == 0 and "running at http://127.0.0.1:" in status.stdout
        from obstore.store import S3Store

        store = S3Store("variants", endpoint=exports["LIGHTBOX_S3_ENDPOINT"],
                        access_key_id=exports["AWS_ACCESS_KEY_ID"],
                        secret_access_key=exports["AWS_SECRET_ACCESS_KEY"], region="us-east-1",
                        client_options={"allow_http": True})
        obstore.put(store, "a/b.txt", b"hello")
        assert bytes(obstore.get(store, "a/b.txt").bytes()) == b"hello"
    finally:
        down = cli("down")
    assert down.returncode == 0 and "stopped s3proxy" in down.stdout
    after = cli("status")
    assert after.returncode == 1 and "not running" in after.stdout
