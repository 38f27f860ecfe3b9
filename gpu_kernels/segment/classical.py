"""Classical foreground segmentation for near-uniform backgrounds (no model needed).

On a working copy (longer side ``work_side``), in CIELAB:

1. Background model: a low-order polynomial colour surface ``c(x, y)`` fitted by least
   squares to a band along the image border, refitted without the worst-fitting ``trim``
   share of samples (a subject touching the border, a shadow). Degree 2 follows plain
   backgrounds, linear and radial gradients and soft vignettes.
2. Distance of every pixel to the model; threshold ``max(min_delta, noise_k * median
   border residual)`` in delta-E units.
3. Background = the below-threshold pixels *connected to the border*; everything else is
   subject (so a white label on a product on white stays subject).
4. Morphology: opening (specks, thin noise), closing (notches), islands dropped.

The binary working mask is resized to the image and goes through the shared
post-processing (threshold, inward feather, ``postprocess.py``). On the GPU the full-size
work (shrink, enlarge, post-processing) runs in CuPy; only the small working copies visit the
host, the batch's in one copy each way, and the batch's masks are refined together
(``postprocess_batch.alpha_batch``, as the model's are).
It fails on textured or cluttered backgrounds, and on subjects whose outline matches the
background colour; use the model there.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import cv2
import numpy as np

from gpu_kernels.array import Array
from gpu_kernels.segment.inputs import precut_alpha, validate_image
from gpu_kernels.segment.ops import ArrayOps, CpuOps, XpOps, cupy_ops, disk
from gpu_kernels.segment.postprocess import MaskPostprocess, alpha_from_probability, clean_cutout
from gpu_kernels.segment.postprocess_batch import alpha_batch
from schemas.errors import LightboxError, ProcessingFailed, per_item

__all__ = ["ClassicalConfig", "ClassicalSegmenter", "background_distance", "classical_foreground"]


@dataclass(frozen=True, slots=True)
class ClassicalConfig:
    """Settings of the border-colour segmenter; pixel sizes are at the working resolution."""

    work_side: int = 512  # longer side of the working copy
    border_frac: float = 0.03  # width of the sampled border band, share of the shorter side
    degree: int = 2  # polynomial degree of the background colour surface
    trim: float = 0.2  # share of worst-fitting border samples left out of the refit
    min_delta: float = 10.0  # smallest CIELAB distance that counts as subject
    noise_k: float = 4.0  # threshold = max(min_delta, noise_k * median border residual)
    open_px: int = 2
    close_px: int = 2
    min_component: float = 0.05  # drop subject islands smaller than this share of the largest

    def __post_init__(self) -> None:
        if self.work_side < 16:
            raise ValueError(f"classical segmenter: work_side must be >= 16, got {self.work_side}")
        if not 0.0 < self.border_frac < 0.5:
            raise ValueError(f"classical segmenter: border_frac must be in (0, 0.5), got {self.border_frac}")
        if not 0 <= self.degree <= 3:
            raise ValueError(f"classical segmenter: degree must be 0..3, got {self.degree}")
        if not 0.0 <= self.trim < 0.9:
            raise ValueError(f"classical segmenter: trim must be in [0, 0.9), got {self.trim}")
        if self.min_delta <= 0 or self.noise_k <= 0 or self.open_px < 0 or self.close_px < 0:
            raise ValueError("classical segmenter: min_delta and noise_k must be > 0, open_px, close_px >= 0")


def _terms(degree: int) -> list[tuple[int, int]]:
    """Exponents ``(i, j)`` of the polynomial terms x^i y^j with i + j <= degree."""
    return [(i, d - i) for d in range(degree + 1) for i in range(d + 1)]


def background_distance(rgb: np.ndarray, cfg: ClassicalConfig) -> tuple[np.ndarray, float]:
    """``(distance (h, w) float32, threshold)`` of each pixel's CIELAB colour to the border model.

    ``rgb``: ``(h, w, 3)`` float32 in [0, 255] or uint8. Coordinates are pixel centres mapped
    to [-1, 1]; the fitted surface is evaluated separably (``Y @ K @ X.T`` per channel).
    """
    h, w = rgb.shape[:2]
    lab = cv2.cvtColor(np.asarray(rgb, dtype=np.float32) / 255.0, cv2.COLOR_RGB2Lab)
    xc = (np.arange(w) + 0.5) / w * 2.0 - 1.0
    yc = (np.arange(h) + 0.5) / h * 2.0 - 1.0
    band = max(1, round(cfg.border_frac * min(h, w)))
    ring = np.zeros((h, w), dtype=bool)
    ring[:band], ring[-band:], ring[:, :band], ring[:, -band:] = True, True, True, True
    ry, rx = np.nonzero(ring)
    terms = _terms(cfg.degree)
    a = np.stack([xc[rx] ** i * yc[ry] ** j for i, j in terms], axis=1)
    b = lab[ry, rx].astype(np.float64)
    keep = np.ones(len(a), dtype=bool)
    for _ in range(2):  # fit, drop the worst `trim` share, refit
        coef = np.linalg.lstsq(a[keep], b[keep], rcond=None)[0]  # (terms, 3)
        resid = np.linalg.norm(b - a @ coef, axis=1)
        if cfg.trim <= 0:
            break
        keep = resid <= np.quantile(resid, 1.0 - cfg.trim)
    threshold = max(cfg.min_delta, cfg.noise_k * float(np.median(resid[keep])))
    powers = np.arange(cfg.degree + 1)
    ymat, xmat = yc[:, None] ** powers, xc[:, None] ** powers  # (h, d+1), (w, d+1)
    sq = np.zeros((h, w), dtype=np.float32)
    for c in range(3):
        k = np.zeros((cfg.degree + 1, cfg.degree + 1))
        for (i, j), value in zip(terms, coef[:, c], strict=True):
            k[j, i] = value
        surface = (ymat @ k @ xmat.T).astype(np.float32)
        sq += (lab[..., c] - surface) ** 2
    return np.sqrt(sq), threshold


def classical_foreground(rgb: np.ndarray, cfg: ClassicalConfig) -> np.ndarray:
    """``(h, w)`` bool subject mask of a working-size ``(h, w, 3)`` RGB image (steps 1-4)."""
    dist, threshold = background_distance(rgb, cfg)
    like_bg = (dist < threshold).astype(np.uint8)
    _, labels = cv2.connectedComponents(like_bg, connectivity=4)
    edge = np.concatenate([labels[0], labels[-1], labels[:, 0], labels[:, -1]])
    border_labels = np.unique(edge[edge > 0])
    fg = ~np.isin(labels, border_labels)
    fg_u8: np.ndarray = fg.astype(np.uint8)
    if cfg.open_px:
        fg_u8 = np.asarray(cv2.morphologyEx(fg_u8, cv2.MORPH_OPEN, disk(cfg.open_px)))
    if cfg.close_px:
        fg_u8 = np.asarray(cv2.morphologyEx(fg_u8, cv2.MORPH_CLOSE, disk(cfg.close_px)))
    out: np.ndarray = CpuOps().keep_large_components(fg_u8.astype(bool), cfg.min_component)
    return out


def _split(flat: Array, shapes: Sequence[tuple[int, ...]]) -> list[Array]:
    """``flat`` cut into consecutive arrays of ``shapes`` (views, no copy)."""
    out, at = [], 0
    for shape in shapes:
        n = int(np.prod(shape))
        out.append(flat[at:at + n].reshape(shape))
        at += n
    return out


class ClassicalSegmenter:
    """Implements :class:`gpu_kernels.backends.Segmenter` with the border-colour model.

    ``device``: "cpu" (NumPy images and masks) or "gpu" (CuPy images and masks, alias "cuda").
    """

    def __init__(
        self,
        config: ClassicalConfig | None = None,
        *,
        device: str = "cpu",
        post: MaskPostprocess | None = None,
        ops: ArrayOps | None = None,
    ) -> None:
        device = "gpu" if device in ("gpu", "cuda") else device
        if device not in ("cpu", "gpu"):
            raise ProcessingFailed(
                f"ClassicalSegmenter: device must be 'cpu' or 'gpu', got {device!r}",
                stage="segment",
            )
        self.device = device
        self.version = "classical-1"  # for the output events' model version
        self.config = config or ClassicalConfig()
        self.post = post or MaskPostprocess()
        self._ops: ArrayOps = ops or (cupy_ops() if device == "gpu" else CpuOps())

    def _work_size(self, img: Array) -> tuple[int, int]:
        h, w = img.shape[:2]
        scale = min(1.0, self.config.work_side / max(h, w))
        return max(1, round(h * scale)), max(1, round(w * scale))

    def _segment_one(self, img: Array) -> Array:
        """One image on its own (the reference :meth:`segment_batch` equals, image by image)."""
        ops = self._ops
        h, w = img.shape[:2]
        small = ops.asnumpy(ops.resize_image(img[..., :3], *self._work_size(img)))
        fg = classical_foreground(small, self.config).astype(np.float32)
        prob = ops.resize_map(ops.asarray(fg), h, w)
        return alpha_from_probability(prob, self.post, ops, img)

    def _probabilities(self, images: Sequence[Array]) -> list[Array]:
        """Each image's full-size subject map (0 or 1, float32): the working copies go to the
        host, the border-colour model runs there (OpenCV), the masks come back and are enlarged.
        On a device the working copies travel in one copy each way for the batch."""
        ops, cfg = self._ops, self.config
        smalls = [ops.resize_image(img[..., :3], *self._work_size(img)) for img in images]
        batched = isinstance(ops, XpOps) and ops.device == "gpu" and len(images) > 1
        if batched:
            flat = ops.asnumpy(ops.xp.concatenate([s.reshape(-1) for s in smalls]))  # the one read back
            hosts = _split(flat, [tuple(s.shape) for s in smalls])
        else:
            hosts = [ops.asnumpy(s) for s in smalls]
        fgs = [classical_foreground(small, cfg).astype(np.float32) for small in hosts]
        if batched:
            up = ops.asarray(np.concatenate([f.reshape(-1) for f in fgs]))
            masks = _split(up, [f.shape for f in fgs])
        else:
            masks = [ops.asarray(f) for f in fgs]
        return [ops.resize_map(m, *img.shape[:2]) for m, img in zip(masks, images, strict=True)]

    def segment_batch(self, images: Sequence[Array]) -> list[Array | LightboxError]:
        """Alpha ``(H, W)`` uint8 per image (0 background, 255 subject), same H, W as the image;
        an image of the wrong shape or dtype gets its ``ProcessingFailed`` in its place.

        The images to segment are refined together (:func:`~.postprocess_batch.alpha_batch`: on
        a device, images of one size as one stack, a few host reads per batch; elsewhere one by
        one), the same alpha as :meth:`_segment_one` gives each image alone."""
        ops = self._ops

        def prepare(item: tuple[int, Array]) -> Array | None:
            i, img = item
            validate_image(i, img)
            precut = precut_alpha(img, ops.xp)
            return clean_cutout(precut, self.post, ops) if precut is not None else None

        out: list[Array | LightboxError | None] = list(per_item(prepare, enumerate(images)))
        todo = [k for k, value in enumerate(out) if value is None]
        if todo:
            chosen = [images[k] for k in todo]
            alphas = alpha_batch(self._probabilities(chosen), chosen, self.post, ops)
            for k, alpha in zip(todo, alphas, strict=True):
                out[k] = alpha
        return [value for value in out if value is not None]

    def close(self) -> None:
        """Nothing to release."""
