"""`lightbox process`: the pipeline offline (no Kafka), variants and results.jsonl on disk."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest
from PIL import Image
from typer.testing import CliRunner

from agents.wiring import build_processor
from gpu_kernels.segment.machine import openvino_available
from lightbox.cli import app
from lightbox.offline import OUTPUT_THREADS, LanePipeline, process_files, unique_skus
from lightbox.samples import BAD_INPUTS
from streams.settings import Settings

runner = CliRunner()


def test_unique_skus_never_collide() -> None:
    files = [Path("a/x.jpg"), Path("b/x.png"), Path("c/y.jpg"), Path("d/x.webp")]
    assert unique_skus(files) == ["x", "x-2", "y", "x-3"]


def test_process_files_writes_variants_and_one_line_per_input(catalog: list[Path], bad_files: dict[str, Path],
                                                              tmp_path: Path) -> None:
    files = [*catalog[:5], *sorted(bad_files.values())]
    processor = build_processor(Settings(segmenter="classical", device="cpu"))
    seen: list[str] = []
    summary = process_files(files, processor, tmp_path / "out", presets=["taobao_main", "thumb_webp"], batch_size=2,
                            on_result=lambda r: seen.append(r.line["status"]))
    lines = [json.loads(s) for s in (tmp_path / "out" / "results.jsonl").read_text().splitlines()]
    assert len(lines) == len(files) == len(seen)
    assert {ln["path"] for ln in lines} == {str(f) for f in files}
    by_name = {Path(ln["path"]).name: ln for ln in lines}
    for name, code in BAD_INPUTS.items():
        ln = by_name[name]
        assert ln["status"] == "dead_letter" and ln["error_code"] == code, ln
        assert ln["stage"] and ln["message"]
    for f in catalog[:5]:
        ln = by_name[f.name]
        assert ln["status"] == "ok", ln
        assert [v["preset"] for v in ln["variants"]] == ["taobao_main", "thumb_webp"]
        for v in ln["variants"]:
            with Image.open(v["path"]) as im:  # the file on disk is the variant the event describes
                assert im.size == (v["width"], v["height"])
                assert im.format == {"jpeg": "JPEG", "webp": "WEBP"}[v["format"]]
            assert Path(v["path"]).stat().st_size == v["size"]
        assert ln["stages_ms"]["segment"] > 0 and ln["latency_ms"] > 0
    assert summary.dead_letters == len(BAD_INPUTS)
    assert len(summary.processed) == 5 and all(v["data"] is None for e in summary.processed for v in e["variants"])


def test_process_keep_background_and_lighting_off(catalog: list[Path], tmp_path: Path) -> None:
    processor = build_processor(Settings(segmenter="none", device="cpu"))
    summary = process_files(catalog[:2], processor, tmp_path, presets=["jd_main"], background="keep",
                            lighting="off")
    assert [r.ok for r in summary.results] == [True, True]
    assert all("segment" not in r.line["stages_ms"] for r in summary.results)


def test_cli_process_reports_dead_letters_and_the_stage_table(catalog: list[Path], bad_files: dict[str, Path],
                                                              tmp_path: Path) -> None:
    out = tmp_path / "cli"
    result = runner.invoke(app, ["process", str(catalog[0]), str(bad_files["truncated.jpg"]), "--out", str(out),
                                 "--presets", "jd_main", "--segmenter", "classical", "--device", "cpu"],
                           env={"COLUMNS": "200"})
    assert result.exit_code == 1, result.output  # one input became a dead letter
    assert "stage latency over 1 processed images" in result.output
    assert "DECODE_FAILED" in result.output
    assert (out / f"{catalog[0].stem}.jd_main.jpg").is_file()
    assert len((out / "results.jsonl").read_text().splitlines()) == 2


def test_cli_process_refuses_a_missing_path(tmp_path: Path) -> None:
    result = runner.invoke(app, ["process", "/no/such/folder", "--out", str(tmp_path)])
    assert result.exit_code == 2 and "/no/such/folder" in result.output


@pytest.mark.skipif(not openvino_available(), reason="needs the 'openvino' package")
def test_cli_process_says_why_a_model_cannot_load_without_a_traceback(catalog: list[Path], tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A model file that is missing, or that the runtime cannot load (OpenVINO compiles at start-up,
    when the model is told how many threads will call it), ends ``process`` with the reason and
    exit 2 before any image is read."""
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a model")
    monkeypatch.setenv("LIGHTBOX_SEGMENT_RUNTIME", "openvino-f32")
    monkeypatch.setenv("LIGHTBOX_MODEL_DIR", str(tmp_path / "models"))
    for model, why in ((bad, "OpenVINO cannot load model"), (tmp_path / "missing.onnx", "does not exist")):
        monkeypatch.setenv("LIGHTBOX_MODEL_PATH", str(model))
        out = tmp_path / f"out-{model.stem}"
        result = runner.invoke(app, ["process", str(catalog[0]), "--out", str(out)])
        assert result.exit_code == 2, result.output
        assert "cannot load the pipeline" in result.output and why in result.output, result.output
        assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
        assert not (out / "results.jsonl").exists()  # no image was read


@pytest.mark.slow
def test_process_with_the_model(catalog: list[Path], tmp_path: Path, u2netp: object) -> None:
    processor = build_processor(Settings(segmenter="model", device="cpu", segment_runtime="fp32"))
    summary = process_files(catalog[:3], processor, tmp_path, presets=["taobao_main"], batch_size=3)
    assert all(r.ok for r in summary.results)
    for r in summary.results:  # the model found a subject, and not the whole frame
        assert r.line["stages_ms"]["segment"] > 0
        assert 0.0 < r.line["quality"]["subject_coverage"] < 0.95, r.line


def test_unreadable_and_oversized_files_become_dead_letters(catalog: list[Path], tmp_path: Path) -> None:
    processor = build_processor(Settings(segmenter="none", device="cpu", max_image_bytes=50_000))
    small = tmp_path / "small.png"
    Image.new("RGB", (64, 48), (200, 30, 30)).save(small)
    gone = tmp_path / "gone.jpg"  # listed, then removed before it is read
    summary = process_files([catalog[0], gone, small], processor, tmp_path / "out", presets=["thumb_webp"])
    by_name = {r.path.name: r.line for r in summary.results}
    assert by_name["gone.jpg"]["error_code"] == "FETCH_FAILED" and "gone.jpg" in by_name["gone.jpg"]["message"]
    assert by_name[catalog[0].name]["error_code"] == "TOO_LARGE"  # over 50 kB: refused before decoding
    assert by_name["small.png"]["status"] == "ok"


class _Lanes:
    """A processor's three lanes, recording which thread ran what; the output lane of batch 0
    waits until batch 1 has decoded, which only happens if the lanes overlap."""

    def __init__(self) -> None:
        self.threads: dict[str, set[str]] = {"decode": set(), "device": set(), "output": set()}
        self.next_decoded = threading.Event()

    def decode(self, batch: list[int]) -> list[int]:
        self.threads["decode"].add(threading.current_thread().name)
        if batch[0] == 1:
            self.next_decoded.set()
        return batch

    def device(self, batch: list[int]) -> list[int]:
        self.threads["device"].add(threading.current_thread().name)
        return batch

    def output(self, batch: list[int]) -> list[int]:
        self.threads["output"].add(threading.current_thread().name)
        if batch[0] == 0:
            assert self.next_decoded.wait(10), "batch 1 did not decode while batch 0 was in the output lane"
        return [x * 10 for x in batch]


def test_lane_pipeline_overlaps_batches_and_keeps_their_order() -> None:
    lanes = _Lanes()
    got: list[Any] = []
    with LanePipeline(lanes, depth=3) as pipe:  # type: ignore[arg-type]
        for k in range(6):
            got += pipe.submit([k, k])  # type: ignore[list-item]
        got += pipe.drain()
    assert got == [[10 * k, 10 * k] for k in range(6)]
    threads = lanes.threads
    assert len(threads["decode"]) == len(threads["device"]) == 1  # one thread each
    assert 1 <= len(threads["output"]) <= OUTPUT_THREADS  # the worker's output lane
    assert len(set.union(*threads.values())) == 2 + len(threads["output"])  # no thread serves two lanes


class _SlowDevice(_Lanes):
    """The device lane takes a while per batch, so a second device thread has work to take."""

    def device(self, batch: list[int]) -> list[int]:
        import time

        time.sleep(0.05 if batch[0] % 2 == 0 else 0.01)  # even batches slower: out of order inside
        return super().device(batch)


def test_lane_pipeline_runs_batches_side_by_side_on_the_device_lane_in_order() -> None:
    lanes = _SlowDevice()
    got: list[Any] = []
    with LanePipeline(lanes, depth=3, device_threads=2) as pipe:  # type: ignore[arg-type]
        for k in range(8):
            got += pipe.submit([k, k])  # type: ignore[list-item]
        got += pipe.drain()
    assert got == [[10 * k, 10 * k] for k in range(8)]
    assert len(lanes.threads["device"]) == 2 and len(lanes.threads["output"]) <= OUTPUT_THREADS


def test_two_device_threads_give_the_same_variants(catalog: list[Path], tmp_path: Path) -> None:
    processor = build_processor(Settings(segmenter="classical", device="cpu"))
    sums = []
    for n in (1, 2):
        summary = process_files(catalog[:6], processor, tmp_path / str(n), presets=["taobao_main", "thumb_webp"],
                                batch_size=1, device_threads=n)
        sums.append({r.line["sku"]: [v["sha256"] for v in r.line["variants"]] for r in summary.results})
    assert sums[0] == sums[1] and len(sums[0]) == 6
