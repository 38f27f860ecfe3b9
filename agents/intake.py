"""The runner's intake, one :class:`Intake` per tier (``live``, ``backfill``): how many of the
tier's inputs the worker holds and may hold, the inputs waiting for a prepare call, the prepared
jobs waiting for the batcher, and the threads its prepare and output calls run in.

Also the unit that travels through the runner (:class:`Item`: one consumed input, with its
acknowledgement ticket and tier) and the log fields that find inputs again (:func:`log_ids`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from collections import deque
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from agents.interfaces import Processor, RunnerConfig
from agents.records import InRecord, OutRecord
from agents.tiers import BACKFILL, LIVE
from agents.watermark import Ticket
from gpu_kernels.stages.base import LANES
from schemas.errors import FatalError

__all__ = ["BACKFILL", "LIVE", "RUNNER_LANES", "TIERS", "Intake", "Item", "Pair", "Sent", "log_ids",
           "lower_thread_priority", "make_intake", "prepare_each", "record_of", "tier_of"]

TIERS = (LIVE, BACKFILL)  # live first wherever both wait
RUNNER_LANES = ("prepare", *LANES)  # the runner's lanes, each with its threads: prepare, then the pipeline's


@dataclass(eq=False, slots=True)
class Item:
    """One handed input on its way through the lanes."""

    event: Any
    record: InRecord
    ticket: Ticket[Item] | None = None
    tier: str = LIVE  # or BACKFILL (agents.tiers)
    parsed: dict[str, Any] | None = None  # the decoded input event, once prepare read it
    charged: int = 0  # its decoded bytes, counted against max_in_flight_bytes from the batcher to its output


Pair = tuple[Item, Any]  # an input and its Prepared job
Sent = tuple[Item, OutRecord]


def tier_of(pairs: Sequence[Pair]) -> str:
    """A batch's tier: its first item's (a live batch with backfill riders is live)."""
    return pairs[0][0].tier if pairs else LIVE


class Intake:
    """One tier's way in (see the module docstring). ``slots`` bound the inputs held (handed and
    not yet acknowledged); ``prepare_slots`` and ``output_slots`` the tier's calls in flight in the
    thread pools named ``prepare_pool`` and ``output_pool``."""

    def __init__(self, tier: str, limit: int, prepare_slots: asyncio.Semaphore, output_slots: asyncio.Semaphore,
                 prepare_pool: str, output_pool: str) -> None:
        self.tier, self.limit = tier, limit
        self.slots = asyncio.Semaphore(limit)
        self.held = 0  # inputs taken and not yet released
        self.preparing = 0  # submitted, not yet back from a prepare call
        self.inbox: deque[Item] = deque()  # submitted, waiting for a prepare call
        self.ready = asyncio.Event()  # the inbox has something
        self.staged: deque[Pair] = deque()  # prepared, waiting to enter the batcher
        self.prepare_slots, self.output_slots = prepare_slots, output_slots
        self.prepare_pool, self.output_pool = prepare_pool, output_pool

    def free(self) -> int:
        return self.limit - self.held

    def waiting(self) -> int:
        """Inputs not yet in the batcher: in the prepare lane (fetch), or staged."""
        return self.preparing + len(self.staged)

    async def take(self) -> None:
        """One more input held; waits while the tier is full."""
        await self.slots.acquire()
        self.held += 1

    def hand(self, item: Item) -> None:
        """A taken input, to the prepare loop."""
        self.preparing += 1
        self.inbox.append(item)
        self.ready.set()

    def release(self) -> None:
        """An input's work is over (acknowledged, or its partition revoked)."""
        self.held -= 1
        self.slots.release()


def make_intake(config: RunnerConfig) -> tuple[dict[str, Intake], dict[str, ThreadPoolExecutor]]:
    """Both tiers' intakes and the thread pools of the lanes. The backfill tier shares the live
    tier's prepare and output threads, or (``backfill_threads``) has its own at a lower CPU
    priority, so its fetches, encodes and store writes take only the CPU live work leaves."""
    pools = {
        "prepare": ThreadPoolExecutor(config.prepare_threads, thread_name_prefix="lightbox-prepare"),
        "decode": ThreadPoolExecutor(1, thread_name_prefix="lightbox-decode"),
        "device": ThreadPoolExecutor(config.device_threads, thread_name_prefix="lightbox-device"),
        "output": ThreadPoolExecutor(config.output_threads, thread_name_prefix="lightbox-output"),
    }
    live_prep, live_out = asyncio.Semaphore(config.prepare_threads), asyncio.Semaphore(config.output_threads)
    live = Intake(LIVE, config.max_in_flight, live_prep, live_out, "prepare", "output")
    if config.backfill_threads <= 0:
        backfill = Intake(BACKFILL, config.backfill_in_flight, live_prep, live_out, "prepare", "output")
    else:
        for call in ("prepare", "output"):
            pools[f"backfill-{call}"] = ThreadPoolExecutor(
                config.backfill_threads, thread_name_prefix=f"lightbox-backfill-{call}",
                initializer=lower_thread_priority, initargs=(config.backfill_nice,))
        backfill = Intake(BACKFILL, config.backfill_in_flight, asyncio.Semaphore(config.backfill_threads),
                          asyncio.Semaphore(config.backfill_threads), "backfill-prepare", "backfill-output")
    return {LIVE: live, BACKFILL: backfill}, pools


def prepare_each(processor: Processor, records: list[InRecord]) -> list[Any]:
    """In a prepare thread: each record's Prepared job, dead letter, or (a broken contract) the
    exception it raised. A :class:`FatalError` stops the call (the runner fail-stops)."""
    out: list[Any] = []
    for rec in records:
        try:
            out.append(processor.prepare(rec))
        except FatalError:
            raise
        except Exception as exc:
            out.append(exc)
    return out


def lower_thread_priority(nice: int) -> None:
    """Thread initializer: lower the calling thread's CPU priority by ``nice`` (Linux, where niceness
    is per thread; elsewhere, or if the OS refuses, nothing happens)."""
    if nice <= 0 or not hasattr(os, "setpriority"):
        return
    tid = threading.get_native_id()
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + nice))


def record_of(event: Any) -> InRecord:
    """The :class:`InRecord` of a Faust event (topic, partition, offset, headers, bytes)."""
    msg = event.message
    headers = msg.headers or []
    if isinstance(headers, dict):
        headers = list(headers.items())
    return InRecord(topic=msg.topic, partition=msg.partition, offset=msg.offset,
                    value=msg.value, key=msg.key,
                    headers=[(str(k), None if v is None else bytes(v)) for k, v in headers],
                    timestamp_ms=int(msg.timestamp * 1000) if msg.timestamp else None)


def log_ids(records: Sequence[InRecord]) -> dict[str, str]:
    """Log fields that find these inputs again: ``inputs`` (topic:partition:offset) and the trace
    ids their ``traceparent`` headers carry, which their spans continue (agents/tracing.py)."""
    traces = []
    for rec in records:
        parent = next((v for k, v in rec.headers or [] if k == "traceparent" and v), None)
        parts = parent.split(b"-") if parent else []
        if len(parts) == 4 and len(parts[1]) == 32:
            traces.append(parts[1].decode("ascii", "replace"))
    out = {"inputs": ",".join(f"{r.topic}:{r.partition}:{r.offset}" for r in records)}
    if traces:
        out["trace_ids"] = ",".join(traces)
    return out
