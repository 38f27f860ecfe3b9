"""How the ``lightbox`` command starts quickly: garbage collection held back while it starts, and
the model compiled beside the pipeline's imports.

Importing the CLI (typer, rich, pydantic-settings) and a command's pipeline (NumPy, OpenCV, the
model runtime, lightbox's own modules) makes many container objects that all live as long as the
process. With Python's default thresholds (a young collection every 700 allocations, an older
one every 10 of those) the interpreter walks them again and again before a one-photo
``lightbox process`` reaches its image, finding nothing to free. :func:`hold` raises
the thresholds for the start (cycles are still collected, rarely); :func:`settle`, once the
command's long-lived objects exist, freezes them (later collections skip them) and puts the
thresholds back as they were.

:func:`load_processor` makes the model first (its runtime from the cached verdict), starts its
compilation on a thread (OpenVINO compiles from its cached blob without holding the
interpreter) and meanwhile imports and builds the rest of the pipeline; it returns once both
are done, so a model that cannot load still fails before any image is read.
"""

from __future__ import annotations

import gc
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from agents.process import BatchProcessor
    from gpu_kernels.backends import ModelSegmenter
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


def load_processor(settings: Settings, files: int) -> tuple[BatchProcessor, int]:
    """The processor ``lightbox process`` runs ``files`` files through, and its device-lane threads
    (several side by side when there is more than one file and the model runs streams, else one).
    The model is made first and compiled for the calls those threads make on a thread, while the
    rest of the pipeline is imported and built; both have ended when this returns, so a model that
    cannot load fails here, before any file. Raises what loading raises
    (:class:`~schemas.errors.LightboxError`, ``OSError``), everything made closed."""
    from concurrent.futures import Future, ThreadPoolExecutor

    from agents.segmenters import make_segmenters
    from gpu_kernels.backends import ModelSegmenter

    settings = settings.model_copy(update={"output_dir": None})
    device = settings.resolved_device()
    segmenters = make_segmenters(settings, device)
    model = segmenters[0]
    callers = 1
    compiling: Future[None] | None = None
    with ThreadPoolExecutor(1, thread_name_prefix="model-compile") as pool:
        if isinstance(model, ModelSegmenter):
            callers = max(1, model.streams) if files > 1 else 1  # ImagePipeline.side_by_side's rule
            compiling = pool.submit(_compile, model, callers)
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
    return processor, callers


def _compile(model: ModelSegmenter, callers: int) -> None:
    """``callers`` threads will call ``model`` (throughput only: ``process``); compile for them now."""
    model.set_callers(callers, lone_latency=False)
    model.prepare()
