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
        assert set(result["by_stage"]) == {"segment.refine", "correct.decontaminate", "quality+compliance"}
        assert all(s["array_calls_per_image"] > 0 for s in result["by_stage"].values())
    # the same host reads for one image as for six (three sizes among them): one stack per size
    assert one["host_syncs_per_batch"] == two["host_syncs_per_batch"] == six["host_syncs_per_batch"] <= 5
    assert six["array_calls_per_image"] < two["array_calls_per_image"] / 2
    assert six["refined_alone"] == 0


@pytest.mark.slow
def test_goal_at_most_50_array_calls_per_image_and_5_host_syncs_per_batch() -> None:
    """The bench's own setting (``python3 bench/gpu/host_work.py``): 25.8 calls per image, 5 host
    reads per batch and 193 bytes copied to the host per image when counted on 2026-12-07."""
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


def test_quality_and_compliance_read_back_a_few_counts_once_per_batch() -> None:
    """The output lane's measures on device canvases: one host read for the whole batch (three
    canvas shapes, masks of two sizes, one item without a mask), a few integers per variant; the
    same measures item by item on host copies read every canvas and mask back."""
    from gpu_kernels.stages.measure import device_counts, host_counts

    xp, _ndi = counted_modules()
    rng = np.random.default_rng(5)
    canvases = [[rng.integers(200, 256, (h, w, c), dtype=np.uint8) for h, w, c in ((80, 80, 3), (40, 40, 4))]
                for _ in range(5)] + [[rng.integers(200, 256, (60, 90, 3), dtype=np.uint8)]]
    masks = [rng.integers(0, 256, s, dtype=np.uint8) for s in ((50, 70), (50, 70), (30, 20), (30, 20), (50, 70))]
    host = [host_counts(m, cs) for m, cs in zip([*masks, None], canvases, strict=True)]
    TALLY.__init__()  # type: ignore[misc]
    counts = device_counts(xp, [_wrap(m) for m in masks] + [None], [[_wrap(c) for c in cs] for cs in canvases])
    assert counts == host
    assert TALLY.syncs == 1 and TALLY.sync_names["get"] == 1
    variants = sum(len(cs) for cs in canvases)
    assert TALLY.bytes_to_host <= 8 * (3 * len(canvases) + 5 * len(masks) + 6 * variants)
    assert TALLY.bytes_to_host < min(c.nbytes for cs in canvases for c in cs)
