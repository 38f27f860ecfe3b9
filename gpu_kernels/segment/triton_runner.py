"""Foreground masks from a model served by Triton Inference Server (PyPI ``tritonclient[http]``).

A fleet of workers can share one model server: :class:`TritonSegmenter` does lightbox's own
pre-processing and post-processing (:class:`~gpu_kernels.segment.bucketed.BucketedSegmenter`,
the same as :class:`~gpu_kernels.segment.onnx_runner.OnnxSegmenter`) and sends only the prepared
batch (``N x 3 x H x W`` float32) to Triton; the model's output comes back and becomes masks here.
So it differs from the in-process runners only in where the model runs.

The server side is ``gpu_kernels/segment/triton_serve.py`` (pytriton, run with Triton's own
interpreter; :class:`TritonServer` starts it as a child process for tests and benchmarks). Its
model takes input ``image`` and returns output ``mask``; Triton's dynamic batcher stacks
concurrent requests, so each worker sends what it has (``max_batch`` caps one request).
"""

from __future__ import annotations

import os
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np

from gpu_kernels.array import Array
from gpu_kernels.segment.bucketed import BucketedSegmenter, batch_buckets
from gpu_kernels.segment.model import U2NETP, ModelSpec
from gpu_kernels.segment.ops import CpuOps
from gpu_kernels.segment.postprocess import MaskPostprocess
from schemas.errors import ProcessingFailed

__all__ = ["SERVE_SCRIPT", "TritonSegmenter", "TritonServer", "find_triton_python"]

STAGE = "segment"
SERVE_SCRIPT = Path(__file__).with_name("triton_serve.py")
INPUT, OUTPUT = "image", "mask"


def default_triton_env() -> Path:
    """Where Triton's own environment is looked for: ``<cache>/tritonenv``, the cache being
    ``$LIGHTBOX_CACHE_DIR`` or ``~/.cache/lightbox`` (where ``.ci/run`` builds it)."""
    cache = os.environ.get("LIGHTBOX_CACHE_DIR") or Path.home() / ".cache" / "lightbox"
    return Path(cache) / "tritonenv"


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


class TritonSegmenter(BucketedSegmenter):
    """Implements :class:`gpu_kernels.backends.Segmenter` with the model on a Triton server.

    ``url``: ``host:port`` of Triton's HTTP endpoint. ``model_name``: the served model (its input
    ``image``, output ``mask``). ``spec``: the model's pre/post-processing, as for the other
    runners. ``max_batch``: the most images in one request (default 16: the server's dynamic
    batcher caps what it runs at once). ``timeout_s``: connection and network timeout. One
    client per segmenter, tied to the thread that made it (tritonclient's HTTP client runs on gevent):
    give each thread its own segmenter.
    """

    def __init__(self, url: str, model_name: str = "u2netp", spec: ModelSpec = U2NETP, *, max_batch: int = 16,
                 timeout_s: float = 60.0, post: MaskPostprocess | None = None, warmup: bool = False) -> None:
        try:
            import tritonclient.http as httpclient
            from tritonclient.utils import InferenceServerException
        except ImportError as exc:
            raise ProcessingFailed("segmenter 'triton' needs tritonclient: pip install 'lightbox[triton]'",
                                   stage=STAGE) from exc
        self.device, self.spec, self.url, self.model_name = "cpu", spec, url, model_name
        self.post = post or MaskPostprocess()
        self._ops = CpuOps()
        self._http: Any = httpclient
        self._errors: tuple[type[BaseException], ...] = (InferenceServerException, OSError, ConnectionError)
        try:
            self._client: Any | None = httpclient.InferenceServerClient(
                url=url, connection_timeout=timeout_s, network_timeout=timeout_s)
            meta = self._client.get_model_metadata(model_name)
            config = self._client.get_model_config(model_name)
        except self._errors as exc:
            raise ProcessingFailed(f"Triton at {url!r}: model {model_name!r} is not available: {exc}",
                                   stage=STAGE) from exc
        served = int(config.get("max_batch_size", 0) or 0)
        self.buckets = batch_buckets(max(1, min(max_batch, served or max_batch)))
        self.version = f"{spec.name}@triton:{model_name}/{meta.get('versions', ['?'])[-1]}"
        self.providers = [f"Triton:{url}"]
        if warmup:
            self.warm_up()

    def _infer(self, x: Array) -> Array:
        if self._client is None:
            raise ProcessingFailed("segmenter used after close()", stage=STAGE)
        batch = np.ascontiguousarray(x, dtype=np.float32)
        tensor = self._http.InferInput(INPUT, list(batch.shape), "FP32")
        tensor.set_data_from_numpy(batch, binary_data=True)
        try:
            result = self._client.infer(self.model_name, [tensor],
                                        outputs=[self._http.InferRequestedOutput(OUTPUT, binary_data=True)])
            out = result.as_numpy(OUTPUT)
        except self._errors as exc:
            raise ProcessingFailed(f"Triton at {self.url!r}, model {self.model_name!r}: a batch of shape "
                                   f"{tuple(batch.shape)} failed: {exc}", stage=STAGE) from exc
        if out is None:
            raise ProcessingFailed(f"Triton at {self.url!r}: model {self.model_name!r} returned no {OUTPUT!r}",
                                   stage=STAGE)
        return np.asarray(out, dtype=np.float32)

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
        self._client = None
