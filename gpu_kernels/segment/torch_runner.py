"""Foreground masks from an ONNX model run by PyTorch, on the CPU or a CUDA GPU (the ``[torch]`` extra).

:class:`TorchSegmenter` builds the model as a PyTorch module from the same ONNX file ONNX Runtime
loads (:func:`gpu_kernels.segment.onnx_torch.load_onnx_module`: the file's weights, its nodes as
``torch.nn.functional`` calls) and shares everything else with the other model segmenters
(:class:`~gpu_kernels.segment.bucketed.BucketedSegmenter`): pre-processing, batch buckets,
min-max normalisation and the mask post-processing, so only the model call differs.

- Memory format ``channels_last`` (NHWC convolutions: oneDNN on the CPU, cuDNN on the GPU).
- ``precision``: ``fp32``; ``bf16`` and ``fp16`` run under ``torch.autocast`` (convolutions in
  the lower precision, the output cast back to float32). They move the masks, so the runtime
  choice (``gpu_kernels.segment.runtime``) takes them only through the fidelity gate.
- ``device="gpu"``: CuPy images stay on the device; the prepared batch goes to PyTorch by
  DLPack (zero copy) and the output comes back the same way; the model runs on CuPy's current
  stream (the device lane's) as a ``torch.cuda.ExternalStream``; NumPy images are uploaded through
  pinned buffers (:class:`~gpu_kernels.pinned.PinnedUploader`); any other array exposing
  ``__dlpack__`` (a DALI GPU tensor, a torch tensor) is taken by DLPack. Masks are CuPy arrays.
- ``cuda_graphs=True``: one CUDA graph per batch bucket, captured on first use and replayed
  (the batch is copied into the graph's fixed input); a bucket whose capture fails runs
  eagerly, and ``cuda_graph_errors`` says why.
- ``compile=True``: ``torch.compile`` the module (inductor; on the CPU with weight freezing);
  a failure to compile falls back to eager and is kept in ``compile_error``.
- ``threads``: PyTorch's intra-op threads on the CPU (a process-wide setting; default: the
  usable cores).

Idle OpenMP threads sleep instead of spinning: torch is first imported here with
``OMP_WAIT_POLICY=PASSIVE`` unless the environment sets it (OpenMP reads it once, when torch
loads). On a 2-vCPU host shared with other work, spinning threads made u2netp cost 2,142
CPU-ms per image in fp32 against 434 passive (ONNX Runtime's session sleeps the same way).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np

from gpu_kernels.array import Array
from gpu_kernels.segment.bucketed import BucketedSegmenter, batch_buckets
from gpu_kernels.segment.fetch_model import sha256_file
from gpu_kernels.segment.graphs import GraphTable
from gpu_kernels.segment.machine import torch_cuda_available
from gpu_kernels.segment.model import U2NETP, ModelSpec
from gpu_kernels.segment.onnx_torch import import_torch
from gpu_kernels.segment.ops import CpuOps, cupy_ops
from gpu_kernels.segment.postprocess import MaskPostprocess
from schemas.errors import LightboxError, ProcessingFailed

__all__ = ["PRECISIONS", "TorchSegmenter", "import_torch"]

STAGE = "segment"
Precision = Literal["fp32", "bf16", "fp16"]
PRECISIONS: tuple[Precision, ...] = ("fp32", "bf16", "fp16")
DEFAULT_MAX_BATCH = {"cpu": 1, "gpu": 16}
_THREADS_LOCK = threading.Lock()


class TorchSegmenter(BucketedSegmenter):
    """Implements :class:`gpu_kernels.backends.Segmenter` with PyTorch (see the module docstring).

    ``model_path``: an ONNX file (checked as OnnxSegmenter checks it; any batch size works, the
    module reads shapes at run time). ``spec``: pre/post-processing. ``device``: "cpu" or "gpu"
    (alias "cuda"). ``precision``: "fp32", "bf16" or "fp16". ``max_batch``: largest bucket
    (default 1 on the CPU, 16 on the GPU). ``channels_last``: NHWC memory format (default on).
    """

    def __init__(self, model_path: Path | str, spec: ModelSpec = U2NETP, *, device: str = "cpu",
                 device_id: int = 0, precision: str = "fp32", threads: int | None = None,
                 max_batch: int | None = None, post: MaskPostprocess | None = None, channels_last: bool = True,
                 cuda_graphs: bool = False, compile: bool = False, warmup: bool = False) -> None:
        try:
            torch = import_torch()
        except ImportError as exc:
            raise ProcessingFailed("the torch runtime needs the 'torch' package (pip install 'lightbox[torch]')",
                                   stage=STAGE) from exc
        from gpu_kernels.segment.onnx_torch import load_onnx_module

        device = "gpu" if device in ("gpu", "cuda") else device
        if device not in ("cpu", "gpu"):
            raise ProcessingFailed(f"TorchSegmenter: device must be 'cpu' or 'gpu', got {device!r}", stage=STAGE)
        if precision not in PRECISIONS:
            raise ProcessingFailed(f"TorchSegmenter: precision must be one of {PRECISIONS}, got {precision!r}",
                                   stage=STAGE)
        if device == "gpu" and not torch_cuda_available():
            raise ProcessingFailed("device 'gpu' needs a CUDA build of torch and a CUDA device", stage=STAGE)
        self.device, self.device_id, self.spec, self.precision = device, device_id, spec, precision
        self.post = post or MaskPostprocess()
        self.model_path = Path(model_path)
        if not self.model_path.is_file():
            raise ProcessingFailed(f"model file {str(self.model_path)!r} does not exist", stage=STAGE)
        if spec.layout != "NCHW":
            raise ProcessingFailed(f"the torch runtime takes NCHW models; spec {spec.name!r} is {spec.layout}",
                                   stage=STAGE)
        self._torch = torch
        self._dev = torch.device("cuda", device_id) if device == "gpu" else torch.device("cpu")
        self._ops = cupy_ops() if device == "gpu" else CpuOps()
        if device == "cpu":
            with _THREADS_LOCK:
                from gpu_kernels.segment.machine import usable_cores

                torch.set_num_threads(threads or usable_cores())
        self.channels_last = channels_last
        self._memory_format = torch.channels_last if channels_last else torch.contiguous_format
        module = load_onnx_module(self.model_path, spec.output_index).to(self._dev)
        self._module: Any = module.to(memory_format=self._memory_format)
        self._dtype = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]
        self.compile_error: str | None = None
        self._fn: Any = self._module
        if compile:
            self._fn = self._compiled()
        self.cuda_graphs = cuda_graphs and device == "gpu"
        self._graphs = GraphTable((Exception,))  # capture failures come as RuntimeError or CUDA errors
        self.cuda_graph_errors = self._graphs.errors
        self._uploader: Any = None
        self.buckets = batch_buckets(max_batch or DEFAULT_MAX_BATCH[device])
        self.version = f"{spec.name}@{sha256_file(self.model_path)[:12]}"
        self.providers = [f"torch-{torch.__version__}:{device}:{precision}" + ("+compile" if compile else "")]
        if warmup or self.cuda_graphs:  # graphs are captured now, before any traffic
            self.warm_up()

    @property
    def cuda_graph_buckets(self) -> tuple[int, ...]:
        return self._graphs.buckets

    def warm_up(self) -> None:
        """Run every bucket once, then (``cuda_graphs``) capture each bucket's graph while nothing
        else uses the device; a bucket whose capture fails runs eagerly."""
        super().warm_up()
        if self.cuda_graphs:
            h, w = self.spec.input_size
            with self._torch.inference_mode():
                self._graphs.capture(self.buckets,
                                     lambda b: _TorchGraph(self._torch, self._forward, (b, 3, h, w), self._dev))

    def _compiled(self) -> Any:
        torch = self._torch
        try:
            options = {"freezing": True} if self.device == "cpu" else None
            return torch.compile(self._module, dynamic=False, options=options)
        except Exception as exc:  # no compiler, an unsupported platform: eager still works
            self.compile_error = f"{type(exc).__name__}: {exc}"[:300]
            return self._module

    # -- the model call ----------------------------------------------------------------------
    def _forward(self, x: Any) -> Any:
        """float32 NCHW tensor on the device -> float32 output (autocast for bf16/fp16)."""
        torch = self._torch
        x = x.contiguous(memory_format=self._memory_format)
        if self._dtype is None:
            return self._fn(x)
        with torch.autocast(self._dev.type, dtype=self._dtype):
            return self._fn(x).float()

    def _run(self, x: Any) -> Any:
        with self._torch.inference_mode():
            return self._graphs.run(x, self._eager) if self.cuda_graphs else self._eager(x)

    def _eager(self, x: Any) -> Any:
        with self._torch.inference_mode():
            try:
                return self._forward(x)
            except Exception as exc:
                if self._fn is self._module:
                    raise
                self.compile_error = f"{type(exc).__name__}: {exc}"[:300]  # compiled at first call; eager then
                self._fn = self._module
                return self._forward(x)

    def _infer(self, x: Array) -> Array:
        torch = self._torch
        if self._module is None:
            raise ProcessingFailed("segmenter used after close()", stage=STAGE)
        try:
            if self.device == "cpu":
                out = self._run(torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)))
                return out.contiguous().numpy()
            import cupy

            xin = cupy.ascontiguousarray(x, dtype=cupy.float32)
            with self._lane_stream(cupy.cuda.get_current_stream().ptr):
                out = self._run(torch.from_dlpack(xin))
                return cupy.from_dlpack(out.contiguous())
        except (RuntimeError, ValueError, TypeError) as exc:  # torch reports kernel failures as RuntimeError
            raise ProcessingFailed(f"model {self.model_path.name} failed on a batch of shape {tuple(x.shape)} "
                                   f"(torch): {exc}"[:600], stage=STAGE) from exc

    def _lane_stream(self, ptr: int) -> Any:
        """PyTorch's current stream for the model call: CuPy's current one (the device lane's
        stream, :mod:`gpu_kernels.lane_streams`) as a ``torch.cuda.ExternalStream``, so the model's
        kernels queue behind the lane's CuPy work and the lane's next kernels behind the model's,
        with no host wait; on the legacy default stream (``ptr`` 0) PyTorch's own current one."""
        if not ptr:
            return contextlib.nullcontext()
        torch = self._torch
        return torch.cuda.stream(torch.cuda.ExternalStream(ptr, device=self._dev))

    # -- inputs on the GPU -------------------------------------------------------------------
    def segment_batch(self, images: Sequence[Array]) -> list[Array | LightboxError]:
        if self.device == "gpu":
            images = [self._to_device(im) for im in images]
        return super().segment_batch(images)

    def _to_device(self, img: Any) -> Any:
        """CuPy as is; NumPy through pinned buffers; other device arrays by DLPack; else untouched
        (the shape/dtype check then rejects it in its place)."""
        import cupy

        if isinstance(img, cupy.ndarray):
            return img
        if isinstance(img, np.ndarray):
            if img.ndim != 3 or img.dtype != np.uint8:
                return img
            if self._uploader is None:
                from gpu_kernels.pinned import PinnedUploader

                self._uploader = PinnedUploader(self.device_id)
            return self._uploader.upload(img)
        if hasattr(img, "__dlpack__"):
            with contextlib.suppress(Exception):
                return cupy.from_dlpack(img)
        return img

    def close(self) -> None:
        self._graphs.clear()
        self._module = None
        self._fn = None

    def __enter__(self) -> TorchSegmenter:
        return self


class _TorchGraph:
    """One bucket's CUDA graph: warm-up on a side stream, capture ``forward`` on a fixed input,
    replay; ``run`` copies the batch in and returns a copy of the fixed output."""

    def __init__(self, torch: Any, forward: Any, shape: tuple[int, ...], device: Any) -> None:
        self.torch = torch
        self.x = torch.zeros(shape, device=device)
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            for _ in range(3):  # cuDNN picks its algorithms and allocations settle before capture
                forward(self.x)
        torch.cuda.current_stream(device).wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.y = forward(self.x)

    def run(self, x: Any) -> Any:
        self.x.copy_(x)
        self.graph.replay()
        return self.y.clone()
