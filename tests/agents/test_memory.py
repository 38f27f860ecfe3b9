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


MMAP_PROGRAM = r"""
import ctypes, ctypes.util, sys
from agents.memory import fix_mmap_threshold

applied = fix_mmap_threshold(int(sys.argv[1]))
big = bytearray(8 << 20)  # mapped (over glibc's initial 128 KiB threshold); freeing it raises the sliding one
del big
held = [bytearray(2 << 20) for _ in range(10)]  # image-sized arrays, as a batch holds them

class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                      "fsmblks", "uordblks", "fordblks", "keepcost")]

libc = ctypes.CDLL(ctypes.util.find_library("c"))
libc.mallinfo2.restype = MallInfo2
print(applied, libc.mallinfo2().hblkhd)
"""


def _mapped(threshold: int) -> tuple[bool, int]:
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", MMAP_PROGRAM, str(threshold)], cwd=root, capture_output=True,
                         text=True, check=True, env={"PYTHONPATH": str(root), "PATH": "/usr/bin"})
    applied, mapped = out.stdout.split()
    return applied == "True", int(mapped)


def test_image_sized_blocks_stay_mapped_on_their_own_with_a_fixed_threshold() -> None:
    """With the threshold fixed, image-sized blocks are mapped (and unmapped when freed) even after a
    larger block was freed; with glibc's sliding threshold they come from the arena, whose freed
    memory stays in the process."""
    applied, mapped = _mapped(1 << 20)
    assert applied and mapped >= 20 << 20, mapped
    default_applied, default_mapped = _mapped(0)
    assert not default_applied and default_mapped < 2 << 20, default_mapped
