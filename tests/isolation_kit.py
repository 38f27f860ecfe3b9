"""Shared by the isolation tests: small real photos, a poison stage, a worker that runs it.

The poison stage stands for a kernel bug that one image triggers (as OpenCV's ``-209`` on a 1x1
alpha band did): a device-lane stage whose call raises a plain exception over the whole call as
soon as the call holds an image of the poison size. Everything else is the real stage list.
"""

from __future__ import annotations

import io
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # as lightbox.cli does, before NumPy

import numpy as np
from PIL import Image

from gpu_kernels.stages.base import BatchContext, Stage

POISON_WIDTH = 61  # a decoded image this wide makes PoisonStage's call raise
PRESETS_TOML = """\
[iso_small]
width = 96
height = 96
format = "jpeg"
quality = 80
fill = 0.8
"""


def photo(seed: int, width: int = 80, height: int = 60) -> bytes:
    """A small JPEG cut from one of scikit-image's photographs (different crop per seed)."""
    import skimage.data

    src = np.asarray(getattr(skimage.data, "astronaut" if seed % 2 else "coffee")())
    y, x = (seed * 37) % (src.shape[0] - 200), (seed * 53) % (src.shape[1] - 200)
    im = Image.fromarray(np.ascontiguousarray(src[y:y + 200, x:x + 260])).resize((width, height))
    buf = io.BytesIO()
    im.save(buf, "JPEG", quality=85)
    return buf.getvalue()


def poison(seed: int = 0) -> bytes:
    return photo(seed, POISON_WIDTH, 47)


class PoisonStage(Stage):
    """Raises ``ValueError`` over its whole call when the call holds a poison-size image."""

    name = "poison"
    lane = "device"

    def apply(self, ctx: BatchContext, idx: list[int]) -> Sequence[object]:
        if any(ctx.images[i].shape[1] == POISON_WIDTH for i in idx):
            raise ValueError(f"poisoned call over {len(idx)} images")
        return [None] * len(idx)

    def keep(self, ctx: BatchContext, i: int, value: Any) -> None:
        ctx.memo["poison", i] = True


def run_worker_with_poison_stage(argv: Sequence[str]) -> int:
    """``lightbox worker`` with :class:`PoisonStage` right after decode in its stage list."""
    from gpu_kernels import pipeline

    real = pipeline.default_stages

    def with_poison(*args: Any, **kwargs: Any) -> list[Stage]:
        stages = real(*args, **kwargs)
        stages.insert(1, PoisonStage())
        return stages

    pipeline.default_stages = with_poison
    from lightbox.cli import main

    sys.argv = ["lightbox", *argv]
    main()
    return 0


def write_presets(root: Path) -> Path:
    path = root / "presets.toml"
    path.write_text(PRESETS_TOML)
    return path


if __name__ == "__main__":
    sys.exit(run_worker_with_poison_stage(sys.argv[1:]))
