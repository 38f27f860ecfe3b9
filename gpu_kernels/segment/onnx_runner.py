"""Foreground masks from an ONNX model with ONNX Runtime: one session, batch-size buckets.

``OnnxSegmenter(model_path, spec, device="cpu")`` runs the CPU provider on NumPy images.
``device="gpu"`` takes CuPy images and keeps them on the device: pre-processing in CuPy,
TensorRT provider when onnxruntime has it (else CUDA), inputs and outputs bound to device
memory with IO binding, post-processing in CuPy; the masks come back as CuPy arrays.
``cuda_graphs=True`` replays one captured CUDA graph per bucket (see the class doc). On the
CPU the session is tuned by :func:`cpu_session_options`, and its optimised graph is kept in the
model cache (:func:`compiled_path`): a later start loads that graph with the optimisations off
instead of optimising the model again (~45 % less CPU to make the session, the same outputs bit
for bit).

The session is created once, in the constructor (one per worker), never per event. A batch
is cut into chunks of at most ``max_batch`` images and each chunk is zero-padded up to the
next bucket (1, 2, 4, 8, ... , ``max_batch``), so the runtime sees a handful of shapes and
plans each once (``warmup=True`` plans them all at start-up). A model whose input declares a
fixed batch (the published u2netp.onnx: 1) limits the buckets to that size.

RGBA images that already carry transparency are cut out already: their alpha (stray specks far
from the subject zeroed, ``clean_cutout``) is returned as the mask and they skip the model.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from gpu_kernels.array import Array
from gpu_kernels.lane_streams import lane_streams
from gpu_kernels.segment.bucketed import BucketedSegmenter, batch_buckets, plan_chunks
from gpu_kernels.segment.fetch_model import model_cache_dir, sha256_file
from gpu_kernels.segment.graphs import GraphTable
from gpu_kernels.segment.machine import cpu_flags_line, usable_cores
from gpu_kernels.segment.model import U2NETP, ModelSpec
from gpu_kernels.segment.ops import ArrayOps, CpuOps, cupy_ops
from gpu_kernels.segment.postprocess import MaskPostprocess
from gpu_kernels.segment.variants import batch_copy
from schemas.errors import ProcessingFailed

if TYPE_CHECKING:
    import onnxruntime as ort

__all__ = ["DEFAULT_MAX_BATCH", "OnnxSegmenter", "batch_buckets", "compiled_path", "cpu_session_options",
           "device_lane_stream", "plan_chunks", "stream_options"]

log = logging.getLogger(__name__)

STAGE = "segment"
DEFAULT_MAX_BATCH = {"cpu": 1, "gpu": 16}  # on CPU batching does not pay (u2netp on 2 cores: time grows with the batch)


def _onnxruntime() -> Any:
    """``onnxruntime``, imported on first use: a start whose model runs on OpenVINO (``auto`` on
    most CPUs) never needs it, and its import costs ~0.1 s."""
    import onnxruntime

    return onnxruntime


@functools.cache
def ort_errors() -> tuple[type[BaseException], ...]:
    """What ONNX Runtime raises when a model cannot load or run."""
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


def graph_errors() -> tuple[type[BaseException], ...]:
    """What building a bucket's CUDA graph may raise (it then runs the plain way)."""
    return (ProcessingFailed, *ort_errors())


def cpu_session_options(threads: int | None = None) -> ort.SessionOptions:
    """Session options for a model on the CPU: every graph optimisation, one intra-op thread
    per usable core (``threads`` overrides), sequential execution (no inter-op pool), and idle
    intra-op threads that sleep instead of spinning: on a machine shared with the decode and
    output threads, spinning cost u2netp 330 CPU-ms per image against 246 (measured on a
    2-vCPU host under load).

    The memory arena is on and memory-pattern planning off. With a pattern, the second run of
    each new batch size allocates a block of its own for that size's intermediate tensors and
    faults its pages in (u2netp's first batch of 8 after the warm-up: 2 GB). On a 2-vCPU
    host a batch of 12 then took 570 ms per image instead of ~150 (9.5 s of system time),
    and the process grew to 8.8 GB. Without a pattern the tensors come from the arena, which
    the warm-up has grown to the largest bucket, so no batch size stalls, at the same
    steady-state speed (paired runs at batches 1, 2 and 4: within 3 ms per image)."""
    ort = _onnxruntime()
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.intra_op_num_threads = threads or usable_cores()
    opts.inter_op_num_threads = 1
    opts.enable_cpu_mem_arena = True
    opts.enable_mem_pattern = False
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return opts


def compiled_path(model: Path, opts: ort.SessionOptions, cache_dir: Path) -> Path:
    """Where the graph ONNX Runtime optimised ``model`` into under ``opts`` on the CPU is kept:
    ``cache_dir/<model stem>.<key>.onnx``, the key a hash of everything the optimised graph
    depends on: the model's SHA-256, ONNX Runtime's version, the options that shape the session
    (optimisation level, execution mode, threads, memory arena and pattern, spinning) and the
    CPU's instruction sets (with every optimisation on, ONNX Runtime lays convolutions out for
    this CPU's vector width: the graph is only valid where it was made)."""
    ort = _onnxruntime()
    raw = json.dumps([sha256_file(model), ort.__version__, int(opts.graph_optimization_level),
                      int(opts.execution_mode), opts.intra_op_num_threads, opts.inter_op_num_threads,
                      opts.enable_cpu_mem_arena, opts.enable_mem_pattern,
                      opts.get_session_config_entry("session.intra_op.allow_spinning"), cpu_flags_line()])
    return cache_dir / f"{model.stem}.{hashlib.sha256(raw.encode()).hexdigest()[:16]}.onnx"


def _cpu_session(path: Path, opts: ort.SessionOptions,
                 cache_dir: Path | None) -> tuple[ort.InferenceSession, Path | None]:
    """A CPU session of ``path`` under ``opts``, and the kept graph it was loaded from (None: it
    was optimised now): from its optimised graph in ``cache_dir`` (see :func:`compiled_path`)
    with the graph optimisations off when that is there, else from ``path``, saving the
    optimised graph there for the next start, with its SHA-256 beside it (``.sha256``). A kept
    graph that does not match its checksum or does not load is logged, deleted and made again; a
    cache that cannot be written is not used. ``cache_dir`` None: no cache."""
    ort = _onnxruntime()
    providers = ["CPUExecutionProvider"]
    if cache_dir is None or opts.graph_optimization_level == ort.GraphOptimizationLevel.ORT_DISABLE_ALL:
        return ort.InferenceSession(str(path), opts, providers=providers), None
    kept = compiled_path(path, opts, cache_dir)
    digest = kept.with_name(kept.name + ".sha256")
    if kept.is_file():
        level = opts.graph_optimization_level
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        try:
            if not digest.is_file() or digest.read_text().strip() != sha256_file(kept):
                raise ValueError("it does not match its checksum")
            return ort.InferenceSession(str(kept), opts, providers=providers), kept
        except ort_errors() as exc:  # OSError and ValueError among them
            log.warning("the optimised graph %s did not load (%s); optimising %s again", kept, exc, path.name)
            for stale in (kept, digest):
                with contextlib.suppress(OSError):
                    stale.unlink()
        finally:
            opts.graph_optimization_level = level
    tmp = kept.with_name(f"{kept.name}.{os.getpid()}.tmp")
    with contextlib.suppress(OSError):
        cache_dir.mkdir(parents=True, exist_ok=True)
    if not os.access(cache_dir, os.W_OK):
        return ort.InferenceSession(str(path), opts, providers=providers), None
    opts.optimized_model_filepath = str(tmp)
    severity = opts.log_severity_level
    opts.log_severity_level = 3  # not its warning that the graph is for this machine only: the key says so
    try:
        session = ort.InferenceSession(str(path), opts, providers=providers)
    except ort_errors():  # the graph could not be written, or the model does not load: once more without
        with contextlib.suppress(OSError):
            tmp.unlink()
        opts.optimized_model_filepath, opts.log_severity_level = "", severity
        return ort.InferenceSession(str(path), opts, providers=providers), None
    finally:
        opts.optimized_model_filepath, opts.log_severity_level = "", severity
    try:  # each file whole or not at all: another process may be reading or writing them
        digest_tmp = digest.with_name(f"{digest.name}.{os.getpid()}.tmp")
        digest_tmp.write_text(sha256_file(tmp))
        tmp.replace(kept)
        digest_tmp.replace(digest)
    except OSError as exc:
        log.info("the optimised graph of %s is not kept (%s)", path.name, exc)
        for stale in (tmp, digest_tmp):
            with contextlib.suppress(OSError):
                stale.unlink()
    return session, None


def stream_options(ptr: int) -> dict[str, str]:
    """CUDA / TensorRT provider options that run the session's kernels on the CUDA stream
    ``ptr`` (a ``cudaStream_t`` handle; none for 0, ONNX Runtime then uses its own)."""
    return {"has_user_compute_stream": "1", "user_compute_stream": str(int(ptr))} if ptr else {}


def device_lane_stream() -> int:
    """The device lane's CUDA stream handle (:mod:`gpu_kernels.lane_streams`); 0 where CuPy
    cannot make one."""
    try:
        return lane_streams("gpu")["device"].ptr
    except Exception:  # no CuPy or no CUDA device: the session then fails or runs on its own stream
        return 0


def _first_input_name(path: Path) -> str | None:
    """The first graph input that is not an initializer, read with ``onnx`` if it is installed."""
    try:
        import onnx
    except ImportError:
        return None
    graph = onnx.load(str(path), load_external_data=False).graph
    initializers = {t.name for t in graph.initializer}
    return next((str(v.name) for v in graph.input if v.name not in initializers), None)


class OnnxSegmenter(BucketedSegmenter):
    """Implements :class:`gpu_kernels.backends.Segmenter` with an ONNX model (see module doc).

    ``model_path``: an ONNX file; for batches above 1 it needs a symbolic batch dimension
    (``fetch_model.ensure_u2netp().batched``). ``spec``: the model's pre/post-processing.
    ``device``: "cpu" or "gpu" (alias "cuda"). ``max_batch``: largest bucket (default 1 on
    CPU, 16 on GPU). ``threads``: CPU intra-op threads (None: the usable cores).
    ``use_tensorrt``: prefer the TensorRT provider when onnxruntime has it (fp16, one
    profile over all buckets, engines cached in ``trt_cache_dir``, by default
    ``model_cache_dir()/trt-engines``); onnxruntime falls back to CUDA if TensorRT fails.
    ``cuda_graphs``: GPU only; one CUDA graph per bucket, each captured by its own session over
    a copy of the model with that static batch (shape subgraphs fold away, every node runs on
    the GPU), input and output bound to fixed device buffers. Every bucket is captured in the
    constructor (before traffic; :mod:`.graphs`); a bucket whose capture or a later replay fails
    runs the plain way; ``cuda_graph_buckets`` says which buckets have one.
    ``ops``: array backend override (tests run the GPU code path on NumPy with it).
    ``compiled_dir``: where the CPU session's optimised graph is kept (:func:`compiled_path`;
    default ``model_cache_dir()/onnxruntime``); ``keep_compiled=False`` optimises at every start.
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
        cuda_graphs: bool = False,
        warmup: bool = False,
        ops: ArrayOps | None = None,
        compiled_dir: Path | None = None,
        keep_compiled: bool = True,
        compute_stream: int | None = None,
    ) -> None:
        device = "gpu" if device in ("gpu", "cuda") else device
        if device not in ("cpu", "gpu"):
            raise ProcessingFailed(f"OnnxSegmenter: device must be 'cpu' or 'gpu', got {device!r}", stage=STAGE)
        self.device, self.device_id, self.spec = device, device_id, spec
        self.pad_chunks = device == "gpu"  # a symbolic batch on a CPU: each chunk at its own size
        self.post = post or MaskPostprocess()
        self.io_binding = device == "gpu"  # the GPU binds device buffers; the CPU runs on host arrays
        self.cuda_graphs = cuda_graphs and self.io_binding
        self._ops: ArrayOps = ops or (cupy_ops() if device == "gpu" else CpuOps())
        # the CUDA stream the GPU session runs its kernels on: the device lane's, so the model is
        # ordered with the lane's CuPy work on the device (0: ONNX Runtime's own stream)
        self.compute_stream = compute_stream if compute_stream is not None else (
            device_lane_stream() if device == "gpu" else 0)
        self.model_path = Path(model_path)
        if not self.model_path.is_file():
            raise ProcessingFailed(f"model file {str(self.model_path)!r} does not exist", stage=STAGE)
        wanted = max_batch or DEFAULT_MAX_BATCH[device]
        self._threads, self._use_tensorrt, self._trt_cache_dir = threads, use_tensorrt, trt_cache_dir
        self._compiled_dir = (compiled_dir or model_cache_dir() / "onnxruntime") if keep_compiled else None
        self.compiled_from: Path | None = None  # the kept optimised graph the CPU session was loaded from
        self._session: ort.InferenceSession | None = self._create_session(self.model_path, wanted)
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
        self._graphs = GraphTable(graph_errors())
        self.cuda_graph_errors = self._graphs.errors  # bucket -> why it has no graph
        if warmup or self.cuda_graphs:  # graphs are captured now, before any traffic
            self.warm_up()

    @property
    def cuda_graph_buckets(self) -> tuple[int, ...]:
        return self._graphs.buckets

    def warm_up(self) -> None:
        """Plan every bucket, then (``cuda_graphs``) capture each bucket's graph while nothing
        else uses the device; a bucket whose capture fails runs the plain way."""
        super().warm_up()
        if self.cuda_graphs:
            self._graphs.capture(self.buckets, self._capture)

    # -- session -----------------------------------------------------------------------------
    def _create_session(self, path: Path, max_batch: int, *, cuda_graph: bool = False) -> ort.InferenceSession:
        ort = _onnxruntime()
        opts = cpu_session_options(self._threads) if self.device == "cpu" else ort.SessionOptions()
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        providers: list[Any] = ["CPUExecutionProvider"]
        if self.device == "gpu":
            providers = self._gpu_providers(path, self._use_tensorrt and not cuda_graph, self._trt_cache_dir,
                                            max_batch, cuda_graph=cuda_graph)
        try:
            if self.device == "cpu":
                session, self.compiled_from = _cpu_session(path, opts, self._compiled_dir)
            else:
                session = ort.InferenceSession(str(path), opts, providers=providers)
        except ort_errors() as exc:
            raise ProcessingFailed(f"cannot load model {str(path)!r}: {exc}", stage=STAGE) from exc
        if self.device == "gpu" and not {
            "CUDAExecutionProvider",
            "TensorrtExecutionProvider",
        } & set(session.get_providers()):
            raise ProcessingFailed(
                f"model {path.name}: the session fell back to "
                f"{session.get_providers()}; is onnxruntime-gpu installed?",
                stage=STAGE,
            )
        return session

    def _gpu_providers(self, path: Path, use_tensorrt: bool, trt_cache_dir: Path | None, max_batch: int, *,
                       cuda_graph: bool = False) -> list[Any]:
        ort = _onnxruntime()
        if hasattr(ort, "preload_dlls"):  # CUDA/cuDNN from nvidia-* wheels, where they came so
            with contextlib.suppress(OSError, RuntimeError):
                ort.preload_dlls()
        available = ort.get_available_providers()
        if "CUDAExecutionProvider" not in available:
            raise ProcessingFailed(f"device 'gpu' needs onnxruntime-gpu; this onnxruntime has {available}", stage=STAGE)
        cuda_opts: dict[str, Any] = {"device_id": self.device_id, "cudnn_conv_algo_search": "EXHAUSTIVE"}
        if cuda_graph:  # captured and replayed on ONNX Runtime's own stream, at warm-up
            cuda_opts["enable_cuda_graph"] = "1"
            return [("CUDAExecutionProvider", cuda_opts)]  # every node on the GPU, or no session
        cuda_opts |= stream_options(self.compute_stream)
        cuda = ("CUDAExecutionProvider", cuda_opts)
        if not (use_tensorrt and "TensorrtExecutionProvider" in available):
            return [cuda, "CPUExecutionProvider"]
        trt: dict[str, Any] = {"device_id": self.device_id, "trt_fp16_enable": True}
        trt |= stream_options(self.compute_stream)
        name = self.spec.input_name or _first_input_name(path)
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

    # -- inference ---------------------------------------------------------------------------
    def _infer(self, x: Array) -> Array:
        """Model output ``output_index`` for the prepared batch ``x`` (an array of ``ops.xp``)."""
        session = self._live_session()
        try:
            if self.cuda_graphs:
                return self._graphs.run(x, lambda x: self._infer_bound(session, x))
            if self.io_binding:
                return self._infer_bound(session, x)
            host = self._ops.asnumpy(x)
            out = session.run([self._output_name], {self._input_name: host})[0]
            return self._ops.asarray(np.asarray(out))
        except ort_errors() as exc:
            raise ProcessingFailed(
                f"model {self.model_path.name} failed on a batch of shape {tuple(x.shape)}: {exc}",
                stage=STAGE,
            ) from exc

    def _live_session(self) -> ort.InferenceSession:
        if self._session is None:
            raise ProcessingFailed("segmenter used after close()", stage=STAGE)
        return self._session

    def _capture(self, bucket: int) -> _GraphBucket:
        """Capture ``bucket``'s graph: a session over a static-batch copy of the model, run until
        ONNX Runtime has captured (it does after one regular run) and replayed once."""
        static = batch_copy(self.model_path, bucket, model_cache_dir() / "static")
        import cupy

        h, w = self.spec.input_size
        shape = (bucket, 3, h, w) if self.spec.layout == "NCHW" else (bucket, h, w, 3)
        out_shape = tuple(self._infer_bound(self._live_session(), cupy.zeros(shape, cupy.float32)).shape)
        session = self._create_session(static, bucket, cuda_graph=True)
        graph = _GraphBucket(session, self._input_name, self._output_name, shape, out_shape, self.device_id)
        for _ in range(2):  # regular run + capture, then a replay: all before the lanes start
            graph.run(cupy.zeros(shape, cupy.float32))
        return graph

    def _infer_bound(self, session: ort.InferenceSession, x: Array) -> Array:
        """GPU: input and output stay in device memory (IO binding); returns a CuPy array."""
        import cupy

        x = cupy.ascontiguousarray(x, dtype=cupy.float32)
        if not self.compute_stream or cupy.cuda.get_current_stream().ptr != self.compute_stream:
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

    def close(self) -> None:
        """Release the sessions; the segmenter cannot be used afterwards."""
        self._session = None
        self._graphs.clear()

    def __enter__(self) -> OnnxSegmenter:
        return self


class _GraphBucket:
    """One batch bucket's CUDA graph: a session with ``enable_cuda_graph`` over a static-batch
    model, its input and output bound once to fixed CuPy buffers (a captured graph replays the
    same addresses). ``run`` copies the batch in, replays, and returns a copy of the output."""

    def __init__(self, session: ort.InferenceSession, input_name: str, output_name: str,
                 shape: tuple[int, ...], out_shape: tuple[int, ...], device_id: int) -> None:
        import cupy

        self.session = session
        self.x = cupy.zeros(shape, cupy.float32)
        self.y = cupy.zeros(out_shape, cupy.float32)
        self.binding = session.io_binding()
        self.binding.bind_input(input_name, "cuda", device_id, np.float32, shape, self.x.data.ptr)
        self.binding.bind_output(output_name, "cuda", device_id, np.float32, out_shape, self.y.data.ptr)

    def run(self, x: Array) -> Array:
        import cupy

        self.x[...] = x
        cupy.cuda.get_current_stream().synchronize()  # the copy is done before the graph reads it
        self.session.run_with_iobinding(self.binding)
        self.binding.synchronize_outputs()
        return self.y.copy()
