"""Contact shadow (preset option ``shadow = "contact"``): a soft shadow right under the product.

On a rendered white-background canvas the subject is every pixel that is not exactly
(255, 255, 255). Let ``yb`` be the subject's lowest row and the *footprint* the columns where the
subject shows in the bottom ``band`` of its height. The shadow darkens background pixels only,
only in rows ``yb + 1 .. yb + depth`` (strictly below the subject), by

    d(y, x) = v(y) * f(x),   v = strength * (1 - (y - yb) / (depth + 1))^2,   f = footprint blurred
    out = rint(255 * (1 - d))  where the pixel is background, else the pixel unchanged

(``f`` is the footprint convolved with a normalized Gaussian, so 0 <= f <= 1). Every other pixel,
the background above and beside the product included, stays exactly 255.

The 1-D profiles ``v`` and ``f`` are computed on the host (a few thousand floats); the per-pixel
pass is :func:`contact_shadow_cpu` (NumPy) or one CuPy elementwise kernel (compiled with
``--fmad=false``, same float32 operations in the same order), so both give the same bytes.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpu_kernels.backends import Array
from gpu_kernels.presets import Preset
from gpu_kernels.stages.base import BatchContext, Lane, Stage, Step, to_host
from schemas.errors import per_item

__all__ = ["ShadowConfig", "ShadowStage", "canvas_box", "contact_shadow", "shadow_profiles"]


@dataclass(frozen=True, slots=True)
class ShadowConfig:
    """``strength``: darkening right under the product (0.3 → 255 becomes 179 at full footprint);
    ``depth``: how far the shadow reaches down, as a share of the subject's height;
    ``band``: bottom share of the subject whose columns make the footprint;
    ``softness``: Gaussian sigma of the footprint, as a share of the subject's width."""

    strength: float = 0.30
    depth: float = 0.05
    band: float = 0.06
    softness: float = 0.03


def canvas_box(image: Array) -> tuple[int, int, int, int] | None:
    """``(x0, y0, x1, y1)`` half-open box of the non-white pixels of an RGB canvas (or of alpha > 0
    for RGBA), on the host; None for an empty canvas. Reductions run on the array's device."""
    if image.shape[2] == 4:
        subject = image[..., 3] > 0
        rows, cols = to_host(subject.any(axis=1)), to_host(subject.any(axis=0))
        if not rows.any():
            return None
        ys, xs = np.flatnonzero(rows), np.flatnonzero(cols)
        return int(xs[0]), int(ys[0]), int(xs[-1]) + 1, int(ys[-1]) + 1
    # RGB: a pixel is subject when its smallest channel is below 255. Row minima over contiguous
    # memory first, then column minima over the subject's rows only (about 10x fewer passes than
    # a boolean (H, W, 3) comparison on a 2000 x 2000 canvas).
    h = image.shape[0]
    ys = np.flatnonzero(to_host(image.reshape(h, -1).min(axis=1) < 255))
    if ys.size == 0:
        return None
    y0, y1 = int(ys[0]), int(ys[-1]) + 1
    xs = np.flatnonzero(to_host(image[y0:y1].min(axis=0).min(axis=1) < 255))
    return int(xs[0]), y0, int(xs[-1]) + 1, y1


def shadow_profiles(subject: Array, box: tuple[int, int, int, int], height: int,
                    cfg: ShadowConfig) -> tuple[int, np.ndarray, np.ndarray] | None:
    """``(first row, v, f)``: the shadow's first row, its row profile ``v`` (float32, one value per
    shadow row) and column profile ``f`` (float32, one per canvas column); None when there is no
    room below the subject. ``subject`` is the (H, W) bool subject mask (NumPy or CuPy)."""
    x0, y0, x1, y1 = box
    room = height - y1
    depth = min(room, max(2, round(cfg.depth * (y1 - y0))))
    if depth < 1:
        return None
    band = max(1, round(cfg.band * (y1 - y0)))
    foot = to_host(subject[y1 - band:y1].any(axis=0)).astype(np.float32)
    sigma = max(1.0, cfg.softness * (x1 - x0))
    radius = int(np.ceil(3 * sigma))
    taps = np.exp(-0.5 * (np.arange(-radius, radius + 1, dtype=np.float32) / np.float32(sigma)) ** 2)
    f = np.convolve(foot, (taps / taps.sum()).astype(np.float32), mode="same").astype(np.float32)
    t = np.arange(1, depth + 1, dtype=np.float32) / np.float32(depth + 1)
    v = (np.float32(cfg.strength) * (np.float32(1) - t) ** 2).astype(np.float32)
    return y1, v, np.clip(f, 0, 1).astype(np.float32)


def contact_shadow_cpu(region: np.ndarray, v: np.ndarray, f: np.ndarray) -> np.ndarray:
    """The per-pixel pass over the shadow rows (NumPy twin of the CuPy kernel)."""
    d = v[:, None] * f[None, :]
    shade = np.rint(np.float32(255) * (np.float32(1) - d)).astype(np.uint8)
    background = (region == 255).all(axis=2)
    out = region.copy()
    out[background] = shade[background][:, None]
    return out


_KERNEL = None


def _cupy_kernel() -> Any:
    global _KERNEL
    if _KERNEL is None:
        import cupy

        _KERNEL = cupy.ElementwiseKernel(
            "raw uint8 src, raw float32 v, raw float32 f, int32 width", "uint8 dst",
            """
            const int p = i / 3, y = p / width, x = p - y * width;
            const bool bg = src[3 * p] == 255 && src[3 * p + 1] == 255 && src[3 * p + 2] == 255;
            if (bg) {
                const float d = __fmul_rn(v[y], f[x]);
                dst = (unsigned char)rintf(__fmul_rn(255.0f, __fsub_rn(1.0f, d)));
            } else {
                dst = src[i];
            }
            """,
            "lb_contact_shadow", options=("--fmad=false",))
    return _KERNEL


def contact_shadow_gpu(region: Any, v: np.ndarray, f: np.ndarray) -> Any:
    """The per-pixel pass on the device: one elementwise kernel over the shadow rows."""
    import cupy

    src = cupy.ascontiguousarray(region)
    out = cupy.empty_like(src)
    _cupy_kernel()(src, cupy.asarray(v), cupy.asarray(f), np.int32(src.shape[1]), out)
    return out


def contact_shadow(image: Array, cfg: ShadowConfig | None = None,
                   box: tuple[int, int, int, int] | None = None) -> Array:
    """``image`` (RGB canvas, white background, NumPy or CuPy) with a contact shadow; a new array.
    An RGBA canvas, an empty one or one without room under the subject comes back unchanged."""
    cfg = cfg or ShadowConfig()
    if image.shape[2] != 3:
        return image
    box = box or canvas_box(image)
    if box is None:
        return image
    subject = (image != 255).any(axis=2)
    found = shadow_profiles(subject, box, image.shape[0], cfg)
    if found is None:
        return image
    first, v, f = found
    out = image.copy()
    region = image[first:first + len(v)]
    on_gpu = not isinstance(image, np.ndarray)
    out[first:first + len(v)] = contact_shadow_gpu(region, v, f) if on_gpu else contact_shadow_cpu(region, v, f)
    return out


class ShadowStage(Stage):
    """Render's lane (device on a GPU, output on the CPU), after render and before encode; one step
    (span ``shadow:<preset>``) per preset with ``shadow = "contact"``. Keeps each canvas' subject box
    (before the shadow) in ``ctx.memo["canvas_box", item, preset]`` for the compliance stage. A
    preset with the same look as one before it takes that one's canvas, shadow and box."""

    name = "shadow"

    def __init__(self, device: str, config: ShadowConfig | None = None, lane: Lane | None = None) -> None:
        self.device, self.config = device, config or ShadowConfig()
        self.lane: Lane = lane or ("device" if device == "gpu" else "output")  # the render's before it

    def steps(self, ctx: BatchContext) -> Iterable[Step]:
        order = ctx.presets()
        for preset in order:
            if preset.shadow != "contact":
                continue
            own, twins = ctx.twins(order, preset, lambda p: p.look)
            if own:
                yield Step(f"shadow:{preset.name}", self.device, own,
                           lambda ix, p=preset: self._apply(ctx, ix, p),  # type: ignore[misc]
                           lambda i, img, p=preset: ctx.rendered.__setitem__((i, p.name), img))  # type: ignore[misc]
            if twins:  # an earlier preset's canvas with the same look has its shadow already
                yield Step(f"shadow:{preset.name}", self.device, list(twins),
                           lambda ix, p=preset, t=twins: self._twin(ctx, ix, p, t),  # type: ignore[misc]
                           lambda i, img, p=preset: ctx.rendered.__setitem__((i, p.name), img))  # type: ignore[misc]

    @staticmethod
    def _twin(ctx: BatchContext, idx: list[int], preset: Preset, twins: dict[int, str]) -> list[Array]:
        for i in idx:
            ctx.memo["canvas_box", i, preset.name] = ctx.memo["canvas_box", i, twins[i]]
        return [ctx.rendered[i, twins[i]] for i in idx]

    def _apply(self, ctx: BatchContext, idx: list[int], preset: Preset) -> Sequence[object]:
        def one(i: int) -> Array:
            image = ctx.rendered[i, preset.name]
            box = ctx.memo.setdefault(("canvas_box", i, preset.name), canvas_box(image))
            return contact_shadow(image, self.config, box)

        return per_item(one, idx)
