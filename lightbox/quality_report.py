"""A quality report PNG: per image ``before | mask | after`` thumbnails, the measures, and the
flags a seller would care about, flagged images first.

Library: :func:`assess` (one image through a segmenter and a retoucher into a preset, measured),
:func:`write_quality_report` (the PNG), :func:`quality_report_of` (both over a folder of photos, or
the sample catalog). Command::

    lightbox quality-report report.png [DIR] [--preset taobao_main] [--limit N]

Measures (from :mod:`gpu_kernels.quality`): the subject's share of the photo, its components,
holes enclosed by the mask, enclosed pure-white islands (>= 16 px) in the output, the a*/b* of
the brightest subject pixels in the output, the share of pure-white pixels on the output's border
and the subject's fill of the canvas, and its enlargement. Flags: ``holes``, ``islands``, ``fragments`` (more than one
subject component), ``tiny`` (subject under 2 % of the photo), ``upscaled`` (the subject is
enlarged more than 2x to fill the preset: soft), ``cut`` (the subject touches two or
more sides of the photo), ``cast`` (near-neutral brightest pixels, chroma 4..15, i.e. a white that
is not white), ``border`` (under 99 % pure white on the border of a white canvas).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import cv2
import numpy as np
from PIL import Image, ImageDraw

from gpu_kernels.backends import Retoucher, RetouchOptions, Segmenter
from gpu_kernels.presets import Preset, load_presets
from gpu_kernels.quality import bright_subject_cast, enclosed_white_islands

__all__ = ["Assessment", "assess", "quality_report_of", "write_quality_report"]

THUMB = 180
TEXT_W = 330
GAP = 6


@dataclass(frozen=True, slots=True)
class Assessment:
    """One image: its thumbnails' sources, measures and flags."""

    name: str
    before: np.ndarray
    mask: np.ndarray
    after: np.ndarray
    measures: dict[str, float] = field(default_factory=dict)
    flags: tuple[str, ...] = ()


def _holes(mask: np.ndarray) -> int:
    n, labels = cv2.connectedComponents((~mask).astype(np.uint8), connectivity=4)
    frame = set(np.unique(np.concatenate([labels[0], labels[-1], labels[:, 0], labels[:, -1]])).tolist())
    return len(set(range(1, n)) - frame)


def assess(name: str, image: np.ndarray, segmenter: Segmenter, retoucher: Retoucher, preset: Preset) -> Assessment:
    """Segment, correct and render ``image`` (``(H, W, 3)`` uint8, host) and measure the result."""
    alpha = np.asarray(segmenter.segment_batch([image])[0])
    corrected = retoucher.correct([image], [alpha], RetouchOptions(preset.background))[0]
    after = np.asarray(retoucher.render(corrected, alpha, preset))[..., :3]
    subject = alpha >= 128
    inverse = np.repeat((255 - alpha)[..., None], 3, axis=2)
    on_canvas = np.asarray(retoucher.render(inverse, alpha, preset))[..., 0] < 8
    coverage = float(subject.mean())
    components = cv2.connectedComponents(subject.astype(np.uint8), connectivity=8)[0] - 1
    holes = _holes(subject)
    islands = enclosed_white_islands(after, 16) if preset.background == "white" else 0
    a, b = bright_subject_cast(after, on_canvas) if on_canvas.any() else (0.0, 0.0)
    edge = np.concatenate([after[0], after[-1], after[:, 0], after[:, -1]])
    border_white = float((edge.min(axis=1) == 255).mean())
    sides = sum(bool(s.any()) for s in (subject[0], subject[-1], subject[:, 0], subject[:, -1]))
    ys, xs = np.nonzero(on_canvas)
    fill = max(float(np.ptp(ys) + 1) / after.shape[0], float(np.ptp(xs) + 1) / after.shape[1]) if ys.size else 0.0
    sy, sx = np.nonzero(subject)
    upscale = (float(max(np.ptp(ys), np.ptp(xs)) + 1) / float(max(np.ptp(sy), np.ptp(sx)) + 1)
               if ys.size and sy.size else 0.0)
    measures = {"subject %": 100 * coverage, "components": components, "holes": holes, "islands": islands,
                "a*": a, "b*": b, "border white %": 100 * border_white, "fill %": 100 * fill, "upscale": upscale}
    chroma = float(np.hypot(a, b))
    flags = tuple(f for f, bad in (
        ("holes", holes > 0), ("islands", islands > 0), ("fragments", components > 1),
        ("tiny", coverage < 0.02), ("upscaled", upscale > 2.0), ("cut", sides >= 2), ("cast", 4.0 < chroma <= 15.0),
        ("border", preset.background == "white" and border_white < 0.99)) if bad)
    return Assessment(name, image, alpha, after, measures, flags)


def _thumb(img: np.ndarray) -> np.ndarray:
    rgb = img if img.ndim == 3 else np.repeat(img[..., None], 3, axis=2)
    h, w = rgb.shape[:2]
    k = THUMB / max(h, w)
    small = cv2.resize(np.ascontiguousarray(rgb[..., :3]), (max(1, round(w * k)), max(1, round(h * k))),
                       interpolation=cv2.INTER_AREA)
    tile = np.full((THUMB, THUMB, 3), 200, np.uint8)
    y, x = (THUMB - small.shape[0]) // 2, (THUMB - small.shape[1]) // 2
    tile[y:y + small.shape[0], x:x + small.shape[1]] = small
    return tile


def write_quality_report(rows: Sequence[Assessment], path: Path | str, title: str = "") -> Path:
    """The report PNG at ``path``: one row per image, the flagged ones first (most flags first)."""
    ordered = sorted(rows, key=lambda r: (-len(r.flags), r.name))
    row_h = THUMB + GAP
    header = 28
    width = 3 * (THUMB + GAP) + TEXT_W + GAP
    sheet = Image.new("RGB", (width, header + row_h * max(1, len(ordered)) + GAP), (255, 255, 255))
    draw = ImageDraw.Draw(sheet)
    flagged = sum(1 for r in ordered if r.flags)
    draw.text((GAP, 8), f"{title}  {len(ordered)} images, {flagged} flagged    before | mask | after",
              fill=(0, 0, 0))
    for i, row in enumerate(ordered):
        y = header + i * row_h
        for j, img in enumerate((row.before, row.mask, row.after)):
            sheet.paste(Image.fromarray(_thumb(img)), (GAP + j * (THUMB + GAP), y))
        x = GAP + 3 * (THUMB + GAP)
        colour = (190, 0, 0) if row.flags else (0, 120, 0)
        draw.rectangle((x - 3, y, x - 1, y + THUMB), fill=colour)
        draw.text((x + 4, y + 2), row.name, fill=(0, 0, 0))
        draw.text((x + 4, y + 18), "FLAGS: " + (", ".join(row.flags) if row.flags else "none"), fill=colour)
        for k, (key, value) in enumerate(row.measures.items()):
            text = f"{key}: {value:.1f}" if isinstance(value, float) else f"{key}: {value}"
            draw.text((x + 4 + (k % 2) * 160, y + 40 + (k // 2) * 16), text, fill=(40, 40, 40))
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    sheet.save(out)
    return out


def _catalog(folder: Path | None, limit: int) -> list[tuple[str, np.ndarray]]:
    import tempfile

    if folder is None:
        from lightbox.samples import make_catalog

        with tempfile.TemporaryDirectory() as tmp:
            return _catalog_from(make_catalog(Path(tmp), limit), limit)
    return _catalog_from(sorted(p for p in folder.iterdir() if p.is_file()), limit)


def _catalog_from(paths: Sequence[Path], limit: int) -> list[tuple[str, np.ndarray]]:
    out = []
    for p in paths[:limit]:
        try:
            with Image.open(p) as im:
                out.append((p.name, np.asarray(im.convert("RGB"))))
        except OSError:
            continue  # not an image: the report covers what decodes
    return out



def quality_report_of(out: Path, folder: Path | None = None, *, preset: str = "taobao_main",
                      limit: int = 24) -> tuple[Path, list[Assessment]]:
    """The report of the first ``limit`` photos in ``folder`` (default: the sample catalog) through
    u2netp and the CPU retoucher into ``preset``, written to ``out``: ``(its path, the rows)``."""
    from gpu_kernels.retouch import CpuRetoucher
    from gpu_kernels.segment import make_segmenter

    target = load_presets()[preset]
    segmenter = make_segmenter("model", "cpu")
    try:
        retoucher = CpuRetoucher()
        rows = [assess(name, img, segmenter, retoucher, target) for name, img in _catalog(folder, limit)]
    finally:
        segmenter.close()
    return write_quality_report(rows, out, title=f"lightbox quality, {target.name}"), rows
