"""The quality and compliance measures of a batch, on the array's device, as integers.

Both output-lane measurement stages (:mod:`gpu_kernels.stages.quality`,
:mod:`gpu_kernels.stages.compliance`) reduce pixels to a few counts per image and per variant;
everything after that is arithmetic on those counts. Two ways to get them, with the same
integers out:

* :func:`host_counts` — the CPU twin, one item at a time on NumPy arrays with OpenCV (what the
  stages run when the canvases are host arrays);
* :func:`device_counts` — the GPU path, written against an array module ``xp`` (CuPy): the
  canvases and masks of the whole batch are stacked where their shapes agree, every count is an
  array reduction over the stack, and all of them come back to the host in one transfer (one
  host synchronisation for the batch; a few hundred bytes per image instead of every canvas and
  the full mask).

The counts are exact integers (the grey level is OpenCV's fixed-point ``RGB2GRAY``, the Laplacian
OpenCV's 3x3 aperture with its reflect-101 border), so the two paths give identical
:class:`Counts`, and :func:`quality_of` and :func:`compliance_counts` turn them into the same
floats on either.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpu_kernels.array import Array
from gpu_kernels.retouch.geometry import VISIBLE_ALPHA
from gpu_kernels.stages.base import BatchContext, to_host
from gpu_kernels.stages.shadow import canvas_box

__all__ = ["COVERED", "GRAY_SHIFT", "GRAY_WEIGHTS", "CanvasCounts", "Counts", "MaskCounts", "batch_counts",
           "device_counts", "host_canvas", "host_counts", "host_mask", "quality_of"]

# OpenCV's COLOR_RGB2GRAY on 8-bit input: (R*9798 + G*19235 + B*3735 + 2**14) >> 15, exact for
# every one of the 2**24 colours.
GRAY_WEIGHTS = (9798, 19235, 3735)
GRAY_SHIFT = 15
COVERED = 127  # a mask pixel counts as subject for the coverage when above this


@dataclass(frozen=True, slots=True)
class MaskCounts:
    """The source mask's counts: pixels, subject pixels (> ``COVERED``) and, per edge (top,
    bottom, left, right), its length and its pixels at or above ``VISIBLE_ALPHA``."""

    pixels: int
    covered: int
    edge_len: tuple[int, int, int, int]
    edge_subject: tuple[int, int, int, int]


@dataclass(frozen=True, slots=True)
class CanvasCounts:
    """One variant's counts: border pixels and the clean ones (pure white RGB, or alpha 0 on
    RGBA; every pixel when a side is under 2), and the subject's half-open box (None: empty)."""

    height: int
    width: int
    border: int
    clean: int
    box: tuple[int, int, int, int] | None


@dataclass(frozen=True, slots=True)
class Counts:
    """One item's counts: its mask (None without one), the first variant's border channel sum
    and count (quality's whiteness) and its Laplacian's pixels, sum and sum of squares
    (quality's sharpness), and each variant's :class:`CanvasCounts` in the item's preset order."""

    mask: MaskCounts | None
    border_sum: int
    border_values: int
    lap_n: int
    lap_sum: int
    lap_sq: int
    canvases: tuple[CanvasCounts, ...]


def quality_of(c: Counts) -> tuple[float, float, float]:
    """``(subject coverage, background whiteness, sharpness)`` from the counts: coverage is the
    share of mask pixels above 127 (1 without a mask), whiteness the mean of the first variant's
    border RGB values over 255, sharpness the variance of its grey level's Laplacian."""
    coverage = 1.0 if c.mask is None else c.mask.covered / c.mask.pixels
    white = c.border_sum / c.border_values / 255.0
    n = c.lap_n
    sharp = (n * c.lap_sq - c.lap_sum * c.lap_sum) / (n * n)  # exact integers, one rounding
    return float(coverage), float(white), float(sharp)


# -- CPU twin ------------------------------------------------------------------------------------
def host_canvas(img: np.ndarray, box: tuple[int, int, int, int] | None = None) -> CanvasCounts:
    """One variant's :class:`CanvasCounts` from a host array (``box``: its subject box when
    already known, else measured here)."""
    h, w = img.shape[:2]
    box = box if box is not None else canvas_box(img)
    if h < 2 or w < 2:
        clean = (img[..., 3] == 0) if img.shape[2] == 4 else (img == 255).all(axis=2)
        return CanvasCounts(h, w, clean.size, int(np.count_nonzero(clean)), box)
    px = np.concatenate([img[0], img[-1], img[1:-1, 0], img[1:-1, -1]])
    clean = px[:, 3] == 0 if img.shape[2] == 4 else (px == 255).all(axis=1)
    return CanvasCounts(h, w, len(px), int(np.count_nonzero(clean)), box)


def host_mask(m: np.ndarray) -> MaskCounts:
    """The source mask's :class:`MaskCounts` from a host array."""
    edges = (m[0], m[-1], m[:, 0], m[:, -1])
    lens = tuple(int(e.size) for e in edges)
    subject = tuple(int(np.count_nonzero(e >= VISIBLE_ALPHA)) for e in edges)
    return MaskCounts(int(m.size), int(np.count_nonzero(m > COVERED)), lens, subject)  # type: ignore[arg-type]


def host_counts(mask: np.ndarray | None, canvases: Sequence[np.ndarray],
                boxes: Sequence[tuple[int, int, int, int] | None] = (), *, variants: bool = True) -> Counts:
    """One item's :class:`Counts` from host arrays (``canvases[0]`` is the first variant;
    ``boxes``: known subject boxes by variant; ``variants=False``: quality's counts only)."""
    import cv2

    rgb = canvases[0][..., :3]
    border = np.concatenate([rgb[0], rgb[-1], rgb[:, 0], rgb[:, -1]])
    gray = cv2.cvtColor(np.ascontiguousarray(rgb), cv2.COLOR_RGB2GRAY)
    lap = cv2.Laplacian(gray, cv2.CV_16S)  # whole numbers in [-1020, 1020]
    known = list(boxes) + [None] * (len(canvases) - len(boxes))
    return Counts(None if mask is None else host_mask(mask), int(border.sum(dtype=np.int64)), int(border.size),
                  int(lap.size), int(lap.sum(dtype=np.int64)),
                  int(cv2.multiply(lap, lap, dtype=cv2.CV_32S).sum(dtype=np.int64)),  # squares <= 1020**2
                  tuple(host_canvas(c, b) for c, b in zip(canvases, known, strict=True)) if variants else ())


# -- device path -----------------------------------------------------------------------------------
def _groups(arrays: Sequence[Array]) -> list[list[int]]:
    """Positions of ``arrays`` by (shape, dtype), first seen first: each group is one stack."""
    out: dict[tuple[Any, ...], list[int]] = {}
    for k, a in enumerate(arrays):
        out.setdefault((tuple(a.shape), str(a.dtype)), []).append(k)
    return list(out.values())


def _on(xp: Any, a: Array | None) -> Array | None:
    """``a`` on ``xp``'s device: a host array (a CPU segmenter's mask beside device canvases) is
    uploaded; device arrays as they are."""
    return xp.asarray(a) if type(a) is np.ndarray and xp is not np else a


def _stack(xp: Any, arrays: Sequence[Array], ks: list[int]) -> Array:
    return arrays[ks[0]][None] if len(ks) == 1 else xp.stack([arrays[k] for k in ks])


def _sum(xp: Any, a: Array, axis: Any) -> Array:
    return a.sum(axis=axis, dtype=xp.int64)


def _mask_rows(xp: Any, m: Array) -> list[Array]:
    """(N, H, W) masks → [covered, top, bottom, left, right] subject counts, each (N,)."""
    vis = m >= VISIBLE_ALPHA
    return [_sum(xp, m > COVERED, (1, 2)), _sum(xp, vis[:, 0, :], 1), _sum(xp, vis[:, -1, :], 1),
            _sum(xp, vis[:, :, 0], 1), _sum(xp, vis[:, :, -1], 1)]


def _quality_rows(xp: Any, c: Array) -> list[Array]:
    """(N, H, W, C) first variants → [border channel sum, Laplacian sum, Laplacian square sum]."""
    rgb = c[..., :3]
    border = (_sum(xp, rgb[:, 0], (1, 2)) + _sum(xp, rgb[:, -1], (1, 2))
              + _sum(xp, rgb[:, :, 0], (1, 2)) + _sum(xp, rgb[:, :, -1], (1, 2)))
    r, g, b = GRAY_WEIGHTS
    gray = (c[..., 0].astype(xp.int32) * r + c[..., 1].astype(xp.int32) * g + c[..., 2].astype(xp.int32) * b
            + (1 << (GRAY_SHIFT - 1))) >> GRAY_SHIFT
    p = xp.pad(gray, ((0, 0), (1, 1), (1, 1)), mode="reflect")  # OpenCV's BORDER_REFLECT_101
    lap = p[:, :-2, 1:-1] + p[:, 2:, 1:-1] + p[:, 1:-1, :-2] + p[:, 1:-1, 2:] - 4 * gray
    return [border, _sum(xp, lap, (1, 2)), _sum(xp, lap * lap, (1, 2))]


def _canvas_rows(xp: Any, c: Array) -> list[Array]:
    """(N, H, W, C) variants → [clean border pixels, has a subject, y0, y1, x0, x1]. A pixel is
    subject when alpha > 0 (RGBA) or its smallest channel is under 255 (RGB); a border pixel is
    clean when it is not subject (alpha 0, or pure white)."""
    _n, h, w, ch = c.shape
    subject = c[..., 3] > 0 if ch == 4 else c.min(axis=3) < 255
    clean = xp.logical_not(subject)
    if h < 2 or w < 2:
        count = _sum(xp, clean, (1, 2))
    else:
        count = (_sum(xp, clean[:, 0], 1) + _sum(xp, clean[:, -1], 1)
                 + _sum(xp, clean[:, 1:-1, 0], 1) + _sum(xp, clean[:, 1:-1, -1], 1))
    rows, cols = subject.any(axis=2), subject.any(axis=1)
    return [count, rows.any(axis=1), rows.argmax(axis=1), h - rows[:, ::-1].argmax(axis=1),
            cols.argmax(axis=1), w - cols[:, ::-1].argmax(axis=1)]


class _Rows:
    """(N,) device vectors to be copied back together, and where each item's values sit."""

    def __init__(self, xp: Any) -> None:
        self.xp, self.size = xp, 0
        self.rows: list[Array] = []
        self.at: dict[tuple[str, int, int], tuple[int, int]] = {}  # key → (offset, stride)
        self.values: list[int] = []

    def add(self, kind: str, keys: list[tuple[int, int]], vectors: list[Array]) -> None:
        for j, (i, v) in enumerate(keys):
            self.at[kind, i, v] = (self.size + j, len(keys))
        self.rows.extend(v.astype(self.xp.int64) for v in vectors)
        self.size += len(keys) * len(vectors)

    def fetch(self) -> None:
        """The one copy to the host (one synchronisation) for every value of the batch."""
        if self.rows:
            joined = self.xp.concatenate(self.rows)
            host = self.xp.asnumpy(joined) if hasattr(self.xp, "asnumpy") else np.asarray(joined)
            self.values = [int(x) for x in np.asarray(host).tolist()]

    def take(self, kind: str, i: int, v: int, count: int) -> list[int]:
        at, stride = self.at[kind, i, v]
        return [self.values[at + stride * r] for r in range(count)]


def device_counts(xp: Any, masks: Sequence[Array | None], canvases: Sequence[Sequence[Array]], *,
                  variants: bool = True) -> list[Counts]:
    """Every item's :class:`Counts`, computed on ``xp``'s device (``masks[i]``: item ``i``'s source
    mask or None; ``canvases[i]``: its variants, first one first; ``variants=False``: quality's
    counts only). Arrays of one shape are stacked and reduced together; the counts of the whole
    batch come back to the host in one copy."""
    rows = _Rows(xp)
    masks = [_on(xp, m) for m in masks]
    canvases = [[_on(xp, c) for c in cs] for cs in canvases]
    with_mask = [i for i, m in enumerate(masks) if m is not None]
    mask_list = [masks[i] for i in with_mask]
    for ks in _groups(mask_list):
        rows.add("mask", [(with_mask[k], 0) for k in ks], _mask_rows(xp, _stack(xp, mask_list, ks)))
    firsts = [c[0] for c in canvases]
    for ks in _groups(firsts):
        rows.add("quality", [(k, 0) for k in ks], _quality_rows(xp, _stack(xp, firsts, ks)))
    flat = [(i, v) for i, cs in enumerate(canvases) for v in range(len(cs))] if variants else []
    every = [canvases[i][v] for i, v in flat]
    for ks in _groups(every):
        rows.add("canvas", [flat[k] for k in ks], _canvas_rows(xp, _stack(xp, every, ks)))
    rows.fetch()
    out = []
    for i, (mask, cs) in enumerate(zip(masks, canvases, strict=True)):
        mc = None
        if mask is not None:
            covered, *edges = rows.take("mask", i, 0, 5)
            h, w = int(mask.shape[0]), int(mask.shape[1])
            mc = MaskCounts(h * w, covered, (w, w, h, h), tuple(edges))  # type: ignore[arg-type]
        b, s1, s2 = rows.take("quality", i, 0, 3)
        fh, fw = int(cs[0].shape[0]), int(cs[0].shape[1])
        found = []
        for v, c in enumerate(cs if variants else ()):
            clean, has, y0, y1, x0, x1 = rows.take("canvas", i, v, 6)
            h, w = int(c.shape[0]), int(c.shape[1])
            border = h * w if h < 2 or w < 2 else 2 * w + 2 * (h - 2)
            found.append(CanvasCounts(h, w, border, clean, (x0, y0, x1, y1) if has else None))
        out.append(Counts(mc, b, 3 * (2 * fw + 2 * fh), fh * fw, s1, s2, tuple(found)))
    return out


# -- the stages' shared step ------------------------------------------------------------------------
def batch_counts(ctx: BatchContext, idx: Sequence[int], xp: Any = None) -> dict[int, Counts]:
    """The :class:`Counts` of items ``idx`` of ``ctx`` (mask, every variant's canvas, the subject
    boxes a shadow stage kept), computed once per item and kept in ``ctx.memo["measure", item]``
    for the other measuring stage. Host canvases (NumPy) are measured one item at a time on the
    host; device canvases all together on their device (:func:`device_counts`, one copy back for
    the batch). ``xp`` forces the device path with that array module."""
    todo = [i for i in idx if ("measure", i) not in ctx.memo]
    if todo:
        canvases = [[ctx.rendered[i, p.name] for p in ctx.jobs[i].presets] for i in todo]
        masks = [ctx.masks.get(i) for i in todo]
        if xp is None and all(isinstance(c, np.ndarray) for cs in canvases for c in cs):
            found = [host_counts(None if m is None else to_host(m), cs,
                                 [ctx.memo.get(("canvas_box", i, p.name)) for p in ctx.jobs[i].presets])
                     for i, m, cs in zip(todo, masks, canvases, strict=True)]
        else:
            if xp is None:
                import cupy

                xp = cupy
            found = device_counts(xp, masks, canvases)
        for i, c in zip(todo, found, strict=True):
            ctx.memo["measure", i] = c
    return {i: ctx.memo["measure", i] for i in idx}
