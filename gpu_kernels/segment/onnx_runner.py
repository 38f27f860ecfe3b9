"""Foreground masks from an ONNX model with ONNX Runtime: one session, batch-size buckets.

``OnnxSegmenter(model_path, spec, device="cpu")`` runs the CPU provider on NumPy images.
``device="gpu"`` takes CuPy images and keeps them on the device: pre-processing in CuPy,
TensorRT provider when onnxruntime has it (else CUDA), inputs and outputs bound to device
memory with IO binding, post-processing in CuPy; the masks come back as CuPy arrays.

The session is created once, in the constructor (one per worker), never per event. A batch
is cut into chunks of at most ``max_batch`` images and each chunk is zero-padded up to the
next bucket (1, 2, 4, 8, ... , ``max_batch``), so the runtime sees a handful of shapes and
plans each once (``warmup=True`` plans them all at start-up). A model whose input declares a
fixed batch (the published u2netp.onnx: 1) limits the buckets to that size.

RGBA images that already carry transparency are cut out already: their alpha is returned as
the mask and they skip the model.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from gpu_kernels.segment.fetch_model import model_cache_dir, sha256_file
from gpu_kernels.segment.inputs import precut_alpha, validate_image
from gpu_kernels.segment.model import U2NETP, ModelSpec, output_to_probability, preprocess
from gpu_kernels.segment.ops import ArrayOps, CpuOps, cupy_ops
from gpu_kernels.segment.postprocess import MaskPostprocess, alpha_from_probability
from schemas.errors import LightboxError, ProcessingFailed, per_item

__all__ = ["DEFAULT_MAX_BATCH", "OnnxSegmenter", "batch_buckets", "plan_chunks"]

Array = Any
STAGE = "segment"
DEFAULT_MAX_BATCH = {"cpu": 1, "gpu": 16}  # on CPU batching does not pay (FACTS.md)


def _ort_errors() -> tuple[type[BaseException], ...]:
    from onnxruntime.capi import onnxruntime_pybind11_state as state

    names = (
        "Fail",
        "InvalidArgument",
        "NoSuchFile",
        "NoModel",
        "EngineError",
        "RuntimeException",
        "InvalidProtobuf",
        "ModelLoaded",
        "NotImplemented",
        "InvalidGraph",
        "EPFail",
    )
    found = tuple(c for n in names if isinstance(c := getattr(state, n, None), type))
    return (*found, RuntimeError, ValueError, OSError)


ORT_ERRORS = _ort_errors()


def batch_buckets(max_batch: int) -> tuple[int, ...]:
    """Powers of two below ``max_batch``, then ``max_batch``: 6 -> (1, 2, 4, 6)."""
    if max_batch < 1:
        raise ValueError(f"max_batch must be >= 1, got {max_batch}")
    out, b = [], 1
    while b < max_batch:
        out.append(b)
        b *= 2
    out.append(max_batch)
    return tuple(out)


def plan_chunks(n: int, buckets: Sequence[int]) -> list[tuple[int, int, int]]:
    """``(start, stop, bucket)`` per chunk: chunks of at most the largest bucket, each padded up."""
    largest, plan, start = max(buckets), [], 0
    while start < n:
        stop = min(start + largest, n)
        plan.append((start, stop, min(b for b in buckets if b >= stop - start)))
        start = stop
    return plan


def _first_input_name(path: Path) -> str | None:
    """The first graph input that is not an initializer, read with ``onnx`` if it is installed."""
    try:
        import onnx
    except ImportError:
        return None
    graph = onnx.load(str(path), load_external_data=False).graph
    initializers = {t.name for t in graph.initializer}
    return next((str(v.name) for v in graph.input if v.name not in initializers), None)


class OnnxSegmenter:
    """Implements :class:`gpu_kernels.backends.Segmenter` with an ONNX model (see module doc).

    ``model_path``: an ONNX file; for batches above 1 it needs a symbolic batch dimension
    (``fetch_model.ensure_u2netp().batched``). ``spec``: the model's pre/post-processing.
    ``device``: "cpu" or "gpu" (alias "cuda"). ``max_batch``: largest bucket (default 1 on
    CPU, 16 on GPU). ``threads``: CPU intra-op threads (None: onnxruntime's default).
    ``io_binding``: GPU only; False copies through host memory (for comparison).
    ``use_tensorrt``: prefer the TensorRT provider when onnxruntime has it (fp16, one
    profile over all buckets, engines cached in ``trt_cache_dir``, by default
    ``model_cache_dir()/trt-engines``); onnxruntime falls back to CUDA if TensorRT fails.
    ``ops``: array backend override (tests run the GPU code path on NumPy with it).
    """

    def __init__(
        self,
        model_path: Path | str,
        spec: ModelSpec = U2NETP,
        *,
        device: str = "cpu",
        device_id: int = 0,
        post: MaskPostprocess | None = None,
        max_batch: int | None = None,
        threads: int | None = None,
        use_tensorrt: bool = True,
        trt_cache_dir: Path | None = None,
        io_binding: bool = True,
        warmup: bool = False,
        ops: ArrayOps | None = None,
    ) -> None:
        device = "gpu" if device in ("gpu", "cuda") else device
        if device not in ("cpu", "gpu"):
            raise ProcessingFailed(f"OnnxSegmenter: device must be 'cpu' or 'gpu', got {device!r}", stage=STAGE)
        self.device, self.device_id, self.spec = device, device_id, spec
        self.post = post or MaskPostprocess()
        self.io_binding = io_binding and device == "gpu"
        self._ops: ArrayOps = ops or (cupy_ops() if device == "gpu" else CpuOps())
        self.model_path = Path(model_path)
        if not self.model_path.is_file():
            raise ProcessingFailed(f"model file {str(self.model_path)!r} does not exist", stage=STAGE)
        wanted = max_batch or DEFAULT_MAX_BATCH[device]
        self._session: ort.InferenceSession | None = self._create_session(threads, use_tensorrt, trt_cache_dir, wanted)
        session = self._live_session()
        inputs = session.get_inputs()
        names = [i.name for i in inputs]
        self._input_name = spec.input_name or names[0]
        if self._input_name not in names:
            raise ProcessingFailed(
                f"model {self.model_path.name}: no input {self._input_name!r}; has {names}",
                stage=STAGE,
            )
        outputs = [o.name for o in session.get_outputs()]
        if spec.output_index >= len(outputs):
            raise ProcessingFailed(
                f"model {self.model_path.name}: output_index {spec.output_index} but the "
                f"model has {len(outputs)} outputs",
                stage=STAGE,
            )
        self._output_name = outputs[spec.output_index]
        fixed = inputs[names.index(self._input_name)].shape[0]
        if isinstance(fixed, int) and fixed > 0 and wanted > fixed:
            if max_batch is not None:
                raise ProcessingFailed(
                    f"model {self.model_path.name} declares a fixed batch of {fixed}; "
                    f"max_batch={max_batch} needs a symbolic batch dimension "
                    "(use fetch_model.ensure_u2netp().batched)",
                    stage=STAGE,
                )
            wanted = fixed
        self.buckets = batch_buckets(wanted)
        self.version = f"{spec.name}@{sha256_file(self.model_path)[:12]}"  # for the output events
        self.providers: list[str] = list(session.get_providers())
        if warmup:
            self.warm_up()

    # -- session -----------------------------------------------------------------------------
    def _create_session(
        self, threads: int | None, use_tensorrt: bool, trt_cache_dir: Path | None, max_batch: int
    ) -> ort.InferenceSession:
        opts = ort.SessionOptions()
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        if threads:
            opts.intra_op_num_threads = threads
        providers: list[Any] = ["CPUExecutionProvider"]
        if self.device == "gpu":
            providers = self._gpu_providers(use_tensorrt, trt_cache_dir, max_batch)
        try:
            session = ort.InferenceSession(str(self.model_path), opts, providers=providers)
        except ORT_ERRORS as exc:
            raise ProcessingFailed(f"cannot load model {str(self.model_path)!r}: {exc}", stage=STAGE) from exc
        if self.device == "gpu" and not {
            "CUDAExecutionProvider",
            "TensorrtExecutionProvider",
        } & set(session.get_providers()):
            raise ProcessingFailed(
                f"model {self.model_path.name}: the session fell back to "
                f"{session.get_providers()}; is onnxruntime-gpu installed?",
                stage=STAGE,
            )
        return session

    def _gpu_providers(self, use_tensorrt: bool, trt_cache_dir: Path | None, max_batch: int) -> list[Any]:
        if hasattr(ort, "preload_dlls"):  # CUDA/cuDNN from nvidia-* wheels, where they came so
            with contextlib.suppress(OSError, RuntimeError):
                ort.preload_dlls()
        available = ort.get_available_providers()
        if "CUDAExecutionProvider" not in available:
            raise ProcessingFailed(f"device 'gpu' needs onnxruntime-gpu; this onnxruntime has {available}", stage=STAGE)
        cuda = (
            "CUDAExecutionProvider",
            {"device_id": self.device_id, "cudnn_conv_algo_search": "EXHAUSTIVE"},
        )
        if not (use_tensorrt and "TensorrtExecutionProvider" in available):
            return [cuda, "CPUExecutionProvider"]
        trt: dict[str, Any] = {"device_id": self.device_id, "trt_fp16_enable": True}
        name = self.spec.input_name or _first_input_name(self.model_path)
        if name is not None:  # one optimisation profile covering every bucket
            h, w = self.spec.input_size
            chw = f"3x{h}x{w}" if self.spec.layout == "NCHW" else f"{h}x{w}x3"
            trt |= {
                "trt_profile_min_shapes": f"{name}:1x{chw}",
                "trt_profile_opt_shapes": f"{name}:{max_batch}x{chw}",
                "trt_profile_max_shapes": f"{name}:{max_batch}x{chw}",
            }
        cache = trt_cache_dir or model_cache_dir() / "trt-engines"
        with contextlib.suppress(OSError):
            cache.mkdir(parents=True, exist_ok=True)
        if cache.is_dir():  # engines are built once per model, GPU and profile, then reused
            trt |= {"trt_engine_cache_enable": True, "trt_engine_cache_path": str(cache)}
        return [("TensorrtExecutionProvider", trt), cuda, "CPUExecutionProvider"]

    def warm_up(self) -> None:
        """Run every bucket once so each shape is planned now rather than on the first event."""
        xp = self._ops.xp
        for b in self.buckets:
            h, w = self.spec.input_size
            self._infer(xp.zeros((b, 3, h, w) if self.spec.layout == "NCHW" else (b, h, w, 3), xp.float32))

    # -- inference ---------------------------------------------------------------------------
    def _infer(self, x: Array) -> Array:
        """Model output ``output_index`` for the prepared batch ``x`` (an array of ``ops.xp``)."""
        session = self._live_session()
        try:
            if self.io_binding:
                return self._infer_bound(session, x)
            host = self._ops.asnumpy(x)
            out = session.run([self._output_name], {self._input_name: host})[0]
            return self._ops.asarray(np.asarray(out))
        except ORT_ERRORS as exc:
            raise ProcessingFailed(
                f"model {self.model_path.name} failed on a batch of shape {tuple(x.shape)}: {exc}",
                stage=STAGE,
            ) from exc

    def _live_session(self) -> ort.InferenceSession:
        if self._session is None:
            raise ProcessingFailed("segmenter used after close()", stage=STAGE)
        return self._session

    def _infer_bound(self, session: ort.InferenceSession, x: Array) -> Array:
        """GPU: input and output stay in device memory (IO binding); returns a CuPy array."""
        import cupy

        x = cupy.ascontiguousarray(x, dtype=cupy.float32)
        cupy.cuda.get_current_stream().synchronize()  # x is complete before onnxruntime reads it
        binding = session.io_binding()
        binding.bind_input(self._input_name, "cuda", self.device_id, np.float32, tuple(x.shape), x.data.ptr)
        binding.bind_output(self._output_name, "cuda", self.device_id)
        session.run_with_iobinding(binding)
        binding.synchronize_outputs()
        value = binding.get_outputs()[0]
        dtypes = {"tensor(float)": cupy.float32, "tensor(float16)": cupy.float16}
        dtype = dtypes.get(value.data_type())
        if dtype is None:
            raise ProcessingFailed(
                f"model {self.model_path.name}: output type {value.data_type()} is not float",
                stage=STAGE,
            )
        shape = tuple(value.shape())
        nbytes = int(np.prod(shape)) * cupy.dtype(dtype).itemsize
        memory = cupy.cuda.UnownedMemory(value.data_ptr(), nbytes, value, self.device_id)
        view = cupy.ndarray(shape, dtype, cupy.cuda.MemoryPointer(memory, 0))
        return view.astype(cupy.float32, copy=True)  # our own memory; onnxruntime's can go

    # -- Segmenter -----------------------------------------------------------------------------
    def segment_batch(self, images: Sequence[Array]) -> list[Array | LightboxError]:
        """Alpha ``(H, W)`` uint8 per image (0 background, 255 subject), same H, W as the image;
        an image of the wrong shape or dtype gets its ``ProcessingFailed`` in its place."""
        ops, xp = self._ops, self._ops.xp

        def checked(item: tuple[int, Array]) -> Array | None:
            validate_image(*item)
            return precut_alpha(item[1], xp)

        masks: list[Array | LightboxError | None] = per_item(checked, enumerate(images))
        todo = [i for i, m in enumerate(masks) if m is None]
        for start, stop, bucket in plan_chunks(len(todo), self.buckets):
            idx = todo[start:stop]
            chunk = [images[i] for i in idx]
            try:
                raw = self._infer(preprocess(chunk, self.spec, bucket, ops))
            except LightboxError as exc:  # this chunk's images fail; the next chunk may still run
                for i in idx:
                    masks[i] = exc
                continue
            probs = output_to_probability(raw[: len(idx)], self.spec, xp)
            for i, prob in zip(idx, probs, strict=True):
                h, w = images[i].shape[:2]
                masks[i] = alpha_from_probability(ops.resize_map(prob, h, w), self.post, ops, images[i])
        return [m for m in masks if m is not None]

    def close(self) -> None:
        """Release the session; the segmenter cannot be used afterwards."""
        self._session = None

    def __enter__(self) -> OnnxSegmenter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
