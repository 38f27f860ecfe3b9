"""CUDA graphs per batch bucket, captured before traffic and dropped when they fail.

A captured graph replays fixed device addresses; capturing one needs a quiet device: ONNX Runtime
captures in the global capture mode, where any CUDA call another thread makes meanwhile (the
decode lane's, the output lane's) invalidates the capture. So every bucket's graph is captured at
warm-up, before the lanes start, and a live batch never captures: a bucket without a graph runs
the plain way. A bucket whose capture fails, or whose replay later raises, is demoted for good:
its error is kept, and that batch and every later one of that size run the plain way instead of
failing their images.

Used by both model runtimes (:mod:`.onnx_runner`, :mod:`.torch_runner`); the capture itself is
theirs (``build``), this table only decides which bucket runs which way.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Protocol

from gpu_kernels.array import Array

__all__ = ["GraphTable", "ReplayGraph"]


class ReplayGraph(Protocol):
    def run(self, x: Array) -> Array: ...


class GraphTable:
    """Which bucket has a captured graph; ``errors`` says why the others have none.

    ``errors_caught``: the exception types a capture or replay may raise (others propagate)."""

    def __init__(self, errors_caught: tuple[type[BaseException], ...] = (Exception,)) -> None:
        self._caught = errors_caught
        self._graphs: dict[int, ReplayGraph | None] = {}
        self.errors: dict[int, str] = {}

    @property
    def buckets(self) -> tuple[int, ...]:
        """The buckets that replay a graph, ascending."""
        return tuple(b for b, g in sorted(self._graphs.items()) if g is not None)

    def capture(self, buckets: Iterable[int], build: Callable[[int], ReplayGraph]) -> None:
        """Capture each bucket not yet tried (``build(bucket)`` captures and returns the graph);
        a bucket whose capture raises is recorded without a graph."""
        for bucket in buckets:
            if bucket in self._graphs:
                continue
            try:
                self._graphs[bucket] = build(bucket)
            except self._caught as exc:
                self._demote(bucket, "capture", exc)

    def run(self, x: Array, plain: Callable[[Array], Array]) -> Array:
        """``x`` through its bucket's graph, else ``plain(x)``. A replay that raises demotes the
        bucket and this batch runs the plain way."""
        bucket = int(x.shape[0])
        graph = self._graphs.get(bucket)
        if graph is None:
            return plain(x)
        try:
            return graph.run(x)
        except self._caught as exc:
            self._demote(bucket, "replay", exc)
            return plain(x)

    def _demote(self, bucket: int, when: str, exc: BaseException) -> None:
        self._graphs[bucket] = None
        self.errors[bucket] = f"{when}: {type(exc).__name__}: {exc}"[:300]

    def clear(self) -> None:
        self._graphs.clear()

    def __contains__(self, bucket: Any) -> bool:
        return bucket in self._graphs
