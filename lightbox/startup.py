"""How the ``lightbox`` command starts quickly: garbage collection held back while it starts, and
the model compiled beside the pipeline's imports.

Importing the CLI (typer, rich, pydantic-settings) and a command's pipeline (NumPy, OpenCV, the
model runtime, lightbox's own modules) makes a few hundred thousand container objects that all
live as long as the process. With Python's default thresholds (a young collection every 700
allocations, an older one every 10 of those) the interpreter walks them ~150 times before a
one-photo ``lightbox process`` reaches its image, finding nothing to free. :func:`hold` raises
the thresholds for the start (cycles are still collected, rarely); :func:`settle`, once the
command's long-lived objects exist, freezes them (later collections skip them) and puts the
thresholds back as they were.

:func:`load_processor` makes the model first (its runtime from the cached verdict), starts its
compilation on a thread (OpenVINO compiles from its cached blob, ~0.2-0.3 s, without holding
the interpreter) and meanwhile imports and builds the rest of the pipeline; it returns once both
are done, so a model that cannot load still fails before any image is read.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from agents.process import BatchProcessor
    from streams.settings import Settings

__all__ = ["START_THRESHOLDS", "hold", "load_processor", "settle"]

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


def load_processor(settings: Settings, callers: Callable[[int], int]) -> BatchProcessor:
    """The pipeline's processor for ``settings``, its model compiled for ``callers(side_by_side)``
    threads (``side_by_side``: how many calls the model runs at once to good effect) as
    :func:`gpu_kernels.segment.runtime.prepare_callers` does, that compilation overlapped with
    importing and building the rest of the pipeline. Raises what building or compiling raises
    (a model file that is missing or that the runtime cannot load), after both have ended."""
    from concurrent.futures import Future, ThreadPoolExecutor

    from agents.segmenters import make_segmenters
    from gpu_kernels.segment.runtime import prepare_callers, side_by_side

    device = settings.resolved_device()
    segmenters = make_segmenters(settings, device)
    model = segmenters[0]
    compiling: Future[None] | None = None
    with ThreadPoolExecutor(1, thread_name_prefix="model-compile") as pool:
        if model is not None:
            compiling = pool.submit(prepare_callers, model, callers(side_by_side(model)), lone_latency=False)
        try:
            from agents.wiring import build_processor  # the rest of the pipeline, beside the compilation

            processor = build_processor(settings, device, segmenters=segmenters)
        except BaseException:
            if compiling is not None:
                compiling.exception()  # wait: the model is closed only once its compilation ended
            for seg in segmenters[:2]:
                if seg is not None:
                    seg.close()
            raise
    if compiling is not None and compiling.exception() is not None:
        processor.close()
        compiling.result()  # raises the compilation's error
    return processor
