"""A local Triton Inference Server for tests and benchmarks: ``triton_serve.py`` (pytriton) as a
child process of Triton's own interpreter, and where that interpreter is.

The client side is :class:`gpu_kernels.segment.triton_runner.TritonSegmenter`.
"""

from __future__ import annotations

import os
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

from lightbox.devservers.launch import cache_root
from schemas.errors import ProcessingFailed

__all__ = ["SERVE_SCRIPT", "TritonServer", "default_triton_env", "find_triton_python"]

STAGE = "segment"
SERVE_SCRIPT = Path(__file__).with_name("triton_serve.py")


def default_triton_env() -> Path:
    """Where Triton's own environment is looked for: ``<cache>/tritonenv`` (``$LIGHTBOX_CACHE_DIR``
    or ``~/.cache/lightbox``), where ``.ci/run`` builds it."""
    return cache_root() / "tritonenv"


def find_triton_python() -> tuple[Path | None, str]:
    """Triton's interpreter (``LIGHTBOX_TRITON_PYTHON``, else ``<cache>/tritonenv/bin/python``)
    and, when there is none usable, why not."""
    env = default_triton_env()
    candidate = Path(os.environ.get("LIGHTBOX_TRITON_PYTHON") or env / "bin" / "python")
    if not candidate.is_file():
        how = (f"/usr/bin/python3.11 -m venv {env} && "
               f"{env}/bin/pip install nvidia-pytriton onnxruntime numpy")
        if not Path("/usr/bin/python3.11").is_file():
            return None, f"no Triton interpreter at {candidate} and no /usr/bin/python3.11 to build one from"
        return None, f"no Triton interpreter at {candidate}; make one: {how} (or set LIGHTBOX_TRITON_PYTHON)"
    probe = subprocess.run([str(candidate), "-c", "import pytriton.triton, onnxruntime, numpy"],
                           capture_output=True, text=True, timeout=120, check=False)
    if probe.returncode != 0:
        return None, f"{candidate} lacks nvidia-pytriton/onnxruntime/numpy: {probe.stderr.strip()[-200:]}"
    return candidate, ""


class TritonServer:
    """``triton_serve.py`` as a child process: started in the constructor, ready when it returns
    (or :class:`ProcessingFailed` with the tail of its log), stopped by :meth:`close`."""

    def __init__(self, python: Path | str, model_path: Path | str, *, http_port: int, grpc_port: int,
                 metrics_port: int, model_name: str = "u2netp", max_batch: int = 16, queue_delay_us: int = 5000,
                 threads: int | None = None, log_path: Path | None = None, start_timeout_s: float = 120.0) -> None:
        self.url = f"127.0.0.1:{http_port}"
        self.metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
        self.model_name = model_name
        self.log_path = log_path or Path(f"/tmp/lightbox-triton-{http_port}.log")
        cmd = [str(python), str(SERVE_SCRIPT), str(model_path), "--model-name", model_name,
               "--max-batch", str(max_batch), "--queue-delay-us", str(queue_delay_us),
               "--http-port", str(http_port), "--grpc-port", str(grpc_port), "--metrics-port", str(metrics_port)]
        if threads:
            cmd += ["--threads", str(threads)]
        self._log = self.log_path.open("wb")
        self.proc: subprocess.Popen[bytes] | None = subprocess.Popen(
            cmd, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + start_timeout_s
        while not self._ready():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.close()
                tail = self.log_path.read_text(errors="replace")[-800:]
                raise ProcessingFailed(f"Triton did not become ready on {self.url}: {tail}", stage=STAGE)
            time.sleep(0.5)

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://{self.url}/v2/models/{self.model_name}/ready", timeout=2) as r:
                return int(r.status) == 200
        except (urllib.error.URLError, OSError):
            return False

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.proc = None
        self._log.close()

    def __enter__(self) -> TritonServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
