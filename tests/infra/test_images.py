"""The container images, built and run: ``make image`` builds ``lightbox:cpu`` and ``lightbox:gpu``
(on local stand-ins for the base images where no registry is reachable), ``make image-test`` runs
this file. Skipped without a Docker engine or without the images.

- the CPU image: at most 1 GB, non-root, health-checked, the model baked in and verified, no build
  CA shipped, ``lightbox doctor`` reporting the image's facts with no network at all;
- the GPU image: the only ONNX Runtime in it is the GPU build, offering the CUDA and TensorRT
  execution providers (true without a GPU: the providers are compiled in);
- the CPU image as a worker against a real local broker (host network, its own metrics port):
  real photos processed, bad files dead-lettered with their codes, ``/healthz`` and Docker's
  health check green, uid 10001, and ``docker stop`` ending it with exit code 0.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import obstore
import pytest

from lightbox.devservers.launch import free_port
from lightbox.samples import BAD_INPUTS
from streams.consume import read_events
from streams.producer import ImageProducer

pytestmark = [pytest.mark.slow]

CPU_IMAGE = os.environ.get("LIGHTBOX_CPU_IMAGE", "lightbox:cpu")
GPU_IMAGE = os.environ.get("LIGHTBOX_GPU_IMAGE", "lightbox:gpu")
MAX_CPU_IMAGE_BYTES = 1_000_000_000
PRESETS = ["taobao_main", "thumb_webp"]


def _docker(*args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout, check=check)


def _image(tag: str) -> dict[str, Any]:
    if shutil.which("docker") is None:
        pytest.skip("no docker client")
    info = _docker("info", "--format", "{{.ServerVersion}}", check=False)
    if info.returncode != 0:
        pytest.skip("no Docker engine running")
    found = _docker("image", "inspect", tag, check=False)
    if found.returncode != 0:
        pytest.skip(f"image {tag} is not built (make image)")
    return dict(json.loads(found.stdout)[0])


@pytest.fixture(scope="module")
def cpu_image() -> dict[str, Any]:
    return _image(CPU_IMAGE)


@pytest.fixture(scope="module")
def gpu_image() -> dict[str, Any]:
    return _image(GPU_IMAGE)


def test_cpu_image_is_small_non_root_and_health_checked(cpu_image: dict[str, Any]) -> None:
    size = int(cpu_image["Size"])
    print(f"{CPU_IMAGE}: {size / 1e6:.0f} MB")
    assert size <= MAX_CPU_IMAGE_BYTES, f"{CPU_IMAGE} is {size / 1e6:.0f} MB, over {MAX_CPU_IMAGE_BYTES / 1e6:.0f}"
    cfg = cpu_image["Config"]
    assert cfg["User"] == "10001"
    assert cfg["Healthcheck"]["Test"][0] == "CMD" and "/healthz" in " ".join(cfg["Healthcheck"]["Test"])
    assert {"9464/tcp", "9465/tcp"} <= set(cfg["ExposedPorts"])
    # no CUDA library in the CPU image, and not the CPU-and-GPU pair of ONNX Runtimes
    listing = _docker("run", "--rm", "--network", "none", "--entrypoint", "python", CPU_IMAGE, "-c",
                      "import importlib.metadata as m, json; "
                      "print(json.dumps(sorted(d.metadata['Name'].lower() for d in m.distributions())))").stdout
    dists = set(json.loads(listing))
    assert "onnxruntime" in dists and "onnxruntime-gpu" not in dists
    assert not {d for d in dists if d.startswith(("nvidia-", "cupy"))}, dists


def test_cpu_image_carries_the_verified_model_and_no_build_ca(cpu_image: dict[str, Any]) -> None:
    """With no network at all, doctor finds the baked-in model (sha256 checked) and the image's facts."""
    run = _docker("run", "--rm", "--network", "none", "-e", "COLUMNS=200", CPU_IMAGE,
                  "doctor", "--bootstrap", "127.0.0.1:1", check=False)
    print(run.stdout)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "lightbox:cpu" in run.stdout and "running as uid 10001" in run.stdout
    assert "u2netp sha256 309c8469" in run.stdout and "verified" in run.stdout
    ca = _docker("run", "--rm", "--network", "none", "--entrypoint", "sh", CPU_IMAGE, "-c",
                 "ls /usr/local/share/ca-certificates/; echo PIP_CERT=${PIP_CERT:-}").stdout
    assert "build-extra.crt" not in ca and "PIP_CERT=\n" in ca + "\n"


def test_gpu_image_has_only_the_gpu_onnxruntime(gpu_image: dict[str, Any]) -> None:
    print(f"{GPU_IMAGE}: {int(gpu_image['Size']) / 1e6:.0f} MB")
    assert gpu_image["Config"]["User"] == "10001"
    probe = _docker("run", "--rm", "--network", "none", "--entrypoint", "python", GPU_IMAGE, "-c",
                    "import importlib.metadata as m, json, onnxruntime as o; print(json.dumps("
                    "{'providers': o.get_available_providers(), 'device': o.get_device(), "
                    "'dists': sorted(d.metadata['Name'].lower() for d in m.distributions())}))")
    got = json.loads(probe.stdout)
    print(got["providers"], got["device"])
    assert {"CUDAExecutionProvider", "TensorrtExecutionProvider"} <= set(got["providers"])
    assert got["device"] == "GPU"
    assert "onnxruntime-gpu" in got["dists"] and "onnxruntime" not in got["dists"]
    assert {"cupy-cuda13x", "nvidia-dali-cuda130"} <= set(got["dists"])


# -- the CPU image as a worker against a real broker -------------------------------------------


@pytest.fixture
def container() -> Iterator[list[str]]:
    names: list[str] = []
    yield names
    for name in names:
        _docker("rm", "-f", name, check=False)


def _free_pair() -> int:
    """A port ``p`` with ``p + 1`` free too (the worker's metrics and its backfill process's)."""
    for _ in range(50):
        p = free_port()
        try:
            import socket

            with socket.socket() as s:
                s.bind(("127.0.0.1", p + 1))
            return p
        except OSError:
            continue
    raise RuntimeError("no two adjacent free ports")


async def _publish(bootstrap: str, topic: str, good: list[Path], bad: dict[str, Path]) -> dict[str, str]:
    """{event_id: what} for every input."""
    sent = {}
    async with ImageProducer(bootstrap, topic) as prod:
        futs = []
        for f in [*good, *bad.values()]:
            ev = prod.event_for_file(f, presets=PRESETS)  # inline: the container sees no host files
            futs.append(await prod.publish(ev))
            sent[ev["event_id"]] = f.name
        for fut in futs:
            await fut
    return sent


async def _outputs(bootstrap: str, topics: list[str]) -> list[tuple[str, dict[str, Any]]]:
    return [x async for x in read_events(bootstrap, topics, idle_s=3.0)]


def _healthz(port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as resp:
            return int(resp.status)
    except OSError:
        return 0


@pytest.mark.kafka
@pytest.mark.timeout(900)
def test_cpu_image_worker_end_to_end(cpu_image: dict[str, Any], kafka_bootstrap: str, catalog: list[Path],
                                     bad_files: dict[str, Path], container: list[str]) -> None:
    tag = uuid.uuid4().hex[:8]
    topics = {"LIGHTBOX_INPUT_TOPIC": f"img-{tag}.images", "LIGHTBOX_OUTPUT_TOPIC": f"img-{tag}.processed",
              "LIGHTBOX_DLQ_TOPIC": f"img-{tag}.dlq", "LIGHTBOX_BACKFILL_TOPIC": f"img-{tag}.backfill"}
    port = _free_pair()
    name = f"lightbox-image-test-{tag}"
    # the model, baked in; fp32 skips the first-start runtime gate (minutes on 2 cores, docs/containers.md)
    env = {**topics, "LIGHTBOX_KAFKA_BOOTSTRAP": kafka_bootstrap, "LIGHTBOX_GROUP_ID": f"img-{tag}",
           "LIGHTBOX_METRICS_PORT": str(port), "LIGHTBOX_SEGMENT_RUNTIME": "fp32"}
    t0 = time.monotonic()
    _docker("run", "-d", "--name", name, "--network", "host",
            *[a for k, v in env.items() for a in ("-e", f"{k}={v}")], CPU_IMAGE, "worker")
    container.append(name)
    good = catalog[:8]
    sent = asyncio.run(_publish(kafka_bootstrap, topics["LIGHTBOX_INPUT_TOPIC"], good, bad_files))
    want_dead = {n: BAD_INPUTS[n] for n in bad_files}

    deadline = time.monotonic() + 420
    processed: list[dict[str, Any]] = []
    dead: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        events = asyncio.run(_outputs(kafka_bootstrap, [topics["LIGHTBOX_OUTPUT_TOPIC"], topics["LIGHTBOX_DLQ_TOPIC"]]))
        processed = [ev for kind, ev in events if kind == "processed"]
        dead = [ev for kind, ev in events if kind == "dead_letter"]
        print(f"{time.monotonic() - t0:.0f} s: {len(processed)} processed, {len(dead)} dead letters")
        if len(processed) + len(dead) >= len(sent):
            break
        state = json.loads(_docker("inspect", name).stdout)[0]["State"]
        assert state["Running"], _docker("logs", "--tail", "60", name).stderr
        time.sleep(3)
    took = time.monotonic() - t0
    print(f"container: {len(processed)} processed, {len(dead)} dead letters of {len(sent)} in {took:.0f} s")
    assert sorted(sent[p["source_event_id"]] for p in processed) == sorted(f.name for f in good)
    got_dead = {sent[d["source_event_id"]]: d["error_code"] for d in dead}
    assert got_dead == want_dead, _docker("logs", "--tail", "60", name).stderr

    assert _healthz(port) == 200
    health = ""
    for _ in range(40):  # the first check runs 15 s after start
        health = json.loads(_docker("inspect", name).stdout)[0]["State"].get("Health", {}).get("Status", "")
        if health == "healthy":
            break
        time.sleep(1)
    assert health == "healthy"
    assert _docker("exec", name, "id", "-u").stdout.strip() == "10001"

    t_stop = time.monotonic()
    _docker("stop", "-t", "30", name, timeout=60)
    stop_s = time.monotonic() - t_stop
    state = json.loads(_docker("inspect", name).stdout)[0]["State"]
    print(f"docker stop took {stop_s:.1f} s, exit code {state['ExitCode']}")
    assert state["ExitCode"] == 0, _docker("logs", "--tail", "40", name).stderr


# -- the compose file's worker service, on this machine's servers ---------------------------------


@pytest.mark.kafka
@pytest.mark.timeout(900)
def test_compose_worker_processes_from_s3_into_s3(cpu_image: dict[str, Any], kafka_bootstrap: str,
                                                  catalog: list[Path], bad_files: dict[str, Path],
                                                  tmp_path: Path) -> None:
    """infra/docker-compose.yml's worker (its env file, fetch allow-list and output store) with
    infra/compose.here.yml: Kafka from `lightbox kafka up`, S3 from `lightbox s3 up` (the images of
    Kafka and the observability services cannot be pulled here)."""
    from obstore.store import S3Store

    from lightbox.devservers.s3_local import LocalS3

    compose = shutil.which("docker-compose")
    if compose is None:
        pytest.skip("docker-compose is not installed (apt-get install docker-compose)")
    tag = uuid.uuid4().hex[:8]
    s3 = LocalS3.start(buckets=("lightbox",))
    project = f"lightbox-it-{tag}"
    root = Path(__file__).resolve().parents[2]
    files = ["-f", str(root / "infra/docker-compose.yml"), "-f", str(root / "infra/compose.here.yml"), "-p", project]
    env_file = tmp_path / "compose.env"
    env_file.write_text(f"AWS_ACCESS_KEY_ID={s3.access_key}\nAWS_SECRET_ACCESS_KEY={s3.secret_key}\n")
    topics = {"LIGHTBOX_INPUT_TOPIC": f"cmp-{tag}.images", "LIGHTBOX_OUTPUT_TOPIC": f"cmp-{tag}.processed",
              "LIGHTBOX_DLQ_TOPIC": f"cmp-{tag}.dlq", "LIGHTBOX_BACKFILL_TOPIC": f"cmp-{tag}.backfill"}
    env = {**os.environ, **topics, "LIGHTBOX_KAFKA_BOOTSTRAP": kafka_bootstrap, "LIGHTBOX_S3_ENDPOINT": s3.endpoint,
           "LIGHTBOX_METRICS_PORT": str(_free_pair()), "LIGHTBOX_GROUP_ID": f"cmp-{tag}",
           "LIGHTBOX_COMPOSE_ENV": str(env_file)}
    bucket = S3Store("lightbox", endpoint=s3.endpoint, access_key_id=s3.access_key,
                     secret_access_key=s3.secret_key, region="us-east-1", client_options={"allow_http": True})
    try:
        good = catalog[8:14]
        for f in good:
            obstore.put(bucket, f"in/{f.name}", f.read_bytes())

        async def publish() -> dict[str, str]:
            sent = {}
            async with ImageProducer(kafka_bootstrap, topics["LIGHTBOX_INPUT_TOPIC"]) as prod:
                futs = []
                for f in good:
                    ev = prod.event({"uri": f"s3://lightbox/in/{f.name}", "sha256": None}, sku=f.stem,
                                    image_id=f.name, presets=PRESETS)
                    futs.append(await prod.publish(ev))
                    sent[ev["event_id"]] = f.name
                for f in bad_files.values():
                    ev = prod.event_for_file(f, presets=PRESETS)
                    futs.append(await prod.publish(ev))
                    sent[ev["event_id"]] = f.name
                for fut in futs:
                    await fut
            return sent

        up = subprocess.run([compose, *files, "up", "-d", "--no-deps", "--no-build", "worker"], env=env,
                            capture_output=True, text=True, timeout=180, check=False)
        assert up.returncode == 0, up.stdout + up.stderr
        sent = asyncio.run(publish())
        deadline = time.monotonic() + 420
        processed: list[dict[str, Any]] = []
        dead: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            events = asyncio.run(_outputs(kafka_bootstrap, [topics["LIGHTBOX_OUTPUT_TOPIC"],
                                                            topics["LIGHTBOX_DLQ_TOPIC"]]))
            processed = [ev for kind, ev in events if kind == "processed"]
            dead = [ev for kind, ev in events if kind == "dead_letter"]
            if len(processed) + len(dead) >= len(sent):
                break
            time.sleep(3)
        logs = subprocess.run([compose, *files, "logs", "--tail", "40", "worker"], env=env, capture_output=True,
                              text=True, timeout=60, check=False).stdout
        variants = [m["path"] for m in obstore.list(bucket, "variants/").collect()]
        print(f"compose: {len(processed)} processed, {len(dead)} dead letters of {len(sent)}; "
              f"{len(variants)} variant objects in s3://lightbox/variants")
        assert sorted(sent[p["source_event_id"]] for p in processed) == sorted(f.name for f in good), logs
        assert {sent[d["source_event_id"]]: d["error_code"] for d in dead} == {n: BAD_INPUTS[n] for n in bad_files}
        assert len(variants) == len(good) * len(PRESETS)
        uris = {v["uri"] for p in processed for v in p["variants"]}
        assert uris == {f"s3://lightbox/{k}" for k in variants}
    finally:
        subprocess.run([compose, *files, "down", "-t", "30"], env=env, capture_output=True, timeout=120, check=False)
        s3.stop()
