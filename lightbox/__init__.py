"""lightbox: the ``lightbox`` command and the tools that sit on top of the pipeline (demo, samples,
report, contact sheet, local Kafka launcher). The pipeline itself lives in ``gpu_kernels``,
``agents``, ``streams`` and ``schemas``."""

from importlib import metadata

try:
    __version__ = metadata.version("lightbox")
except metadata.PackageNotFoundError:  # running from a checkout without an install
    __version__ = "0+unknown"

__all__ = ["__version__"]
