"""The plain retoucher: no colour work, fit the whole image into the preset and pad with
white (or transparent). The walking skeleton's stage; kept as the ``retouch=plain`` mode."""

from __future__ import annotations

from collections.abc import Sequence

import cv2
import numpy as np

from gpu_kernels.backends import Array, RetouchOptions
from gpu_kernels.presets import Preset

__all__ = ["PlainRetoucher"]


class PlainRetoucher:
    device = "cpu"

    def correct(self, images: Sequence[Array], masks: Sequence[Array | None], options: RetouchOptions) -> list[Array]:
        return [np.asarray(im) for im in images]

    def render(self, image: Array, mask: Array | None, preset: Preset) -> Array:
        img = np.asarray(image)
        if img.ndim == 2:
            img = np.repeat(img[..., None], 3, axis=2)
        channels = 4 if preset.background == "transparent" else 3
        if img.shape[2] != channels:
            img = cv2.cvtColor(img, cv2.COLOR_RGB2RGBA if channels == 4 else cv2.COLOR_RGBA2RGB)
        h, w = img.shape[:2]
        scale = min(preset.width / w, preset.height / h)
        nw, nh = max(1, round(w * scale)), max(1, round(h * scale))
        interp = cv2.INTER_AREA if scale < 1 else cv2.INTER_CUBIC
        small = cv2.resize(img, (nw, nh), interpolation=interp)
        canvas = np.full((preset.height, preset.width, channels), 255, np.uint8)
        if channels == 4:
            canvas[..., 3] = 0
        y, x = (preset.height - nh) // 2, (preset.width - nw) // 2
        canvas[y:y + nh, x:x + nw] = small
        return canvas
