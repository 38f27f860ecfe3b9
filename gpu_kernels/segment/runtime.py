"""Which runtime runs the segmentation model: chosen once at start-up, behind a fidelity gate.

A faster runtime only replaces ONNX Runtime fp32 when its masks match fp32's on the gate set
(real photographs from scikit-image and composites of them, :func:`gate_images`): mean IoU of
the alpha masks (alpha >= 128) at least :data:`GATE_MEAN_IOU` and every image at least
:data:`GATE_WORST_IOU`. The runtimes:

- ``fp32``: ONNX Runtime, float32 (CPU or GPU; the reference).
- ``openvino``: OpenVINO on the CPU, bf16 inference where the CPU has it (gated), else f32.
- ``int8``: ONNX Runtime on a static QDQ INT8 copy calibrated on :func:`calibration_images`
  (a set disjoint from the gate set).
- ``openvino-checked``: OpenVINO bf16 that runs an image again at f32 when its bf16 probability
  map is unsure over much of the subject (``OpenVinoSegmenter(recheck=...)``); where the CPU has
  bf16. Gated in ``auto`` and ``openvino``.
- ``openvino-bf16``, ``openvino-f32``, ``openvino-checked`` by name: that OpenVINO runtime,
  ungated (for measurements).
- ``fp16``: GPU only, a float16 copy on the CUDA/TensorRT provider (gated on the GPU).
- ``torch``: PyTorch (the ``[torch]`` extra), the model built from the same ONNX file
  (``torch_runner``). On the CPU: bf16 (autocast) where oneDNN has it and it passes the gate,
  else fp32; on the GPU: fp16 (autocast) when it passes the gate, else fp32.
- ``torch-fp32``, ``torch-bf16``, ``torch-fp16``: that PyTorch precision, ungated.
- ``auto``: on the CPU, the fastest of openvino-bf16, openvino-checked, openvino-f32, int8 and (when torch is
  installed) torch-bf16 / torch-fp16 (where oneDNN has them) and torch-fp32 that passes the
  gate and is at least :data:`MIN_SPEEDUP` faster than fp32 in the same interleaved run, else
  fp32; on the GPU, fp32, or ``torch`` when ONNX Runtime has no CUDA provider and torch has CUDA.

A runtime asked for by name is used as asked, except ``openvino``, which takes bf16 when it passes
the gate, else the checked bf16 when that passes, else f32. Gate verdicts are cached
(``model_cache_dir()/gate.json``) per model sha256, runtime, library versions, CPU and thread
count, so the gate runs once per machine.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.metadata
import json
import logging
import platform
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from gpu_kernels.backends import Segmenter
from gpu_kernels.segment.fetch_model import model_cache_dir, sha256_file
from gpu_kernels.segment.model import U2NETP, ModelSpec
from gpu_kernels.segment.onnx_runner import OnnxSegmenter, cpu_flags_line, usable_cores
from gpu_kernels.segment.variants import derived_path, make_fp16, make_int8
from schemas.errors import ProcessingFailed

__all__ = [
    "GATE_MEAN_IOU",
    "GATE_WORST_IOU",
    "MIN_SPEEDUP",
    "RUNTIMES",
    "TORCH_RUNTIMES",
    "GateResult",
    "RuntimeChoice",
    "available_runtimes",
    "cached_auto_choice",
    "calibration_images",
    "gate_images",
    "make_model_segmenter",
    "mask_iou",
    "prepare_callers",
    "run_gate",
    "side_by_side",
]

log = logging.getLogger(__name__)

GATE_MEAN_IOU = 0.97
GATE_WORST_IOU = 0.90
MIN_SPEEDUP = 1.10
GATE_VERSION = 4  # bump when the gate set, the rule, the candidates or the mask post-processing change
RUNTIMES: tuple[str, ...] = ("auto", "fp32", "openvino", "openvino-bf16", "openvino-checked", "openvino-f32", "int8",
                              "fp16")
TORCH_RUNTIMES = ("torch", "torch-fp32", "torch-bf16", "torch-fp16")
RUNTIMES += TORCH_RUNTIMES
GATE_PHOTOS = ("coffee", "chelsea", "astronaut", "rocket", "camera", "coins", "clock", "immunohistochemistry")


def _rgb(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(np.dstack([a] * 3) if a.ndim == 2 else a[..., :3])


def gate_images() -> list[np.ndarray]:
    """The gate set: 8 scikit-image photographs (colour and grey) and 8 composites of them."""
    import skimage.data

    from gpu_kernels.segment.samples import BACKGROUNDS, OBJECTS, SHAPES, make_composite

    photos = [_rgb(getattr(skimage.data, name)()) for name in GATE_PHOTOS]
    comps = [make_composite(OBJECTS[k % 4], SHAPES[(k + 2) % 4], BACKGROUNDS[(3 - k) % 4],
                            offset=(0, 40 * (k // 4))).image for k in range(8)]
    return photos + comps


def calibration_images() -> list[np.ndarray]:
    """INT8 calibration set, disjoint from the gate set: composites in other shapes, sizes,
    backgrounds and places, and crops of the photographs."""
    import skimage.data

    from gpu_kernels.segment.samples import BACKGROUNDS, OBJECTS, SHAPES, make_composite

    out = [make_composite(o, s, b, size=(480, 640), frac=0.7, offset=(-20, 30)).image
           for o in OBJECTS for s, b in zip(SHAPES, BACKGROUNDS, strict=True)]
    for name in GATE_PHOTOS[:4]:
        img = _rgb(getattr(skimage.data, name)())
        h, w = img.shape[:2]
        out.append(np.ascontiguousarray(img[h // 8:, w // 10: w - w // 10]))
    return out


def mask_iou(a: Any, b: Any) -> float:
    """IoU of two alpha masks at alpha >= 128 (1.0 when both are empty)."""
    fa, fb = np.asarray(a) >= 128, np.asarray(b) >= 128
    union = int((fa | fb).sum())
    return 1.0 if union == 0 else float((fa & fb).sum()) / union


@dataclass(frozen=True, slots=True)
class GateResult:
    runtime: str
    mean_iou: float
    worst_iou: float
    n: int
    ms_per_image: float
    reference_ms_per_image: float
    passed: bool

    @property
    def speedup(self) -> float:
        return self.reference_ms_per_image / self.ms_per_image if self.ms_per_image else 0.0


def run_gate(runtime: str, candidate: Segmenter, reference: Segmenter, images: Sequence[Any], *,
             mean_min: float = GATE_MEAN_IOU, worst_min: float = GATE_WORST_IOU) -> GateResult:
    """Masks of ``candidate`` against ``reference`` on ``images``, one image at a time, the two
    interleaved; one warm-up call each is not timed. The times are means over the images (not
    medians: a runtime whose cost depends on the image, such as the checked bf16 that runs some
    images again at f32, is judged by what it costs on average).

    Where both segmenters time their model alone (``model_s``, every CPU
    :class:`BucketedSegmenter`), that wall time is what is compared: the mask refinement after the
    model is the same code for every runtime, and counting it diluted OpenVINO f32, 1.3x faster
    than ONNX Runtime at the model, to under the 1.1x ``auto`` asks for. Otherwise it is the whole call's CPU time (all
    threads). Wall time, not CPU time, for the model: OpenVINO's threads spin while they wait for
    each other, so on a loaded machine its CPU time grows while its wall time does not."""
    if not images:
        raise ValueError("the gate needs at least one image")
    candidate.segment_batch([images[0]])
    reference.segment_batch([images[0]])
    model_alone = _model_s(reference) is not None and _model_s(candidate) is not None

    def clock(seg: Segmenter) -> float:
        return float(getattr(seg, "model_s")) if model_alone else time.process_time()  # noqa: B009

    ious, t_ref, t_cand = [], [], []
    for img in images:
        t0 = clock(reference)
        ref = reference.segment_batch([img])[0]
        t_ref.append(clock(reference) - t0)
        t1 = clock(candidate)
        got = candidate.segment_batch([img])[0]
        t_cand.append(clock(candidate) - t1)
        ious.append(mask_iou(_host(got), _host(ref)))
    mean, worst = float(np.mean(ious)), float(np.min(ious))
    return GateResult(runtime, round(mean, 4), round(worst, 4), len(images), round(float(np.mean(t_cand)) * 1000, 1),
                      round(float(np.mean(t_ref)) * 1000, 1), mean >= mean_min and worst >= worst_min)


def _model_s(seg: Segmenter) -> float | None:
    """The model's own wall time so far, on the CPU only: on a GPU the call may return before the
    device has finished, so there the whole call's time is compared (as before)."""
    got = getattr(seg, "model_s", None)
    return float(got) if isinstance(got, (int, float)) and getattr(seg, "device", "cpu") == "cpu" else None


def _host(a: Any) -> np.ndarray:
    return a.get() if hasattr(a, "get") and not isinstance(a, np.ndarray) else np.asarray(a)


@dataclass(slots=True)
class RuntimeChoice:
    """What :func:`make_model_segmenter` picked, and why (gate results of every candidate)."""

    runtime: str
    reason: str
    gates: list[GateResult] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"runtime": self.runtime, "reason": self.reason, "gates": [asdict(g) for g in self.gates]}


@functools.cache
def _machine(torch: bool) -> tuple[list[str], str]:
    """The runtime versions and the CPU (its flags) a verdict holds for; once per process."""
    versions = []
    for package in ("onnxruntime", "onnxruntime-gpu", "openvino", *(("torch",) if torch else ())):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):  # not imported: ~0.3 s at start
            versions.append(importlib.metadata.version(package))
    return versions, cpu_flags_line() or platform.processor() or platform.machine()


class _GateCache:
    """Verdicts in a JSON file, keyed by everything that could change them."""

    def __init__(self, path: Path | None, gate: tuple[float, float]) -> None:
        self.path, self.gate = path, gate
        self.data: dict[str, Any] = {}
        if path is not None and path.is_file():
            with contextlib.suppress(OSError, ValueError):
                self.data = json.loads(path.read_text())

    @staticmethod
    def key(model_sha: str, runtime: str, threads: int) -> str:
        raw = json.dumps([GATE_VERSION, model_sha, runtime, threads, *_machine(runtime.startswith("torch"))])
        return f"{runtime}:{hashlib.sha256(raw.encode()).hexdigest()[:16]}"

    def get(self, key: str) -> GateResult | None:
        with contextlib.suppress(TypeError, KeyError):
            if key in self.data:
                r = GateResult(**self.data[key])
                return replace(r, passed=r.mean_iou >= self.gate[0] and r.worst_iou >= self.gate[1])
        return None

    def names(self, key: str) -> list[str] | None:
        """The candidate runtimes a start on this machine judged (None: not recorded)."""
        got = self.data.get(key)
        return [str(n) for n in got] if isinstance(got, list) else None

    def put(self, key: str, result: GateResult | list[str]) -> None:
        self.data[key] = list(result) if isinstance(result, list) else asdict(result)
        if self.path is None:
            return
        with contextlib.suppress(OSError):
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps(self.data, indent=1, sort_keys=True))
            tmp.replace(self.path)


Factory = Callable[[], Segmenter]


def _cpu_candidates(model_path: Path, spec: ModelSpec, threads: int, max_batch: int | None,
                    variants_dir: Path) -> dict[str, Factory]:
    from gpu_kernels.segment.openvino_runner import (
        RECHECK_UNSURE,
        OpenVinoSegmenter,
        openvino_available,
        supports_bf16,
    )

    out: dict[str, Factory] = {}
    if openvino_available():
        if supports_bf16():
            out["openvino-bf16"] = lambda: OpenVinoSegmenter(model_path, spec, precision="bf16", threads=threads,
                                                             max_batch=max_batch)
            out["openvino-checked"] = lambda: OpenVinoSegmenter(model_path, spec, precision="bf16", threads=threads,
                                                                max_batch=max_batch, recheck=RECHECK_UNSURE)
        out["openvino-f32"] = lambda: OpenVinoSegmenter(model_path, spec, precision="f32", threads=threads,
                                                        max_batch=max_batch)

    def int8() -> Segmenter:
        path = derived_path(model_path, "int8", variants_dir)
        if not path.is_file():
            make_int8(model_path, path, spec, calibration_images())
        return OnnxSegmenter(path, spec, threads=threads, max_batch=max_batch)

    out["int8"] = int8
    out.update(_torch_candidates(model_path, spec, threads, max_batch))
    return out


def _torch_candidates(model_path: Path, spec: ModelSpec, threads: int, max_batch: int | None) -> dict[str, Factory]:
    """torch-bf16 / torch-fp16 where oneDNN has them natively, and torch-fp32; none without torch."""
    from gpu_kernels.segment.torch_runner import torch_cpu_supports

    def factory(precision: str) -> Factory:
        return lambda: _torch_segmenter(model_path, spec, "cpu", precision, threads=threads, max_batch=max_batch)

    return {f"torch-{p}": factory(p) for p in ("bf16", "fp16", "fp32") if torch_cpu_supports(p)}


def _torch_segmenter(model_path: Path, spec: ModelSpec, device: str, precision: str, **options: Any) -> Segmenter:
    from gpu_kernels.segment.torch_runner import TorchSegmenter

    return TorchSegmenter(model_path, spec, device=device, precision=precision, **options)


def make_model_segmenter(model_path: Path, spec: ModelSpec = U2NETP, *, device: str = "cpu",
                         runtime: str = "auto", threads: int | None = None, max_batch: int | None = None,
                         cuda_graphs: bool = False, cache_dir: Path | None = None,
                         images: Callable[[], Sequence[np.ndarray]] = gate_images,
                         gate: tuple[float, float] = (GATE_MEAN_IOU, GATE_WORST_IOU),
                         **gpu_options: Any) -> tuple[Segmenter, RuntimeChoice]:
    """The model segmenter for ``device`` with the runtime chosen as the module docstring says.

    ``cache_dir``: where derived models and gate verdicts live (default ``model_cache_dir()``).
    ``images``: the gate set (tests pass a smaller one). ``gate``: (mean, worst) IoU minimums;
    cached verdicts keep the IoUs, so a changed gate re-judges them without running the model.
    ``gpu_options`` go to OnnxSegmenter.
    """
    if runtime not in RUNTIMES:
        raise ProcessingFailed(f"unknown segment runtime {runtime!r}; known: {RUNTIMES}", stage="segment")
    cache_root = cache_dir or model_cache_dir()
    gates = _GateCache(cache_root / "gate.json", gate)
    model_path = Path(model_path)
    if device in ("gpu", "cuda"):
        return _gpu_segmenter(model_path, spec, runtime, max_batch, cuda_graphs, cache_root, gates, images,
                              gpu_options)
    if runtime == "fp16":
        raise ProcessingFailed("the fp16 runtime is for the GPU; on the CPU use auto, fp32, openvino or int8",
                               stage="segment")
    threads = threads or usable_cores()

    def fp32() -> Segmenter:
        return OnnxSegmenter(model_path, spec, threads=threads, max_batch=max_batch)

    if runtime == "fp32":
        return fp32(), RuntimeChoice("fp32", "asked for")
    sha = sha256_file(model_path)
    if runtime == "auto":  # every candidate judged before on this machine: no runtime loaded to decide
        names = gates.names(_GateCache.key(sha, "candidates", threads))
        cached = [gates.get(_GateCache.key(sha, n, threads)) for n in names or ()]
        if names and all(r is not None for r in cached):
            known = [r for r in cached if r is not None]
            if not any(r.passed and r.speedup >= MIN_SPEEDUP for r in known):
                return fp32(), RuntimeChoice("fp32", "no faster runtime passed the gate", known)
    variants_dir = cache_root / "variants"
    candidates = _cpu_candidates(model_path, spec, threads, max_batch, variants_dir)
    if runtime in ("torch-fp32", "torch-bf16", "torch-fp16"):
        return _torch_segmenter(model_path, spec, "cpu", runtime.removeprefix("torch-"), threads=threads,
                                max_batch=max_batch), RuntimeChoice(runtime, "asked for (not gated)")
    if runtime in ("int8", "openvino-bf16", "openvino-checked", "openvino-f32"):
        if runtime not in candidates:
            raise ProcessingFailed(f"segment runtime {runtime} is not available on this machine", stage="segment")
        return candidates[runtime](), RuntimeChoice(runtime, "asked for (not gated)")
    if runtime == "openvino":
        if "openvino-f32" not in candidates:
            raise ProcessingFailed("the openvino runtime needs the 'openvino' package", stage="segment")
        candidates = {k: v for k, v in candidates.items() if k.startswith("openvino")}
    if runtime == "torch":
        candidates = {k: v for k, v in candidates.items() if k.startswith("torch") and k != "torch-fp32"}
        if not candidates and "torch-fp32" not in _torch_candidates(model_path, spec, threads, max_batch):
            raise ProcessingFailed("the torch runtime needs the 'torch' package (pip install 'lightbox[torch]')",
                                   stage="segment")
    reference: Segmenter | None = None
    results: list[GateResult] = []
    gate_set: Sequence[np.ndarray] | None = None
    for name, factory in candidates.items():
        key = _GateCache.key(sha, name, threads)
        result = gates.get(key)
        if result is None:
            try:
                seg = factory()
            except ProcessingFailed as exc:
                log.warning("segment runtime %s unavailable: %s", name, exc)
                continue
            reference = reference or fp32()
            gate_set = gate_set if gate_set is not None else images()
            log.info("judging segment runtime %s against fp32 on %d images (once per machine and model; "
                     "the verdict is kept in %s)", name, len(gate_set), gates.path)
            result = run_gate(name, seg, reference, gate_set, mean_min=gate[0], worst_min=gate[1])
            seg.close()
            gates.put(key, result)
        results.append(result)
    if reference is not None:
        reference.close()
    if runtime == "auto" and len(results) == len(candidates):
        gates.put(_GateCache.key(sha, "candidates", threads), list(candidates))
    if runtime == "openvino":
        passed = {r.runtime for r in results if r.passed}
        chosen = next((n for n in ("openvino-bf16", "openvino-checked") if n in passed), "openvino-f32")
        why = "passed the gate" if chosen != "openvino-f32" else "bf16 (plain and checked) failed the gate or is absent"
        return candidates[chosen](), RuntimeChoice(chosen, f"asked for openvino; {why}", results)
    if runtime == "torch":
        low = sorted((r for r in results if r.passed), key=lambda r: r.ms_per_image)
        if low:
            return candidates[low[0].runtime](), RuntimeChoice(low[0].runtime, "asked for torch; it passed the gate",
                                                              results)
        return _torch_segmenter(model_path, spec, "cpu", "fp32", threads=threads, max_batch=max_batch), \
            RuntimeChoice("torch-fp32", "asked for torch; no lower precision passed the gate", results)
    best = _auto_pick(results)
    if best is None:
        return fp32(), RuntimeChoice("fp32", "no faster runtime passed the gate", results)
    return candidates[best.runtime](), RuntimeChoice(best.runtime, f"passed the gate, {best.speedup:.2f}x fp32",
                                                     results)


def _auto_pick(results: Sequence[GateResult]) -> GateResult | None:
    """auto's rule on the CPU: the fastest verdict that passed and is MIN_SPEEDUP faster than fp32."""
    good = sorted((r for r in results if r.passed and r.speedup >= MIN_SPEEDUP), key=lambda r: r.ms_per_image)
    return good[0] if good else None


def _ort_has_cuda() -> bool:
    import onnxruntime as ort

    if hasattr(ort, "preload_dlls"):
        with contextlib.suppress(OSError, RuntimeError):
            ort.preload_dlls()
    return "CUDAExecutionProvider" in ort.get_available_providers()


def available_runtimes(device: str = "cpu") -> list[str]:
    """The runtime names this installation can run on ``device`` (without loading a model)."""
    from gpu_kernels.segment.openvino_runner import openvino_available, supports_bf16
    from gpu_kernels.segment.torch_runner import torch_available, torch_cpu_supports, torch_cuda_available

    if device in ("gpu", "cuda"):
        out = ["fp32", "fp16"] if _ort_has_cuda() else []
        if torch_cuda_available():
            out += ["torch", "torch-fp32", "torch-bf16", "torch-fp16"]
        return out
    out = ["fp32", "int8"]
    if openvino_available():
        out += ["openvino", "openvino-f32"] + (["openvino-bf16", "openvino-checked"] if supports_bf16() else [])
    if torch_available():
        out += ["torch", "torch-fp32"] + [f"torch-{p}" for p in ("bf16", "fp16") if torch_cpu_supports(p)]
    return out


def cached_auto_choice(model_path: Path, spec: ModelSpec = U2NETP, *, threads: int | None = None,
                       cache_dir: Path | None = None,
                       gate: tuple[float, float] = (GATE_MEAN_IOU, GATE_WORST_IOU)) -> tuple[str | None, str]:
    """What ``auto`` picks on this CPU from the cached gate verdicts alone (no model is run):
    ``(runtime, why)``, or ``(None, why)`` while a candidate has no verdict yet (the first
    worker start with ``auto`` measures them)."""
    threads = threads or usable_cores()
    gates = _GateCache((cache_dir or model_cache_dir()) / "gate.json", gate)
    names = list(_cpu_candidates(Path(model_path), spec, threads, None, Path(".")))
    sha = sha256_file(Path(model_path))
    results, missing = [], []
    for name in names:
        result = gates.get(_GateCache.key(sha, name, threads))
        if result is None:
            missing.append(name)
        else:
            results.append(result)
    if missing:
        return None, f"not measured yet for {', '.join(missing)} ({threads} threads): the first start measures it"
    best = _auto_pick(results)
    if best is None:
        return "fp32", "no faster runtime passed the gate"
    return best.runtime, f"passed the gate (IoU mean {best.mean_iou}, worst {best.worst_iou}), {best.speedup:.2f}x fp32"


def _gpu_segmenter(model_path: Path, spec: ModelSpec, runtime: str, max_batch: int | None, cuda_graphs: bool,
                   cache_root: Path, gates: _GateCache, images: Callable[[], Sequence[np.ndarray]],
                   options: dict[str, Any]) -> tuple[Segmenter, RuntimeChoice]:
    """GPU: fp32 (auto), or the FP16 copy when it passes the gate against fp32 on this GPU."""
    if runtime in TORCH_RUNTIMES or (runtime == "auto" and not _ort_has_cuda()):
        from gpu_kernels.segment.torch_runner import torch_cuda_available

        if runtime == "auto" and not torch_cuda_available():
            raise ProcessingFailed("device 'gpu' needs onnxruntime-gpu or a CUDA build of torch", stage="segment")
        return _torch_gpu_segmenter(model_path, spec, "torch" if runtime == "auto" else runtime, max_batch,
                                    cuda_graphs, gates, images, options)
    if runtime not in ("auto", "fp32", "fp16"):
        raise ProcessingFailed(f"segment runtime {runtime!r} is CPU-only; on the GPU use auto, fp32 or fp16",
                               stage="segment")

    def make(path: Path) -> OnnxSegmenter:
        return OnnxSegmenter(path, spec, device="gpu", max_batch=max_batch, cuda_graphs=cuda_graphs, **options)

    if runtime != "fp16":
        return make(model_path), RuntimeChoice("fp32", "asked for" if runtime == "fp32" else "GPU default")
    fp16_path = derived_path(model_path, "fp16", cache_root / "variants")
    if not fp16_path.is_file():
        make_fp16(model_path, fp16_path)
    key = _GateCache.key(sha256_file(model_path), "fp16-gpu", 0)
    result = gates.get(key)
    candidate = make(fp16_path)
    if result is None:
        import cupy

        reference = make(model_path)
        result = run_gate("fp16", candidate, reference, [cupy.asarray(im) for im in images()],
                          mean_min=gates.gate[0], worst_min=gates.gate[1])
        reference.close()
        gates.put(key, result)
    if result.passed:
        return candidate, RuntimeChoice("fp16", "passed the gate", [result])
    candidate.close()
    return make(model_path), RuntimeChoice("fp32", "fp16 failed the gate", [result])


def _torch_gpu_segmenter(model_path: Path, spec: ModelSpec, runtime: str, max_batch: int | None, cuda_graphs: bool,
                         gates: _GateCache, images: Callable[[], Sequence[np.ndarray]],
                         options: dict[str, Any]) -> tuple[Segmenter, RuntimeChoice]:
    """PyTorch on the GPU: a precision by name, or ``torch``: fp16 when it passes the gate against
    ONNX Runtime fp32 masks (on the GPU when onnxruntime has CUDA, else on the CPU), else fp32."""
    torch_opts = {k: options[k] for k in ("device_id", "compile", "channels_last", "post") if k in options}

    def make(precision: str) -> Segmenter:
        return _torch_segmenter(model_path, spec, "gpu", precision, max_batch=max_batch, cuda_graphs=cuda_graphs,
                                **torch_opts)

    if runtime != "torch":
        return make(runtime.removeprefix("torch-")), RuntimeChoice(runtime, "asked for (not gated)")
    key = _GateCache.key(sha256_file(model_path), "torch-fp16-gpu", 0)
    result = gates.get(key)
    candidate = make("fp16")
    if result is None:
        if _ort_has_cuda():
            import cupy

            reference: Segmenter = OnnxSegmenter(model_path, spec, device="gpu", use_tensorrt=False)
            imgs: list[Any] = [cupy.asarray(im) for im in images()]
        else:
            reference, imgs = OnnxSegmenter(model_path, spec), list(images())
        result = run_gate("torch-fp16", candidate, reference, imgs, mean_min=gates.gate[0], worst_min=gates.gate[1])
        reference.close()
        gates.put(key, result)
    if result.passed:
        return candidate, RuntimeChoice("torch-fp16", "passed the gate", [result])
    candidate.close()
    return make("fp32"), RuntimeChoice("torch-fp32", "torch fp16 failed the gate", [result])


def prepare_callers(segmenter: Segmenter, n: int, *, lone_latency: bool = True) -> None:
    """Tell ``segmenter`` that ``n`` threads call it at once: OpenVINO then runs a single image on
    one of its streams, beside the other caller's, instead of on all threads; with
    ``lone_latency`` (the worker: latency at light load) not when no other call is about, without
    it (``process``: throughput only) always. A model that compiles per use (OpenVINO) compiles
    what those calls run on now: a model that cannot load fails here, at start-up, not on the
    first image. Again for the same ``n``: nothing more to compile."""
    callers = getattr(segmenter, "callers", None)  # a model with streams (not in the Segmenter protocol)
    if callers is not None:
        callers.concurrent, callers.lone_latency = n > 1, lone_latency
    prepare = getattr(segmenter, "prepare", None)  # compile what those calls run on, now
    if prepare is not None:
        prepare()


def side_by_side(segmenter: Segmenter | None) -> int:
    """How many calls ``segmenter`` runs at once to good effect: OpenVINO on a CPU, its streams
    (2); 1 for every other model or none."""
    return max(1, int(getattr(segmenter, "streams", 1)))
