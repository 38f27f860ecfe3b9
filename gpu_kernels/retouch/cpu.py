"""The CPU twin: :class:`CpuRetoucher` (NumPy only)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from gpu_kernels.backends import Array, RetouchOptions
from gpu_kernels.presets import Preset
from gpu_kernels.retouch.checks import alpha_source, as_pixels
from gpu_kernels.retouch.composite import Background, cutout_source
from gpu_kernels.retouch.config import RetouchConfig
from gpu_kernels.retouch.correction import (
    ColorPlan,
    correct_fused_cpu,
    correct_reference,
    plan_correction,
)
from gpu_kernels.retouch.geometry import placement, read_window, subject_box
from gpu_kernels.retouch.illumination import gaussian_matrix
from gpu_kernels.retouch.matting import decontaminate
from gpu_kernels.retouch.render import render_fused_cpu, render_reference
from schemas.errors import per_item

__all__ = ["CpuRetoucher", "Window", "effective_background"]

Window = tuple[int, int, int, int]  # x0, y0, x1, y1 (half-open) of the part of an image to colour


def effective_background(requested: Background, alpha: Array | None) -> Background:
    """White without any alpha (no mask, no RGBA) keeps the image: nothing to composite."""
    return "keep" if requested == "white" and alpha is None else requested


class CpuRetoucher:
    """Retoucher on NumPy arrays (see :class:`gpu_kernels.backends.Retoucher`).

    ``correct`` returns, per item, the corrected ``(H, W, 3|4)`` uint8 array or the
    :class:`~schemas.errors.ProcessingFailed` it failed with (bad shape/dtype): one bad image
    never fails its batch-mates. ``render`` raises ``ProcessingFailed``. Inputs are never
    modified. The alpha used is the mask, else an RGBA image's own alpha, else none.
    """

    device = "cpu"
    version = "retouch-2"  # 2: exposure from the frame's highlights, no subject-percentile stretch

    def __init__(self, config: RetouchConfig | None = None) -> None:
        self.config = config or RetouchConfig()

    def close(self) -> None:
        """Nothing to release."""

    def correct(
        self, images: Sequence[Array], masks: Sequence[Array | None], options: RetouchOptions,
        windows: Sequence[Window | None] | None = None,
    ) -> list[Array]:
        """Pass (a) per item; with ``windows`` (see :meth:`correction_window`), an item with a
        window gets only that part of the image coloured (the parameters still come from the
        whole image): ``(y1 - y0, x1 - x0, 3|4)``."""
        wins = windows if windows is not None else [None] * len(images)
        return per_item(lambda im: self.correct_one(im[0], im[1], options, im[2]),
                        zip(images, masks, wins, strict=True))

    def correction_window(self, image: Array, mask: Array | None, presets: Sequence[Preset]) -> Window | None:
        """The part of ``image`` that rendering ``presets`` will read (:func:`.geometry.read_window`),
        or None for the whole image (no mask, the option off, or nothing to leave out)."""
        if not self.config.crop_to_presets or mask is None or not presets:
            return None
        pixels, alpha = self._inputs(image, mask, "retouch.correct")
        if alpha is None:
            return None
        h, w = pixels.shape[:2]
        box = subject_box(np, alpha, h, w, self.config.geometry.mask_threshold)
        win = read_window(box, [(p.width, p.height, p.fill) for p in presets], h, w,
                          self.config.geometry.cubic_coefficients())
        return None if win == (0, 0, w, h) else win

    @staticmethod
    def _inputs(
        image: Array, mask: Array | None, stage: str
    ) -> tuple[np.ndarray, np.ndarray | None]:
        pixels = as_pixels(np.asarray(image), stage=stage)
        alpha, _ = alpha_source(None if mask is None else np.asarray(mask), pixels, stage=stage)
        return pixels, alpha

    def plan(self, image: Array, mask: Array | None, options: RetouchOptions) -> ColorPlan:
        """Pass (a)'s parameters for one image."""
        pixels, alpha = self._inputs(image, mask, "retouch.correct")
        return plan_correction(np, pixels, alpha, options.lighting, self.config, gaussian_matrix)

    def correct_one(self, image: Array, mask: Array | None, options: RetouchOptions,
                    window: Window | None = None) -> np.ndarray:
        """Pass (a) for one image (fused, in row bands), or for its ``window``; raises
        ``ProcessingFailed``."""
        pixels, alpha = self._inputs(image, mask, "retouch.correct")
        plan = plan_correction(np, pixels, alpha, options.lighting, self.config, gaussian_matrix)
        pixels = self.edge_colours(pixels, alpha, options)  # on the whole image: a window sees the same
        if window is not None:
            x0, y0, x1, y1 = window
            pixels = pixels[y0:y1, x0:x1]
            alpha = None if alpha is None else alpha[y0:y1, x0:x1]
            plan = plan.shifted(y0, x0)
        background = effective_background(options.background, alpha)
        return correct_fused_cpu(pixels, alpha, plan, background, tables=self.config.tables)

    def correct_unfused(
        self, image: Array, mask: Array | None, options: RetouchOptions
    ) -> np.ndarray:
        """The unfused chain (one full-image pass per stage); same result as :meth:`correct_one`."""
        pixels, alpha = self._inputs(image, mask, "retouch.correct")
        plan = plan_correction(np, pixels, alpha, options.lighting, self.config, gaussian_matrix)
        background = effective_background(options.background, alpha)
        pixels = self.edge_colours(pixels, alpha, options)
        return np.asarray(correct_reference(np, pixels, alpha, plan, background))

    def edge_colours(self, pixels: np.ndarray, alpha: np.ndarray | None, options: RetouchOptions) -> np.ndarray:
        """``pixels`` with the subject's own colour at its soft edge (``RetouchConfig.decontaminate``),
        when a cut-out is composited (background white or transparent, an RGB image and a mask)."""
        if (not self.config.decontaminate or alpha is None or pixels.shape[2] != 3
                or effective_background(options.background, alpha) == "keep"):
            return pixels
        out: np.ndarray = decontaminate(np, pixels, alpha)
        return out

    def placement(self, image: Array, mask: Array | None, preset: Preset) -> np.ndarray:
        """``(3,)`` float32 ``[inv_k, ox, oy]`` for ``preset`` (see :mod:`.geometry`)."""
        pixels, alpha = self._inputs(image, mask, "retouch.render")
        h, w = pixels.shape[:2]
        box = subject_box(np, alpha, h, w, self.config.geometry.mask_threshold)
        return np.asarray(placement(np, box, preset.width, preset.height, preset.fill))

    def render(self, image: Array, mask: Array | None, preset: Preset) -> np.ndarray:
        """Pass (b): ``(preset.height, preset.width, 3)`` uint8 (4 for a transparent preset)."""
        pixels, alpha = self._inputs(image, mask, "retouch.render")
        params = self.placement(image, mask, preset)
        if preset.background == "transparent":  # the subject's alpha, not an opaque white box
            pixels = cutout_source(np, pixels, alpha)
        return render_fused_cpu(pixels, params, preset.width, preset.height,
                                preset.background == "transparent", preset.sharpen,
                                self.config.geometry.cubic_coefficients())

    def render_unfused(self, image: Array, mask: Array | None, preset: Preset) -> np.ndarray:
        """The unfused chain (crop, resize, pad, sharpen, finalize); same as :meth:`render`."""
        pixels, alpha = self._inputs(image, mask, "retouch.render")
        params = self.placement(image, mask, preset)
        if preset.background == "transparent":
            pixels = cutout_source(np, pixels, alpha)
        return np.asarray(render_reference(
            np, pixels, params, preset.width, preset.height, preset.background == "transparent",
            preset.sharpen, self.config.geometry.cubic_coefficients()))

    def render_batch(
        self, images: Sequence[Array], masks: Sequence[Array | None], preset: Preset
    ) -> list[Array]:
        """:meth:`render` per item; an item's ``ProcessingFailed`` is returned in its place."""
        return per_item(lambda im: self.render(im[0], im[1], preset), zip(images, masks, strict=True))
