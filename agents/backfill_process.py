"""The backfill tier in a process of its own (``LIGHTBOX_BACKFILL_PROCESS``: ``auto``, the default,
means on a CPU worker on Linux).

Why: a CPU worker's lanes are Python threads of one process, and they share its interpreter lock.
In one process the backfill's decode, segment, correct and render hold the lock that live work
waits for, whatever their threads' CPU priority, and a core stays partly idle. In a process of its
own, at a lower CPU priority (``backfill_nice``) and in the kernel's idle scheduling class
(``backfill_sched_idle``, Linux), the backfill takes only what the cores leave: the kernel, not the
interpreter, puts live work first. ``bench/bench_load.py backfill`` measures both; its figures
are in docs/backfills.md.

Starvation: under SCHED_IDLE the child gets no CPU while live work takes every core. Its consumer
can then miss heartbeats and lose its backfill partitions to another worker; what it held is
redone there (at least once, same output ids). Nothing is lost; live traffic that fills every
core has no spare capacity to give anyway.

- The parent, ``lightbox worker`` (:func:`agents.worker.run_worker`), consumes only the live topic.
  It starts the child (:func:`spawn`), fail-stops if the child ends by itself (:func:`watch`), and
  on its own way out stops the child with SIGTERM and waits for it (:func:`stop`).
- The child, ``python -m agents.worker backfill-worker`` (:func:`agents.worker.run_backfill`), is
  a runner whose live tier stays empty,
  fed by the same :class:`~agents.backfill.BackfillConsumer` and group (``<group_id>.backfill``)
  as an in-process backfill tier; no Faust. It lowers its own CPU priority before it starts
  any thread (every thread inherits it), and asks the kernel for SIGTERM when the parent dies
  (Linux), so it never outlives its worker. SIGTERM or SIGINT: intake stops, in-flight work
  finishes and is committed (up to ``shutdown_timeout_s``), exit 0. A fail-stop of its runner, or
  a consumer loop that fails, exits 70.

Live work, seen from the child: the parent writes its live work (live inputs queued in it, live
records waiting in the brokers) every ``backfill_check_ms`` into a few bytes of memory the two share
(:class:`LiveSignal`), and the child's consumer pauses the backfill partitions and holds at most
``backfill_busy_in_flight`` inputs while there is some, as the tier in the worker's own process
does. What the child cannot see is the parent's device queue: a released backfill batch does not wait for a live batch
there; the CPU priority puts live first instead. Fit for a CPU worker, where the cores are the
device; a GPU worker keeps the lane in its process, where the device queue puts live first.

OpenCV's thread pool: in this mode both processes use one OpenCV thread (unless
``OPENCV_FOR_THREADS_NUM`` is set): the parallelism is the two processes. With OpenCV's default (a
thread per core) the live process's parallel loops wait for chunks queued behind the child on the
other core (docs/backfills.md has the measurement).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import mmap
import os
import signal
import struct
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from typing import Any

__all__ = ["LiveSignal", "check_port", "lower_priority", "one_opencv_thread", "spawn", "stop", "watch"]

log = logging.getLogger(__name__)

PARENT_ENV = "LIGHTBOX_BACKFILL_PARENT_PID"  # set by spawn: the worker the child belongs to
LIVE_FD_ENV = "LIGHTBOX_BACKFILL_LIVE_FD"  # set by spawn: the file descriptor of the LiveSignal
OPENCV_THREADS_ENV = "OPENCV_FOR_THREADS_NUM"  # OpenCV's own: its thread pool's size, read at import
_PR_SET_PDEATHSIG = 1


class LiveSignal:
    """The worker's live work, shared with its backfill process: ``(queued, lag)`` as two 64-bit
    integers in an anonymous shared memory file (Linux ``memfd``; a deleted temporary file
    elsewhere) that the child inherits by its descriptor. The worker writes, the child reads; a
    read during a write may pair one write's ``queued`` with the previous ``lag``, which only
    shifts a pause by one check."""

    _FORMAT = struct.Struct("=qq")

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._map = mmap.mmap(fd, self._FORMAT.size)

    @classmethod
    def create(cls) -> LiveSignal:
        """A new signal, reading ``(0, 0)``; its descriptor is inheritable (pass it with ``pass_fds``)."""
        if hasattr(os, "memfd_create"):
            fd = os.memfd_create("lightbox-live-work", 0)
        else:  # no memfd: a temporary file, already deleted
            with tempfile.TemporaryFile() as tmp:
                fd = os.dup(tmp.fileno())
        os.ftruncate(fd, cls._FORMAT.size)
        os.set_inheritable(fd, True)
        return cls(fd)

    def write(self, queued: int, lag: int) -> None:
        self._FORMAT.pack_into(self._map, 0, queued, lag)

    def read(self) -> tuple[int, int]:
        queued, lag = self._FORMAT.unpack_from(self._map, 0)
        return queued, lag

    def close(self) -> None:
        self._map.close()
        with contextlib.suppress(OSError):
            os.close(self.fd)


def check_port(port: int) -> None:
    """OSError naming the setting if the backfill process's metrics ``port`` is taken now (the worker
    asks before it joins its group, rather than fail-stop when the child cannot serve it)."""
    if not port:
        return
    import socket

    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the metrics server binds
        try:
            sock.bind(("0.0.0.0", port))
        except OSError as exc:
            raise OSError(exc.errno, f"the backfill process's metrics port {port}: {exc.strerror} (set "
                                     "LIGHTBOX_BACKFILL_METRICS_PORT to a free port, or 0 for none; by default "
                                     "it is LIGHTBOX_METRICS_PORT + 1)") from exc


def one_opencv_thread() -> None:
    """OpenCV in this process on one thread, unless ``OPENCV_FOR_THREADS_NUM`` says otherwise (see
    the module docstring)."""
    if OPENCV_THREADS_ENV not in os.environ:
        import cv2

        cv2.setNumThreads(1)


def lower_priority(nice: int, idle: bool) -> None:
    """This process's CPU priority ``nice`` lower and, with ``idle``, in the kernel's idle
    scheduling class (Linux ``SCHED_IDLE``: it runs only where no other thread wants the core, and a
    waking live thread preempts it at once); and SIGTERM when the parent dies. Call it before any
    thread starts: on Linux both are per thread, and new threads inherit the caller's."""
    if nice > 0 and hasattr(os, "nice"):
        with contextlib.suppress(OSError):
            os.nice(nice)
    if idle and hasattr(os, "SCHED_IDLE"):
        with contextlib.suppress(OSError):
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        parent = os.environ.get(PARENT_ENV, "")
        if parent.isdigit() and os.getppid() != int(parent):  # it died before we asked: stop now
            os.kill(os.getpid(), signal.SIGTERM)


def spawn(overrides: Mapping[str, Any], loglevel: str, live: LiveSignal, metrics_port: int) -> subprocess.Popen[bytes]:
    """Start the backfill child (``python -m agents.worker backfill-worker``) with this process's
    environment plus the command line's ``overrides`` (settings names), its metrics on
    ``metrics_port`` (0: off), reading the worker's live work from ``live``, on one OpenCV
    thread (unless ``OPENCV_FOR_THREADS_NUM`` is set)."""
    env = dict(os.environ)
    env.update({f"LIGHTBOX_{key.upper()}": str(value) for key, value in overrides.items()})
    env["LIGHTBOX_METRICS_PORT"] = str(metrics_port)
    env[PARENT_ENV] = str(os.getpid())
    env[LIVE_FD_ENV] = str(live.fd)
    env.setdefault(OPENCV_THREADS_ENV, "1")
    env.setdefault("OPENBLAS_NUM_THREADS", "1")  # as `lightbox` sets it for itself (before numpy starts)
    return subprocess.Popen([sys.executable, "-m", "agents.worker", "backfill-worker", "--loglevel", loglevel],
                            env=env, pass_fds=(live.fd,))


def watch(child: subprocess.Popen[bytes]) -> BaseException | None:
    """Why the worker must fail-stop: the child ended with a non-zero code. (Exit 0 is a clean stop,
    e.g. Ctrl-C reaching both processes; its partitions went back to the group.)"""
    code = child.poll()
    return None if not code else RuntimeError(f"the backfill process (pid {child.pid}) exited with {code}")


def stop(child: subprocess.Popen[bytes], timeout_s: float) -> int | None:
    """SIGTERM, then wait up to ``timeout_s`` (it drains), then kill; its exit code (None: killed)."""
    if child.poll() is None:
        child.send_signal(signal.SIGTERM)
        try:
            return child.wait(timeout_s)
        except subprocess.TimeoutExpired:
            log.error("the backfill process did not stop within %.0f s; killing it", timeout_s)
            child.kill()
            child.wait()
            return None
    return child.returncode
