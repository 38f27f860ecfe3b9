"""gpu_kernels.threads: a call on a thread of its own at the lowest CPU priority."""

from __future__ import annotations

import os
import threading

import pytest

from gpu_kernels.threads import in_background


@pytest.mark.skipif(not hasattr(os, "setpriority"), reason="no per-thread niceness here")
def test_a_background_call_runs_on_its_own_thread_at_the_lowest_priority() -> None:
    here = threading.get_native_id()
    before = os.getpriority(os.PRIO_PROCESS, here)

    def where() -> tuple[int, str, int]:
        tid = threading.get_native_id()
        return tid, threading.current_thread().name, os.getpriority(os.PRIO_PROCESS, tid)

    tid, name, nice = in_background(where, name="compile-here").result(timeout=10)
    assert tid != here and name == "compile-here" and nice == 19
    assert os.getpriority(os.PRIO_PROCESS, here) == before  # the caller's priority is its own


def test_a_background_call_hands_its_exception_to_whoever_waits() -> None:
    def fail(what: str) -> None:
        raise ValueError(what)

    with pytest.raises(ValueError, match="no model"):
        in_background(fail, "no model").result(timeout=10)
