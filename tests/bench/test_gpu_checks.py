"""The GPU validation run's figures on the CPU: rows that outlive a step cut off by its time limit,
labels that name the provider that really ran, and rates that count processed images only."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.gpu.checks import configuration_rows, provider_mismatch, rate_row  # noqa: E402
from streams.settings import Settings  # noqa: E402

ABSENT = [p for p in ("TensorrtExecutionProvider", "CUDAExecutionProvider") if p not in ort.get_available_providers()]


def _rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []


# -- finding 4: a step cut off keeps the rows it finished -----------------------------------------

STEPS = {
    "e2e": lambda model, out: ["e2e", "--model", str(model), "--device", "cpu", "--out", str(out)],
    "model": lambda model, out: ["model", str(model), "--dry-run-cpu", "--budget", "0", "--out", str(out)],
}


@pytest.mark.parametrize("step", sorted(STEPS))
def test_a_step_killed_mid_run_keeps_the_rows_it_wrote_and_the_report_reads_them(step: str, u2netp: Any,
                                                                                  tmp_path: Path) -> None:
    out, work = tmp_path / "out", tmp_path / "work"
    out.mkdir()
    work.mkdir()
    rows_file = out / "gpu_suite.rows.jsonl"  # as bench/gpu/suite.sh names it
    env = {**os.environ, "PYTHONPATH": str(ROOT), "GPU_SUITE_ROWS": str(rows_file), "GPU_SUITE_STEP": step,
           "LIGHTBOX_MODEL_DIR": str(Path(u2netp.batched).parent.parent), "LIGHTBOX_OFFLINE": "1",
           "OPENBLAS_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, str(ROOT / "bench" / "gpu" / "checks.py"),
                             *STEPS[step](u2netp.batched, work / f"{step}.json")],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        give_up = time.monotonic() + 600  # a guard against a hang, not a figure
        while not any(r["kind"] == "row" for r in _rows(rows_file)) and proc.poll() is None \
                and time.monotonic() < give_up:
            time.sleep(0.01)
        proc.send_signal(signal.SIGKILL)  # what `timeout --kill-after` ends a step with
    finally:
        proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL, f"{step} ended ({proc.returncode}) before its first row was cut"
    landed = _rows(rows_file)  # every line is whole JSON: each row is flushed and synced as it lands
    figures = [r for r in landed if r["kind"] == "row"]
    assert figures and all(r["step"] == step and r["img_per_s"] > 0 for r in figures), landed
    first = {"e2e": ("batch", 1), "model": ("precision", "fp32")}[step]  # its later rows had not landed
    assert all(r[first[0]] == first[1] for r in figures), f"{step}'s rows landed together, not each as measured"

    # the suite records the cut step and builds its report from the rows file, a torn last line and all
    (work / "steps.jsonl").write_text(json.dumps({"step": step, "rc": 137, "seconds": 9, "limit_s": 9}) + "\n")
    with rows_file.open("a") as fh:
        fh.write(json.dumps({"step": step, "kind": "row", "img_per_s": 1.0})[:30])  # cut mid-line
    report = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu" / "suite.py"), "report", str(work), str(out)],
                            env=env, capture_output=True, text=True, timeout=120)
    assert report.returncode == 0, report.stdout + report.stderr
    built = json.loads((out / "gpu_suite.json").read_text())
    assert [r for r in built["rows"][step] if r["kind"] == "row"] == figures
    assert built["summary"][step]["status"] == "cut at 9 s" and built["summary"][step]["rows"] == len(figures)


# -- finding 6: a row's label names the provider that ran it --------------------------------------

@pytest.mark.skipif(not ABSENT, reason="this onnxruntime has TensorRT and CUDA: no provider to fall back from")
def test_onnx_runtime_falls_back_silently_and_the_label_follows_the_provider_that_ran(u2netp: Any) -> None:
    """Asked for providers it lacks, ONNX Runtime builds the session on the next one and says so in
    a warning only: the InferenceSession's own providers decide the label, never the request."""
    asked = ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"]
    with pytest.warns(UserWarning, match="not in available provider names"):
        ran = ort.InferenceSession(str(u2netp.batched), providers=asked).get_providers()
    assert ran[0] not in ABSENT
    for mode in ("tensorrt", "plain", "cuda_graphs"):
        why = provider_mismatch(mode, True, ran)
        assert why is not None and ran[0] in why and mode in why
    assert provider_mismatch("plain", False, ran) is None  # the CPU dry run's rows are the CPU's
    assert provider_mismatch("tensorrt", True, ["TensorrtExecutionProvider", "CUDAExecutionProvider"]) is None
    assert provider_mismatch("tensorrt", True, ["CUDAExecutionProvider", "CPUExecutionProvider"]) is not None
    assert provider_mismatch("plain", True, ["CUDAExecutionProvider", "CPUExecutionProvider"]) is None


def test_no_row_is_written_for_a_mode_its_session_does_not_run_on(u2netp: Any, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from gpu_kernels.segment import OnnxSegmenter

    rows_file = tmp_path / "rows.jsonl"
    monkeypatch.setenv("GPU_SUITE_ROWS", str(rows_file))
    monkeypatch.setenv("GPU_SUITE_STEP", "model")
    seg = OnnxSegmenter(u2netp.batched, max_batch=1, threads=1)  # runs on ONNX Runtime's CPU provider
    try:
        trt = configuration_rows(seg, "fp32", "tensorrt", True, (1,), np, lambda: None, 0.0, 0.1)
        cpu = configuration_rows(seg, "fp32", "plain", False, (1,), np, lambda: None, 0.0, 0.1)
    finally:
        seg.close()
    assert trt == [{"precision": "fp32", "mode": "tensorrt", "providers": seg.providers,
                    "skipped": provider_mismatch("tensorrt", True, seg.providers)}]
    written = _rows(rows_file)
    assert not [r for r in written if r["mode"] == "tensorrt" and r["kind"] != "skipped"], written
    assert [r["kind"] for r in written if r["mode"] == "tensorrt"] == ["skipped"]
    figures = [r for r in written if r["kind"] == "row"]
    assert len(figures) == 1 and figures[0]["mode"] == "plain" and figures[0]["img_per_s"] > 0
    assert figures[0]["provider"] == seg.providers[0] == "CPUExecutionProvider"
    assert cpu[0] == {k: v for k, v in figures[0].items() if k not in ("step", "kind", "t")}


# -- finding 6: images/s counts processed images, never dead letters ------------------------------

def test_an_e2e_row_counts_dead_letters_apart_and_never_in_the_rate(catalog: list[Path], bad_files: dict[str, Path],
                                                                    tmp_path: Path) -> None:
    from agents.wiring import build_processor
    from lightbox.offline import process_files
    from lightbox.report import stage_table

    files = [*catalog[:3], *sorted(bad_files.values())]
    processor = build_processor(Settings(segmenter="classical", device="cpu"))
    try:
        summary = process_files(files, processor, tmp_path / "out", presets=["thumb_webp"], batch_size=2)
    finally:
        processor.close()
    ok = [r for r in summary.results if r.ok]
    assert len(ok) == 3 and summary.dead_letters == len(bad_files) > 0
    stages, _ = stage_table(summary.processed)
    row = rate_row(2, summary, stages, "classical")
    assert (row["processed"], row["dead_letters"]) == (3, len(bad_files))
    assert row["img_per_s"] == round(3 / summary.seconds, 2) < round(len(files) / summary.seconds, 2)
    lat = [r.line["latency_ms"] for r in ok]
    assert row["p99_ms"] == round(float(np.percentile(lat, 99)), 1)



def test_the_measures_check_runs_its_path_on_the_cpu_twin() -> None:
    """``checks.py retouch``'s measures section, with NumPy as the array module, the CPU twin as
    the renderer and the host's no-op lane streams: device counts equal host counts."""
    import numpy as np

    from bench.gpu.checks import check_measures
    from gpu_kernels.lane_streams import LaneStreams
    from gpu_kernels.retouch import CpuRetoucher

    out = check_measures(np, CpuRetoucher(), LaneStreams("cpu"))
    assert out["ok"] and out["equal"] and out["items"] == 4
    assert out["bytes_back"] < out["canvas_bytes"] / 1000
