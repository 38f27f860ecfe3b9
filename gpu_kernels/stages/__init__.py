"""The pipeline's stages, one module each (kernel + CPU twin behind the same interface), and the
framework that runs them (:mod:`.base`). The order lives in :mod:`gpu_kernels.pipeline`."""

from __future__ import annotations

from gpu_kernels.stages.base import (
    LANES,
    BatchContext,
    Compliance,
    Job,
    JobResult,
    Lane,
    Quality,
    Stage,
    Step,
    Variant,
    run_lane,
    to_host,
)

__all__ = [
    "LANES",
    "BatchContext",
    "Compliance",
    "Job",
    "JobResult",
    "Lane",
    "Quality",
    "Stage",
    "Step",
    "Variant",
    "run_lane",
    "to_host",
]
