"""Per-stage timing spans recorded with a monotonic clock (every output event carries them)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

__all__ = ["Span", "SpanRecorder"]

Clock = Callable[[], int]  # monotonic nanoseconds


@dataclass(frozen=True, slots=True)
class Span:
    stage: str
    start_us: int  # offset from the recorder's origin
    duration_us: int
    batch_size: int
    device: str

    def as_record(self) -> dict[str, object]:
        return {"stage": self.stage, "start_us": self.start_us, "duration_us": self.duration_us,
                "batch_size": self.batch_size, "device": self.device}


class SpanRecorder:
    """Collects the spans of one item; ``origin_ns`` is when that item's processing started."""

    def __init__(self, origin_ns: int | None = None, clock: Clock = time.monotonic_ns) -> None:
        self.clock = clock
        self.origin_ns = clock() if origin_ns is None else origin_ns
        self.spans: list[Span] = []

    def add(self, stage: str, start_ns: int, end_ns: int, *, batch_size: int = 1, device: str = "cpu") -> None:
        # A stage always costs something; a clock too coarse to see it still reports 1 µs.
        self.spans.append(Span(stage, max(0, (start_ns - self.origin_ns) // 1000),
                               max(1, (end_ns - start_ns) // 1000), batch_size, device))

    @contextmanager
    def span(self, stage: str, *, batch_size: int = 1, device: str = "cpu") -> Iterator[None]:
        start = self.clock()
        try:
            yield
        finally:
            self.add(stage, start, self.clock(), batch_size=batch_size, device=device)
