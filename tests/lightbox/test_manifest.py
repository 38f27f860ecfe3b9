"""Manifests for `lightbox produce`: CSV and JSON Lines rows become events (URIs, presets, options), bad rows
name their line; `produce` publishes manifest rows and bare URIs to a real broker."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from lightbox.cli import app
from streams.producer import ImageProducer, ManifestError, read_manifest, sku_from_uri


def test_csv_manifest_rows(tmp_path: Path) -> None:
    (tmp_path / "local.jpg").write_bytes(b"\xff\xd8\xff")
    m = tmp_path / "catalog.csv"
    m.write_text("sku,uri,presets,background,priority\n"
                 "# a comment line\n"
                 "SKU-1,s3://photos/a/1.jpg,jd_main;thumb_webp,transparent,5\n"
                 "SKU-2,https://cdn.example.com/2.png?v=3,,,\n"
                 "SKU-3,local.jpg,jd_main,,\n")
    rows = list(read_manifest(m))
    assert [r.sku for r in rows] == ["SKU-1", "SKU-2", "SKU-3"]
    assert rows[0].presets == ("jd_main", "thumb_webp") and rows[0].priority == 5 and rows[1].presets is None
    ev = ImageProducer.event_for_row(rows[0], base=tmp_path, presets=["taobao_main"])
    assert ev["source"] == {"uri": "s3://photos/a/1.jpg", "sha256": None} and ev["presets"] == ["jd_main", "thumb_webp"]
    assert ev["retouch"]["background"] == "TRANSPARENT" and ev["priority"] == 5 and ev["image_id"] == "1.jpg"
    ev = ImageProducer.event_for_row(rows[1], base=tmp_path, presets=["taobao_main"])
    assert ev["source"]["uri"] == "https://cdn.example.com/2.png?v=3" and ev["presets"] == ["taobao_main"]
    ev = ImageProducer.event_for_row(rows[2], base=tmp_path, presets=["x"])
    assert ev["source"] == {"data": b"\xff\xd8\xff"}  # a relative path: the file next to the manifest, inline


def test_jsonl_manifest_rows(tmp_path: Path) -> None:
    m = tmp_path / "catalog.jsonl"
    m.write_text(json.dumps({"sku": "A", "uri": "gs://b/a.jpg", "presets": ["jd_main"], "lighting": "off",
                             "sha256": "ab" * 32}) + "\n\n" + json.dumps({"sku": "B", "uri": "az://c/b.webp"}) + "\n")
    a, b = read_manifest(m)
    assert a.presets == ("jd_main",) and a.lighting == "off" and a.sha256 == "ab" * 32 and b.sku == "B"


@pytest.mark.parametrize("text, suffix, where", [
    ("sku,uri\nSKU-1,\n", ".csv", "line 2: no uri"),
    ("uri\ns3://b/k.jpg\n", ".csv", "needs a header"),
    ("sku,uri,colour\nA,s3://b/k,red\n", ".csv", "unknown column"),
    ("sku,uri,priority\nA,s3://b/k,high\n", ".csv", "not an integer"),
    ('{"sku": "A", "uri": "s3://b/k"}\n{not json\n', ".jsonl", "line 2: not JSON"),
    ('["A", "s3://b/k"]\n', ".jsonl", "line 1: expected an object"),
    ('{"uri": "s3://b/k"}\n', ".jsonl", "line 1: no sku"),
])
def test_bad_manifest_rows_name_their_line(tmp_path: Path, text: str, suffix: str, where: str) -> None:
    m = tmp_path / f"m{suffix}"
    m.write_text(text)
    with pytest.raises(ManifestError, match=where):
        list(read_manifest(m))


def test_sku_from_a_bare_uri() -> None:
    assert sku_from_uri("s3://b/dir/SKU-77.jpg") == "SKU-77"
    assert sku_from_uri("https://cdn.example.com/p/SKU%2088.png?x=1") == "SKU 88"


@pytest.mark.kafka
def test_produce_publishes_manifest_rows_and_uris(kafka_bootstrap: str, settings, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    m = tmp_path / "m.csv"
    m.write_text("sku,uri,presets\nSKU-M1,s3://photos/1.jpg,jd_main\nSKU-M2,http://cdn.example.com/2.jpg,\n")
    result = CliRunner().invoke(app, ["produce", "s3://photos/SKU-U.jpg", "--manifest", str(m), "--presets",
                                      "thumb_webp", "--bootstrap", kafka_bootstrap],
                                env={"LIGHTBOX_INPUT_TOPIC": settings.topics.input, "COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert f"published 3 events to {settings.topics.input}" in result.output
    from streams.consume import read_events

    async def read() -> list[dict]:
        return [ev async for _, ev in read_events(kafka_bootstrap, [settings.topics.input], limit=3, idle_s=20)]

    got = {e["sku"]: (e["source"]["uri"], e["presets"]) for e in asyncio.run(read())}
    assert got == {"SKU-U": ("s3://photos/SKU-U.jpg", ["thumb_webp"]), "SKU-M1": ("s3://photos/1.jpg", ["jd_main"]),
                   "SKU-M2": ("http://cdn.example.com/2.jpg", ["thumb_webp"])}


def test_produce_reports_a_bad_manifest(tmp_path: Path) -> None:
    m = tmp_path / "m.csv"
    m.write_text("sku,uri\nA,\n")
    result = CliRunner().invoke(app, ["produce", "--manifest", str(m), "--bootstrap", "127.0.0.1:1"])
    assert result.exit_code == 2 and "line 2: no uri" in result.output
