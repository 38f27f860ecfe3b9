"""Synthetic image sets with known answers, for the quality benches and tests.

- :mod:`lightbox.datasets.quality_set`: product shots drawn with their true alpha (the cut-out
  quality set, by class);
- :mod:`lightbox.datasets.hole_samples`: composites with holes and thin parts.

They build on the sample photos of :mod:`gpu_kernels.segment.samples`; no product path reads them.
"""
