"""A process that loaded and released OpenVINO models (the start-up gate does) still survives its
next signal. OpenVINO's CPU plugin installs an alternate signal stack on the threads that use it and
frees that memory when the plugin is unloaded; with a ``Core`` per model, releasing the last model
unloaded the plugin and the next SIGTERM killed the worker with SIGSEGV (exit 139) instead of
letting it stop cleanly. Each case runs in a child process, since the failure is that process dying."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from gpu_kernels.segment.machine import openvino_available

pytestmark = pytest.mark.skipif(not openvino_available(), reason="needs the 'openvino' package")

_SIGNAL_AFTER = """
import os, signal, sys
handled = []
signal.signal(signal.SIGTERM, lambda signum, frame: handled.append(signum))
os.kill(os.getpid(), signal.SIGTERM)  # delivered on this thread, on whatever signal stack it has
print("handled" if handled else "not handled", flush=True)
"""


def _run(script: str, model_dir: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "LIGHTBOX_MODEL_DIR": str(model_dir)}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(script) + _SIGNAL_AFTER], env=env,
                          capture_output=True, text=True, timeout=120)


def test_sigterm_after_openvino_models_released_out_of_order_is_handled(u2netp: Any, tmp_path: Path) -> None:
    result = _run(f"""
        import gc
        import numpy as np
        from gpu_kernels.segment.openvino_runner import OpenVinoSegmenter
        first = OpenVinoSegmenter({str(u2netp.batched)!r}, precision="f32")
        second = OpenVinoSegmenter({str(u2netp.batched)!r}, precision="f32")
        for seg in (first, second):
            assert seg.segment_batch([np.full((64, 80, 3), 128, np.uint8)])[0].shape == (64, 80)
        del seg
        first.close()
        del first  # the first made is dropped first, as the gate drops its candidates
        gc.collect()
        second.close()
        del second
        gc.collect()
        """, tmp_path)
    assert result.returncode == 0, (result.returncode, result.stderr[-2000:])
    assert result.stdout.splitlines()[-1] == "handled", result.stdout


@pytest.mark.slow
def test_sigterm_after_the_auto_gate_is_handled(u2netp: Any, tmp_path: Path) -> None:
    """The worker's start-up: ``auto`` with no cached verdicts builds and gates every candidate
    (OpenVINO ones included) and releases them; the process must still take a SIGTERM. A gate no
    candidate can pass makes the choice fp32, so no OpenVINO model is left loaded (as on a machine
    where none passes)."""
    result = _run(f"""
        from pathlib import Path
        from gpu_kernels.segment.runtime import gate_images, make_model_segmenter
        seg, choice = make_model_segmenter(Path({str(u2netp.batched)!r}), cache_dir=Path({str(tmp_path)!r}),
                                           images=lambda: gate_images()[:1], gate=(1.01, 1.01))
        print("chose", choice.runtime, [g.runtime for g in choice.gates], flush=True)
        """, tmp_path)
    assert result.returncode == 0, (result.returncode, result.stderr[-2000:])
    assert "chose fp32" in result.stdout and "openvino-f32" in result.stdout, result.stdout  # loaded, released
    assert result.stdout.splitlines()[-1] == "handled", result.stdout
