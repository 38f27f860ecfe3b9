"""Thread helpers shared by the worker's lanes and the model runtimes: a lower CPU priority for
the calling thread, and one call on a thread of its own at the lowest priority."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

__all__ = ["in_background", "lower_thread_priority"]


def lower_thread_priority(nice: int) -> None:
    """Lower the calling thread's CPU priority by ``nice`` (Linux, where niceness is per thread;
    elsewhere, or if the OS refuses, nothing happens)."""
    if nice <= 0 or not hasattr(os, "setpriority"):
        return
    tid = threading.get_native_id()
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + nice))


def in_background(fn: Callable[..., Any], *args: Any, name: str = "background") -> Future[Any]:
    """``fn(*args)`` on a daemon thread of its own at the lowest CPU priority, so it takes only
    the cycles nothing else wants; its result (or exception) in the returned future."""
    done: Future[Any] = Future()

    def run() -> None:
        lower_thread_priority(19)
        try:
            done.set_result(fn(*args))
        except BaseException as exc:  # handed to whoever waits for the result
            done.set_exception(exc)

    threading.Thread(target=run, name=name, daemon=True).start()
    return done
