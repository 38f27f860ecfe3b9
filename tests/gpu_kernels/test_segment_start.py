"""Start-up of the ``auto`` segment runtime: once every candidate has a verdict on this machine,
a start decides from the cached verdicts alone (no candidate runtime is loaded, none imported),
and ONNX Runtime's session comes from its kept optimised graph."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpu_kernels.segment import runtime as rt
from gpu_kernels.segment.fetch_model import sha256_file
from gpu_kernels.segment.machine import usable_cores
from gpu_kernels.segment.onnx_runner import OnnxSegmenter
from gpu_kernels.segment.runtime import GateResult, _GateCache, make_model_segmenter


def _seed(tmp_path: Path, model: Path, verdicts: dict[str, tuple[float, float]], threads: int) -> None:
    cache = _GateCache(tmp_path / "gate.json", (rt.GATE_MEAN_IOU, rt.GATE_WORST_IOU))
    sha = sha256_file(model)
    for name, (worst, ms) in verdicts.items():
        cache.put(_GateCache.key(sha, name, threads),
                  GateResult(name, max(worst, 0.97), worst, 16, ms, 300.0, worst >= rt.GATE_WORST_IOU))
    cache.put(_GateCache.key(sha, "candidates", threads), list(verdicts))


def _no_candidates(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("candidate runtimes were loaded")


def test_cached_verdicts_that_all_fail_give_fp32_without_loading_candidates(
        u2netp: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    threads = usable_cores()
    _seed(tmp_path, u2netp.batched, {"openvino-bf16": (0.84, 150.0), "openvino-f32": (1.0, 290.0),
                                     "int8": (0.3, 170.0)}, threads)
    monkeypatch.setattr(rt, "_factories", _no_candidates)
    seg, choice = make_model_segmenter(u2netp.batched, cache_dir=tmp_path)
    assert isinstance(seg, OnnxSegmenter) and choice.runtime == "fp32"
    assert {g.runtime for g in choice.gates} == {"openvino-bf16", "openvino-f32", "int8"}
    assert not any(g.passed for g in choice.gates if g.runtime != "openvino-f32")


START = """
import json, sys
from pathlib import Path
from gpu_kernels.segment.runtime import make_model_segmenter
seg, choice = make_model_segmenter(Path(sys.argv[1]), cache_dir=Path(sys.argv[2]))
print(json.dumps({"runtime": choice.runtime, "openvino": "openvino" in sys.modules,
                  "kept": str(seg.compiled_from) if getattr(seg, "compiled_from", None) else None}))
"""


def test_a_start_that_runs_onnx_runtime_imports_no_other_runtime_and_reuses_its_graph(
        u2netp: Any, tmp_path: Path) -> None:
    """Every cached verdict failed: fp32, OpenVINO never imported; the second start loads the
    optimised graph the first one kept (under the runtime choice's cache folder)."""
    _seed(tmp_path, u2netp.batched, {"openvino-f32": (1.0, 290.0), "int8": (0.3, 170.0)}, usable_cores())
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root)}

    def start() -> dict[str, Any]:
        done = subprocess.run([sys.executable, "-c", START, str(u2netp.batched), str(tmp_path)], cwd=root, env=env,
                              capture_output=True, text=True, timeout=300, check=True)
        return dict(json.loads(done.stdout.strip().splitlines()[-1]))

    first, second = start(), start()
    assert first == {"runtime": "fp32", "openvino": False, "kept": None}
    assert second["runtime"] == "fp32" and not second["openvino"]
    assert second["kept"] is not None and Path(second["kept"]).parent == tmp_path / "onnxruntime"


def test_a_cached_verdict_that_passes_still_loads_the_winner(
        u2netp: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    threads = usable_cores()
    _seed(tmp_path, u2netp.batched, {"openvino-f32": (1.0, 150.0)}, threads)  # 2x fp32 and passing
    loaded: list[str] = []

    def candidates(*args: Any, **kwargs: Any) -> dict[str, Any]:
        def make() -> Any:
            loaded.append("openvino-f32")
            return OnnxSegmenter(u2netp.batched)  # stands in for the winner's runtime
        return {"openvino-f32": make}

    monkeypatch.setattr(rt, "_factories", candidates)
    _, choice = make_model_segmenter(u2netp.batched, cache_dir=tmp_path)
    assert choice.runtime == "openvino-f32" and loaded == ["openvino-f32"]


def test_missing_candidate_list_falls_back_to_judging(u2netp: Any, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rt, "_factories", _no_candidates)
    with pytest.raises(AssertionError, match="candidate runtimes were loaded"):
        make_model_segmenter(u2netp.batched, cache_dir=tmp_path)


def test_without_onnx_runtime_every_choice_says_which_extra_to_install(u2netp: Any, tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from gpu_kernels.segment import machine
    from schemas.errors import ProcessingFailed

    monkeypatch.setattr(machine, "ort_available", lambda: False)
    for runtime in ("auto", "fp32", "openvino"):
        with pytest.raises(ProcessingFailed, match=r"lightbox\[cpu\]") as info:
            make_model_segmenter(u2netp.batched, runtime=runtime, cache_dir=tmp_path)
        assert "\n" not in str(info.value)


def test_the_table_is_what_settings_accept_and_what_each_device_offers() -> None:
    from pydantic import ValidationError

    from schemas import segment_runtimes as table
    from streams.settings import Settings

    for name in table.NAMES:
        assert Settings(segment_runtime=name).segment.runtime == name
    with pytest.raises(ValidationError, match="one of: auto"):
        Settings(segment_runtime="tensorrt")
    assert "fp16" in table.names_for("gpu") and "fp16" not in table.names_for("cpu")
    assert "openvino" in table.names_for("cpu") and "openvino" not in table.names_for("gpu")
    for fam in table.FAMILIES:  # every name a family refers to is a row of the table or another family
        assert all(table.runtime(n) is not None or table.family(n, fam.device) is not None
                   for n in (*fam.candidates, *fam.fallback))
