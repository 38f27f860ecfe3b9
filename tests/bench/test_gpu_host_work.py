"""The host-work counter of the GPU branch (bench/gpu/host_work.py): it counts what a CuPy run
would launch and wait for, and it holds the goal: at batch 64 of ~1 MP photos, at most 50 array
calls per image and 5 host synchronisations per batch (counts, not timings: the same on any host)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.gpu.host_work import TALLY, _wrap, count_batch, counted_modules


def test_the_counter_counts_launches_and_host_waits() -> None:
    xp, ndi = counted_modules()
    a = _wrap(np.arange(-4, 5, dtype=np.float32))
    TALLY.__init__()  # type: ignore[misc]
    b = xp.where(a > 0, a, xp.float32(0))  # greater, where
    assert (TALLY.calls, TALLY.syncs) == (2, 0)
    n = int(b.sum())  # add.reduce, then the host reads it
    assert (TALLY.calls, TALLY.syncs, n) == (3, 1, 10)
    picked = a[a > 0]  # greater, a gather whose size the host must learn
    assert (TALLY.calls, TALLY.syncs, picked.size) == (5, 2, 4)
    _labels, count = ndi.label(_wrap(np.array([1, 0, 1], bool)))  # one call; the count comes back to the host
    assert (TALLY.calls, TALLY.syncs, count) == (6, 3, 2)


def test_the_bench_counts_each_stage_and_waits_per_batch_not_per_image() -> None:
    one, two, six = count_batch(1, 320), count_batch(2, 320), count_batch(6, 320)
    for result in (one, two, six):
        assert set(result["by_stage"]) == {"segment.refine", "correct.decontaminate"}
        assert all(s["array_calls_per_image"] > 0 for s in result["by_stage"].values())
    # the same host reads for one image as for six (three sizes among them): one stack per size
    assert one["host_syncs_per_batch"] == two["host_syncs_per_batch"] == six["host_syncs_per_batch"] <= 5
    assert six["array_calls_per_image"] < two["array_calls_per_image"] / 2
    assert six["refined_alone"] == 0


@pytest.mark.slow
def test_goal_at_most_50_array_calls_per_image_and_5_host_syncs_per_batch() -> None:
    """The bench's own setting (``python3 bench/gpu/host_work.py``): 24.0 calls per image and 4
    host reads per batch when counted on 2026-12-07."""
    result = count_batch(64, 1000)
    assert result["refined_alone"] == 0, result  # the batched path, not the per-image one
    assert result["array_calls_per_image"] <= 50 and result["host_syncs_per_batch"] <= 5, result


def test_the_erosion_disk_goes_to_the_device_once_per_radius() -> None:
    from gpu_kernels.segment.ops import XpOps, numpy_xp_ops

    xp, ndi = counted_modules()
    ops = XpOps(xp, ndi, "gpu")
    mask = _wrap(np.pad(np.ones((20, 20), bool), 5))
    ops.erode(mask, 3)
    TALLY.__init__()  # type: ignore[misc]
    out = ops.erode(mask, 3)
    assert TALLY.by_name.get("asarray", 0) == 0 and TALLY.calls == 1  # the erosion alone
    np.testing.assert_array_equal(np.asarray(out), numpy_xp_ops().erode(np.asarray(mask), 3))
