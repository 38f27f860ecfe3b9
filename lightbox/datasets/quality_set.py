"""A cut-out quality set with true alpha: the commonest catalog shots and the hard ones.

Every item is drawn, deterministically, as ``image = backdrop * (1 - alpha) + product * alpha``
(in sRGB levels, then JPEG-encoded like a camera's file), so its true alpha is known exactly,
soft edges and translucent parts included. Products are drawn at 4x and area-averaged down,
so their outlines are antialiased like a photo's. Classes (:data:`CLASSES`):

* ``pale``: white and cream products (a box, a cylinder, a bottle, a jar; white ones also in
  the shade, darker than the backdrop) on white, cream, beige and light-grey paper backdrops
  with a soft shadow, the commonest catalog shot;
* ``glass``: a tumbler whose body lets the backdrop through (alpha 0.35) inside an opaque rim;
* ``fur``: scikit-image's cat (``chelsea``) cut along an outline of fine strands (soft alpha);
* ``thin``: a mug's handle, a ring, a lamp on a thin pole (:mod:`.hole_samples` shapes);
* ``multi``: a pair of shoes, a jar beside its lid, a white cylinder beside a framed photo;
* ``clutter``: the product and an object of another colour entering from the frame's edge
  (not part of the truth: a cut-out should drop it).

``pale`` items also carry ``product``: the product's inner pixels (edge-free), where the colour
a cut-out shows can be compared with the input's. Needs scikit-image (photos), imported lazily.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import cv2
import numpy as np

from gpu_kernels.segment.samples import _photo
from lightbox.datasets.hole_samples import holed_shape

__all__ = ["BACKDROPS", "CLASSES", "TruthItem", "quality_set"]

CLASSES = ("pale", "glass", "fur", "thin", "multi", "clutter")
# plain paper backdrops (sRGB): the light ones a white product is most often shot on, then colours
BACKDROPS: dict[str, tuple[float, float, float]] = {
    "white": (244.0, 244.0, 242.0),
    "cream": (242.0, 230.0, 204.0),
    "beige": (226.0, 206.0, 176.0),
    "grey": (204.0, 204.0, 202.0),
    "sage": (150.0, 172.0, 140.0),
    "blue": (96.0, 134.0, 190.0),
    "wood": (168.0, 112.0, 70.0),
}
SS = 4  # supersampling of drawn shapes


@dataclass(frozen=True, slots=True)
class TruthItem:
    """``image`` ``(H, W, 3)`` uint8; ``alpha`` ``(H, W)`` float32 in [0, 1] (the truth);
    ``product`` ``(H, W)`` bool inner product pixels for colour checks (empty when not measured)."""

    name: str
    cls: str
    image: np.ndarray
    alpha: np.ndarray
    product: np.ndarray


def _backdrop(colour: tuple[float, float, float], h: int, w: int, rng: np.random.Generator) -> np.ndarray:
    """Plain paper: a gentle light fall-off, fine grain; float32 levels."""
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    fall = 1.0 - 0.05 * ((x / w - 0.6) ** 2 + (y / h - 0.3) ** 2)
    grain = rng.normal(0.0, 1.2, (h, w)).astype(np.float32)
    out: np.ndarray = np.asarray(colour, np.float32) * fall[..., None] + grain[..., None]
    return out


def _draw(h: int, w: int, draw: list[tuple[str, tuple[object, ...]]]) -> np.ndarray:
    """Antialiased coverage ``(h, w)`` float32 of shapes drawn at ``SS`` x (coordinates in the
    ``h`` x ``w`` frame): ``("rect", (x0, y0, x1, y1, value))``, ``("ellipse", (cx, cy, ax, ay, value))``,
    ``("poly", (points, value))``; value 1 adds, 0 cuts."""
    big = np.zeros((h * SS, w * SS), np.uint8)
    for kind, args in draw:
        if kind == "rect":
            x0, y0, x1, y1, v = (float(a) for a in args)  # type: ignore[arg-type]
            cv2.rectangle(big, (int(x0 * SS), int(y0 * SS)), (int(x1 * SS), int(y1 * SS)), int(v), -1)
        elif kind == "ellipse":
            cx, cy, ax, ay, v = (float(a) for a in args)  # type: ignore[arg-type]
            cv2.ellipse(big, (int(cx * SS), int(cy * SS)), (int(ax * SS), int(ay * SS)), 0, 0, 360, int(v), -1)
        else:
            pts, fill = args
            poly = np.round(np.asarray(pts, np.float64) * SS).astype(np.int32)
            cv2.fillPoly(big, [poly], int(fill))  # type: ignore[call-overload]
    small = cv2.resize(big.astype(np.float32), (w, h), interpolation=cv2.INTER_AREA)
    return np.asarray(small, np.float32)


def _shadow(cover: np.ndarray, dx: float, dy: float, strength: float) -> np.ndarray:
    """A soft cast shadow of ``cover`` (multiplier on the backdrop)."""
    m = np.array([[1, 0, dx], [0, 1, dy]], np.float32)
    moved = cv2.warpAffine(cover, m, (cover.shape[1], cover.shape[0]))
    blurred = np.asarray(cv2.GaussianBlur(moved, (0, 0), 10.0), np.float32)
    return np.asarray(1.0 - strength * blurred, np.float32)


def _shade(cover: np.ndarray, base: tuple[float, float, float], rng: np.random.Generator,
           light: float = 0.06) -> np.ndarray:
    """A matte product's colour: ``base`` lit from the left (across its bounding box), fine grain."""
    h, w = cover.shape
    _, xs = np.nonzero(cover > 0)
    x0, x1 = (int(xs.min()), int(xs.max()) + 1) if xs.size else (0, w)
    x = np.arange(w, dtype=np.float32)
    t = np.clip((x - x0) / max(1, x1 - x0), 0.0, 1.0)
    shade = (1.0 + light) - 2.0 * light * t ** 1.5
    grain = rng.normal(0.0, 1.0, (h, w)).astype(np.float32)
    return np.asarray(base, np.float32) * shade[None, :, None] + grain[..., None]


def _compose(back: np.ndarray, layers: list[tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
    """Layers ``(colour (H, W, 3), alpha (H, W))`` over ``back``, in order; float32 levels."""
    out = back.copy()
    for colour, a in layers:
        out = out * (1.0 - a[..., None]) + colour * a[..., None]
    return out


def _jpeg(levels: np.ndarray, quality: int = 92) -> np.ndarray:
    out = np.clip(np.rint(levels), 0, 255).astype(np.uint8)
    ok, enc = cv2.imencode(".jpg", cv2.cvtColor(out, cv2.COLOR_RGB2BGR), [cv2.IMWRITE_JPEG_QUALITY, quality])
    dec = cv2.imdecode(enc, cv2.IMREAD_COLOR) if ok else None
    if dec is None:
        raise RuntimeError("quality set: JPEG round trip failed")
    return np.asarray(cv2.cvtColor(dec, cv2.COLOR_BGR2RGB))


def _inner(alpha: np.ndarray, px: int = 6) -> np.ndarray:
    return np.asarray(cv2.erode((alpha >= 0.999).astype(np.uint8), np.ones((2 * px + 1, 2 * px + 1), np.uint8)),
                      bool)


def _product_shape(kind: str, h: int, w: int, cx: float, cy: float, s: float) -> np.ndarray:
    """Coverage of a simple product centred at ``(cx, cy)``, about ``s`` px tall."""
    if kind == "box":
        return _draw(h, w, [("rect", (cx - 0.35 * s, cy - 0.5 * s, cx + 0.35 * s, cy + 0.5 * s, 1))])
    if kind == "cylinder":
        return _draw(h, w, [("rect", (cx - 0.25 * s, cy - 0.42 * s, cx + 0.25 * s, cy + 0.42 * s, 1)),
                            ("ellipse", (cx, cy - 0.42 * s, 0.25 * s, 0.07 * s, 1)),
                            ("ellipse", (cx, cy + 0.42 * s, 0.25 * s, 0.07 * s, 1))])
    if kind == "bottle":
        return _draw(h, w, [("rect", (cx - 0.22 * s, cy - 0.1 * s, cx + 0.22 * s, cy + 0.5 * s, 1)),
                            ("ellipse", (cx, cy - 0.1 * s, 0.22 * s, 0.12 * s, 1)),
                            ("rect", (cx - 0.08 * s, cy - 0.5 * s, cx + 0.08 * s, cy - 0.1 * s, 1))])
    if kind == "jar":
        return _draw(h, w, [("rect", (cx - 0.33 * s, cy - 0.3 * s, cx + 0.33 * s, cy + 0.5 * s, 1)),
                            ("ellipse", (cx, cy + 0.5 * s, 0.33 * s, 0.05 * s, 1))])
    raise ValueError(f"unknown product {kind!r}")


def _pale(h: int, w: int) -> Iterator[TruthItem]:
    # cream: b* +9; shade: a white product in the shade, darker than the backdrop
    whites = {"white": (246.0, 246.0, 245.0), "cream": (242.0, 234.0, 218.0), "shade": (215.0, 215.0, 214.0)}
    combos = [(p, b, "white") for b in ("white", "cream", "beige", "grey")
              for p in ("box", "cylinder", "bottle")]
    combos += [("jar", "cream", "cream"), ("box", "beige", "cream"),
               ("box", "cream", "shade"), ("bottle", "beige", "shade")]
    for k, (prod, back, colour) in enumerate(combos):
        rng = np.random.default_rng(100 + k)
        cover = _product_shape(prod, h, w, w * 0.5, h * 0.52, h * 0.62)
        bg = _backdrop(BACKDROPS[back], h, w, rng) * _shadow(cover, 14, 10, 0.35)[..., None]
        image = _jpeg(_compose(bg, [(_shade(cover, whites[colour], rng), cover)]))
        yield TruthItem(f"pale-{colour}-{prod}-on-{back}", "pale", image, cover, _inner(cover))


def _glass(h: int, w: int) -> Iterator[TruthItem]:
    for k, back in enumerate(("white", "cream", "beige", "grey", "blue", "wood")):
        rng = np.random.default_rng(200 + k)
        cx, top, bot, half = w * 0.5, h * 0.2, h * 0.82, h * 0.2
        body = [(cx - half, top), (cx + half, top), (cx + 0.8 * half, bot), (cx - 0.8 * half, bot)]
        inner = [(cx - 0.9 * half, top + 8), (cx + 0.9 * half, top + 8), (cx + 0.72 * half, bot - 14),
                 (cx - 0.72 * half, bot - 14)]
        outer = _draw(h, w, [("poly", (body, 1))])
        hollow = _draw(h, w, [("poly", (inner, 1))])
        alpha = outer * (1.0 - 0.65 * hollow)  # rim opaque, body alpha 0.35
        colour = np.empty((h, w, 3), np.float32)
        colour[...] = (214.0, 226.0, 232.0)  # a faint blue-grey glass
        colour += rng.normal(0.0, 1.0, (h, w, 1)).astype(np.float32)
        bg = _backdrop(BACKDROPS[back], h, w, rng) * _shadow(outer, 12, 8, 0.15)[..., None]
        image = _jpeg(_compose(bg, [(colour, alpha)]))
        yield TruthItem(f"glass-tumbler-on-{back}", "glass", image, alpha, np.zeros((h, w), bool))


def _fur(h: int, w: int) -> Iterator[TruthItem]:
    cat = _photo("chelsea")
    for k, back in enumerate(("white", "cream", "grey", "sage", "blue", "beige")):
        rng = np.random.default_rng(300 + k)
        bh, bw = int(h * 0.72), int(w * 0.5)
        core = _draw(h, w, [("ellipse", (w * 0.5, h * 0.52, bw / 2 - 10, bh / 2 - 10, 1))])
        # strands: noise stretched along the outline's normal, thresholded softly in a band
        dist = cv2.distanceTransform((core < 0.5).astype(np.uint8), cv2.DIST_L2, 5)
        noise = rng.normal(0.0, 1.0, (h, w)).astype(np.float32)
        ys, xs = np.mgrid[0:h, 0:w].astype(np.float32)
        ang = np.arctan2(ys - h * 0.52, xs - w * 0.5)
        streak = np.asarray(cv2.GaussianBlur(noise, (0, 0), 1.2), np.float32)
        streak = 0.5 + 0.5 * np.sin(ang * (60 + 10 * k) + 3.0 * streak)
        reach = 14.0 * streak  # strands up to 14 px long
        strands = np.clip(1.0 - dist / np.maximum(reach, 1e-3), 0.0, 1.0) * (dist > 0)
        alpha = np.clip(np.maximum(core, strands * 0.9), 0.0, 1.0).astype(np.float32)
        fur = cv2.resize(cat, (w, h), interpolation=cv2.INTER_AREA).astype(np.float32)
        bg = _backdrop(BACKDROPS[back], h, w, rng)
        image = _jpeg(_compose(bg, [(fur, alpha)]))
        yield TruthItem(f"fur-cat-on-{back}", "fur", image, alpha, np.zeros((h, w), bool))


def _thin(h: int, w: int) -> Iterator[TruthItem]:
    combos = [("mug", "coffee", "white"), ("mug", "rocket", "beige"), ("ring", "astronaut", "grey"),
              ("ring", "coffee", "cream"), ("lamp", "rocket", "white"), ("lamp", "coffee", "sage")]
    for k, (shape, obj, back) in enumerate(combos):
        rng = np.random.default_rng(400 + k)
        bh = int(h * 0.7)
        bw = int(bh * (1.2 if shape == "mug" else 0.8))
        big = holed_shape(shape, bh * SS, bw * SS).astype(np.float32)
        cut = np.asarray(cv2.resize(big, (bw, bh), interpolation=cv2.INTER_AREA), np.float32)
        alpha = np.zeros((h, w), np.float32)
        y0, x0 = (h - bh) // 2, (w - bw) // 2
        alpha[y0:y0 + bh, x0:x0 + bw] = cut
        colour = np.zeros((h, w, 3), np.float32)
        colour[y0:y0 + bh, x0:x0 + bw] = cv2.resize(_photo(obj), (bw, bh), interpolation=cv2.INTER_AREA)
        bg = _backdrop(BACKDROPS[back], h, w, rng)
        image = _jpeg(_compose(bg, [(colour, alpha)]))
        yield TruthItem(f"thin-{obj}-{shape}-on-{back}", "thin", image, alpha, np.zeros((h, w), bool))


def _multi(h: int, w: int) -> Iterator[TruthItem]:
    import skimage.data

    cam = np.asarray(skimage.data.camera())  # type: ignore[no-untyped-call]
    setups = ("shoes", "jar-lid", "cylinder-photo")
    for k, back in enumerate(("white", "beige", "cream", "grey", "cream", "beige")):
        setup = setups[k % 3]
        rng = np.random.default_rng(500 + k)
        layers: list[tuple[np.ndarray, np.ndarray]] = []
        if setup == "shoes":
            for j, cx in enumerate((w * 0.33, w * 0.67)):
                cover = _draw(h, w, [("ellipse", (cx, h * 0.55, w * 0.12, h * 0.3, 1)),
                                     ("ellipse", (cx, h * 0.3, w * 0.09, h * 0.08, 1))])
                tone = (60.0 + 90 * j, 70.0 + 40 * j, 90.0) if k < 3 else (236.0, 236.0, 234.0)
                layers.append((_shade(cover, tone, rng), cover))
        elif setup == "jar-lid":
            jar = _product_shape("jar", h, w, w * 0.4, h * 0.58, h * 0.55)
            lid = _draw(h, w, [("rect", (w * 0.62, h * 0.7, w * 0.86, h * 0.8, 1))])
            layers.append((_shade(jar, (238.0, 238.0, 236.0), rng), jar))
            layers.append((_shade(lid, (200.0, 60.0, 50.0) if k < 3 else (120.0, 120.0, 124.0), rng), lid))
        else:
            cyl = _product_shape("cylinder", h, w, w * 0.3, h * 0.55, h * 0.6)
            frame = _draw(h, w, [("rect", (w * 0.5, h * 0.25, w * 0.82, h * 0.82, 1))])
            photo = np.zeros((h, w, 3), np.float32)
            x0, y0, x1, y1 = int(w * 0.5), int(h * 0.25), int(w * 0.82), int(h * 0.82)
            photo[...] = 40.0
            pic = cv2.resize(cam, (x1 - x0 - 16, y1 - y0 - 16), interpolation=cv2.INTER_AREA)
            photo[y0 + 8:y1 - 8, x0 + 8:x1 - 8] = pic[..., None].astype(np.float32)
            layers.append((_shade(cyl, (245.0, 245.0, 244.0), rng), cyl))
            layers.append((photo, frame))
        alpha = np.zeros((h, w), np.float32)
        for _, a in layers:
            alpha = alpha + a * (1.0 - alpha)
        cover_all = np.clip(alpha, 0, 1)
        bg = _backdrop(BACKDROPS[back], h, w, rng) * _shadow(cover_all, 12, 8, 0.3)[..., None]
        image = _jpeg(_compose(bg, layers))
        yield TruthItem(f"multi-{setup}-on-{back}", "multi", image, alpha.astype(np.float32),
                        np.zeros((h, w), bool))


def _clutter(h: int, w: int) -> Iterator[TruthItem]:
    intruders = (("flag", (180.0, 30.0, 40.0)), ("plant", (40.0, 90.0, 40.0)), ("hand", (200.0, 150.0, 120.0)))
    for k, back in enumerate(("white", "cream", "grey", "beige", "white", "sage")):
        name, tone = intruders[k % 3]
        rng = np.random.default_rng(600 + k)
        prod = _product_shape(("bottle", "cylinder", "box")[k % 3], h, w, w * 0.48, h * 0.52, h * 0.6)
        side = k % 2
        edge_x = 0.0 if side == 0 else float(w)
        sx = 1.0 if side == 0 else -1.0
        if name == "flag":
            pts = [(edge_x, h * 0.05), (edge_x + sx * w * 0.2, h * 0.12), (edge_x + sx * w * 0.18, h * 0.4),
                   (edge_x, h * 0.35)]
            other = _draw(h, w, [("poly", (pts, 1))])
        elif name == "plant":
            other = _draw(h, w, [("ellipse", (edge_x, h * 0.85, w * 0.16, h * 0.25, 1))])
        else:
            other = _draw(h, w, [("rect", (min(edge_x, edge_x + sx * w * 0.22), h * 0.62,
                                           max(edge_x, edge_x + sx * w * 0.22), h * 0.74, 1))])
        colour = (236.0, 236.0, 234.0) if k < 3 else (70.0, 110.0, 170.0)
        bg = _backdrop(BACKDROPS[back], h, w, rng) * _shadow(prod, 12, 8, 0.3)[..., None]
        image = _jpeg(_compose(bg, [(_shade(prod, colour, rng), prod), (_shade(other, tone, rng), other)]))
        yield TruthItem(f"clutter-{name}-on-{back}", "clutter", image, prod, np.zeros((h, w), bool))


def quality_set(size: tuple[int, int] = (480, 640), classes: tuple[str, ...] = CLASSES) -> list[TruthItem]:
    """The set (46 items at the default size; ``size`` is ``(H, W)``), in class order."""
    h, w = size
    makers = {"pale": _pale, "glass": _glass, "fur": _fur, "thin": _thin, "multi": _multi, "clutter": _clutter}
    unknown = set(classes) - set(makers)
    if unknown:
        raise ValueError(f"unknown classes {sorted(unknown)}; known: {CLASSES}")
    return [item for c in classes for item in makers[c](h, w)]
