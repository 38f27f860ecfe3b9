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

``LIGHTBOX_MALLOC_MMAP_THRESHOLD`` fixes the size from which glibc maps a block on its own (and unmaps
it when it is freed). Unset, glibc slides that threshold up to the largest block freed so far, so after
the first images every image-sized array comes from an arena, and a drain's batches leave the arena
as large as their peak. Measured on the broker ``timeout`` cell (60 s, ``--rate 5.5``; 2026-12-07, a
shared 2-vCPU host): RSS peak / steady 1.34 with 1 MiB, 1.33 with 256 KiB, 1.46-1.53 unset; but each
mapped block costs a system call and its page faults, and the worker spent 95-104 ms of CPU per input
with 1 MiB against 65-73 ms unset (a 120-input backlog of the bench's mixed stream, alternating
rounds). A trade for a host short of memory, so it is off by default.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

__all__ = ["M_ARENA_MAX", "M_MMAP_THRESHOLD", "cap_malloc_arenas", "fix_mmap_threshold"]

M_ARENA_MAX = -8  # glibc's malloc.h
M_MMAP_THRESHOLD = -3


def _mallopt(param: int, value: int) -> bool:
    """glibc's ``mallopt(param, value)``; False off glibc or when glibc refuses."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (musl has no mallopt arenas)
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(param, value))


def cap_malloc_arenas(arenas: int) -> bool:
    """At most ``arenas`` malloc arenas from now on (call it before the threads start); 0 leaves
    glibc's default. Returns whether the cap is in force (False off glibc)."""
    return arenas > 0 and _mallopt(M_ARENA_MAX, arenas)


def fix_mmap_threshold(nbytes: int) -> bool:
    """Blocks of ``nbytes`` and more are mapped on their own and unmapped when freed, from now on;
    0 leaves glibc's sliding threshold (which rises to the largest block freed so far, up to
    32 MiB: after the first large image, every image-sized array comes from an arena and what is
    freed stays in the process). Returns whether the threshold is in force (False off glibc)."""
    return nbytes > 0 and _mallopt(M_MMAP_THRESHOLD, nbytes)
