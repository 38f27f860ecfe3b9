"""Bytes in and out of the pipeline: fetching source images (``blobio.fetch``) and the output store
that holds variants moved out of line (``blobio.store``).

Sits between :mod:`schemas` and :mod:`agents`: it imports ``schemas`` only, and ``gpu_kernels``
(pixel work) never imports it.
"""
