"""Array primitives the segmenters need, once per backend, behind one small interface.

``CpuOps`` uses OpenCV on NumPy arrays. ``XpOps`` is written against an array module and its
``ndimage`` (``cupy`` + ``cupyx.scipy.ndimage`` on the GPU); built over ``numpy`` +
``scipy.ndimage`` it runs the very same code on the CPU, which is how the GPU path is tested
without a GPU. The algorithms (pre-processing, mask post-processing) are written once, in
``model.py`` and ``postprocess.py``, on top of these primitives.

Conventions: images ``(H, W, 3)`` uint8 RGB; maps ``(H, W)`` float32; masks ``(H, W)`` bool.
Resizing follows OpenCV's conventions: pixel centres at ``i + 0.5``; shrinking averages the
covered source area (``INTER_AREA``), enlarging is bilinear with clamped edges (``INTER_LINEAR``).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, Protocol

import cv2
import numpy as np

from gpu_kernels.array import Array

__all__ = [
    "ArrayOps",
    "CpuOps",
    "XpOps",
    "cupy_ops",
    "disk",
    "numpy_xp_ops",
    "resample_matrix",
]


class ArrayOps(Protocol):
    """What the segmenters need from an array backend."""

    device: str
    xp: Any  # the array module: numpy or cupy

    def resize_image(self, img: Array, out_h: int, out_w: int) -> Array:
        """``(H, W, C)`` uint8 -> ``(out_h, out_w, C)`` float32 in [0, 255]."""
        ...

    def resize_map(self, a: Array, out_h: int, out_w: int) -> Array:
        """``(H, W)`` float32 -> ``(out_h, out_w)`` float32."""
        ...

    def resize_u8(self, a: Array, out_h: int, out_w: int) -> Array:
        """A uint8 image ``(H, W, C)`` or map ``(H, W)`` resized, rounded back to uint8 (on the
        CPU in one pass, without a float32 copy: OpenCV's fixed-point resampling, within one
        level of rounding the float result)."""
        ...

    def zero_below(self, a: Array, level: int) -> Array:
        """uint8 ``a`` with every value under ``level`` set to 0, in place; returns ``a``."""
        ...

    def erode(self, mask: Array, radius: int) -> Array:
        """Binary erosion by a disk of ``radius`` px; outside the image counts as foreground."""
        ...

    def blur(self, a: Array, sigma: float) -> Array:
        """Gaussian blur of a float32 map (mirrored edges, kernel radius ~4 sigma)."""
        ...

    def keep_large_components(self, mask: Array, min_fraction: float) -> Array:
        """Drop 8-connected components smaller than ``min_fraction`` of the largest one."""
        ...

    def label(self, mask: Array, connectivity: int) -> tuple[Array, int]:
        """``(labels (H, W) int32, n)``: components of ``mask`` (4- or 8-connected) numbered
        1..n, 0 outside the mask."""
        ...

    def distance_to(self, mask: Array) -> Array:
        """``(H, W)`` float32 Euclidean distance of each pixel to the nearest ``mask`` pixel (0 on
        it); a large value everywhere when the mask is empty."""
        ...

    def asnumpy(self, a: Array) -> np.ndarray: ...

    def asarray(self, a: np.ndarray) -> Array: ...


def disk(radius: int) -> np.ndarray:
    """``(2r+1, 2r+1)`` uint8 disk, OpenCV's ``MORPH_ELLIPSE`` (the same on every backend)."""
    size = 2 * radius + 1
    return cv2.getStructuringElement(cv2.MORPH_ELLIPSE, (size, size))


@lru_cache(maxsize=128)
def resample_matrix(n_in: int, n_out: int) -> np.ndarray:
    """``(n_out, n_in)`` float32 weights so that ``M @ x`` resizes a 1-D signal.

    Shrinking: each output pixel averages the source interval it covers (area weights, rows
    sum to 1). Enlarging: bilinear at half-pixel centres, clamped at the ends. Equal sizes:
    identity.
    """
    if n_in < 1 or n_out < 1:
        raise ValueError(f"resample_matrix: sizes must be positive, got {n_in} -> {n_out}")
    scale = n_in / n_out
    if n_out < n_in:
        start = np.arange(n_out, dtype=np.float64)[:, None] * scale
        end = start + scale
        j = np.arange(n_in, dtype=np.float64)[None, :]
        overlap = np.clip(np.minimum(end, j + 1.0) - np.maximum(start, j), 0.0, None)
        area: np.ndarray = (overlap / scale).astype(np.float32)
        return area
    src = np.clip((np.arange(n_out, dtype=np.float64) + 0.5) * scale - 0.5, 0.0, n_in - 1)
    j0 = np.floor(src).astype(np.int64)
    j1 = np.minimum(j0 + 1, n_in - 1)
    frac = src - j0
    m = np.zeros((n_out, n_in), dtype=np.float64)
    rows = np.arange(n_out)
    np.add.at(m, (rows, j0), 1.0 - frac)
    np.add.at(m, (rows, j1), frac)
    return m.astype(np.float32)


class CpuOps:
    """OpenCV on NumPy arrays: the CPU backend."""

    def __init__(self) -> None:
        self.device: str = "cpu"
        self.xp: Any = np

    def resize_image(self, img: Array, out_h: int, out_w: int) -> Array:
        small = cv2.resize(np.ascontiguousarray(img), (out_w, out_h), interpolation=_interp(img, out_h, out_w))
        return small.astype(np.float32)

    def resize_map(self, a: Array, out_h: int, out_w: int) -> Array:
        out = cv2.resize(
            np.ascontiguousarray(a, dtype=np.float32),
            (out_w, out_h),
            interpolation=_interp(a, out_h, out_w),
        )
        return np.asarray(out, dtype=np.float32)

    def resize_u8(self, a: Array, out_h: int, out_w: int) -> Array:
        return cv2.resize(np.ascontiguousarray(a), (out_w, out_h), interpolation=_interp(a, out_h, out_w))

    def zero_below(self, a: Array, level: int) -> Array:
        cv2.threshold(a, level - 1, 0, cv2.THRESH_TOZERO, dst=a)  # keeps values > level - 1
        return a

    def erode(self, mask: Array, radius: int) -> Array:
        if radius <= 0:
            return mask
        return cv2.erode(mask.astype(np.uint8), disk(radius)).astype(bool)

    def blur(self, a: Array, sigma: float) -> Array:
        return cv2.GaussianBlur(
            np.asarray(a, dtype=np.float32),
            (0, 0),
            sigmaX=sigma,
            sigmaY=sigma,
            borderType=cv2.BORDER_REFLECT_101,
        )

    def keep_large_components(self, mask: Array, min_fraction: float) -> Array:
        n, labels, stats, _ = cv2.connectedComponentsWithStats(mask.astype(np.uint8), connectivity=8)
        if n <= 2 or min_fraction <= 0:
            return mask
        areas = stats[:, cv2.CC_STAT_AREA].copy()
        areas[0] = 0
        keep = areas >= min_fraction * areas.max()
        keep[0] = False
        return keep[labels]

    def label(self, mask: Array, connectivity: int) -> tuple[Array, int]:
        n, labels = cv2.connectedComponents(mask.astype(np.uint8), connectivity=connectivity, ltype=cv2.CV_32S)
        return labels, int(n) - 1

    def distance_to(self, mask: Array) -> Array:
        if not bool(mask.any()):
            return np.full(mask.shape, np.float32(1e9))
        dist = cv2.distanceTransform((~mask.astype(bool)).astype(np.uint8), cv2.DIST_L2, cv2.DIST_MASK_PRECISE)
        return np.asarray(dist, dtype=np.float32)

    def asnumpy(self, a: Array) -> np.ndarray:
        return np.asarray(a)

    def asarray(self, a: np.ndarray) -> Array:
        return a


def _interp(a: Array, out_h: int, out_w: int) -> int:
    h, w = a.shape[:2]
    return cv2.INTER_AREA if out_h <= h and out_w <= w else cv2.INTER_LINEAR


class XpOps:
    """The same primitives over an array module ``xp`` and its ``ndi`` (scipy.ndimage API).

    Resizing is two small matrix products (``resample_matrix`` per axis), which is exact,
    branch-free and fast on a GPU. Matrices are cached per size on the device.
    """

    def __init__(self, xp: Any, ndi: Any, device: str) -> None:
        self.xp, self.ndi, self.device = xp, ndi, device
        self._matrices: dict[tuple[int, int], Array] = {}
        self._disks: dict[int, Array] = {}  # structuring elements by radius, kept on the device
        self._structures: dict[tuple[str, int], Array] = {}

    def _matrix(self, n_in: int, n_out: int) -> Array:
        key = (n_in, n_out)
        m = self._matrices.get(key)
        if m is None:
            if len(self._matrices) > 256:
                self._matrices.clear()
            m = self._matrices[key] = self.xp.asarray(resample_matrix(n_in, n_out))
        return m

    def _resize(self, a: Array, out_h: int, out_w: int) -> Array:
        xp = self.xp
        h, w = a.shape[:2]
        ry, rx = self._matrix(h, out_h), self._matrix(w, out_w)
        a = a.astype(xp.float32, copy=False)
        if a.ndim == 2:
            return ry @ a @ rx.T
        rows = xp.tensordot(ry, a, axes=(1, 0))  # (out_h, W, C)
        out = xp.tensordot(rows, rx, axes=((1,), (1,)))  # (out_h, C, out_w)
        return xp.ascontiguousarray(out.transpose(0, 2, 1))

    def resize_image(self, img: Array, out_h: int, out_w: int) -> Array:
        return self._resize(img, out_h, out_w)

    def resize_map(self, a: Array, out_h: int, out_w: int) -> Array:
        return self._resize(a, out_h, out_w)

    def resize_u8(self, a: Array, out_h: int, out_w: int) -> Array:
        xp = self.xp
        return xp.clip(xp.rint(self._resize(a, out_h, out_w)), 0, 255).astype(xp.uint8)

    def zero_below(self, a: Array, level: int) -> Array:
        a[a < level] = 0
        return a

    def erode(self, mask: Array, radius: int) -> Array:
        if radius <= 0:
            return mask
        structure = self._disks.get(radius)
        if structure is None:  # one host-to-device copy per radius, not per call
            structure = self._disks[radius] = self.xp.asarray(disk(radius).astype(bool))
        return self.ndi.binary_erosion(mask, structure=structure, border_value=1)

    def blur(self, a: Array, sigma: float) -> Array:
        return self.ndi.gaussian_filter(a.astype(self.xp.float32, copy=False), sigma, mode="mirror", truncate=4.0)

    def keep_large_components(self, mask: Array, min_fraction: float) -> Array:
        xp = self.xp
        if min_fraction <= 0:
            return mask
        labels, n = self.ndi.label(mask, structure=xp.ones((3, 3), dtype=bool))
        if int(n) <= 1:
            return mask
        areas = xp.bincount(labels.ravel())
        areas[0] = 0
        keep = areas >= min_fraction * areas.max()
        keep[0] = False
        return keep[labels]

    def label(self, mask: Array, connectivity: int) -> tuple[Array, int]:
        xp = self.xp
        structure = xp.ones((3, 3), dtype=bool) if connectivity == 8 else xp.asarray(
            np.array([[0, 1, 0], [1, 1, 1], [0, 1, 0]], bool))
        labels, n = self.ndi.label(mask, structure=structure)
        return labels.astype(xp.int32), int(n)

    def distance_to(self, mask: Array) -> Array:
        xp = self.xp
        if not bool(mask.any()):
            return xp.full(mask.shape, xp.float32(1e9))
        return self.ndi.distance_transform_edt(~mask.astype(bool)).astype(xp.float32)

    # -- stacks: ``(B, H, W)`` maps or masks of images of one size, each slice as the 2-D call --
    def resize_maps(self, a: Array, out_h: int, out_w: int) -> Array:
        """:meth:`resize_map` of each slice of ``(B, H, W)`` float32, in two batched products."""
        ry, rx = self._matrix(a.shape[1], out_h), self._matrix(a.shape[2], out_w)
        return ry @ a.astype(self.xp.float32, copy=False) @ rx.T

    def blur_maps(self, a: Array, sigma: float) -> Array:
        """:meth:`blur` of each slice (no smoothing across the stack: sigma 0 on its axis)."""
        return self.ndi.gaussian_filter(a.astype(self.xp.float32, copy=False), (0.0, sigma, sigma),
                                        mode="mirror", truncate=4.0)

    def erode_masks(self, mask: Array, radius: int) -> Array:
        """:meth:`erode` of each slice (a one-plane structuring element)."""
        if radius <= 0:
            return mask
        key = -radius  # stacked disks cached beside the 2-D ones
        structure = self._disks.get(key)
        if structure is None:
            structure = self._disks[key] = self.xp.asarray(disk(radius).astype(bool)[None])
        return self.ndi.binary_erosion(mask, structure=structure, border_value=1)

    def label_masks(self, mask: Array, connectivity: int) -> tuple[Array, int]:
        """:meth:`label` of each slice in one call: no component crosses slices; numbers are
        unique across the stack (1..n in all), 0 outside the masks."""
        xp = self.xp
        key = ("label", connectivity)
        structure = self._structures.get(key)
        if structure is None:
            plane = np.ones((3, 3), bool) if connectivity == 8 else np.array([[0, 1, 0], [1, 1, 1], [0, 1, 0]], bool)
            cube = np.zeros((3, 3, 3), bool)
            cube[1] = plane
            structure = self._structures[key] = xp.asarray(cube)
        labels, n = self.ndi.label(mask, structure=structure)
        return labels.astype(xp.int32), int(n)

    def box_means(self, a: Array, radius: int) -> Array:
        """Box mean (``(2 r + 1)`` square, borders reflected) of each slice of ``(B, H, W[, C])``
        float32, as :func:`gpu_kernels.retouch.matting.box_blur` of each: on the device one
        ``uniform_filter`` with size 1 on the stack's and the channels' axes."""
        if radius <= 0:
            return a
        if self.xp is np:  # the per-image code's own filter (OpenCV) slice by slice: the same bits
            from gpu_kernels.retouch.matting import box_blur

            return np.stack([box_blur(np, np.ascontiguousarray(x), radius) for x in a])
        k = 2 * radius + 1
        size = (1, k, k) + ((1,) if a.ndim == 4 else ())
        return self.ndi.uniform_filter(self.xp.ascontiguousarray(a), size=size, mode="reflect")

    def asnumpy(self, a: Array) -> np.ndarray:
        if self.xp is np:
            return np.asarray(a)
        return self.xp.asnumpy(a)  # type: ignore[no-any-return]

    def asarray(self, a: np.ndarray) -> Array:
        return self.xp.asarray(a)


def cupy_ops() -> XpOps:
    """The GPU backend: CuPy + ``cupyx.scipy.ndimage`` on the current device (imported lazily)."""
    import cupy
    import cupyx.scipy.ndimage as ndi

    return XpOps(cupy, ndi, "gpu")


def numpy_xp_ops() -> XpOps:
    """The GPU code path over NumPy + ``scipy.ndimage``: for testing that path on a CPU."""
    import scipy.ndimage as ndi

    return XpOps(np, ndi, "cpu")
