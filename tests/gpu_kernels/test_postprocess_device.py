"""The device backend erodes the whole frame where the CPU erodes tile by tile near the outline:
the same mask, bit for bit (the GPU branch run over NumPy)."""

from __future__ import annotations

import cv2
import numpy as np
import scipy.ndimage as ndi

from gpu_kernels.segment.ops import XpOps, numpy_xp_ops
from gpu_kernels.segment.postprocess import erode_near_outline


def test_whole_frame_erosion_on_the_device_equals_the_tiled_one() -> None:
    mask = np.zeros((700, 900), np.uint8)
    cv2.ellipse(mask, (450, 350), (300, 250), 15.0, 0, 360, 1, -1)
    cv2.circle(mask, (120, 100), 30, 1, -1)
    hard = mask.astype(bool)
    device = XpOps(np, ndi, "gpu")
    for radius in (2, 5, 11):
        tiled = erode_near_outline(hard, radius, numpy_xp_ops())
        whole = erode_near_outline(hard, radius, device)
        assert np.array_equal(tiled, whole), radius
        assert tiled.sum() < hard.sum()  # it did erode


def test_the_device_erosion_is_one_call_and_no_host_read() -> None:
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from bench.gpu_host_work import TALLY, _wrap, counted_modules

    xp, cndi = counted_modules()
    ops = XpOps(xp, cndi, "gpu")
    mask = np.zeros((700, 900), bool)
    mask[100:600, 150:800] = True
    ops.erode(_wrap(mask), 5)  # the disk goes to the device once
    TALLY.__init__()  # type: ignore[misc]
    erode_near_outline(_wrap(mask), 5, ops)
    assert (TALLY.calls, TALLY.syncs) == (1, 0), (TALLY.by_name, TALLY.sync_names)
