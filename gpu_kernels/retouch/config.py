"""The retouch configuration: one frozen dataclass per stage, gathered in :class:`RetouchConfig`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from gpu_kernels.retouch.color import ExposureConfig, WhiteBalanceConfig
from gpu_kernels.retouch.geometry import GeometryConfig
from gpu_kernels.retouch.illumination import RetinexConfig

__all__ = ["RetouchConfig"]


@dataclass(frozen=True, slots=True)
class RetouchConfig:
    """Everything both backends need.

    ``sample``/``sample_side``: the copy on which the colour statistics (white balance clusters,
    exposure percentiles) and the Retinex gain map are computed, at most ``sample_side`` pixels
    along its longer side: ``"strided"`` one pixel per block (``image[::s, ::s]``), or ``"area"``
    block means of the whole image. Strided is the default: the statistics are percentiles and
    clusters of the *pixel* distribution, which a strided pick samples without bias, while block
    means pull its tails in (highlight percentiles, saturated pixels; docs/quality.md compares
    both against full resolution).

    ``tables``: apply white balance (and, without a Retinex map, the whole colour chain) through
    per-channel 256-entry tables instead of per-pixel arithmetic (same numbers).
    ``crop_to_presets``: the correct stage colours only the part of the image that some preset
    of the event will read (the union of their crop windows, plus a margin).
    ``decontaminate``: before compositing, edge pixels (0 < alpha < 255) take the subject's own
    colour (:func:`gpu_kernels.retouch.matting.decontaminate`, on the whole image, so a window
    of it is coloured as the whole would be), so no backdrop colour fringes.
    """

    white_balance: WhiteBalanceConfig = field(default_factory=WhiteBalanceConfig)
    exposure: ExposureConfig = field(default_factory=ExposureConfig)
    retinex: RetinexConfig = field(default_factory=RetinexConfig)
    geometry: GeometryConfig = field(default_factory=GeometryConfig)
    sample_side: int = 160
    sample: Literal["area", "strided"] = "strided"
    tables: bool = True
    crop_to_presets: bool = True
    decontaminate: bool = True

    def __post_init__(self) -> None:
        if self.sample_side < 8:
            raise ValueError(f"sample_side must be >= 8; got {self.sample_side}")
        if self.sample not in ("area", "strided"):
            raise ValueError(f"sample must be 'area' or 'strided'; got {self.sample!r}")
