"""The decoder chain (docs/architecture.md, step 2): header guards, then DALI, libjpeg-turbo, Pillow
and OpenCV in turn, on CPU or GPU behind one class.

``DecoderChain(device="cpu")`` runs ``external_source → decoders.image(device="cpu")``;
``DecoderChain(device="gpu")`` runs the same pipeline with ``device="mixed"`` (nvJPEG with the
hardware JPEG decoder taking ``hw_decoder_load`` of the batch) and hands out CuPy arrays.
Output per image: ``(H, W, 3)`` uint8 RGB, or ``(H, W, 4)`` uint8 RGBA for sources whose
header declares transparency; EXIF orientation applied; CMYK/YCCK and grayscale converted to
RGB; 16-bit PNGs reduced to 8 bits.

Routing (decided from :func:`~gpu_kernels.codec.sniff.sniff`, before any pixel is decoded):

- guard failures (bytes, pixels, frames, JPEG scans/markers, broken header) → the error,
  nothing decoded;
- Pillow (:mod:`.pillow_decode`, CPU on both backends, uploaded afterwards on GPU): GIF,
  HEIF/HEIC (pillow-heif) and AVIF, which DALI 2.4 refuses ("nvImageCodec failure: '#4'");
  sources with alpha (PNG colour type 4/6 or tRNS, WebP/TIFF/BMP with alpha: DALI 2.4's
  ``output_type=RGB`` drops alpha, and ``ANY_DATA`` — the only mode that keeps it — fails on
  gray+alpha PNGs and kills the process (SIGSEGV) on grayscale JPEGs); animated sources (first
  frame only); samples deeper than 8 bits (a 16-bit 8000² PNG peaks at 12 bytes a pixel
  through DALI's CPU decoder, 7 through Pillow); and any image whose embedded ICC profile is
  not sRGB (converted to sRGB; DALI ignores profiles);
- reduced-size decode when ``max_side`` is at most half the source's longer side:
  ``"dct"`` (CPU default) decodes JPEGs (not CMYK) with libjpeg-turbo's DCT scaling
  (simplejpeg, factors 1/2, 1/4, 1/8) to the smallest size whose longer side is still
  >= ``max_side``; ``"resize"`` (GPU default) fuses an antialiased ``fn.resize`` into the DALI
  pipeline to exactly ``max_side`` on the longer side;
- everything else (JPEG, 8-bit PNG, WebP, 8-bit TIFF and BMP; sRGB or untagged) → the DALI
  pipeline, ``batch_size`` images per run. DALI's TIFF (libtiff: LZW, multi-page → first page)
  and BMP decodes are pixel-identical to Pillow's (docs/robustness.md has the speeds) — one
  path kept.

Fallbacks: a decoder's refusal is not final while another decoder reads the format. What DALI
refuses (e.g. 1-bit TIFF, 16-bit 555 BMP: "nvImageCodec failure", "Invalid sample_type") goes to
Pillow, then to OpenCV (:mod:`.opencv_decode`); a DCT-scaled decode that libjpeg-turbo refuses
goes to Pillow, then OpenCV; the Pillow path's refusals go to OpenCV (for the formats it reads).
The fallbacks run on the budgeted pool; when every decoder refuses, the one ``DecodeFailed``
names each decoder's reason ("DALI: …; Pillow: …; OpenCV: …"). What is not a refusal stops the
chain: the header guards (nothing decoded at all), the time budget, and a decoder that sees more
pixels than the guard passed.

DALI fails a whole run when one sample is bad. A failed run is retried without the
sample DALI names ("Failed to decode sample #i"), or one image at a time when it names none, so
batch-mates always survive. A JPEG cut short (no end-of-image marker) is refused by
:func:`sniff` on every backend; libjpeg-turbo refuses it too. Corrupt entropy-coded data that
still ends in an EOI (bit flips, a zeroed middle) decodes to garbage pixels with only a
warning, as with every JPEG decoder.

Time budget (``time_budget_s``, per image). Pillow and DCT-scaled decodes run on a small
thread pool; an item whose decode takes longer than ``time_budget_s`` (still running at its
deadline, or finished late) is returned as ``DecodeFailed`` "over time budget" and its
batch-mates go on (items queued behind it move to a
fresh pool). Small images (at most ``CHUNK_PIXELS`` by their header) go to the pool in chunks,
one per pool thread, so that a batch of thumbnails pays a few thread hand-offs rather than one
per image: a chunk has ``time_budget_s`` × its image count, an image that took longer than
``time_budget_s`` is over budget as above, and when a chunk overruns, the images it has not
finished run alone under ``time_budget_s`` (on a fresh pool). A DALI run (one chunk) runs on
its own thread with ``time_budget_s`` × its image count; when it overruns, the run and its
pipelines are abandoned and each image of the chunk runs alone under ``time_budget_s`` — so
the slow one is isolated and the rest are decoded.
A late decode cannot be interrupted (a C decoder in a thread): it is abandoned and ends by
itself — every decode is bounded by the header guards (pixels, frames, scans, bytes), so the
budget protects the batch's latency, not the CPU. Threads rather than worker processes: a
process would copy every decoded image back (192 MB for a 64 MP photo; on GPU the DALI output
must stay in this process's CUDA context) and must not be forked from a process holding a
CUDA context; a forkserver sandbox that could also kill a runaway decode and contain a codec
crash is the next step if a decoder is ever found to loop. Pipeline builds are not counted.

Not thread-safe: one decoder per worker thread.
"""

from __future__ import annotations

import importlib
import os
import re
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np

from gpu_kernels.array import Array
from gpu_kernels.codec.opencv_decode import OPENCV_FORMATS, decode_opencv
from gpu_kernels.codec.orient import orient
from gpu_kernels.codec.pillow_decode import decode_first_frame, icc_profile, is_srgb, refusal, safe_reason
from gpu_kernels.codec.sniff import (
    DEFAULT_MAX_BYTES,
    DEFAULT_MAX_FRAMES,
    DEFAULT_MAX_MARKERS,
    DEFAULT_MAX_PIXELS,
    DEFAULT_MAX_SCANS,
    ImageInfo,
    fingerprint,
    sniff,
)
from schemas.errors import DecodeFailed, LightboxError

__all__ = ["CPU_DECODE_THREADS", "GPU_DECODE_THREADS_CAP", "DecoderChain", "ReduceMode", "decode_threads",
           "reduced_size"]

STAGE = "decode"
ReduceMode = Literal["auto", "dct", "resize", "off"]
_FAILED_SAMPLE = re.compile(r"Failed to decode sample #(\d+)")
DEFAULT_TIME_BUDGET_S = 10.0
CHUNK_PIXELS = 256 * 256  # images up to this many pixels (header) go to the pool in chunks
CPU_DECODE_THREADS = 2  # a CPU worker's decode pool: its cores also run the model and the output lane
GPU_DECODE_THREADS_CAP = 8  # a GPU decoder's CPU threads at most (DALI's pool: Huffman decode, fallbacks)


def decode_threads(device: str) -> int:
    """The CPU threads a decoder on ``device`` gets by default: on ``"gpu"`` one per core this
    process may run on (its CPU affinity), at most :data:`GPU_DECODE_THREADS_CAP` (DALI's
    pipeline threads run the host half of nvJPEG's hybrid decode, the part the hardware
    decoder does not take, and the Pillow/OpenCV fallbacks share the same count); on ``"cpu"``
    :data:`CPU_DECODE_THREADS`."""
    if device != "gpu":
        return CPU_DECODE_THREADS
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return max(1, min(GPU_DECODE_THREADS_CAP, cores))


@dataclass(frozen=True, slots=True)
class _Job:
    index: int  # position in the caller's batch
    blob: bytes
    info: ImageInfo
    target: tuple[int, int] | None  # (height, width) for the fused resize, oriented


def reduced_size(info: ImageInfo, max_side: int | None) -> tuple[int, int] | None:
    """``(height, width)`` (oriented) to decode ``info`` to for ``max_side``, or ``None`` for
    full size. Reduces only when ``max_side`` is at most half the source's longer side; the
    result's longer side is exactly ``max_side``, the aspect ratio kept (sides >= 1)."""
    if max_side is None or max_side <= 0:
        return None
    w, h = info.oriented_size
    longer = max(w, h)
    if 2 * max_side > longer:
        return None
    scale = max_side / longer
    return (
        max_side if h == longer else max(1, round(h * scale)),
        max_side if w == longer else max(1, round(w * scale)),
    )


class DecoderChain:
    """:class:`~gpu_kernels.backends.Decoder`: the chain of decoders (DALI where installed, else
    libjpeg-turbo and Pillow; OpenCV last), routed by each file's header; see the module docstring.

    Args:
        device: ``"cpu"`` (NumPy out) or ``"gpu"`` (``mixed`` decode, CuPy out).
        max_pixels, max_bytes, max_frames, max_scans, max_markers: header guards, see :func:`sniff`.
        batch_size: largest DALI batch; longer inputs run in chunks.
        num_threads: DALI's CPU threads (``Pipeline(num_threads=...)``) and the pool of the
            Pillow, OpenCV and DCT-scaled decodes; ``None``: :func:`decode_threads` of ``device``
            (on a GPU the process's cores, at most 8; on a CPU 2).
        hw_decoder_load: share of each JPEG batch sent to the hardware decoder (GPU only).
        device_id: CUDA device (GPU only).
        reduce: reduced-size decode strategy; ``"auto"`` = ``"dct"`` on CPU, ``"resize"`` on GPU.
        time_budget_s: the longest one item may decode on the Pillow/DCT paths (module doc).
        dali: route what DALI takes through DALI (default ``True``); ``False`` (CPU only) decodes
            those images with libjpeg-turbo (simplejpeg, JPEG) and Pillow (the rest) on the same
            budgeted pool, so a CPU install needs no DALI (``make_decoder("cpu")`` does this).
    """

    version = "dali-decode-1"

    def __init__(
        self,
        device: str = "cpu",
        *,
        max_pixels: int = DEFAULT_MAX_PIXELS,
        max_bytes: int = DEFAULT_MAX_BYTES,
        batch_size: int = 32,
        num_threads: int | None = None,
        hw_decoder_load: float = 0.65,
        device_id: int = 0,
        reduce: ReduceMode = "auto",
        max_frames: int = DEFAULT_MAX_FRAMES,
        max_scans: int = DEFAULT_MAX_SCANS,
        max_markers: int = DEFAULT_MAX_MARKERS,
        time_budget_s: float = DEFAULT_TIME_BUDGET_S,
        dali: bool = True,
    ) -> None:
        if device not in ("cpu", "gpu"):
            raise ValueError(f"DecoderChain: device must be 'cpu' or 'gpu', got {device!r}")
        if not dali and device == "gpu":
            raise ValueError("DecoderChain: the gpu decoder is DALI's (dali=False is CPU only)")
        if not 0.0 <= hw_decoder_load <= 1.0:
            raise ValueError(
                f"DecoderChain: hw_decoder_load must be in [0, 1], got {hw_decoder_load}"
            )
        if num_threads is None:
            num_threads = decode_threads(device)
        if batch_size < 1 or num_threads < 1:
            raise ValueError("DecoderChain: batch_size and num_threads must be >= 1")
        if not time_budget_s > 0:
            raise ValueError(f"DecoderChain: time_budget_s must be > 0, got {time_budget_s}")
        self.device = device
        self.max_pixels = max_pixels
        self.max_bytes = max_bytes
        self.batch_size = batch_size
        self.num_threads = num_threads
        self.hw_decoder_load = hw_decoder_load
        self.device_id = device_id
        self.max_frames, self.max_scans, self.max_markers = max_frames, max_scans, max_markers
        self.time_budget_s = time_budget_s
        self.dali = dali
        if not dali:
            self.version = "cpu-decode-1"
        self.reduce: ReduceMode = (
            reduce if reduce != "auto" else ("dct" if device == "cpu" else "resize")
        )
        self._pipes: dict[bool, Any] = {}
        self._pool: ThreadPoolExecutor | None = None
        self._dali_thread: ThreadPoolExecutor | None = None
        self._closed = False

    # ---- public ------------------------------------------------------------------------

    def decode_batch(
        self, blobs: Sequence[bytes], *, max_side: int | None = None
    ) -> list[Array | LightboxError]:
        """Decode each blob; per-item errors are returned in place, never raised."""
        if self._closed:
            raise RuntimeError("DecoderChain is closed")
        out: list[Array | LightboxError] = [DecodeFailed("not decoded", stage=STAGE) for _ in blobs]
        dali_plain: list[_Job] = []
        dali_resized: list[_Job] = []
        pooled: list[tuple[_Job, Callable[[_Job], Array]]] = []
        for i, blob in enumerate(blobs):
            try:
                info = sniff(
                    blob,
                    max_bytes=self.max_bytes,
                    max_pixels=self.max_pixels,
                    max_frames=self.max_frames,
                    max_scans=self.max_scans,
                    max_markers=self.max_markers,
                )
            except LightboxError as err:
                out[i] = err
                continue
            target = None if self.reduce == "off" else reduced_size(info, max_side)
            job = _Job(i, bytes(blob), info, target)
            if info.pillow_path or self._needs_colour_management(job):
                pooled.append((job, self._chain(("pillow", "opencv"))))
            elif not self.dali:
                dct = target is not None and self.reduce == "dct" and info.format == "jpeg" and info.components != 4
                turbo = info.format == "jpeg" and info.components != 4
                names = ("libjpeg-turbo",) if dct else ("plain",) if turbo else ()
                pooled.append((job, self._chain((*names, "pillow", "opencv"))))
            elif target is None:
                dali_plain.append(job)
            elif self.reduce == "dct" and info.format == "jpeg" and info.components != 4:
                pooled.append((job, self._chain(("libjpeg-turbo", "pillow", "opencv"))))
            elif self.reduce == "resize":
                dali_resized.append(job)
            else:
                dali_plain.append(job)
        for jobs, resized in ((dali_plain, False), (dali_resized, True)):
            for start in range(0, len(jobs), self.batch_size):
                self._run_dali_budgeted(jobs[start : start + self.batch_size], resized, out)
            for job in jobs:  # what DALI refused, the next decoders try (on the pool, budgeted)
                reason = _refusal(out[job.index])
                if reason is not None:
                    pooled.append((job, self._chain(("pillow", "opencv"), [("DALI", reason)])))
        small = [item for item in pooled if item[0].info.width * item[0].info.height <= CHUNK_PIXELS]
        if len(small) > 1:
            large = [item for item in pooled if item[0].info.width * item[0].info.height > CHUNK_PIXELS]
            pooled = large + self._run_chunked(small, out)
        if pooled:
            self._run_budgeted(pooled, out)
        return out

    def close(self) -> None:
        """Release the DALI pipelines and the thread pool; idempotent."""
        self._pipes = {}
        for pool in (self._pool, self._dali_thread):
            if pool is not None:
                pool.shutdown(wait=True)
        self._pool = self._dali_thread = None
        self._closed = True

    def __enter__(self) -> DecoderChain:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- DALI --------------------------------------------------------------------------

    def _pipeline(self, resized: bool, pipes: dict[bool, Any]) -> Any:
        pipe = pipes.get(resized)
        if pipe is None:
            pipe = self._build(resized)
            pipes[resized] = pipe
        return pipe

    def _build(self, resized: bool) -> Any:
        # DALI's Python API is only partly typed: use it as Any.
        fn: Any = importlib.import_module("nvidia.dali.fn")
        types: Any = importlib.import_module("nvidia.dali.types")
        pipeline_cls: Any = importlib.import_module("nvidia.dali.pipeline").Pipeline
        gpu = self.device == "gpu"
        pipe = pipeline_cls(
            batch_size=self.batch_size,
            num_threads=self.num_threads,
            device_id=self.device_id if gpu else None,
            prefetch_queue_depth=1,  # feed one batch, run one batch
            exec_dynamic=True,  # outputs stay valid while referenced (zero-copy hand-off)
        )
        with pipe:
            encoded = fn.external_source(name="encoded", dtype=types.UINT8, ndim=1)
            extra: dict[str, Any] = {"hw_decoder_load": self.hw_decoder_load} if gpu else {}
            images = fn.decoders.image(
                encoded, device="mixed" if gpu else "cpu", output_type=types.RGB, **extra
            )
            if resized:
                size = fn.external_source(name="size", dtype=types.FLOAT, ndim=1)
                images = fn.resize(
                    images,  # on the GPU after a mixed decode, on the CPU otherwise
                    size=size,
                    antialias=True,
                    interp_type=types.INTERP_LINEAR,
                )
            pipe.set_outputs(images)
        pipe.build()
        return pipe

    def _run_dali_budgeted(self, jobs: list[_Job], resized: bool, out: list[Array | LightboxError]) -> None:
        """One DALI run for ``jobs`` given ``time_budget_s`` per image; when it overruns, each
        image runs alone under ``time_budget_s``, and those that overrun alone are failed."""
        results = self._dali_call(jobs, resized, self.time_budget_s * len(jobs))
        if results is None:
            results = {}
            for job in jobs:
                alone = self._dali_call([job], resized, self.time_budget_s)
                results.update(alone if alone is not None else {job.index: self._over_budget(job)})
        for index, result in results.items():
            out[index] = result

    def _dali_call(self, jobs: list[_Job], resized: bool, timeout: float) -> dict[int, Array | LightboxError] | None:
        """Run ``jobs`` on the DALI thread; ``None`` when it is still running after ``timeout``:
        then that thread and its pipelines are abandoned (they finish by themselves, and never
        touch the pipelines used from then on)."""
        pipes = self._pipes
        self._pipeline(resized, pipes)  # a first build does not count against the budget
        if self._dali_thread is None:
            self._dali_thread = ThreadPoolExecutor(1, thread_name_prefix="dali")
        def timed() -> tuple[dict[int, Array | LightboxError], float]:
            start = time.monotonic()
            results = self._run_dali(jobs, resized, pipes)
            return results, time.monotonic() - start

        fut = self._dali_thread.submit(timed)
        done, _ = wait([fut], timeout=timeout)
        if done:
            results, elapsed = fut.result()
            return results if elapsed <= timeout else None  # finished, but late: same verdict
        self._pipes = {}
        self._dali_thread.shutdown(wait=False)
        self._dali_thread = None
        return None

    def _run_dali(self, jobs: list[_Job], resized: bool, pipes: dict[bool, Any]) -> dict[int, Array | LightboxError]:
        """Decode ``jobs`` in one run; on failure drop the named sample and retry the rest."""
        out: dict[int, Array | LightboxError] = {}
        pending = list(jobs)
        while pending:
            try:
                arrays = self._run_once(pending, resized, pipes)
            except RuntimeError as err:
                text = str(err)
                match = _FAILED_SAMPLE.search(text)
                if match and int(match.group(1)) < len(pending):
                    bad = pending.pop(int(match.group(1)))
                    out[bad.index] = self._dali_error(bad, text)
                    continue
                # DALI named nobody: rebuild the pipeline and decode one by one.
                pipes.pop(resized, None)
                if len(pending) == 1:
                    out[pending[0].index] = self._dali_error(pending[0], text)
                    return out
                for job in pending:
                    out.update(self._run_dali([job], resized, pipes))
                return out
            for job, array in zip(pending, arrays, strict=True):
                out[job.index] = array
            return out
        return out

    def _run_once(self, jobs: list[_Job], resized: bool, pipes: dict[bool, Any]) -> list[Array]:
        pipe = self._pipeline(resized, pipes)
        pipe.feed_input("encoded", [np.frombuffer(j.blob, dtype=np.uint8) for j in jobs])
        if resized:
            pipe.feed_input("size", [np.asarray(j.target, dtype=np.float32) for j in jobs])
        if self.device == "gpu":
            import cupy as cp

            with cp.cuda.Device(self.device_id):
                (batch,) = pipe.run()
                # Zero copy: with DALI's dynamic executor an output buffer lives as long as
                # something references it, so the CuPy arrays own the decoded pixels. The
                # DLPack exchange makes CuPy's current stream wait for DALI's.
                return [cp.from_dlpack(batch[i]) for i in range(len(jobs))]
        (batch,) = pipe.run()
        # One host copy buys owned, writeable NumPy arrays; the
        # zero-copy view (np.from_dlpack) would be read-only.
        return [np.array(batch[i]) for i in range(len(jobs))]

    def _over_budget(self, job: _Job) -> DecodeFailed:
        i = job.info
        return DecodeFailed(
            f"over time budget: the {i.format} image ({i.width}x{i.height}, {fingerprint(job.blob)}) "
            f"was still decoding after {self.time_budget_s:g} s; its batch-mates went on",
            stage=STAGE,
        )

    @staticmethod
    def _dali_error(job: _Job, text: str) -> DecodeFailed:
        """DALI's message: operator, traceback, "encountered:", the reason. Keep the reason,
        without the sample index (it counts within the run, not the caller's batch)."""
        after = text.split("encountered:", 1)[-1]
        lines = [
            ln.strip()
            for ln in after.splitlines()
            if ln.strip()
            and "pipeline object is no longer valid" not in ln
            and not ln.startswith("Critical error in pipeline")
        ]
        reason = _FAILED_SAMPLE.sub("failed to decode", "; ".join(lines)).strip(" :;")
        i = job.info
        err = DecodeFailed(
            f"DALI decoders.image could not decode the {i.format} image ({i.width}x{i.height}, "
            f"{fingerprint(job.blob)}; corrupt or truncated data): {safe_reason(reason or 'no reason given', 300)}",
            stage=STAGE,
        )
        err.reason = safe_reason(reason or "no reason given")  # type: ignore[attr-defined]
        return err

    # ---- non-DALI paths ----------------------------------------------------------------

    @staticmethod
    def _needs_colour_management(job: _Job) -> bool:
        if not job.info.has_icc:
            return False
        icc = icc_profile(job.blob, job.info)
        return icc is not None and not is_srgb(icc)

    def _new_pool(self) -> ThreadPoolExecutor:
        self._pool = ThreadPoolExecutor(self.num_threads, thread_name_prefix="decode")
        return self._pool

    def _run_budgeted(
        self, items: list[tuple[_Job, Callable[[_Job], Array]]], out: list[Array | LightboxError]
    ) -> None:
        """Run each item on the pool; an item still running ``time_budget_s`` after it started
        is failed and abandoned, and the items queued behind it move to a fresh pool."""
        budget = self.time_budget_s
        started: dict[int, float] = {}
        took: dict[int, float] = {}
        lock = threading.Lock()

        def call(job: _Job, fn: Callable[[_Job], Array]) -> Array:
            with lock:
                started[job.index] = start = time.monotonic()
            try:
                return fn(job)
            finally:
                took[job.index] = time.monotonic() - start

        pool = self._pool or self._new_pool()
        futures: dict[Future[Array], tuple[_Job, Callable[[_Job], Array]]] = {
            pool.submit(call, job, fn): (job, fn) for job, fn in items
        }
        while futures:
            with lock:
                deadlines = [started[j.index] + budget for j, _ in futures.values() if j.index in started]
            timeout = max(0.0, min(deadlines) - time.monotonic()) if deadlines else budget
            done, _ = wait(futures, timeout=timeout, return_when=FIRST_COMPLETED)
            for fut in done:
                job, _fn = futures.pop(fut)
                late_but_done = took.get(job.index, 0.0) > budget  # the verdict must not depend on when we looked
                out[job.index] = self._over_budget(job) if late_but_done else self._result(fut, job)
            now = time.monotonic()
            with lock:
                late = [f for f, (j, _) in futures.items() if j.index in started and now - started[j.index] >= budget]
            if not late:
                continue
            for fut in late:
                job, _fn = futures.pop(fut)
                out[job.index] = self._over_budget(job)
            # The late threads are lost to this pool: what still waits in its queue moves on.
            old, pool = pool, self._new_pool()
            old.shutdown(wait=False)
            for fut, (job, fn) in list(futures.items()):
                if fut.cancel():
                    del futures[fut]
                    futures[pool.submit(call, job, fn)] = (job, fn)

    def _run_chunked(
        self, items: list[tuple[_Job, Callable[[_Job], Array]]], out: list[Array | LightboxError]
    ) -> list[tuple[_Job, Callable[[_Job], Array]]]:
        """Run small items on the pool in one chunk per pool thread (see the module docstring);
        returns the items a chunk that overran did not finish, to be run alone."""
        n = min(self.num_threads, len(items))
        chunks = [items[k::n] for k in range(n)]
        done: dict[int, tuple[Array | BaseException, float]] = {}  # index -> (result, seconds)
        stop = threading.Event()

        def run(chunk: list[tuple[_Job, Callable[[_Job], Array]]]) -> None:
            for job, fn in chunk:
                if stop.is_set():  # the chunk overran: what is left runs alone elsewhere
                    return
                start = time.monotonic()
                try:
                    value: Array | BaseException = fn(job)
                except Exception as err:
                    value = err
                done[job.index] = (value, time.monotonic() - start)

        pool = self._pool or self._new_pool()
        futures = [pool.submit(run, chunk) for chunk in chunks]
        _, late = wait(futures, timeout=self.time_budget_s * max(len(c) for c in chunks))
        stop.set()
        finished = dict(done)  # a result that lands after this moment is not used
        if late:  # the late chunk's thread is lost to this pool
            self._new_pool()
            pool.shutdown(wait=False)
        left = []
        for job, fn in items:
            if job.index not in finished:
                left.append((job, fn))
                continue
            value, took = finished[job.index]
            out[job.index] = self._over_budget(job) if took > self.time_budget_s else self._settle(value, job)
        return left

    @staticmethod
    def _result(fut: Future[Array], job: _Job) -> Array | LightboxError:
        err = fut.exception()
        return DecoderChain._settle(fut.result() if err is None else err, job)

    @staticmethod
    def _settle(value: Array | BaseException, job: _Job) -> Array | LightboxError:
        """A pool decode's result: the array, or the item's error (a LightboxError as raised, any
        other exception as a ``DecodeFailed`` naming the image)."""
        if not isinstance(value, BaseException):
            return value
        err = value
        if isinstance(err, LightboxError):
            return err
        i = job.info
        return DecodeFailed(
            f"could not decode the {i.format} image ({i.width}x{i.height}, {fingerprint(job.blob)}): "
            f"{type(err).__name__}: {safe_reason(err)}",
            stage=STAGE,
        )

    def _decode_dct(self, job: _Job) -> Array:
        """libjpeg-turbo DCT-scaled decode: the smallest 1/2, 1/4 or 1/8 scale that keeps
        the longer side >= max_side (``job.target`` holds exactly max_side there)."""
        assert job.target is not None
        th, tw = job.target
        # target is oriented; the stored image is transposed for orientations 5..8.
        if job.info.orientation in (5, 6, 7, 8):
            th, tw = tw, th
        return self._decode_turbo(job, min_height=th, min_width=tw, min_factor=2)

    def _decode_plain(self, job: _Job) -> Array:
        """Full-size libjpeg-turbo decode of a 3- or 1-component JPEG (the CPU path without DALI)."""
        return self._decode_turbo(job)

    def _decode_turbo(self, job: _Job, **scale: int) -> Array:
        """libjpeg-turbo to RGB (``scale``: simplejpeg's DCT-scaling arguments), orientation applied;
        its refusal passes the chain on to the next decoder."""
        import simplejpeg  # CPU path only: keeps the GPU box free of this dependency

        try:
            img = simplejpeg.decode_jpeg(job.blob, colorspace="RGB", **scale)
        except (ValueError, RuntimeError) as err:
            raise refusal("libjpeg-turbo", job.info, job.blob, err) from None
        return self._to_device(orient(img, job.info.orientation))

    def _chain(self, names: Sequence[str], tried: Sequence[tuple[str, str]] = ()) -> Callable[[_Job], Array]:
        """Decode with the first of ``names`` that reads the file (``tried``: the refusals of the
        decoders before them). A refusal (an error with a ``reason``) passes to the next decoder
        that reads the format; a final error (the decoder sees more pixels than the header guard
        passed) stops the chain. When all refuse, one ``DecodeFailed`` names each one's reason."""

        def run(job: _Job) -> Array:
            reasons = list(tried)
            last: DecodeFailed | None = None
            for name in names:
                if name == "opencv" and job.info.format not in OPENCV_FORMATS:
                    continue
                try:
                    return self._DECODERS[name](self, job)
                except LightboxError as err:
                    reason = _refusal(err)
                    if reason is None:
                        raise
                    reasons.append((_LABELS[name], reason))
                    last = err if isinstance(err, DecodeFailed) else last
                except (MemoryError, RecursionError):
                    raise
                except Exception as err:  # a decoder's own bug: the next one may still read it
                    reasons.append((_LABELS[name], f"{type(err).__name__}: {safe_reason(err)}"))
            if last is not None and len(reasons) == 1:
                raise last
            i = job.info
            raise DecodeFailed(
                f"no decoder could read the {i.format} image ({i.width}x{i.height}, {fingerprint(job.blob)}): "
                + "; ".join(f"{who}: {why}" for who, why in reasons),
                stage=STAGE,
            )

        return run

    def _decode_opencv(self, job: _Job) -> Array:
        """OpenCV's imdecode, the last fallback (:mod:`.opencv_decode`)."""
        return self._to_device(decode_opencv(job.blob, job.info, self.max_pixels))

    def _decode_pillow(self, job: _Job) -> Array:
        """Pillow formats, alpha, animation, deep samples, ICC profiles (:mod:`.pillow_decode`)."""
        return self._to_device(decode_first_frame(job.blob, job.info, self.max_pixels))

    def _to_device(self, image: np.ndarray) -> Array:
        if self.device == "gpu":  # through a pinned staging buffer: an asynchronous DMA
            from gpu_kernels.pinned import upload

            return upload(image, self.device_id)
        return image

    _DECODERS: ClassVar[dict[str, Callable[[DecoderChain, _Job], Array]]] = {
        "libjpeg-turbo": _decode_dct,
        "plain": _decode_plain,
        "pillow": _decode_pillow,
        "opencv": _decode_opencv,
    }


_LABELS = {"libjpeg-turbo": "libjpeg-turbo", "plain": "libjpeg-turbo", "pillow": "Pillow", "opencv": "OpenCV"}


def _refusal(result: object) -> str | None:
    """A decoder's refusal reason when ``result`` is one (another decoder may try), else None:
    a decoded image, an over-time-budget verdict, a guard's or a final error."""
    if isinstance(result, DecodeFailed):
        reason = getattr(result, "reason", None)
        return reason if isinstance(reason, str) else None
    return None
