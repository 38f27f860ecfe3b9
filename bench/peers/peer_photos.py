"""The photo set of the peer benchmark: scikit-image's photographs in three size classes and
mixed formats, made deterministically (same bytes on every run with the same libraries).

Size classes: ``small`` (<= 0.5 MP), ``mid`` (0.5-3 MP), ``large`` (3-24 MP). Each photo is
scaled (Lanczos) to a target pixel count of its class, and written in one of the formats
ordinary shops upload: baseline JPEG, progressive JPEG, CMYK JPEG, PNG and WebP, in turn.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from PIL import Image

__all__ = ["CLASSES", "FORMATS", "PhotoSpec", "assemble", "photo_specs"]

# photographs of things (not the star field: a sky of specks has no subject to cut out)
PHOTOS = ("coffee", "chelsea", "astronaut", "rocket", "camera", "clock", "coins", "immunohistochemistry", "retina")
FORMATS = ("jpeg", "progressive", "cmyk", "png", "webp")
CLASSES: dict[str, tuple[float, ...]] = {  # target megapixels per photo, in turn
    "small": (0.12, 0.2, 0.3, 0.45, 0.16, 0.25, 0.35, 0.48),
    "mid": (0.6, 1.0, 1.6, 2.4, 0.8, 1.2, 2.0, 2.8),
    "large": (3.5, 6.0, 9.0, 12.0),
}
QUICK = {"small": 3, "mid": 3, "large": 1}


@dataclass(frozen=True, slots=True)
class PhotoSpec:
    name: str  # file stem
    photo: str  # the scikit-image photograph
    size_class: str
    fmt: str
    width: int
    height: int

    @property
    def suffix(self) -> str:
        return {"png": ".png", "webp": ".webp"}.get(self.fmt, ".jpg")


def _photo(name: str) -> np.ndarray:
    import skimage.data

    a = getattr(skimage.data, name)()
    if a.ndim == 2:
        a = np.dstack([a] * 3)
    return np.ascontiguousarray(a[..., :3])


def photo_specs(quick: bool = False) -> list[PhotoSpec]:
    specs = []
    for k, (cls, targets) in enumerate(CLASSES.items()):
        for j, mp in enumerate(targets[: QUICK[cls]] if quick else targets):
            photo = PHOTOS[(k * 3 + j) % len(PHOTOS)]
            h, w = _photo(photo).shape[:2]
            s = (mp * 1e6 / (h * w)) ** 0.5
            specs.append(PhotoSpec(f"{cls}-{j:02d}-{photo}", photo, cls, FORMATS[(k + j) % len(FORMATS)],
                                   max(1, round(w * s)), max(1, round(h * s))))
    return specs


def _write(img: Image.Image, spec: PhotoSpec, path: Path) -> None:
    if spec.fmt == "jpeg":
        img.save(path, "JPEG", quality=90)
    elif spec.fmt == "progressive":
        img.save(path, "JPEG", quality=90, progressive=True, optimize=True)
    elif spec.fmt == "cmyk":
        img.convert("CMYK").save(path, "JPEG", quality=92)
    elif spec.fmt == "png":
        img.save(path, "PNG", compress_level=6)
    else:
        img.save(path, "WEBP", quality=90, method=4)


def assemble(root: Path, quick: bool = False) -> dict[str, list[Path]]:
    """Write the set under ``root/<class>/`` (kept when already there and complete); returns the
    files per size class. ``root/manifest.json`` records each photo's spec."""
    specs = photo_specs(quick)
    manifest = root / "manifest.json"
    wanted = [asdict(s) for s in specs]
    out: dict[str, list[Path]] = {c: [] for c in CLASSES}
    paths = [root / s.size_class / f"{s.name}{s.suffix}" for s in specs]
    fresh = manifest.is_file() and json.loads(manifest.read_text()) == wanted and all(p.is_file() for p in paths)
    for spec, path in zip(specs, paths, strict=True):
        if not fresh:
            path.parent.mkdir(parents=True, exist_ok=True)
            img = Image.fromarray(_photo(spec.photo)).resize((spec.width, spec.height), Image.Resampling.LANCZOS)
            _write(img, spec, path)
        out[spec.size_class].append(path)
    if not fresh:
        manifest.write_text(json.dumps(wanted, indent=1))
    return {c: v for c, v in out.items() if v}
