"""``lightbox schemas register|check`` against a real registry (Apicurio Registry, the session fixture)."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from lightbox.cli import app
from schemas.codec import load_schema
from tests.registry_kit import product_v2

pytestmark = [pytest.mark.registry]

runner = CliRunner()


def _env(registry: Any) -> dict[str, str]:
    tag = uuid.uuid4().hex[:8]
    return {"LIGHTBOX_SCHEMA_REGISTRY_URL": registry.api_url, "LIGHTBOX_INPUT_TOPIC": f"c-{tag}.images",
            "LIGHTBOX_OUTPUT_TOPIC": f"c-{tag}.processed", "LIGHTBOX_DLQ_TOPIC": f"c-{tag}.dlq", "COLUMNS": "200"}


def test_register_then_check_a_producers_next_version(schema_registry: Any, tmp_path: Path) -> None:
    env = _env(schema_registry)
    done = runner.invoke(app, ["schemas", "register"], env=env)
    assert done.exit_code == 0, done.output
    assert "io.lightbox.v1.ProductImageEvent: id" in done.output and ".images-value" in done.output
    assert done.output.count("BACKWARD") == 3, done.output

    good = tmp_path / "v2.avsc"
    good.write_text(json.dumps(product_v2()))
    checked = runner.invoke(app, ["schemas", "check", str(good)], env=env)
    assert checked.exit_code == 0, checked.output
    assert "lightbox reads it, and the registry accepts it" in checked.output

    broken = load_schema("product_image_event")
    broken["fields"] = [f for f in broken["fields"] if f["name"] != "sku"]  # lightbox needs the sku
    broken["fields"].append({"name": "region", "type": "string"})  # and the registry's BACKWARD refuses this
    bad = tmp_path / "bad.avsc"
    bad.write_text(json.dumps(broken))
    refused = runner.invoke(app, ["schemas", "check", str(bad)], env=env)
    assert refused.exit_code == 1, refused.output
    assert "lightbox cannot read records written with it" in refused.output and "sku" in refused.output
    assert "the registry refuses it under" in refused.output


def test_schemas_commands_need_a_registry_url() -> None:
    result = runner.invoke(app, ["schemas", "register"], env={"LIGHTBOX_SCHEMA_REGISTRY_URL": ""})
    assert result.exit_code == 2
    assert "LIGHTBOX_SCHEMA_REGISTRY_URL is not set" in result.output


def test_a_schema_registered_just_before_a_crash_is_kept(schema_registry: Any) -> None:
    """The local registry flushes each registration before answering (H2 without a write delay):
    a schema registered and then SIGKILLed at once is still there after the restart, as a
    producer that got its id must be able to count on."""
    from lightbox.devservers.registry_local import _request

    schema = {"type": "record", "name": f"Crash{uuid.uuid4().hex[:8]}", "fields": [{"name": "a", "type": "int"}]}
    got = _request(f"{schema_registry.api_url}/subjects/crash-{uuid.uuid4().hex[:8]}/versions", "POST",
                   {"schema": json.dumps(schema)})
    assert isinstance(got, dict)
    schema_registry.kill()
    schema_registry.restart()
    kept = _request(f"{schema_registry.api_url}/schemas/ids/{got['id']}")
    assert isinstance(kept, dict) and json.loads(kept["schema"])["name"] == schema["name"]
