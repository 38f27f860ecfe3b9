"""Foreground masks from a model served by Triton Inference Server (PyPI ``tritonclient[http]``).

A fleet of workers can share one model server: :class:`TritonSegmenter` does lightbox's own
pre-processing and post-processing (:class:`~gpu_kernels.segment.bucketed.BucketedSegmenter`,
the same as :class:`~gpu_kernels.segment.onnx_runner.OnnxSegmenter`) and sends only the prepared
batch (``N x 3 x H x W`` float32) to Triton; the model's output comes back and becomes masks here.
So it differs from the in-process runners only in where the model runs.

The server side is ``lightbox/devservers/triton_serve.py`` (pytriton, run with Triton's own
interpreter; :class:`lightbox.devservers.triton_local.TritonServer` starts it as a child process
for tests and benchmarks). Its model takes input ``image`` and returns output ``mask``; Triton's
dynamic batcher stacks concurrent requests, so each worker sends what it has (``max_batch`` caps
one request).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gpu_kernels.array import Array
from gpu_kernels.segment.bucketed import BucketedSegmenter, batch_buckets
from gpu_kernels.segment.model import U2NETP, ModelSpec
from gpu_kernels.segment.ops import CpuOps
from gpu_kernels.segment.postprocess import MaskPostprocess
from schemas.errors import ProcessingFailed

__all__ = ["TritonSegmenter"]

STAGE = "segment"
INPUT, OUTPUT = "image", "mask"


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
