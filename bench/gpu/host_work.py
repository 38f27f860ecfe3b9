"""Host work of the GPU branch per image, counted without a GPU.

The device code (CuPy) pays per call, not per pixel: every array call is at least one kernel
launch issued from Python on the one device thread, and every value the host reads back (a
shape that depends on the data, ``int(x)``, a boolean mask's gather) waits for the device. This
runs the GPU branch's own code over NumPy through a counting array module (same calls, same
order, as ``XpOps`` and ``xp``-generic code make them on CuPy) and reports, for a batch:

- array calls per image: ufuncs and operators, array functions, ``scipy.ndimage`` calls, gathers
  and scatters by index arrays, ``astype``/``copy``;
- host synchronisations per batch: ``int``/``float``/``bool`` of an array, ``item``/``tolist``,
  data-dependent shapes (``nonzero``, ``unique``, ``bincount``, boolean-mask gathers,
  ``ndimage.label``'s count);
- bytes copied to the host per image: the size of every array (or value) the host reads back.

Stages counted, as the device lane runs them on a batch: the mask refinement of ``segment``
(``segment.postprocess_batch.alpha_batch`` from the model's probability and the image: guided
edge, the rules' checks, matte; the images of one size as one stack, an image a rule changes
refined again on its own) and the edge decontamination of ``correct``
(``retouch.matting_device.decontaminate_batch``, what ``CupyRetoucher.correct`` runs before its
kernel), on synthetic ~1 MP product photos of three sizes; then, as the output lane runs them on
device canvases, the ``quality`` and ``compliance`` measures
(``stages.measure.device_counts``: the refined masks and two presets' canvases per image, an
800 x 800 white one and a 400 x 400 transparent one). ``compare`` shows the same measures taken
item by item on host copies of each canvas and mask (the CPU twin's functions handed device
arrays), for their host reads and bytes. The RawKernel passes of ``correct``
and ``render`` (one launch per image and per preset) and the decode and encode libraries are
not array-module code and are not counted here; nor are the few index maps the batched
decontamination makes on the host with NumPy (integers per row and column of the batch, each
sent in one counted ``asarray``).

``refined_alone``: the images the refinement's flags sent back to the per-image code (a rule
that only it decides; none on these photos, which have one subject and no holes: a batch of
real photos pays for those images their per-image calls and host reads on top).

    python3 bench/gpu/host_work.py [--batch 64] [--size 1000] [--json FILE]

Goal (batch 64, decode to encode): at most 50 array calls per image and 5 host
synchronisations per batch.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import threading
import types
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

SYNC_FUNCTIONS = {"nonzero", "argwhere", "flatnonzero", "unique", "bincount", "compress", "extract"}


class Tally:
    def __init__(self) -> None:
        self.calls = 0
        self.syncs = 0
        self.by_name: collections.Counter[str] = collections.Counter()
        self.sync_names: collections.Counter[str] = collections.Counter()
        self.bytes_to_host = 0
        self._quiet = threading.local()

    def call(self, name: str) -> None:
        if getattr(self._quiet, "depth", 0) == 0:
            self.calls += 1
            self.by_name[name] += 1

    def sync(self, name: str) -> None:
        if getattr(self._quiet, "depth", 0) == 0:
            self.syncs += 1
            self.sync_names[name] += 1

    def quiet(self) -> Any:
        tally = self

        class _Quiet:
            def __enter__(self) -> None:
                tally._quiet.depth = getattr(tally._quiet, "depth", 0) + 1

            def __exit__(self, *exc: object) -> None:
                tally._quiet.depth -= 1

        return _Quiet()


TALLY = Tally()


def _unwrap(x: Any) -> Any:
    if isinstance(x, CountedArray):
        return x.view(np.ndarray)
    if isinstance(x, tuple):
        return tuple(_unwrap(v) for v in x)
    if isinstance(x, list):
        return [_unwrap(v) for v in x]
    if isinstance(x, dict):
        return {k: _unwrap(v) for k, v in x.items()}
    return x


def _wrap(x: Any) -> Any:
    if isinstance(x, np.ndarray) and not isinstance(x, CountedArray):
        return x.view(CountedArray)
    if isinstance(x, np.generic):  # CuPy gives a 0-d device array where NumPy gives a scalar
        return np.asarray(x).view(CountedArray)
    if isinstance(x, tuple):
        return tuple(_wrap(v) for v in x)
    if isinstance(x, list):
        return [_wrap(v) for v in x]
    return x


def _is_array_index(idx: Any) -> tuple[bool, bool]:
    """(an index array is involved, a boolean mask is involved)."""
    parts = idx if isinstance(idx, tuple) else (idx,)
    arrays = [p for p in parts if isinstance(p, np.ndarray | list)]
    return bool(arrays), any(np.asarray(p).dtype == bool for p in arrays)


class CountedArray(np.ndarray):
    """A NumPy array whose operations are tallied as if each were a device call."""

    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        TALLY.call(f"{ufunc.__name__}.{method}" if method != "__call__" else ufunc.__name__)
        with TALLY.quiet():
            return _wrap(getattr(ufunc, method)(*_unwrap(inputs), **_unwrap(kwargs)))

    def __array_function__(self, func: Any, types_: Any, args: Any, kwargs: Any) -> Any:
        TALLY.call(func.__name__)
        if func.__name__ in SYNC_FUNCTIONS:
            TALLY.sync(func.__name__)
        with TALLY.quiet():
            return _wrap(func(*_unwrap(args), **_unwrap(kwargs)))

    def __getitem__(self, idx: Any) -> Any:
        gather, mask = _is_array_index(_unwrap(idx))
        if gather:
            TALLY.call("gather")
            if mask:
                TALLY.sync("boolean gather")
        return _wrap(self.view(np.ndarray)[_unwrap(idx)])

    def __setitem__(self, idx: Any, value: Any) -> None:
        scatter, _ = _is_array_index(_unwrap(idx))
        TALLY.call("scatter" if scatter else "fill")
        self.view(np.ndarray)[_unwrap(idx)] = _unwrap(value)

    def astype(self, *args: Any, **kwargs: Any) -> Any:
        TALLY.call("astype")
        return _wrap(self.view(np.ndarray).astype(*args, **kwargs))

    def copy(self, *args: Any, **kwargs: Any) -> Any:
        TALLY.call("copy")
        return _wrap(self.view(np.ndarray).copy(*args, **kwargs))

    def _host(self, name: str) -> np.ndarray:
        TALLY.sync(name)
        TALLY.bytes_to_host += self.nbytes
        return self.view(np.ndarray)

    def __bool__(self) -> bool:
        return bool(self._host("bool"))

    def __int__(self) -> int:
        return int(self._host("int"))

    def __float__(self) -> float:
        return float(self._host("float"))

    def __index__(self) -> int:
        return int(self._host("index"))

    def item(self, *args: Any) -> Any:
        return self._host("item").item(*args)

    def tolist(self) -> Any:
        return self._host("tolist").tolist()

    def get(self) -> np.ndarray:
        return self._host("get").copy()


class _Module(types.ModuleType):
    """An array module (numpy, scipy.ndimage) whose calls are tallied and whose arrays count."""

    def __init__(self, inner: Any, prefix: str, syncs: frozenset[str] = frozenset()) -> None:
        super().__init__(f"counted_{inner.__name__}")
        self._inner, self._prefix, self._syncs = inner, prefix, syncs

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._inner, name)
        if not callable(value) or isinstance(value, type | np.ufunc):
            return value  # dtypes, constants; ufuncs count through the arrays

        def call(*args: Any, **kwargs: Any) -> Any:
            TALLY.call(f"{self._prefix}{name}")
            if name in self._syncs or name in SYNC_FUNCTIONS:
                TALLY.sync(f"{self._prefix}{name}")
            with TALLY.quiet():
                return _wrap(value(*_unwrap(args), **_unwrap(kwargs)))

        return call


def counted_modules() -> tuple[Any, Any]:
    """(xp, ndi): NumPy and scipy.ndimage as counted stand-ins for CuPy and cupyx.scipy.ndimage."""
    import scipy.ndimage as ndi

    xp = _Module(np, "")
    xp.ndarray = CountedArray  # type: ignore[attr-defined]
    xp.asnumpy = lambda a: np.asarray(_unwrap(a)) if not isinstance(a, CountedArray) else a.get()  # type: ignore[attr-defined]
    return xp, _Module(ndi, "ndimage.", frozenset({"label"}))


def synth(k: int, size: int) -> tuple[np.ndarray, np.ndarray]:
    """A product photo (light backdrop, a textured ellipse and a cap) and a model-like
    probability: the true mask blurred at 320 px and enlarged (soft, a few px off)."""
    import cv2

    rng = np.random.default_rng(k)
    h, w = size, int(size * (1.0 + 0.25 * (k % 3)))
    img = np.full((h, w, 3), 242, np.uint8)
    mask = np.zeros((h, w), np.uint8)
    cv2.ellipse(mask, (w // 2, int(h * 0.55)), (int(w * 0.22), int(h * 0.33)), float(k * 11 % 40), 0, 360, 1, -1)
    cv2.rectangle(mask, (int(w * 0.45), int(h * 0.1)), (int(w * 0.55), int(h * 0.25)), 1, -1)
    tex = cv2.resize(rng.integers(0, 256, (6, 6, 3), dtype=np.uint8), (w, h), interpolation=cv2.INTER_CUBIC)
    img[mask > 0] = tex[mask > 0]
    small = cv2.GaussianBlur(cv2.resize(mask.astype(np.float32), (320, 320), interpolation=cv2.INTER_AREA), (0, 0), 2)
    prob = np.clip(cv2.resize(small, (w, h), interpolation=cv2.INTER_LINEAR), 0, 1).astype(np.float32)
    return img, prob


def count_batch(batch: int, size: int) -> dict[str, Any]:
    """Tally the counted stages over ``batch`` images; per image and per batch figures."""
    from gpu_kernels.segment.ops import XpOps

    xp, ndi = counted_modules()
    ops = XpOps(xp, ndi, "gpu")
    with _AsCupyx(ndi):
        return _count(xp, ops, batch, size)


class _AsCupyx:
    """``cupyx.scipy.ndimage`` is the counted scipy.ndimage while counting: the code that imports
    it on the GPU branch (``from cupyx.scipy import ndimage``) gets the counted one."""

    def __init__(self, ndi: Any) -> None:
        pkg, sub = types.ModuleType("cupyx"), types.ModuleType("cupyx.scipy")
        pkg.scipy, sub.ndimage = sub, ndi  # type: ignore[attr-defined]
        self.modules = {"cupyx": pkg, "cupyx.scipy": sub, "cupyx.scipy.ndimage": ndi}
        self.saved: dict[str, Any] = {}

    def __enter__(self) -> None:
        for name, mod in self.modules.items():
            self.saved[name] = sys.modules.get(name)
            sys.modules[name] = mod

    def __exit__(self, *exc: object) -> None:
        for name, mod in self.saved.items():
            if mod is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = mod


def _count(xp: Any, ops: Any, batch: int, size: int) -> dict[str, Any]:
    from gpu_kernels.retouch.matting_device import decontaminate_batch
    from gpu_kernels.segment.postprocess import MaskPostprocess
    from gpu_kernels.segment.postprocess_batch import alpha_batch
    from gpu_kernels.stages.measure import device_counts

    inputs = [synth(k, size) for k in range(min(batch, 4))]  # 4 distinct photos, cycled
    images = [_wrap(inputs[i % len(inputs)][0]) for i in range(batch)]
    probs = [_wrap(inputs[i % len(inputs)][1]) for i in range(batch)]
    import gpu_kernels.segment.postprocess_batch as batched

    alone: list[int] = []
    one = batched.alpha_from_probability  # the per-image refinement of an image a flag sends back

    def counted_one(*args: Any) -> Any:
        alone.append(1)
        return one(*args)

    TALLY.__init__()  # type: ignore[misc]
    batched.alpha_from_probability = counted_one  # type: ignore[assignment]
    try:
        alphas = alpha_batch(probs, images, MaskPostprocess(), ops)  # what the device lane's refine runs
    finally:
        batched.alpha_from_probability = one
    c1, s1, b1 = TALLY.calls, TALLY.syncs, TALLY.bytes_to_host
    decontaminate_batch(xp, images, alphas)  # what the device lane's correct runs before its kernel
    c2, s2, b2 = TALLY.calls, TALLY.syncs, TALLY.bytes_to_host
    canvases = _canvases(inputs, batch)
    device_counts(xp, alphas, canvases)  # what the output lane's quality and compliance run
    c3, s3, b3 = TALLY.calls, TALLY.syncs, TALLY.bytes_to_host
    stage = {"segment.refine": (c1, s1, b1), "correct.decontaminate": (c2 - c1, s2 - s1, b2 - b1),
             "quality+compliance": (c3 - c2, s3 - s2, b3 - b2)}
    result = {"batch": batch, "size": size, "array_calls_per_image": round(TALLY.calls / batch, 1),
              "host_syncs_per_batch": TALLY.syncs, "bytes_to_host_per_image": round(TALLY.bytes_to_host / batch),
              "refined_alone": len(alone),
              "by_stage": {k: {"array_calls_per_image": round(c / batch, 1), "host_syncs_per_batch": s,
                               "bytes_to_host_per_image": round(b / batch)} for k, (c, s, b) in stage.items()},
              "top_calls": dict(TALLY.by_name.most_common(12)), "top_syncs": dict(TALLY.sync_names.most_common(8)),
              "goal": {"array_calls_per_image": 50, "host_syncs_per_batch": 5}}
    result["compare"] = {"quality+compliance per item on host copies": _host_copies(alphas, canvases)}
    return result


def _canvases(inputs: list[tuple[np.ndarray, np.ndarray]], batch: int) -> list[list[Any]]:
    """Two variants per image, rendered by the CPU twin from the inputs (4 distinct, cycled): an
    800 x 800 white JPEG canvas and a 400 x 400 transparent one."""
    from gpu_kernels.presets import Preset
    from gpu_kernels.retouch.cpu import CpuRetoucher

    presets = [Preset("white", 800, 800), Preset("clear", 400, 400, format="png", background="transparent")]
    retoucher = CpuRetoucher()
    made = [[retoucher.render(img, (prob * 255).astype(np.uint8), p) for p in presets] for img, prob in inputs]
    return [[_wrap(c) for c in made[i % len(made)]] for i in range(batch)]


def _host_copies(masks: list[Any], canvases: list[list[Any]]) -> dict[str, Any]:
    """Quality and compliance item by item on host copies (``to_host`` of each canvas and of the
    mask, per item and per variant), tallied as the device would see them."""
    import gpu_kernels.stages.compliance as compliance
    import gpu_kernels.stages.quality as quality
    from gpu_kernels.presets import Preset

    presets = [Preset("white", 800, 800), Preset("clear", 400, 400, format="png", background="transparent")]

    def copy(a: Any) -> np.ndarray:
        return a.get() if isinstance(a, CountedArray) else np.asarray(a)

    saved = quality.to_host, compliance.to_host
    quality.to_host = compliance.to_host = copy  # type: ignore[assignment]
    TALLY.__init__()  # type: ignore[misc]
    try:
        for mask, cs in zip(masks, canvases, strict=True):
            quality.measure_quality(mask, cs[0])
            for c, p in zip(cs, presets, strict=True):
                compliance.measure_compliance(c, p, mask)
    finally:
        quality.to_host, compliance.to_host = saved  # type: ignore[assignment]
    n = len(masks)
    return {"host_syncs_per_batch": TALLY.syncs, "bytes_to_host_per_image": round(TALLY.bytes_to_host / n)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--size", type=int, default=1000, help="image height in px (widths 1x-1.5x)")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    result = count_batch(args.batch, args.size)
    text = json.dumps(result, indent=1)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
