"""The settings reference: generated from streams/settings.py, complete, current, secrets masked."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from pydantic import Field

from lightbox import settings_reference as ref
from streams.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
# where a LIGHTBOX_* name in code is something a user or operator may set
PRODUCT_PATHS = ("agents", "blobio", "gpu_kernels", "lightbox", "schemas", "streams", "infra", ".ci", "Makefile")


def test_docs_settings_md_is_generated_from_the_code() -> None:
    on_disk = (ROOT / "docs" / "settings.md").read_text()
    assert on_disk == ref.markdown(), f"docs/settings.md is stale: run `make docs` ({ref.REGENERATE})"


def test_every_setting_has_one_row_with_a_meaning() -> None:
    rows = ref.rows()
    assert [r.variable for r in rows] == ["LIGHTBOX_" + n.upper() for n in Settings.flat_names()]
    assert all(r.meaning and r.type and r.default for r in rows)
    s3 = next(r for r in rows if r.variable == "LIGHTBOX_S3_ENDPOINT")
    assert s3.sections == ("fetch", "store")
    assert next(r for r in rows if r.variable == "LIGHTBOX_MAX_IN_FLIGHT").type == "int, ≥ 1"
    assert next(r for r in rows if r.variable == "LIGHTBOX_DEVICE").type == "auto, cpu or gpu"


def test_a_field_without_a_description_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from streams.settings import TopicSettings

    info = TopicSettings.model_fields["input"]
    monkeypatch.setitem(TopicSettings.model_fields, "input", Field("x"))
    with pytest.raises(ValueError, match=r"topics\.input has no description"):
        ref.rows()
    monkeypatch.setitem(TopicSettings.model_fields, "input", info)
    assert ref.rows()


def test_every_lightbox_variable_the_code_reads_is_in_the_reference() -> None:
    listed = set(re.findall(r"LIGHTBOX_[A-Z0-9_]+", ref.markdown()))
    files = subprocess.run(["git", "ls-files", *PRODUCT_PATHS], cwd=ROOT, capture_output=True, text=True,
                           check=True).stdout.split()
    missing: dict[str, str] = {}
    for name in files:
        path = ROOT / name
        if path.suffix in {".png", ".onnx", ".jar"} or not path.is_file():
            continue
        text = path.read_text(errors="replace")
        for var in re.findall(r"LIGHTBOX_[A-Z0-9_]+", text):
            if var not in listed and not var.endswith("_"):  # a prefix such as LIGHTBOX_KAFKA_SSL_ is no name
                missing.setdefault(var, name)
    assert not missing, f"LIGHTBOX_* variables read but not in docs/settings.md: {missing}"


def test_values_in_effect_mask_secrets_and_say_where_they_came_from() -> None:
    settings = Settings(_env_file=None, kafka_sasl_password="hunter2", kafka_sasl_username="svc",
                        s3_endpoint="https://key:hunter3@s3.example.com", max_in_flight=9)
    environ = {"LIGHTBOX_KAFKA_SASL_PASSWORD": "hunter2", "LIGHTBOX_S3_ENDPOINT": "…"}
    rows = {row.variable: (value, source) for row, value, source in
            ref.in_effect(settings, environ, {"LIGHTBOX_MAX_IN_FLIGHT": "9"})}
    assert rows["LIGHTBOX_KAFKA_SASL_PASSWORD"] == (ref.MASK, "environment")
    assert rows["LIGHTBOX_S3_ENDPOINT"] == ("https://***@s3.example.com", "environment")
    assert rows["LIGHTBOX_MAX_IN_FLIGHT"] == ("9", ".env")
    assert rows["LIGHTBOX_KAFKA_SASL_USERNAME"] == ("svc", "default")  # given as a keyword here
    assert rows["LIGHTBOX_KAFKA_SSL_KEY_PASSWORD"] == ("unset", "default")
    assert "hunter" not in repr(rows)


def _run(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    import os
    import sys

    clean = {k: v for k, v in os.environ.items() if not k.startswith("LIGHTBOX_")}
    env = {**clean, "PYTHONPATH": str(ROOT), "COLUMNS": "250", "LIGHTBOX_STATE_DIR": str(cwd / "state"), **env}
    return subprocess.run([sys.executable, "-m", "lightbox.cli", *args], cwd=cwd, text=True, capture_output=True,
                          env=env, timeout=120, check=False)


def test_lightbox_settings_prints_values_in_effect_and_masks_secrets(tmp_path: Path) -> None:
    (tmp_path / ".env").write_text("LIGHTBOX_MAX_IN_FLIGHT=9\nLIGHTBOX_KAFKA_SSL_KEY_PASSWORD=dotenv-secret\n")
    out = _run(["settings"], {"LIGHTBOX_KAFKA_SASL_PASSWORD": "env-secret",
                              "LIGHTBOX_S3_ENDPOINT": "https://key:url-secret@s3.example.com"}, tmp_path)
    assert out.returncode == 0, out.stderr
    lines = {ln.split()[0]: ln for ln in out.stdout.splitlines() if ln.strip().startswith("LIGHTBOX_")}
    assert set(lines) == {r.variable for r in ref.rows()}
    assert not any(s in out.stdout for s in ("env-secret", "dotenv-secret", "url-secret"))
    assert ref.MASK in lines["LIGHTBOX_KAFKA_SASL_PASSWORD"] and "environment" in lines["LIGHTBOX_KAFKA_SASL_PASSWORD"]
    assert ref.MASK in lines["LIGHTBOX_KAFKA_SSL_KEY_PASSWORD"] and ".env" in lines["LIGHTBOX_KAFKA_SSL_KEY_PASSWORD"]
    assert "https://***@s3.example.com" in lines["LIGHTBOX_S3_ENDPOINT"]
    assert " 9 " in lines["LIGHTBOX_MAX_IN_FLIGHT"] and ".env" in lines["LIGHTBOX_MAX_IN_FLIGHT"]
    changed = _run(["settings", "--changed"], {}, tmp_path)
    assert [ln.split()[0] for ln in changed.stdout.splitlines() if ln.strip().startswith("LIGHTBOX_")] == [
        "LIGHTBOX_KAFKA_SSL_KEY_PASSWORD", "LIGHTBOX_MAX_IN_FLIGHT"]
    assert _run(["settings", "--markdown"], {}, tmp_path).stdout == ref.markdown()


def test_lightbox_settings_names_an_invalid_variable(tmp_path: Path) -> None:
    out = _run(["settings"], {"LIGHTBOX_MAX_IN_FLIGHT": "many"}, tmp_path)
    assert out.returncode == 2
    assert "LIGHTBOX_MAX_IN_FLIGHT" in out.stderr and "integer" in out.stderr
