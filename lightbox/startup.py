"""Garbage collection while the ``lightbox`` command starts.

Importing the CLI (typer, rich, pydantic-settings) and a command's pipeline (NumPy, OpenCV, the
model runtime, lightbox's own modules) makes a few hundred thousand container objects that all
live as long as the process. With Python's default thresholds (a young collection every 700
allocations, an older one every 10 of those) the interpreter walks them ~150 times before a
one-photo ``lightbox process`` reaches its image, finding nothing to free. :func:`hold` raises
the thresholds for the start (cycles are still collected, rarely); :func:`settle`, once the
command's long-lived objects exist, freezes them (later collections skip them) and puts the
thresholds back as they were.
"""

from __future__ import annotations

import gc

__all__ = ["START_THRESHOLDS", "hold", "settle"]

START_THRESHOLDS = (100_000, 50, 100)  # young, middle, old: a young pass per 100k allocations
_saved: tuple[int, int, int] | None = None


def hold() -> None:
    """Raise the collection thresholds for the start (once; a second call keeps the first's)."""
    global _saved
    if _saved is None:
        _saved = gc.get_threshold()
        gc.set_threshold(*START_THRESHOLDS)


def settle() -> None:
    """The start is over: freeze what exists and restore the thresholds :func:`hold` found."""
    global _saved
    gc.freeze()
    if _saved is not None:
        gc.set_threshold(*_saved)
        _saved = None
