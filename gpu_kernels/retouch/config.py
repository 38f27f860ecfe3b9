"""The retouch configuration: one frozen dataclass per stage, gathered in :class:`RetouchConfig`."""

from __future__ import annotations

from dataclasses import dataclass, field

from gpu_kernels.retouch.color import ExposureConfig, WhiteBalanceConfig
from gpu_kernels.retouch.geometry import GeometryConfig
from gpu_kernels.retouch.illumination import RetinexConfig

__all__ = ["RetouchConfig"]


@dataclass(frozen=True, slots=True)
class RetouchConfig:
    """Everything both backends need. ``sample_side``: the longer side of the strided sample on
    which colour parameters are estimated (the heavy per-pixel work never runs on it)."""

    white_balance: WhiteBalanceConfig = field(default_factory=WhiteBalanceConfig)
    exposure: ExposureConfig = field(default_factory=ExposureConfig)
    retinex: RetinexConfig = field(default_factory=RetinexConfig)
    geometry: GeometryConfig = field(default_factory=GeometryConfig)
    sample_side: int = 256

    def __post_init__(self) -> None:
        if self.sample_side < 8:
            raise ValueError(f"sample_side must be >= 8; got {self.sample_side}")
