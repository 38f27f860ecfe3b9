"""SIGTERM while ``lightbox worker`` is still starting: on a fresh machine the ``auto`` segment
runtime gates every candidate (an INT8 calibration, OpenVINO compiles) before the worker joins its
group, which can take minutes. A stop asked then ends the process at once with exit 0 (it holds no
partitions yet), where the default action ended it by the signal, and as a container's PID 1,
which ignores SIGTERM without a handler, not at all. The backfill child, which builds the same
pipeline, stops the same way."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from streams.settings import Settings

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

GATE_STARTED = "judging segment runtime"  # the runtime gate's INFO line as it starts on a candidate


@pytest.mark.parametrize("command", [["-c", "from lightbox.cli import main; main()", "worker"],
                                     ["-m", "agents.worker", "backfill-worker"]], ids=["worker", "backfill-child"])
def test_sigterm_during_the_runtime_gate_stops_the_worker_with_exit_0(settings: Settings, u2netp: Any,
                                                                       tmp_path: Path, command: list[str]) -> None:
    models = tmp_path / "models"  # a fresh model cache: no gate verdicts, so the gate runs
    shutil.copytree(Path(u2netp.batched).parent, models / "u2netp")
    env = {**os.environ, "LIGHTBOX_KAFKA_BOOTSTRAP": settings.kafka.bootstrap,
           "LIGHTBOX_GROUP_ID": settings.kafka.group_id, "LIGHTBOX_INPUT_TOPIC": settings.topics.input,
           "LIGHTBOX_OUTPUT_TOPIC": settings.topics.output, "LIGHTBOX_DLQ_TOPIC": settings.topics.dlq,
           "LIGHTBOX_BACKFILL_TOPIC": settings.topics.backfill, "LIGHTBOX_DATA_DIR": str(tmp_path / "faust"),
           "LIGHTBOX_DEVICE": "cpu", "LIGHTBOX_SEGMENTER": "model", "LIGHTBOX_SEGMENT_RUNTIME": "auto",
           "LIGHTBOX_MODEL_DIR": str(models), "LIGHTBOX_METRICS_PORT": "0", "LIGHTBOX_LOG_LEVEL": "INFO"}
    log = tmp_path / "worker.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, *command], stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + 120
        while GATE_STARTED not in log.read_text() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)  # the gate logs each candidate it judges (at INFO) as it starts on it
        assert proc.poll() is None, log.read_text()[-2000:]
        assert GATE_STARTED in log.read_text(), "the gate never started: " + log.read_text()[-2000:]
        assert not (models / "gate.json").exists() or "candidates" not in (models / "gate.json").read_text()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = log.read_text()
    assert code == 0, (code, text[-2000:])
    assert "stopped while starting (SIGTERM)" in text, text[-2000:]
    assert "backfill tier: process" not in text  # it stopped before starting anything else


@pytest.mark.parametrize("command", [["-c", "from lightbox.cli import main; main()", "worker"],
                                     ["-m", "agents.worker", "backfill-worker"]], ids=["worker", "backfill-child"])
def test_a_model_openvino_cannot_load_stops_the_worker_at_start_with_the_reason(settings: Settings, tmp_path: Path,
                                                                               command: list[str]) -> None:
    """OpenVINO compiles when the worker tells the model how many threads will call it, before it
    joins its group (nothing is compiled when the segmenter is built); a model file it cannot load
    still ends the start with the reason and exit 70, in the backfill child too."""
    from agents.worker import EXIT_FAIL_STOP

    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a model")
    env = {**os.environ, "LIGHTBOX_KAFKA_BOOTSTRAP": settings.kafka.bootstrap,
           "LIGHTBOX_GROUP_ID": settings.kafka.group_id, "LIGHTBOX_INPUT_TOPIC": settings.topics.input,
           "LIGHTBOX_OUTPUT_TOPIC": settings.topics.output, "LIGHTBOX_DLQ_TOPIC": settings.topics.dlq,
           "LIGHTBOX_BACKFILL_TOPIC": settings.topics.backfill, "LIGHTBOX_DATA_DIR": str(tmp_path / "faust"),
           "LIGHTBOX_DEVICE": "cpu", "LIGHTBOX_SEGMENTER": "model", "LIGHTBOX_SEGMENT_RUNTIME": "openvino-f32",
           "LIGHTBOX_MODEL_PATH": str(bad), "LIGHTBOX_MODEL_DIR": str(tmp_path / "models"),
           "LIGHTBOX_METRICS_PORT": "0", "LIGHTBOX_BACKFILL_ENABLED": "false"}
    proc = subprocess.run([sys.executable, *command], capture_output=True, text=True, env=env, timeout=120)
    text = proc.stdout + proc.stderr
    assert proc.returncode == EXIT_FAIL_STOP, (proc.returncode, text[-2000:])
    assert "could not start: ProcessingFailed" in text and "cannot load model" in text, text[-2000:]
    assert "Traceback" not in text, text[-2000:]
