"""Which runtime runs the segmentation model: chosen once at start-up, behind a fidelity gate.

The runtimes and the names that choose among them are one table,
:mod:`schemas.segment_runtimes`; this module builds a row (:func:`build`) and runs a family's
choice (:func:`make_model_segmenter`): each candidate available here (:mod:`~gpu_kernels.segment.machine`)
is judged against ONNX Runtime fp32 on the gate set (real photographs from scikit-image and
composites of them, :func:`gate_images`): mean IoU of the alpha masks (alpha >= 128) at least
:data:`GATE_MEAN_IOU` and every image at least :data:`GATE_WORST_IOU`; the family's rule picks one
of those that passed, else its fallback is used.

A runtime asked for by name (not a family) is used as asked, ungated. Gate verdicts are cached
(``model_cache_dir()/gate.json``) per model sha256, runtime, library versions, CPU and thread
count, so the gate runs once per machine; once every candidate of ``auto`` has a verdict, a start
decides from them without loading a candidate that would not be chosen.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from gpu_kernels.backends import ModelSegmenter, Segmenter
from gpu_kernels.segment import machine
from gpu_kernels.segment.fetch_model import model_cache_dir, sha256_file
from gpu_kernels.segment.model import U2NETP, ModelSpec
from gpu_kernels.segment.variants import derived_path, make_fp16, make_int8
from schemas import segment_runtimes as table
from schemas.errors import ProcessingFailed

__all__ = [
    "GATE_MEAN_IOU",
    "GATE_WORST_IOU",
    "GateResult",
    "RuntimeChoice",
    "available_runtimes",
    "build",
    "cached_auto_choice",
    "calibration_images",
    "gate_images",
    "make_model_segmenter",
    "mask_iou",
    "run_gate",
]

log = logging.getLogger(__name__)

GATE_MEAN_IOU = 0.97
GATE_WORST_IOU = 0.90
GATE_VERSION = 4  # bump when the gate set, the rule, the candidates or the mask post-processing change
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
        return float(_model_s(seg) or 0.0) if model_alone else time.process_time()

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
    return float(seg.model_s) if isinstance(seg, ModelSegmenter) and seg.device == "cpu" else None


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
        raw = json.dumps([GATE_VERSION, model_sha, runtime, threads, *machine.machine_key(runtime.startswith("torch"))])
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



@dataclass(frozen=True)
class BuildContext:
    """What every runtime of one start is built with."""

    model_path: Path
    spec: ModelSpec
    device: str  # "cpu" or "gpu"
    threads: int  # CPU model threads (0 on the GPU)
    max_batch: int | None
    cuda_graphs: bool
    variants_dir: Path
    options: dict[str, Any]  # the GPU runners' extra options (OnnxSegmenter's; PyTorch takes its own)
    compiled_dir: Path | None = None  # ONNX Runtime's kept CPU graphs (None: model_cache_dir()/onnxruntime)


def build(row: table.SegmentRuntime, b: BuildContext) -> Segmenter:
    """The segmenter of runtime ``row`` on ``b.device``: its engine's runner at its precision."""
    gpu = b.device == "gpu"
    if row.engine == "onnxruntime":
        from gpu_kernels.segment.onnx_runner import OnnxSegmenter

        path = b.model_path
        if row.precision != "fp32":
            path = derived_path(b.model_path, row.precision, b.variants_dir)
            if not path.is_file():
                if row.precision == "int8":
                    make_int8(b.model_path, path, b.spec, calibration_images())
                else:
                    make_fp16(b.model_path, path)
        if gpu:
            return OnnxSegmenter(path, b.spec, device="gpu", max_batch=b.max_batch, cuda_graphs=b.cuda_graphs,
                                 **b.options)
        return OnnxSegmenter(path, b.spec, threads=b.threads, max_batch=b.max_batch, compiled_dir=b.compiled_dir)
    if row.engine == "openvino":
        from gpu_kernels.segment.openvino_runner import RECHECK_UNSURE, OpenVinoSegmenter

        return OpenVinoSegmenter(b.model_path, b.spec, precision=row.precision,  # type: ignore[arg-type]
                                 threads=b.threads,
                                 max_batch=b.max_batch, recheck=RECHECK_UNSURE if row.recheck else None)
    from gpu_kernels.segment.torch_runner import TorchSegmenter

    if gpu:
        torch_opts = {k: b.options[k] for k in ("device_id", "compile", "channels_last", "post") if k in b.options}
        return TorchSegmenter(b.model_path, b.spec, device="gpu", precision=row.precision,
                              max_batch=b.max_batch, cuda_graphs=b.cuda_graphs, **torch_opts)
    return TorchSegmenter(b.model_path, b.spec, device="cpu", precision=row.precision,
                          threads=b.threads, max_batch=b.max_batch)


def _reference(b: BuildContext) -> Segmenter:
    """ONNX Runtime fp32, what every candidate is judged against: on the GPU when ONNX Runtime has
    CUDA there (TensorRT off: the reference is plain fp32), else on the CPU."""
    from gpu_kernels.segment.onnx_runner import OnnxSegmenter

    if b.device == "gpu" and machine.ort_has_cuda():
        return OnnxSegmenter(b.model_path, b.spec, device="gpu", use_tensorrt=False)
    return OnnxSegmenter(b.model_path, b.spec, threads=b.threads or machine.usable_cores(), max_batch=b.max_batch
                         if b.device == "cpu" else None, compiled_dir=b.compiled_dir)


def _row(name: str, device: str) -> table.SegmentRuntime:
    """The runtime ``name`` on ``device``, or a :class:`ProcessingFailed` that says what to use
    or install instead."""
    row = table.runtime(name)
    if row is None:
        raise ProcessingFailed(f"unknown segment runtime {name!r}; known: {', '.join(table.NAMES)}", stage="segment")
    if device not in row.devices:
        where = "the GPU" if row.devices == ("gpu",) else "the CPU"
        raise ProcessingFailed(f"the {name} runtime is for {where}; on the {device.upper()} use "
                               f"{', '.join(table.names_for(device))}", stage="segment")
    if not machine.available(row, device):
        if not _engine_installed(row.engine):
            why = f"it needs {row.engine}: {machine.INSTALL[row.engine]}"
        else:
            why = f"{row.engine} has no CUDA here" if device == "gpu" else "this CPU lacks the instructions it needs"
        raise ProcessingFailed(f"segment runtime {name} is not available on this machine ({why})", stage="segment")
    return row


def _engine_installed(engine: str) -> bool:
    return {"onnxruntime": machine.ort_available, "openvino": machine.openvino_available,
            "torch": machine.torch_available}[engine]()


def _key(sha: str, name: str, b: BuildContext) -> str:
    return _GateCache.key(sha, name, b.threads) if b.device == "cpu" else _GateCache.key(sha, f"{name}-gpu", 0)


def _factories(names: Sequence[str], b: BuildContext) -> dict[str, Callable[[], Segmenter]]:
    """The builders of the candidates ``names`` that are available here, in order."""
    out: dict[str, Callable[[], Segmenter]] = {}
    for name in names:
        row = table.runtime(name)
        if row is not None and machine.available(row, b.device):
            out[name] = lambda row=row: build(row, b)  # type: ignore[misc]
    return out


def _choose(fam: table.RuntimeFamily, b: BuildContext, gates: _GateCache,
            images: Callable[[], Sequence[np.ndarray]]) -> tuple[Segmenter, RuntimeChoice]:
    """The one gate-and-choose flow: judge each available candidate (its cached verdict, else the
    gate against fp32), pick by the family's rule, else its first available fallback."""
    asked = "" if fam.name == "auto" else f"asked for {fam.name}; "
    sha = sha256_file(b.model_path) if fam.candidates else ""
    all_key = _key(sha, "candidates" if fam.name == "auto" else f"candidates-{fam.name}", b)
    results: list[GateResult] = []
    known = [gates.get(_key(sha, n, b)) for n in gates.names(all_key) or ()] if fam.rule == "fastest" else []
    if known and all(r is not None for r in known):  # every candidate judged before: none loaded to decide
        results = [r for r in known if r is not None]
        if _pick(fam, results) is None:
            return _fallback(fam, b, gates, images, results, asked)
    factories = _factories(fam.candidates, b)
    results, reference, gate_set = [], None, None
    for name, factory in factories.items():
        result = gates.get(_key(sha, name, b))
        if result is None:
            try:
                seg = factory()
            except ProcessingFailed as exc:
                log.warning("segment runtime %s unavailable: %s", name, exc)
                continue
            reference = reference or _reference(b)
            if gate_set is None:
                gate_set = list(images())
                if reference.device == "gpu":
                    import cupy

                    gate_set = [cupy.asarray(im) for im in gate_set]
            log.info("judging segment runtime %s against fp32 on %d images (once per machine and model; "
                     "the verdict is kept in %s)", name, len(gate_set), gates.path)
            result = run_gate(name, seg, reference, gate_set, mean_min=gates.gate[0], worst_min=gates.gate[1])
            seg.close()
            gates.put(_key(sha, name, b), result)
        results.append(result)
    if reference is not None:
        reference.close()
    if fam.rule == "fastest" and len(results) == len(factories):
        gates.put(all_key, list(factories))
    best = _pick(fam, results)
    if best is None:
        return _fallback(fam, b, gates, images, results, asked)
    why = f"{best.speedup:.2f}x fp32" if fam.min_speedup else f"IoU mean {best.mean_iou}, worst {best.worst_iou}"
    return factories[best.runtime](), RuntimeChoice(best.runtime, f"{asked}passed the gate, {why}", results)


def _pick(fam: table.RuntimeFamily, results: Sequence[GateResult]) -> GateResult | None:
    passed = [r for r in results if r.passed and r.speedup >= fam.min_speedup]
    if fam.rule == "first":
        return next((r for n in fam.candidates for r in passed if r.runtime == n), None)
    return min(passed, key=lambda r: r.ms_per_image, default=None)


def _fallback(fam: table.RuntimeFamily, b: BuildContext, gates: _GateCache, images: Callable[[], Sequence[np.ndarray]],
              results: list[GateResult], asked: str) -> tuple[Segmenter, RuntimeChoice]:
    why = "no faster runtime passed the gate" if fam.candidates else f"the {b.device.upper()} default"
    for name in fam.fallback:
        sub = table.family(name, b.device)
        if sub is not None:
            if any(machine.available(r, b.device) for n in (*sub.candidates, *sub.fallback)
                   if (r := table.runtime(n)) is not None):
                seg, choice = _choose(sub, b, gates, images)
                return seg, RuntimeChoice(choice.runtime, f"{asked}{why}: {choice.reason}", choice.gates)
            continue
        row = table.runtime(name)
        if row is not None and machine.available(row, b.device):
            return build(row, b), RuntimeChoice(name, f"{asked}{why}", results)
    row = _row(fam.fallback[0], b.device)  # raises: says what to install
    return build(row, b), RuntimeChoice(row.name, f"{asked}{why}", results)


def make_model_segmenter(model_path: Path, spec: ModelSpec = U2NETP, *, device: str = "cpu",
                         runtime: str = "auto", threads: int | None = None, max_batch: int | None = None,
                         cuda_graphs: bool = False, cache_dir: Path | None = None,
                         images: Callable[[], Sequence[np.ndarray]] = gate_images,
                         gate: tuple[float, float] = (GATE_MEAN_IOU, GATE_WORST_IOU),
                         **gpu_options: Any) -> tuple[Segmenter, RuntimeChoice]:
    """The model segmenter for ``device`` with runtime ``runtime`` (a name of
    :mod:`schemas.segment_runtimes`), chosen as the module docstring says.

    ``cache_dir``: where derived models, ONNX Runtime's kept graphs and gate verdicts live (default
    ``model_cache_dir()``).
    ``images``: the gate set (tests pass a smaller one). ``gate``: (mean, worst) IoU minimums;
    cached verdicts keep the IoUs, so a changed gate re-judges them without running the model.
    ``gpu_options`` go to the GPU runner.
    """
    dev = "gpu" if device in ("gpu", "cuda") else "cpu"
    if runtime not in table.NAMES:
        raise ProcessingFailed(f"unknown segment runtime {runtime!r}; known: {', '.join(table.NAMES)}",
                               stage="segment")
    root = cache_dir or model_cache_dir()
    b = BuildContext(Path(model_path), spec, dev, (threads or machine.usable_cores()) if dev == "cpu" else 0, max_batch,
               cuda_graphs, root / "variants", gpu_options, root / "onnxruntime")
    fam = table.family(runtime, dev)
    if fam is not None and not machine.ort_available():  # the gate's reference, and fp32, are ONNX Runtime's
        raise ProcessingFailed(f"no ONNX Runtime is installed: {machine.INSTALL['onnxruntime']}", stage="segment")
    if fam is None:
        row = _row(runtime, dev)
        return build(row, b), RuntimeChoice(runtime, "asked for" if runtime == "fp32" else "asked for (not gated)")
    if not any(machine.available(r, dev) for r in _reachable(fam, dev)):
        engines = sorted({r.engine for r in _reachable(fam, dev)})
        raise ProcessingFailed(f"segment runtime {runtime} on the {dev.upper()} needs one of: "
                               + "; ".join(machine.INSTALL[e] for e in engines), stage="segment")
    return _choose(fam, b, _GateCache(root / "gate.json", gate), images)


def _reachable(fam: table.RuntimeFamily, device: str) -> list[table.SegmentRuntime]:
    """Every runtime ``fam`` may end with on ``device``: its candidates and fallbacks, through the
    families it falls back to."""
    out: list[table.SegmentRuntime] = []
    for name in (*fam.candidates, *fam.fallback):
        sub = table.family(name, device)
        out += _reachable(sub, device) if sub is not None and sub is not fam else (
            [row] if (row := table.runtime(name)) is not None else [])
    return out


def available_runtimes(device: str = "cpu") -> list[str]:
    """The runtime names this installation can run on ``device`` (without loading a model): the
    runtimes available here and the families with a candidate or fallback among them."""
    dev = "gpu" if device in ("gpu", "cuda") else "cpu"
    rows = {r.name for r in table.RUNTIMES if machine.available(r, dev)}
    out = []
    for name in table.names_for(dev):
        fam = table.family(name, dev)
        if name in rows or (fam is not None and fam.name != "auto" and rows & {r.name for r in _reachable(fam, dev)}):
            out.append(name)
    return out


def cached_auto_choice(model_path: Path, spec: ModelSpec = U2NETP, *, threads: int | None = None,
                       cache_dir: Path | None = None,
                       gate: tuple[float, float] = (GATE_MEAN_IOU, GATE_WORST_IOU)) -> tuple[str | None, str]:
    """What ``auto`` picks on this CPU from the cached gate verdicts alone (no model is run):
    ``(runtime, why)``, or ``(None, why)`` while a candidate has no verdict yet (the first
    worker start with ``auto`` measures them)."""
    fam = table.family("auto", "cpu")
    assert fam is not None
    b = BuildContext(Path(model_path), spec, "cpu", threads or machine.usable_cores(), None, False, Path("."), {})
    gates = _GateCache((cache_dir or model_cache_dir()) / "gate.json", gate)
    sha = sha256_file(Path(model_path))
    results, missing = [], []
    for name in _factories(fam.candidates, b):
        result = gates.get(_key(sha, name, b))
        if result is None:
            missing.append(name)
        else:
            results.append(result)
    if missing:
        return None, f"not measured yet for {', '.join(missing)} ({b.threads} threads): the first start measures it"
    best = _pick(fam, results)
    if best is None:
        return "fp32", "no faster runtime passed the gate"
    return best.runtime, f"passed the gate (IoU mean {best.mean_iou}, worst {best.worst_iou}), {best.speedup:.2f}x fp32"
