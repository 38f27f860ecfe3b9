"""Edge decontamination shaped for the device: the crop around the edge, whole, in a few dozen
array calls and one host read per image.

:func:`gpu_kernels.retouch.matting.decontaminate` (the CPU twin) filters only the tiles its
edge pixels fall in and gathers the edge pixels into lists, which on a 2-core CPU is the fast
way and on a GPU costs hundreds of tiny launches and a host wait per tile. Here the same crop
(the edge's bounding box plus the widest window) is computed whole: each pass's planes over the
crop's sampling grid with ``where`` instead of index lists, the box means enlarged back to the
crop by index maps, and the result put in place with one ``where``. The bounding box is the one
value read back (``edge_box``; :func:`edge_boxes` reads a whole batch's in one go).

The arithmetic is the twin's, operation for operation; the box filter (``box_blur``) over the
whole sampled crop equals the twin's tiles on the device (a direct sum per pixel) and within one
level after rounding on NumPy, where OpenCV's running sums differ in the last bits between tiles.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from gpu_kernels.array import Array
from gpu_kernels.retouch.matting import MattingConfig, box_blur

STACK_PIXELS = 1 << 26  # pixels per stack at most (64 MP), as the refinement's

__all__ = ["decontaminate_batch", "decontaminate_device", "edge_box", "edge_boxes"]

Box = tuple[int, int, int, int] | None  # (first row, last row, first column, last column) of the edge


def _box_parts(xp: Any, alpha: Array) -> Array:
    """``(..., 4)`` int64 on the device: first/last row and column holding an edge pixel (-1 if
    none), of one ``(H, W)`` alpha or of each of a ``(B, H, W)`` stack."""
    edge = (alpha > 0) & (alpha < 255)
    rows, cols = edge.any(axis=-1), edge.any(axis=-2)
    h, w = alpha.shape[-2:]
    first_r, first_c = xp.argmax(rows, axis=-1), xp.argmax(cols, axis=-1)
    last_r, last_c = h - 1 - xp.argmax(rows[..., ::-1], axis=-1), w - 1 - xp.argmax(cols[..., ::-1], axis=-1)
    none = ~rows.any(axis=-1)
    return xp.where(none[..., None], -1, xp.stack([first_r, last_r, first_c, last_c], axis=-1).astype(xp.int64))


def edge_box(xp: Any, alpha: Array) -> Box:
    """The edge's bounding box of one alpha (one host read)."""
    return edge_boxes(xp, [alpha])[0]


def edge_boxes(xp: Any, alphas: Sequence[Array]) -> list[Box]:
    """The edge's bounding box of each alpha, all read back in one host transfer (the alphas of
    one size found as one stack)."""
    if not alphas:
        return []
    groups: dict[tuple[int, ...], list[int]] = {}
    for k, a in enumerate(alphas):
        groups.setdefault(tuple(a.shape), []).append(k)
    order = [k for members in groups.values() for k in members]
    parts = [_box_parts(xp, alphas[m[0]][None] if len(m) == 1 else xp.stack([alphas[k] for k in m]))
             for m in groups.values()]
    both = parts[0] if len(parts) == 1 else xp.concatenate(parts)
    host = (both.get() if hasattr(both, "get") else both).tolist()
    boxes: list[Box] = [None] * len(alphas)
    for k, r in zip(order, host, strict=True):
        boxes[k] = None if int(r[0]) < 0 else (int(r[0]), int(r[1]), int(r[2]), int(r[3]))
    return boxes


def decontaminate_device(xp: Any, pixels: Array, alpha: Array, cfg: MattingConfig | None = None,
                         box: Box | str = "read") -> Array:
    """As :func:`~gpu_kernels.retouch.matting.decontaminate`; ``box``: the edge's bounding box when
    already read (:func:`edge_boxes`), else it is read here."""
    cfg = cfg or MattingConfig()
    if pixels.ndim != 3 or pixels.shape[2] != 3:
        return pixels
    if box == "read":
        box = edge_box(xp, alpha)
    if box is None or isinstance(box, str):
        return pixels
    h, w = alpha.shape
    diag = math.hypot(h, w)
    radii = tuple(max(1, round(r * diag)) for r in cfg.radii)
    m = max(radii)
    r0, r1, c0, c1 = box
    y0, y1, x0, x1 = max(0, r0 - m), min(h, r1 + m + 1), max(0, c0 - m), min(w, c1 + m + 1)
    crop = xp.ascontiguousarray(pixels[y0:y1, x0:x1])
    sub = alpha[y0:y1, x0:x1]
    edge = ((sub > 0) & (sub < 255))[..., None]
    a = sub.astype(xp.float32) * xp.float32(1 / 255)
    a3 = a[..., None]
    i = crop.astype(xp.float32)
    ia = i * a3
    fa, bna = ia, i - ia  # pass 0: f = b = the pixel itself, as the twin's
    hc, wc = a.shape
    f = b = i
    for k, r in enumerate(radii):
        st = max(1, r // 8)
        rs = max(1, round(r / st))
        if k > 0:
            fa = xp.where(edge, f * a3, ia)
            bna = xp.where(edge, b * (1.0 - a3), i - ia)
        a_s = a[::st, ::st]
        means = [box_blur(xp, xp.ascontiguousarray(p), rs)
                 for p in (a_s, 1.0 - a_s, fa[::st, ::st], bna[::st, ::st])]
        ys = (xp.arange(hc) // st)[:, None]
        xs = (xp.arange(wc) // st)[None, :]
        wf, wb, fs, bs = (p[ys, xs] for p in means)  # enlarged back by index maps
        fm = fs / (wf + xp.float32(1e-5))[..., None]
        bm = bs / (wb + xp.float32(1e-5))[..., None]
        f = xp.clip(fm + a3 * (i - a3 * fm - (1.0 - a3) * bm), xp.float32(0), xp.float32(255))
        b = bm
    fixed = xp.clip(xp.floor(f.astype(xp.float32) + xp.float32(0.5)), 0, 255).astype(xp.uint8)
    out = pixels.copy()
    out[y0:y1, x0:x1] = xp.where(edge, fixed, crop)
    return out



def decontaminate_batch(xp: Any, pixels: Sequence[Array], alphas: Sequence[Array | None],
                        cfg: MattingConfig | None = None, ndi: Any = None) -> list[Array]:
    """:func:`decontaminate_device` of each pair (``alpha`` None, or not 3-channel pixels: the
    pixels as they are), the same bytes: the edge boxes of all read back in one host transfer,
    then the images of one size run as one stack (:func:`_decontaminate_stack`; at most
    :data:`STACK_PIXELS` pixels a stack). ``ndi``: the
    array module's ``scipy.ndimage`` (default: ``cupyx.scipy.ndimage``)."""
    cfg = cfg or MattingConfig()
    out = list(pixels)
    todo = []
    for k, (p, a) in enumerate(zip(pixels, alphas, strict=True)):
        if a is not None and p.ndim == 3 and p.shape[2] == 3 and tuple(a.shape) == tuple(p.shape[:2]):
            todo.append(k)
        elif a is not None:
            out[k] = decontaminate_device(xp, p, a, cfg)
    boxes = edge_boxes(xp, [alphas[k] for k in todo])
    groups: dict[tuple[int, int], list[tuple[int, tuple[int, int, int, int]]]] = {}
    for k, box in zip(todo, boxes, strict=True):
        if box is not None:
            groups.setdefault(tuple(pixels[k].shape[:2]), []).append((k, box))
    if ndi is None and groups:
        ndi = importlib.import_module("cupyx.scipy.ndimage")
    chunks = [members[c:c + depth] for (h, w), members in groups.items()
              for depth in [max(1, STACK_PIXELS // (h * w))] for c in range(0, len(members), depth)]
    for members in chunks:
        fixed = _decontaminate_stack(xp, ndi, xp.stack([pixels[k] for k, _ in members]),
                                     xp.stack([alphas[k] for k, _ in members]), [b for _, b in members], cfg)
        for j, (k, _) in enumerate(members):
            out[k] = fixed[j]
    return out


def _reflect(i: Any, n: Any) -> Any:
    """``scipy.ndimage``'s ``reflect`` extension: index ``i`` of a line of ``n`` (d c b a | a b c d)."""
    i = i % (2 * n)
    return np.where(i >= n, 2 * n - 1 - i, i)


def _decontaminate_stack(xp: Any, ndi: Any, pixels: Array, alpha: Array, boxes: list[tuple[int, int, int, int]],
                         cfg: MattingConfig) -> Array:
    """:func:`decontaminate_device` of each slice of ``(B, H, W, 3)`` / ``(B, H, W)`` with its edge
    box, the same arithmetic per pixel. Each image's crop keeps its own sampling grid and its own
    reflected borders: the sampled planes are gathered through index maps made on the host (the
    crop's sample rows and columns, reflected ``rs`` beyond its ends, as ``uniform_filter`` would
    extend it), box-filtered together, and enlarged back by index maps; all images' arrays span
    the union of their crops."""
    b_n, h, w = alpha.shape
    diag = math.hypot(h, w)
    radii = tuple(max(1, round(r * diag)) for r in cfg.radii)
    m = max(radii)
    crops = np.array([(max(0, r0 - m), min(h, r1 + m + 1), max(0, c0 - m), min(w, c1 + m + 1))
                      for r0, r1, c0, c1 in boxes])
    uy0, uy1, ux0, ux1 = int(crops[:, 0].min()), int(crops[:, 1].max()), int(crops[:, 2].min()), int(crops[:, 3].max())
    crop = pixels[:, uy0:uy1, ux0:ux1]
    sub = alpha[:, uy0:uy1, ux0:ux1]
    edge = ((sub > 0) & (sub < 255))[..., None]
    a = sub.astype(xp.float32) * xp.float32(1 / 255)
    a3 = a[..., None]
    i = crop.astype(xp.float32)
    ia = i * a3
    fa, bna = ia, i - ia
    f = b = i
    oy, ox = crops[:, 0] - uy0, crops[:, 2] - ux0  # each crop's origin in the union
    hc, wc = crops[:, 1] - crops[:, 0], crops[:, 3] - crops[:, 2]
    batch = xp.arange(b_n)[:, None, None]
    for k, r in enumerate(radii):
        st = max(1, r // 8)
        rs = max(1, round(r / st))
        if k > 0:
            fa = xp.where(edge, f * a3, ia)
            bna = xp.where(edge, b * (1.0 - a3), i - ia)
        ny, nx = -(-hc // st), -(-wc // st)  # each crop's samples per column and row
        jy, jx = np.arange(int(ny.max()) + 2 * rs)[None, :], np.arange(int(nx.max()) + 2 * rs)[None, :]
        rows = oy[:, None] + st * _reflect(np.minimum(jy, ny[:, None] + 2 * rs - 1) - rs, ny[:, None])
        cols = ox[:, None] + st * _reflect(np.minimum(jx, nx[:, None] + 2 * rs - 1) - rs, nx[:, None])
        at = (batch, xp.asarray(rows[:, :, None]), xp.asarray(cols[:, None, :]))
        a_s = a[at][..., None]
        planes = xp.concatenate([a_s, 1.0 - a_s, fa[at], bna[at]], axis=-1)  # (B, hs, ws, 8)
        means = ndi.uniform_filter(planes, size=(1, 2 * rs + 1, 2 * rs + 1, 1), mode="reflect")
        ys = np.minimum(np.maximum(np.arange(uy1 - uy0)[None, :] - oy[:, None], 0) // st, ny[:, None] - 1) + rs
        xs = np.minimum(np.maximum(np.arange(ux1 - ux0)[None, :] - ox[:, None], 0) // st, nx[:, None] - 1) + rs
        big = means[batch, xp.asarray(ys[:, :, None]), xp.asarray(xs[:, None, :])]  # enlarged back by index maps
        wf, wb, fs, bs = big[..., 0], big[..., 1], big[..., 2:5], big[..., 5:8]
        fm = fs / (wf + xp.float32(1e-5))[..., None]
        bm = bs / (wb + xp.float32(1e-5))[..., None]
        f = xp.clip(fm + a3 * (i - a3 * fm - (1.0 - a3) * bm), xp.float32(0), xp.float32(255))
        b = bm
    fixed = xp.clip(xp.floor(f.astype(xp.float32) + xp.float32(0.5)), 0, 255).astype(xp.uint8)
    out = pixels.copy()
    out[:, uy0:uy1, ux0:ux1] = xp.where(edge, fixed, crop)
    return out
