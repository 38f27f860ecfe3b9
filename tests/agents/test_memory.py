"""The worker's cap on glibc malloc arenas (agents/memory.py): threads that allocate at once share
the capped arenas instead of making one each. Counted with glibc's own ``malloc_info`` report."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's arenas")

PROGRAM = r"""
import ctypes, ctypes.util, sys, threading
from agents.memory import cap_malloc_arenas

applied = cap_malloc_arenas(int(sys.argv[1]))
start, held = threading.Barrier(8), []

def work():
    start.wait()  # all allocate together, as the lanes do when a backlog arrives
    held.append([bytearray(100_000) for _ in range(20)])  # malloc'd, below the mmap threshold

threads = [threading.Thread(target=work) for _ in range(8)]
for t in threads:
    t.start()
for t in threads:
    t.join()
libc = ctypes.CDLL(ctypes.util.find_library("c"))
libc.fopen.restype = ctypes.c_void_p
libc.fopen.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
libc.fclose.argtypes = [ctypes.c_void_p]
fp = libc.fopen(sys.argv[2].encode(), b"w")
libc.malloc_info(0, fp)
libc.fclose(fp)
print(applied, open(sys.argv[2]).read().count("<heap nr="))
"""


def _arenas(cap: int, tmp_path: Path) -> tuple[bool, int]:
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", PROGRAM, str(cap), str(tmp_path / f"info-{cap}.xml")], cwd=root,
                         capture_output=True, text=True, check=True, env={"PYTHONPATH": str(root), "PATH": "/usr/bin"})
    applied, heaps = out.stdout.split()
    return applied == "True", int(heaps)


def test_threads_allocating_at_once_share_the_capped_arenas(tmp_path: Path) -> None:
    applied, heaps = _arenas(2, tmp_path)
    assert applied and heaps <= 2, heaps
    default_applied, default_heaps = _arenas(0, tmp_path)  # glibc's default: one arena per thread, about
    assert not default_applied and default_heaps > 2, default_heaps  # (the case exercised: without the cap, more)
