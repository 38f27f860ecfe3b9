"""lightbox: the ``lightbox`` command and the tools that sit on top of the pipeline (demo, samples,
report, contact sheet, local Kafka launcher). The pipeline itself lives in ``gpu_kernels``,
``agents``, ``streams`` and ``schemas``."""

from typing import Any

__all__ = ["__version__"]


def __getattr__(name: str) -> Any:
    """``__version__``, looked up on first use: ``importlib.metadata`` costs ~30 ms at every
    start of the command, which most commands never need."""
    if name != "__version__":
        raise AttributeError(f"module 'lightbox' has no attribute {name!r}")
    from importlib import metadata

    try:
        version = metadata.version("lightbox")
    except metadata.PackageNotFoundError:  # running from a checkout without an install
        version = "0+unknown"
    globals()["__version__"] = version
    return version
