"""bench/gpu_suite.sh runs through on a machine without a GPU (as in CI): every step ends, the GPU
parts say they were skipped and why, and the JSON and PNG are written."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _has_gpu() -> bool:
    try:
        import cupy

        return int(cupy.cuda.runtime.getDeviceCount()) > 0
    except Exception:
        return False


@pytest.mark.skipif(_has_gpu(), reason="this checks the no-GPU run; bench/gpu_suite.sh is the GPU run itself")
def test_gpu_suite_runs_through_without_a_gpu(tmp_path: Path) -> None:
    out = tmp_path / "suite"
    env = {**os.environ, "OUT": str(out), "PYTHON": sys.executable, "E2E_N": "8", "E2E_BATCHES": "1,4"}
    run = subprocess.run(["bash", str(ROOT / "bench" / "gpu_suite.sh")], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "NO GPU on this machine" in run.stdout

    steps = [json.loads(line) for line in (out / "parts" / "steps.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == ["parity", "torch", "decode", "retouch", "model", "e2e", "report"]
    # pytest's 5 is "nothing collected": every GPU test module skips at import without CuPy;
    # the torch step is skipped (-1) where the [torch] extra is not installed
    has_torch = importlib.util.find_spec("torch") is not None
    assert all(s["rc"] in (0, 5) or (s["step"] == "torch" and not has_torch and s["rc"] == -1) for s in steps), steps

    report = json.loads((out / "gpu_suite.json").read_text())
    summary = report["summary"]
    for name in ("parity", "codec", "retouch"):
        assert summary[name]["status"] == "skipped", (name, summary[name])
    assert "cupy" in " ".join(summary["parity"]["skip_reasons"]).lower()
    if has_torch:  # the torch grid's CPU dry run, and its gate against ONNX Runtime's masks
        assert summary["torch"]["status"] == "ok" and summary["torch"]["skipped"], summary["torch"]
        torch_part = report["parts"]["torch"]
        assert torch_part["gate"]["passed"] and any(r.get("img_per_s", 0) > 0 for r in torch_part["grid"])
    for name in ("model", "e2e"):  # small CPU dry runs in place of the GPU grids, and they say so
        assert summary[name]["status"] == "ok" and summary[name]["skipped"], (name, summary[name])
    grid = json.loads((out / "parts" / "e2e.json").read_text())
    assert grid["device"] == "cpu" and len({r["batch"] for r in grid["rows"]}) >= 2, grid
    assert all(r["dead_letters"] == 0 and r["img_per_s"] > 0 for r in grid["rows"]), grid["rows"]
    assert (out / "gpu_suite.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
