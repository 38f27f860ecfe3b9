"""Test images with a known foreground: real photo content cut along a known shape.

A :class:`Composite` takes a scikit-image sample photo (coffee, chelsea, astronaut, rocket),
resizes it into a box, cuts it along a known shape (ellipse, star, bottle, hexagon) and
pastes it onto a background: ``plain``, ``gradient`` (two-colour diagonal ramp), or textured
(``brick``, ``grass``: tinted scikit-image textures). The paste mask is the ground truth.
Deterministic; needs scikit-image (a dev dependency), imported lazily.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import cv2
import numpy as np

__all__ = [
    "BACKGROUNDS",
    "OBJECTS",
    "SHAPES",
    "Composite",
    "make_background",
    "make_composite",
    "sample_catalog",
    "shape_mask",
]

Shape = Literal["ellipse", "star", "bottle", "hexagon"]
SHAPES: tuple[Shape, ...] = ("ellipse", "star", "bottle", "hexagon")
OBJECTS = ("coffee", "chelsea", "astronaut", "rocket")
BACKGROUNDS = ("plain", "gradient", "brick", "grass")


@dataclass(frozen=True, slots=True)
class Composite:
    """``image`` ``(H, W, 3)`` uint8 RGB and its true subject ``mask`` ``(H, W)`` bool."""

    name: str
    image: np.ndarray
    mask: np.ndarray
    background: str


def _photo(name: str) -> np.ndarray:
    import skimage.data

    img: np.ndarray = getattr(skimage.data, name)()
    return img[..., :3]


def shape_mask(shape: Shape, h: int, w: int) -> np.ndarray:
    """``(h, w)`` bool mask of ``shape`` filling an ``h`` x ``w`` box."""
    m = np.zeros((h, w), np.uint8)
    if shape == "ellipse":
        cv2.ellipse(m, (w // 2, h // 2), (w // 2 - 1, h // 2 - 1), 0, 0, 360, 1, -1)
    elif shape == "star":
        k = np.arange(10)
        r = np.where(k % 2 == 0, 0.5, 0.3)
        a = np.pi * k / 5 - np.pi / 2
        pts = np.stack([w / 2 + np.cos(a) * w * r, h / 2 + np.sin(a) * h * r], axis=1)
        cv2.fillPoly(m, [np.round(pts).astype(np.int32)], 1)
    elif shape == "bottle":
        cv2.rectangle(m, (int(w * 0.15), int(h * 0.35)), (int(w * 0.85), h - 1), 1, -1)
        cv2.rectangle(m, (int(w * 0.36), 0), (int(w * 0.64), int(h * 0.4)), 1, -1)
        cv2.ellipse(m, (w // 2, int(h * 0.35)), (int(w * 0.35), int(h * 0.12)), 0, 180, 360, 1, -1)
    elif shape == "hexagon":
        a = np.linspace(0, 2 * np.pi, 7)[:-1]
        pts = np.stack([w / 2 + (w / 2 - 1) * np.cos(a), h / 2 + (h / 2 - 1) * np.sin(a)], axis=1)
        cv2.fillPoly(m, [np.round(pts).astype(np.int32)], 1)
    else:
        raise ValueError(f"unknown shape {shape!r}; known: {SHAPES}")
    return m.astype(bool)


def make_background(kind: str, h: int, w: int) -> np.ndarray:
    """``(h, w, 3)`` uint8 background: plain, gradient, brick or grass."""
    if kind == "plain":
        return np.full((h, w, 3), (238, 238, 236), np.uint8)
    if kind == "gradient":
        t = (np.linspace(0, 1, h)[:, None] * 0.6 + np.linspace(0, 1, w)[None, :] * 0.4)[..., None]
        top, bottom = np.array([250.0, 246.0, 238.0]), np.array([168.0, 184.0, 212.0])
        return np.rint(top * (1 - t) + bottom * t).astype(np.uint8)
    if kind in ("brick", "grass"):
        import skimage.data

        tex = cv2.resize(getattr(skimage.data, kind)(), (w, h), interpolation=cv2.INTER_LINEAR)
        tint = np.array([200.0, 140.0, 95.0]) if kind == "brick" else np.array([120.0, 195.0, 95.0])
        textured: np.ndarray = np.clip(tex[..., None] / 255.0 * tint, 0, 255).astype(np.uint8)
        return textured
    raise ValueError(f"unknown background {kind!r}; known: {BACKGROUNDS}")


def make_composite(
    obj: str,
    shape: Shape,
    background: str,
    *,
    size: tuple[int, int] = (600, 800),
    frac: float = 0.6,
    offset: tuple[int, int] = (0, 0),
) -> Composite:
    """Photo ``obj`` cut along ``shape`` in a box of ``frac`` x the frame, centred + ``offset``."""
    h, w = size
    bh, bw = int(h * frac), int(w * frac * 0.75)
    crop = cv2.resize(_photo(obj), (bw, bh), interpolation=cv2.INTER_AREA)
    cut = shape_mask(shape, bh, bw)
    image = make_background(background, h, w)
    y0, x0 = (h - bh) // 2 + offset[0], (w - bw) // 2 + offset[1]
    if not (y0 >= 0 and y0 + bh <= h and x0 >= 0 and x0 + bw <= w):
        raise ValueError(f"composite {obj}/{shape}: box {bh}x{bw} at ({y0}, {x0}) leaves the {h}x{w} frame")
    region = image[y0 : y0 + bh, x0 : x0 + bw]
    region[cut] = crop[cut]
    mask = np.zeros((h, w), bool)
    mask[y0 : y0 + bh, x0 : x0 + bw] = cut
    return Composite(f"{obj}-{shape}-{background}", image, mask, background)


def sample_catalog() -> list[tuple[str, np.ndarray]]:
    """The sample catalog for contact sheets: the four photos, then one composite per background."""
    items = [(name, _photo(name)) for name in OBJECTS]
    for i, bg in enumerate(BACKGROUNDS):
        c = make_composite(OBJECTS[i], SHAPES[(i + 1) % len(SHAPES)], bg)
        items.append((c.name, c.image))
    return items
