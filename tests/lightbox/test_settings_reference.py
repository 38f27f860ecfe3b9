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
