"""How many glibc malloc arenas the worker's process may use (``LIGHTBOX_MALLOC_ARENAS``).

glibc gives each thread that allocates an arena of its own, up to eight per core, and keeps what is
freed in an arena for later. A worker's lanes run in a dozen threads (prepare, decode, device,
output, the clients'); when a backlog arrives at once — after a broker or store outage — they all
allocate together, new arenas are made, and the process's RSS rises and stays up after the
backlog is gone. Capping the arenas (``mallopt(M_ARENA_MAX)``, what ``MALLOC_ARENA_MAX`` does when
set before start) makes the threads share a few. Measured with ``bench/bench_faults.py --links
broker --faults timeout --rate 0.64`` (a 60 s blackhole, a 38-input backlog drained at the heal;
2026-12-07, a shared 2-vCPU host): the worker process's RSS rose 72 MiB over its steady value with
glibc's default arenas and about 30 MiB with 2 (28 with MALLOC_ARENA_MAX=2 in the environment, 33 with
this cap).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

__all__ = ["M_ARENA_MAX", "cap_malloc_arenas"]

M_ARENA_MAX = -8  # glibc's malloc.h


def cap_malloc_arenas(arenas: int) -> bool:
    """At most ``arenas`` malloc arenas from now on (call it before the threads start); 0 leaves
    glibc's default. Returns whether the cap is in force (False off glibc)."""
    if arenas <= 0 or not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (musl has no mallopt arenas)
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(M_ARENA_MAX, arenas))
