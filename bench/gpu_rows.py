"""Rows of the GPU validation run, appended to one JSON Lines file as each figure lands.

``bench/gpu_suite.sh`` sets ``GPU_SUITE_ROWS`` (the file) and ``GPU_SUITE_STEP`` (the step
running); :func:`append` then writes one line per row, flushed and synced, so a step cut off by
its time limit keeps every row it finished. Outside the suite (neither variable set) it does
nothing. ``bench/gpu_suite_report.py`` turns the file into the run's one JSON.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

__all__ = ["append"]


def append(row: dict[str, Any], *, kind: str = "row") -> None:
    """Append ``row`` (tagged with the step, ``kind`` and the time) to ``$GPU_SUITE_ROWS``."""
    path = os.environ.get("GPU_SUITE_ROWS")
    if not path:
        return
    line = {"step": os.environ.get("GPU_SUITE_STEP", "?"), "kind": kind, "t": round(time.time(), 3), **row}
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(line, default=str) + "\n")
        fh.flush()
        os.fsync(fh.fileno())
