"""Synthetic product shots with known neutral objects, for white-balance tests and benchmarks.

A :class:`Scene` is a white box (the product, with a lit top, a front and a shaded side) and a
grey photograph (scikit-image's ``camera``, printed neutral) lying on a textured surface (wood
grain, green fabric, blue paper, or a plain grey backdrop), with a soft shadow, optionally under
a colour cast (a per-channel gain in linear light, as an illuminant acts), then JPEG-encoded.
The masks of the box and of the photograph are known, so the colour of pixels that are truly
neutral can be measured after any correction. Deterministic; NumPy + OpenCV (+ scikit-image for
the photograph, imported lazily).
"""

from __future__ import annotations

from dataclasses import dataclass

import cv2
import numpy as np

__all__ = ["SURFACES", "WARM_CAST", "Scene", "make_scene", "srgb_cast"]

SURFACES = ("wood", "green", "blue", "grey")
WARM_CAST = (1.0, 0.86, 0.58)  # linear-light gains of a warm (tungsten-like) light: b* ≈ +20 on white


@dataclass(frozen=True, slots=True)
class Scene:
    """``image`` ``(H, W, 3)`` uint8 RGB; ``subject`` the white box's mask (what a segmenter
    would cut out), ``box`` and ``card`` the inner (edge-free) neutral regions, all ``(H, W)`` bool."""

    name: str
    image: np.ndarray
    subject: np.ndarray
    box: np.ndarray
    card: np.ndarray


def _smooth_noise(rng: np.random.Generator, h: int, w: int, sigma: float) -> np.ndarray:
    n = np.asarray(cv2.GaussianBlur(rng.normal(0.0, 1.0, (h, w)).astype(np.float32), (0, 0), sigma))
    out: np.ndarray = n / max(float(n.std()), 1e-6)
    return out


def _surface(kind: str, h: int, w: int, rng: np.random.Generator) -> np.ndarray:
    """``(h, w, 3)`` float32 sRGB levels of a textured surface."""
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    fine = rng.normal(0.0, 1.0, (h, w)).astype(np.float32)
    if kind == "wood":
        warp = _smooth_noise(rng, h, w, 60.0) * 6.0
        grain = np.sin(2 * np.pi * (y / 23.0 + warp)) * 0.5 + 0.5
        shade = 0.72 + 0.28 * grain ** 3 + 0.04 * _smooth_noise(rng, h, w, 2.0) + 0.02 * fine
        base = np.array([168.0, 104.0, 58.0], np.float32)
    elif kind == "green":
        weave = (np.sin(2 * np.pi * x / 6.0) * np.sin(2 * np.pi * y / 6.0)) * 0.08
        shade = 0.9 + weave + 0.06 * _smooth_noise(rng, h, w, 8.0) + 0.04 * fine
        base = np.array([62.0, 150.0, 78.0], np.float32)
    elif kind == "blue":
        fibres = np.asarray(cv2.GaussianBlur(fine, (0, 0), sigmaX=6.0, sigmaY=0.8), np.float32)
        fibres = fibres * np.float32(0.12 / max(float(fibres.std()), 1e-6))
        shade = 0.9 + fibres + 0.05 * _smooth_noise(rng, h, w, 20.0) + 0.03 * fine
        base = np.array([52.0, 96.0, 182.0], np.float32)
    elif kind == "grey":
        shade = 0.97 + 0.008 * fine
        base = np.array([196.0, 196.0, 196.0], np.float32)
    else:
        raise ValueError(f"unknown surface {kind!r}; known: {SURFACES}")
    ramp = 0.92 + 0.1 * (x / w)  # the light falls off to the left
    out: np.ndarray = base * (shade * ramp)[..., None]
    return out


def _to_linear(v: np.ndarray) -> np.ndarray:
    c = v / 255.0
    out: np.ndarray = np.where(c <= 0.04045, c / 12.92, ((c + 0.055) / 1.055) ** 2.4)
    return out


def _to_srgb(lin: np.ndarray) -> np.ndarray:
    c = np.clip(lin, 0.0, 1.0)
    out: np.ndarray = 255.0 * np.where(c <= 0.0031308, c * 12.92, 1.055 * c ** (1 / 2.4) - 0.055)
    return out


def srgb_cast(image: np.ndarray, gains: tuple[float, float, float]) -> np.ndarray:
    """``image`` (uint8 RGB) under a light of linear-light per-channel ``gains``."""
    lin = _to_linear(image.astype(np.float64)) * np.asarray(gains)
    out: np.ndarray = np.rint(_to_srgb(lin)).astype(np.uint8)
    return out


def make_scene(
    surface: str, cast: tuple[float, float, float] | None = None, *, size: tuple[int, int] = (900, 1200),
    seed: int = 3, jpeg_quality: int = 90,
) -> Scene:
    """The white box and the grey photograph on ``surface`` (see the module docstring)."""
    import skimage.data

    h, w = size
    rng = np.random.default_rng(seed)
    img = _surface(surface, h, w, rng)
    # the box: front face, top face (a parallelogram) and right side, in grey levels
    fx0, fy0, fx1, fy1 = int(w * 0.22), int(h * 0.40), int(w * 0.50), int(h * 0.82)
    depth = int(h * 0.10)
    front = np.zeros((h, w), np.uint8)
    top = np.zeros((h, w), np.uint8)
    side = np.zeros((h, w), np.uint8)
    cv2.rectangle(front, (fx0, fy0), (fx1, fy1), 1, -1)
    cv2.fillPoly(top, [np.array([[fx0, fy0], [fx0 + depth, fy0 - depth], [fx1 + depth, fy0 - depth], [fx1, fy0]])], 1)
    cv2.fillPoly(side, [np.array([[fx1, fy0], [fx1 + depth, fy0 - depth], [fx1 + depth, fy1 - depth], [fx1, fy1]])], 1)
    subject = (front | top | side).astype(bool)
    # its shadow on the surface, to the lower right
    outline = np.zeros((h, w), np.float32)
    cv2.fillPoly(outline, [np.array([[fx0 + 20, fy1], [fx1 + depth + 40, fy1 - depth + 10],
                                    [fx1 + depth + 60, fy1 + 30], [fx0 + 40, fy1 + 40]])], 1.0)
    shadow = np.asarray(cv2.GaussianBlur(outline, (0, 0), 18.0))
    img *= (1.0 - 0.45 * shadow)[..., None]
    grain = rng.normal(0.0, 1.5, (h, w)).astype(np.float32)
    for face, level in ((top, 242.0), (front, 226.0), (side, 196.0)):
        sel = face.astype(bool)
        img[sel] = (level + grain[sel])[:, None]
    # the grey photograph, printed neutral, with a white border
    photo = np.asarray(skimage.data.camera())  # type: ignore[no-untyped-call]
    cam = cv2.resize(photo, (int(w * 0.24), int(w * 0.24)), interpolation=cv2.INTER_AREA)
    cy0, cx0 = int(h * 0.30), int(w * 0.64)
    ch, cw = cam.shape
    b = 10
    img[cy0 - b:cy0 + ch + b, cx0 - b:cx0 + cw + b] = 236.0
    img[cy0:cy0 + ch, cx0:cx0 + cw] = (40.0 + cam.astype(np.float32) * (180.0 / 255.0))[..., None]
    card = np.zeros((h, w), bool)
    card[cy0 - b:cy0 + ch + b, cx0 - b:cx0 + cw + b] = True
    out = np.clip(np.rint(img), 0, 255).astype(np.uint8)
    if cast is not None:
        out = srgb_cast(out, cast)
    ok, enc = cv2.imencode(".jpg", cv2.cvtColor(out, cv2.COLOR_RGB2BGR), [cv2.IMWRITE_JPEG_QUALITY, jpeg_quality])
    decoded = cv2.imdecode(enc, cv2.IMREAD_COLOR)
    if not ok or decoded is None:
        raise RuntimeError(f"scene {surface!r}: JPEG round trip failed")
    out = np.asarray(cv2.cvtColor(decoded, cv2.COLOR_BGR2RGB))
    inner = np.ones((9, 9), np.uint8)
    box = cv2.erode(subject.astype(np.uint8), inner).astype(bool)
    card_in = cv2.erode(card.astype(np.uint8), inner).astype(bool)
    name = f"{surface}" + ("" if cast is None else "-cast")
    return Scene(name, out, subject, box, card_in)
