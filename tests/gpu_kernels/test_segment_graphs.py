"""CUDA graphs per bucket: captured before traffic only, a failing bucket demoted to the plain
path. The table's logic runs here on NumPy; the capture is the one stand-in (it needs a GPU)."""

from __future__ import annotations

import numpy as np
import pytest

from gpu_kernels.segment.graphs import GraphTable


class _Graph:
    def __init__(self, bucket: int, fail_replay: bool = False) -> None:
        self.bucket, self.fail_replay, self.replays = bucket, fail_replay, 0

    def run(self, x: np.ndarray) -> np.ndarray:
        self.replays += 1
        if self.fail_replay:
            raise RuntimeError("cudaErrorStreamCaptureInvalidated")
        return x + 1.0


def _plain(x: np.ndarray) -> np.ndarray:
    return x + 1.0


def _build(failing: set[int], replay_failing: set[int] = frozenset(), built: list[int] | None = None):  # type: ignore[assignment]
    def build(bucket: int) -> _Graph:
        if built is not None:
            built.append(bucket)
        if bucket in failing:
            raise RuntimeError("capture failed: operation not permitted when stream is capturing")
        return _Graph(bucket, bucket in replay_failing)

    return build


def test_a_bucket_whose_capture_fails_runs_the_plain_way_and_says_why() -> None:
    table = GraphTable((RuntimeError,))
    table.capture([1, 2, 4], _build({2}))
    assert table.buckets == (1, 4)
    assert "capture" in table.errors[2] and "not permitted" in table.errors[2]
    out = table.run(np.zeros((2, 3)), _plain)  # the demoted bucket: same result, no error
    np.testing.assert_array_equal(out, np.ones((2, 3)))


def test_a_live_batch_never_captures() -> None:
    built: list[int] = []
    table = GraphTable((RuntimeError,))
    table.capture([1, 2], _build(set(), built=built))
    calls: list[int] = []
    table.run(np.zeros((8, 3)), lambda x: calls.append(int(x.shape[0])) or x)  # bucket 8 was not warmed up
    assert built == [1, 2] and calls == [8]
    table.capture([1, 2], _build(set(), built=built))  # already tried: not captured again
    assert built == [1, 2]


def test_a_replay_failure_demotes_the_bucket_for_good() -> None:
    table = GraphTable((RuntimeError,))
    table.capture([1, 4], _build(set(), replay_failing={4}))
    plain_calls: list[int] = []

    def plain(x: np.ndarray) -> np.ndarray:
        plain_calls.append(int(x.shape[0]))
        return x + 1.0

    for _ in range(3):  # the first batch fails over to plain; the next ones go plain directly
        np.testing.assert_array_equal(table.run(np.zeros((4, 2)), plain), np.ones((4, 2)))
    assert plain_calls == [4, 4, 4]
    assert table.buckets == (1,) and table.errors[4].startswith("replay")
    np.testing.assert_array_equal(table.run(np.zeros((1, 2)), plain), np.ones((1, 2)))
    assert plain_calls == [4, 4, 4]  # bucket 1 still replays its graph


def test_errors_outside_the_caught_types_propagate() -> None:
    table = GraphTable((RuntimeError,))
    with pytest.raises(KeyError):
        table.capture([1], lambda b: (_ for _ in ()).throw(KeyError("bug")))

