"""The one array type of the kernels: ``numpy.ndarray`` on the CPU backend, ``cupy.ndarray`` on
the GPU backend. Kept as ``Any`` so that neither library is needed to type-check the other's
path; every module that handles pixels imports it from here."""

from typing import Any

__all__ = ["Array"]

Array = Any
