"""A before/after contact sheet PNG: one row per image, ``before | mask | cutout on white``.

Library: :func:`write_contact_sheet`; :func:`contact_sheet_of_files` (image files and folders) and
:func:`contact_sheet_of_samples` (the scikit-image sample catalog). Command::

    lightbox contact-sheet [PATHS...] [--out sheet.png] [--segmenter model|classical]
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import cv2
import numpy as np

from gpu_kernels.backends import Segmenter
from schemas.errors import LightboxError, ProcessingFailed

__all__ = ["compose_rows", "contact_sheet_of_files", "contact_sheet_of_samples", "cutout_on_white",
           "write_contact_sheet"]

GAP = 8
BACKDROP = (224, 224, 224)


def cutout_on_white(image: np.ndarray, alpha: np.ndarray) -> np.ndarray:
    """``(H, W, 3)`` uint8: the image over pure white 255 by ``alpha`` ``(H, W)`` uint8."""
    a = alpha.astype(np.float32)[..., None] / 255.0
    out: np.ndarray = np.rint(image[..., :3].astype(np.float32) * a + 255.0 * (1.0 - a))
    return out.astype(np.uint8)


def _fit_height(img: np.ndarray, height: int) -> np.ndarray:
    h, w = img.shape[:2]
    width = max(1, round(w * height / h))
    interp = cv2.INTER_AREA if height < h else cv2.INTER_LINEAR
    return cv2.resize(np.ascontiguousarray(img), (width, height), interpolation=interp)


def compose_rows(
    images: Sequence[np.ndarray],
    masks: Sequence[np.ndarray],
    labels: Sequence[str],
    row_height: int = 240,
) -> np.ndarray:
    """The sheet as one ``(H, W, 3)`` uint8 RGB array (see module doc)."""
    rows = []
    for img, mask, label in zip(images, masks, labels, strict=True):
        rgb = np.ascontiguousarray(img[..., :3])
        panels = [rgb, np.repeat(mask[..., None], 3, axis=2), cutout_on_white(rgb, mask)]
        scaled = [_fit_height(p, row_height) for p in panels]
        gap = np.full((row_height, GAP, 3), BACKDROP, np.uint8)
        row = np.concatenate([scaled[0], gap, scaled[1], gap, scaled[2]], axis=1)
        cv2.putText(row, label, (6, 20), cv2.FONT_HERSHEY_SIMPLEX, 0.55, (0, 0, 0), 3, cv2.LINE_AA)
        cv2.putText(row, label, (6, 20), cv2.FONT_HERSHEY_SIMPLEX, 0.55, (255, 255, 255), 1, cv2.LINE_AA)
        rows.append(row)
    width = max(r.shape[1] for r in rows)
    sheet = np.full((len(rows) * (row_height + GAP) + GAP, width + 2 * GAP, 3), BACKDROP, np.uint8)
    for k, row in enumerate(rows):
        y = GAP + k * (row_height + GAP)
        sheet[y : y + row_height, GAP : GAP + row.shape[1]] = row
    return sheet


def write_contact_sheet(
    images: Sequence[np.ndarray],
    out_png: str | Path,
    *,
    segmenter: Segmenter | None = None,
    masks: Sequence[np.ndarray] | None = None,
    labels: Sequence[str] | None = None,
    row_height: int = 240,
) -> Path:
    """Write the sheet for ``images`` (``(H, W, 3|4)`` uint8 RGB(A), NumPy) to ``out_png``.

    Masks come from ``masks`` if given, else from ``segmenter``, else from the default model
    segmenter (u2netp on the CPU, fetched on first use). Returns the written path.
    """
    if not images:
        raise ProcessingFailed("contact sheet: no images", stage="contact_sheet")
    if masks is None:
        owned = segmenter is None
        if segmenter is None:
            from gpu_kernels.segment import make_segmenter

            segmenter = make_segmenter("model", "cpu")
        try:
            found = segmenter.segment_batch(list(images))
        finally:
            if owned:
                segmenter.close()
        failed = next((m for m in found if isinstance(m, LightboxError)), None)
        if failed is not None:
            raise failed
        masks = [np.asarray(m) for m in found]
    masks = [np.asarray(m) for m in masks]
    names = list(labels) if labels is not None else [f"#{i}" for i in range(len(images))]
    sheet = compose_rows(images, masks, names, row_height)
    out = Path(out_png)
    out.parent.mkdir(parents=True, exist_ok=True)
    if not cv2.imwrite(str(out), cv2.cvtColor(sheet, cv2.COLOR_RGB2BGR)):
        raise ProcessingFailed(f"contact sheet: cannot write {str(out)!r}", stage="contact_sheet")
    return out


def contact_sheet_of_files(paths: Sequence[Path], out_png: Path, *, segmenter: str = "model",
                           limit: int = 24, max_side: int = 1024) -> tuple[Path, int, list[tuple[Path, str]]]:
    """The sheet of the first ``limit`` image files under ``paths`` (files and folders), decoded at
    ``max_side`` on the CPU and segmented by ``segmenter`` ("model": u2netp, or "classical"):
    ``(the written path, its rows, [(file, why) for each file that did not decode])``. Raises
    :class:`ProcessingFailed` when no file decodes."""
    from gpu_kernels.codec import make_decoder
    from gpu_kernels.segment import make_segmenter
    from streams.producer import iter_image_files

    files = list(iter_image_files(paths))[:limit]
    with make_decoder("cpu") as decoder:
        decoded = decoder.decode_batch([f.read_bytes() for f in files], max_side=max_side)
    good = [(f, im) for f, im in zip(files, decoded, strict=True) if not isinstance(im, Exception)]
    skipped = [(f, str(im)) for f, im in zip(files, decoded, strict=True) if isinstance(im, Exception)]
    if not good:
        raise ProcessingFailed("contact sheet: no decodable images", stage="contact_sheet")
    seg = make_segmenter("model" if segmenter == "model" else "classical", "cpu")
    try:
        path = write_contact_sheet([im for _, im in good], out_png, segmenter=seg, labels=[f.name for f, _ in good])
    finally:
        seg.close()
    return path, len(good), skipped



def contact_sheet_of_samples(out_png: Path, *, segmenter: str = "model") -> tuple[Path, int]:
    """The sheet of scikit-image's sample catalog (``gpu_kernels.segment.samples``), segmented by
    ``segmenter`` ("model": u2netp, or "classical"): ``(the written path, its rows)``."""
    from gpu_kernels.segment import make_segmenter
    from gpu_kernels.segment.samples import sample_catalog

    catalog = sample_catalog()
    seg = make_segmenter("model" if segmenter == "model" else "classical", "cpu")
    try:
        path = write_contact_sheet([img for _, img in catalog], out_png, segmenter=seg,
                                   labels=[f"{name} ({segmenter})" for name, _ in catalog])
    finally:
        seg.close()
    return path, len(catalog)
