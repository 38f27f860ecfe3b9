"""Per-partition contiguous watermarks: which consumed inputs may be acknowledged (committed).

Pure: no asyncio, no Kafka. The runner ``submit``\\ s every input it is handed, in the order the
consumer hands them (per partition that is offset order), and calls ``done`` when the input's
output (processed event or dead letter) is acknowledged by the brokers, in any order. ``done``
returns the tickets that just became committable: the contiguous run of done tickets at the head
of the partition's queue, in offset order. So an input is released only when it and every lower
offset the worker was handed are done — as Kafka Connect's ``SubmittedRecords`` does: one deque
per partition in submission order; the committable offset is the head's contiguous done prefix.

Offsets that were never handed (transaction markers, compacted records) are not waited for: the
queue holds what was handed, nothing else.

Generations: ``revoke`` drops a partition's queue (its partitions went to another worker, or the
consumer rewound). Tickets of the dropped queue become stale: ``done`` on one releases nothing,
so work that was in flight for a revoked partition never acknowledges into a later assignment.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

__all__ = ["OffsetRewound", "Ticket", "Watermarks"]

T = TypeVar("T")


class OffsetRewound(ValueError):
    """An offset at or below one already submitted for the partition in this generation."""


@dataclass(eq=False, slots=True)
class Ticket(Generic[T]):
    """One handed input: its partition key, offset, generation and the caller's token."""

    key: Hashable
    offset: int
    epoch: int
    token: T
    done: bool = False


@dataclass(slots=True)
class _Partition(Generic[T]):
    epoch: int
    queue: deque[Ticket[T]] = field(default_factory=deque)
    last_submitted: int | None = None
    next_offset: int | None = None  # last released offset + 1: the committable position


class Watermarks(Generic[T]):
    """Contiguous per-partition acknowledgement; see the module docstring."""

    def __init__(self) -> None:
        self._parts: dict[Hashable, _Partition[T]] = {}
        self._epochs: dict[Hashable, int] = {}  # survives revoke, so generations never repeat
        self._pending = 0

    @property
    def pending(self) -> int:
        """Tickets submitted in current generations and not yet released (done or not)."""
        return self._pending

    def submit(self, key: Hashable, offset: int, token: T) -> Ticket[T]:
        """Register a handed input. Offsets must rise within a generation (else :class:`OffsetRewound`)."""
        part = self._parts.get(key)
        if part is None:
            part = self._parts[key] = _Partition(self._epochs.get(key, 0))
        if part.last_submitted is not None and offset <= part.last_submitted:
            raise OffsetRewound(f"partition {key!r}: offset {offset} submitted after {part.last_submitted}")
        ticket = Ticket(key, offset, part.epoch, token)
        part.queue.append(ticket)
        part.last_submitted = offset
        self._pending += 1
        return ticket

    def is_current(self, ticket: Ticket[T]) -> bool:
        """False once the ticket's partition was revoked after it was submitted."""
        part = self._parts.get(ticket.key)
        return part is not None and part.epoch == ticket.epoch

    def done(self, ticket: Ticket[T]) -> list[Ticket[T]]:
        """Mark ``ticket`` done; return the tickets now releasable, in offset order ([] if stale)."""
        if not self.is_current(ticket):
            return []
        if ticket.done:
            raise ValueError(f"partition {ticket.key!r}: offset {ticket.offset} marked done twice")
        ticket.done = True
        part = self._parts[ticket.key]
        released: list[Ticket[T]] = []
        while part.queue and part.queue[0].done:
            released.append(part.queue.popleft())
        if released:
            part.next_offset = released[-1].offset + 1
            self._pending -= len(released)
        return released

    def revoke(self, keys: Iterable[Hashable]) -> list[Ticket[T]]:
        """Drop these partitions' queues. Returns the dropped tickets that were already done
        (their work is over); the others become stale and release nothing when done."""
        dropped: list[Ticket[T]] = []
        for key in keys:
            part = self._parts.pop(key, None)
            if part is None:
                continue
            self._epochs[key] = part.epoch + 1
            self._pending -= len(part.queue)
            dropped.extend(t for t in part.queue if t.done)
        return dropped

    def committable(self) -> dict[Hashable, int]:
        """Per partition, the offset a commit may name: the last released offset + 1."""
        return {k: p.next_offset for k, p in self._parts.items() if p.next_offset is not None}

    def lowest_unreleased(self, key: Hashable) -> int | None:
        """The head of the partition's queue: the lowest handed offset not yet released."""
        part = self._parts.get(key)
        return part.queue[0].offset if part is not None and part.queue else None

    def keys(self) -> list[Hashable]:
        return list(self._parts)
