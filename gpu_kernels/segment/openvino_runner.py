"""Foreground masks from an ONNX model on the CPU with the OpenVINO runtime (PyPI ``openvino``).

OpenVINO reads the ``.onnx`` file directly. On CPUs with bf16 instructions (AVX512-BF16, AMX)
its ``bf16`` inference precision runs u2netp about twice as fast as ONNX Runtime fp32 here
(docs/operations.md, "Model runtimes"), but the masks move (IoU 0.946 on one photo), so the runtime choice
(``gpu_kernels.segment.runtime``) only takes it through the fidelity gate. ``precision="f32"``
keeps full precision. Compiled models are cached in ``model_cache_dir()/openvino`` so a restart
does not compile again. Same pre/post-processing and buckets as :class:`OnnxSegmenter`.

Two images side by side: one image runs on a latency-compiled model that spreads each layer over
every thread, but u2netp's many small layers leave those threads waiting for each other, the more
so when another lane (render, encode) holds a core. A chunk of two or more images therefore goes
to a second compilation of the same model with ``streams`` streams (default 2), each image on
its own stream and its share of the threads, started together and awaited together: on a
2-vCPU host two images take ~240 ms instead of 2 × 137 ms, and ~200 ms/img instead of
~280 ms/img while a single-threaded lane runs beside them (docs/performance.md). Each
compilation (~0.1 s from the cache) is made when first needed, or by :meth:`~OpenVinoSegmenter.prepare`
at start-up (``ImagePipeline.device_callers`` calls it), never at construction: ``lightbox
process`` of several files sends every image to the streams and never compiles the other. With
``callers.concurrent`` (several threads calling at once: ``lightbox process`` and the worker run
two on their device lane) a single image takes a stream while other threads' calls come and go,
and the latency compilation when it is alone (no other thread's call now nor within the last
``LONE_GAP_S``): one image on one stream's thread takes ~230 ms against ~115 ms on both, so a
worker at light load keeps its latency (``lone_latency``, :class:`~gpu_kernels.segment.bucketed.Callers`;
``lightbox process``, which wants throughput only, turns it off). The segmenter is safe for such callers (the one-image
request under a lock, a pool of stream requests, the bindings' calls serialised).

bf16, checked (``recheck``): bf16 moves u2netp's masks on some photos and not on others, and
the photos it moves are those where the bf16 probability map is unsure over a large part of the
subject. So with ``recheck`` set, each image of a bf16 call whose :func:`unsure_share` exceeds
it is run again at f32 (a one-image f32 compilation of the same file, made when first needed) and
takes that output; the others keep bf16's. Over the gate set, the INT8 calibration set and the
peer benchmark's photos (56 images, at the model's resolution) every image whose bf16 mask fell
below IoU 0.94 against f32 had an unsure share of 0.13-0.46, and every other one at most 0.043
(docs/model-runtimes.md); :data:`RECHECK_UNSURE` sits between.
"""

from __future__ import annotations

import contextlib
import functools
import queue
import sys
import threading
from pathlib import Path
from typing import Any, Literal

import numpy as np

from gpu_kernels.array import Array
from gpu_kernels.segment.bucketed import BucketedSegmenter, Callers, batch_buckets
from gpu_kernels.segment.fetch_model import model_cache_dir, sha256_file
from gpu_kernels.segment.machine import usable_cores
from gpu_kernels.segment.model import U2NETP, ModelSpec, output_to_probability
from gpu_kernels.segment.ops import CpuOps
from gpu_kernels.segment.postprocess import MaskPostprocess
from gpu_kernels.segment.variants import batch_copy
from schemas.errors import ProcessingFailed

__all__ = ["RECHECK_UNSURE", "OpenVinoSegmenter", "openvino_module", "shared_core",
           "unsure_share"]

STAGE = "segment"
Precision = Literal["f32", "bf16", "f16"]
RECHECK_UNSURE = 0.08  # bf16, checked: an image whose unsure_share exceeds this runs again at f32
UNSURE_BAND = 0.1  # a probability within this of 1/2 is unsure


def unsure_share(prob: np.ndarray) -> np.ndarray:
    """Per map of ``prob`` ``(N, h, w)`` in [0, 1]: the pixels within :data:`UNSURE_BAND` of 1/2,
    as a share of the subject's pixels (``prob >= 1/2``; at least 1 % of the map, so a map with
    next to no subject is not judged by a handful of pixels)."""
    n = prob.shape[1] * prob.shape[2]
    unsure = (np.abs(prob - np.float32(0.5)) < np.float32(UNSURE_BAND)).sum(axis=(1, 2))
    subject = (prob >= np.float32(0.5)).sum(axis=(1, 2))
    return np.asarray(unsure / np.maximum(subject, 0.01 * n), dtype=np.float64)


def openvino_module() -> Any:
    """The ``openvino`` package without its model converter: ``import openvino`` also imports
    ``openvino.tools.ovc`` (``convert_model``, ~50 ms of argparse and friends at every start),
    which lightbox never calls: it reads ONNX files directly. The package's ``__init__`` skips the
    converter when importing it raises ``ImportError``, which a ``None`` in ``sys.modules`` makes
    it do; the ``None`` is taken out again so an explicit import of the converter still works."""
    if "openvino" in sys.modules:
        return sys.modules["openvino"]
    blocked = "openvino.tools.ovc" not in sys.modules
    if blocked:
        sys.modules["openvino.tools.ovc"] = None  # type: ignore[assignment]
    try:
        import openvino
    finally:
        if blocked and sys.modules.get("openvino.tools.ovc", 0) is None:
            del sys.modules["openvino.tools.ovc"]
    return openvino


@functools.cache
def shared_core() -> Any:
    """The process's one OpenVINO ``Core``, kept until the process ends.

    Each ``Core``'s CPU plugin installs its own alternate signal stack on the thread that compiles a
    model and, when it goes away, frees it and puts back the stack it found. Models of different
    ``Core`` objects released in another order than they were made (the start-up gate does: the
    next candidate is built before the last one is dropped) leave the thread on a freed stack, and
    its next signal, SIGTERM included, killed the process with SIGSEGV. One ``Core`` for the
    whole process installs one stack per thread and keeps it."""
    return openvino_module().Core()


def _batch_of_one(model: Path, cache: Path) -> Path:
    """A copy of ``model`` with its batch fixed at 1 in ``cache`` (written on first use), or
    ``model`` itself when the copy cannot be written. Every request of a segmenter with
    ``max_batch=1`` runs one image, and with every shape known OpenVINO folds u2netp's shape
    arithmetic (509 ShapeOf nodes) at compile time instead of working shapes out at the first
    call: on a 2-vCPU host the first image took ~165 instead of ~210 ms, the first pair on the streams ~310
    instead of ~420 ms, and later images ~3 % less (docs/performance.md)."""
    try:
        return batch_copy(model, 1, cache)
    except Exception:  # a read-only cache, no 'onnx' package, a file 'onnx' cannot parse:
        return model  # the model as it is (OpenVINO then says what it makes of a bad one)


class OpenVinoSegmenter(BucketedSegmenter):
    """Implements :class:`gpu_kernels.backends.Segmenter` on the CPU with OpenVINO.

    ``model_path``: an ONNX file (symbolic batch for ``max_batch`` > 1). ``precision``: the
    inference precision hint ("f32", "bf16"). ``threads``: inference threads (None: the usable
    cores). ``streams``: images run side by side when a chunk has several (None: 2 when there
    are 2 threads or more; 1 turns it off). ``max_batch``: the largest batch one model call takes
    (default 1, the largest bucket is then ``streams``: batching within a call does not pay on a
    CPU). ``recheck`` (bf16 only): run each image whose :func:`unsure_share` exceeds it again at
    f32 (see the module docstring; :data:`RECHECK_UNSURE`).
    """

    def __init__(self, model_path: Path | str, spec: ModelSpec = U2NETP, *, precision: Precision = "bf16",
                 threads: int | None = None, streams: int | None = None, max_batch: int | None = None,
                 post: MaskPostprocess | None = None, cache_dir: Path | None = None, warmup: bool = False,
                 recheck: float | None = None) -> None:
        try:
            shared_core()
        except ImportError as exc:
            raise ProcessingFailed("the OpenVINO runtime needs the 'openvino' package", stage=STAGE) from exc
        self.device, self.spec, self.precision = "cpu", spec, precision
        self.pad_chunks = False  # each chunk at its own size (see BucketedSegmenter)
        self.post = post or MaskPostprocess()
        self._ops = CpuOps()
        self.model_path = Path(model_path)
        if not self.model_path.is_file():
            raise ProcessingFailed(f"model file {str(self.model_path)!r} does not exist", stage=STAGE)
        cache = cache_dir or model_cache_dir() / "openvino"
        self._cache_dir = cache_dir
        wanted = max_batch or 1
        self._source = self.model_path if wanted > 1 else _batch_of_one(self.model_path, cache)
        threads = threads or usable_cores()
        self.streams = max(1, min(streams or 2, threads))
        self._config: dict[str, Any] = {"INFERENCE_PRECISION_HINT": precision, "INFERENCE_NUM_THREADS": threads,
                                        "PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": 1}
        with contextlib.suppress(OSError):
            cache.mkdir(parents=True, exist_ok=True)
            self._config["CACHE_DIR"] = str(cache)  # per compiled model: the shared Core keeps no cache setting
        self.buckets = batch_buckets(wanted * self.streams)
        self._wanted = wanted
        self._compiled: Any | None = None  # the one-image compilation, made when first needed
        self._request: Any | None = None  # its request
        self._input, self._output = "", None  # from the first compilation (either)
        self._side_by_side: list[Any] = []  # the streams' requests, made when first needed
        self._free: queue.SimpleQueue[Any] = queue.SimpleQueue()  # those not running an image now
        self._closed = False
        self._latency_lock, self._take_lock, self._api_lock = threading.Lock(), threading.Lock(), threading.Lock()
        self.callers = Callers(self.streams)  # which calls take the streams (concurrent, lone_latency)
        self.version = f"{spec.name}@{sha256_file(self.model_path)[:12]}"
        self.providers = [f"OpenVINO:CPU:{precision}"]
        # the f32 twin that re-runs unsure images (one image at a time, its own lock); made when first needed
        self.recheck = recheck if precision == "bf16" else None
        self.rechecked = 0  # images run again at f32 so far
        self._exact: OpenVinoSegmenter | None = None
        self._exact_lock = threading.Lock()
        if self.recheck is not None:
            self.providers.append("OpenVINO:CPU:f32 (unsure images)")
        if warmup:
            self.warm_up()

    def prepare(self) -> None:
        """Compile now what the first calls will run on, so that a model OpenVINO cannot load
        fails here and the first image pays no compilation: the streams when every image takes
        them (``callers.concurrent`` without ``lone_latency``: ``lightbox process`` of several
        files), else the one-image compilation. Nothing is compiled at construction: a run that
        never sends a single image to the one-image compilation never compiles it (~0.1 s)."""
        self._check_open()
        callers = self.callers
        assert callers is not None
        if self.streams >= 2 and callers.concurrent and not callers.lone_latency:
            with self._take_lock:
                self._make_streams()
        else:
            with self._latency_lock:
                self._one_image_request()

    def _compile(self, config: dict[str, Any]) -> Any:
        """A compilation of the model with ``config``, checked against the spec and ``max_batch``."""
        try:  # from the path: with a cached blob OpenVINO skips reading the ONNX file (~0.1 s at start)
            compiled = shared_core().compile_model(str(self._source), "CPU", config)
        except RuntimeError as exc:
            raise ProcessingFailed(f"OpenVINO cannot load model {str(self.model_path)!r}: {exc}",
                                   stage=STAGE) from exc
        inputs = [p.get_any_name() for p in compiled.inputs]
        name = self.spec.input_name or inputs[0]
        if name not in inputs:
            raise ProcessingFailed(f"model {self.model_path.name}: no input {name!r}; has {inputs}", stage=STAGE)
        outputs = compiled.outputs
        if self.spec.output_index >= len(outputs):
            raise ProcessingFailed(f"model {self.model_path.name}: output_index {self.spec.output_index} but the "
                                   f"model has {len(outputs)} outputs", stage=STAGE)
        batch_dim = compiled.input(name).get_partial_shape()[0]
        if batch_dim.is_static and self._wanted > batch_dim.get_length():
            raise ProcessingFailed(f"model {self.model_path.name} declares a fixed batch of {batch_dim.get_length()}; "
                                   f"max_batch={self._wanted} needs a symbolic batch dimension", stage=STAGE)
        self._input, self._output = name, outputs[self.spec.output_index]
        return compiled

    def _one_image_request(self) -> Any:
        """The one-image compilation's request, compiled on first use (the caller holds
        ``_latency_lock``)."""
        if self._request is None:
            self._compiled = self._compile(self._config)
            self._request = self._compiled.create_infer_request()
        return self._request

    def _make_streams(self) -> None:
        """The side-by-side compilation and its requests, compiled on first use (the caller holds
        ``_take_lock``)."""
        if not self._side_by_side:
            compiled = self._compile({**self._config, "PERFORMANCE_HINT": "THROUGHPUT", "NUM_STREAMS": self.streams})
            self._side_by_side = [compiled.create_infer_request() for _ in range(self.streams)]
            for req in self._side_by_side:
                self._free.put(req)

    def _check_open(self) -> None:
        if self._closed:
            raise ProcessingFailed("segmenter used after close()", stage=STAGE)

    def _infer(self, x: Array) -> Array:
        self._check_open()
        x = np.ascontiguousarray(x, dtype=np.float32)
        assert self.callers is not None
        with self.callers.call(len(x)) as side_by_side:
            raw = self._run(x, side_by_side)
        return raw if self.recheck is None else self._rechecked(x, raw)

    def _rechecked(self, x: np.ndarray, raw: np.ndarray) -> np.ndarray:
        """``raw`` with the output of each image whose bf16 map is unsure replaced by f32's."""
        unsure = np.flatnonzero(unsure_share(np.asarray(output_to_probability(raw, self.spec, np))) > self.recheck)
        if unsure.size == 0:
            return raw
        exact = self._exact_twin()
        for i in unsure:  # a minority (a quarter of the peer photos), one at a time on the twin's one-image compilation
            raw[i] = exact._run(x[i:i + 1], side_by_side=False)[0]
        with self._exact_lock:
            self.rechecked += int(unsure.size)
        return raw

    def _exact_twin(self) -> OpenVinoSegmenter:
        with self._exact_lock:
            if self._exact is None:
                self._exact = OpenVinoSegmenter(self.model_path, self.spec, precision="f32",
                                                threads=int(self._config["INFERENCE_NUM_THREADS"]), streams=1,
                                                max_batch=self._wanted, post=self.post,
                                                cache_dir=self._cache_dir)
            return self._exact

    def _run(self, x: np.ndarray, side_by_side: bool) -> Array:
        try:
            if not side_by_side:
                with self._latency_lock:  # one request: calls from several threads take turns
                    request = self._one_image_request()
                    with self._api_lock:  # its input copy never beside a stream's (see below)
                        request.start_async({self._input: x})
                    request.wait()
                    with self._api_lock:  # a copy: the request reuses its buffers
                        return np.array(request.get_tensor(self._output).data, dtype=np.float32)
            parts = np.array_split(x, min(self.streams, len(x)))
            requests = self._take_streams(len(parts))
            try:  # the bindings' calls one thread at a time (two threads copying inputs at once hung once)
                with self._api_lock:
                    for req, part in zip(requests, parts, strict=True):
                        req.start_async({self._input: part})
                for req in requests:
                    req.wait()
                with self._api_lock:
                    return np.concatenate([np.array(req.get_tensor(self._output).data, dtype=np.float32)
                                           for req in requests])
            finally:
                for req in requests:
                    self._free.put(req)
        except RuntimeError as exc:
            raise ProcessingFailed(f"model {self.model_path.name} failed on a batch of shape {tuple(x.shape)} "
                                   f"(OpenVINO): {exc}", stage=STAGE) from exc

    def _take_streams(self, n: int) -> list[Any]:
        """``n`` free requests of the side-by-side compilation (compiled on first use), waiting
        while other callers' images hold them. Taken together under the lock: two callers that
        each held one request and waited for a second would wait for ever."""
        with self._take_lock:
            self._make_streams()
            return [self._free.get() for _ in range(n)]

    def close(self) -> None:
        self._closed = True
        if self._exact is not None:
            self._exact.close()
        self._request = None
        self._side_by_side, self._free = [], queue.SimpleQueue()
        self._compiled = None
