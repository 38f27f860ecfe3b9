"""From a foreground probability map to the alpha mask composites use, without a halo.

    prob  = guided(prob, image) where the model is unsure   (the edge follows the photo's edges)
    hard  = prob >= threshold
            - regions the model was unsure of that look like the backdrop around them, dropped
              (the backdrop between items of a multi-item shot)
            + thick parts the model half sees, unlike the backdrop and touching the mask, added
              (the rest of an item the model cut in two)
            - islands small beside the largest, or far from it and not large, dropped,
              unless the model is sure of them and they are unlike the backdrop (every item kept)
            - other objects that touch the frame's edge and are unlike the largest, dropped
            + holes enclosed by the subject filled: specks always, larger ones up to a share of
              the subject unless they look like the background (a mug's handle stays open)
    alpha = matte(hard, image) in a band around the outline and where the model was unsure
            (a colour-guided alpha matte: soft where the photo's edge is soft; default)
    or, without the image or with ``matte`` off:
    core  = hard eroded by ``erode_px``       (the edge pixels, mixed with background, go)
    alpha = min(blur(core, feather_px), hard) (a feathered edge that only fades *inward*)

The model's probability comes from a small input (320 px for u2netp) upsampled to the photo, so
its edge is soft and a few pixels off; a guided filter (He et al., grey guide, Gaussian windows)
at full resolution snaps it to the photo's edges, only where the model is unsure (``guide_band``)
so thin parts the model is sure of are never blurred away. So alpha is exactly 0 wherever the
refined mask is background (no background colour can bleed into a composite as a fringe),
exactly 255 deep inside the subject, and ramps over a few pixels just inside the outline.
Written once over :class:`ArrayOps`, so the CPU (OpenCV) and GPU (CuPy) backends run the same
steps; the image-dependent steps need the image (``image=None`` skips them).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpu_kernels.array import Array
from gpu_kernels.retouch.color import srgb_to_lab
from gpu_kernels.retouch.matting import box_blur, colour_line_alpha, colour_line_planes, matte_band, matte_block
from gpu_kernels.segment.ops import ArrayOps

Likeness = tuple[Array, int] | None | Callable[[], tuple[Array, int] | None]

__all__ = [
    "MaskPostprocess",
    "alpha_from_probability",
    "backdrop_likeness",
    "clean_cutout",
    "drop_backdrop_regions",
    "drop_edge_clutter",
    "drop_islands",
    "drop_leaks",
    "fill_holes",
    "grow_unsure",
    "guided_probability",
    "keep_items",
    "matte_alpha",
]


@dataclass(frozen=True, slots=True)
class MaskPostprocess:
    """Mask post-processing settings; pixel sizes are at the image's full resolution.

    Islands: a component is kept when it is at least ``min_component`` of the largest and either
    within ``near`` (a share of the image diagonal) of the largest or at least ``far_component``
    of it. Holes (background components that do not touch the frame): filled when at most
    ``speck_hole`` of the subject's area, or at most ``max_hole`` of it and their mean colour is
    more than ``hole_delta_e`` (CIELAB ΔE) from the background just around the subject
    (``ring`` share of the diagonal), or when the model's probability is at least ``hole_prob``
    everywhere in them (it wavered under its threshold there and never saw the background: a
    cat's pale fur beside a pale wall; a hole it sees through dips far lower). Bays
    (``bay_edge`` > 0): a background component that meets the frame's edge in a single stretch
    of at most ``bay_edge`` of its length, between two parts of the subject, and is neither the
    piece that meets it longest nor a speck, is a hole the frame cut open (the cheek of a face
    cut by the frame's side) and is filled as a larger hole is, when unlike the background
    around the subject, or when the model's mean probability on it is at least ``bay_prob`` (the
    cat's pale cheek fur beside a pale wall, which the model half sees).
    Guided filter: Gaussian window ``guide_sigma`` px (0: off), regulariser ``guide_eps`` (on a
    0..1 grey guide), applied where ``|prob - 0.5| < guide_band``.
    Leaks (off by default, ``leak_prob`` 0): subject pixels with ``prob < leak_prob`` within
    ``leak_delta_e`` of the background around the subject are dropped (on the sample catalog at
    0.8 it removes the backdrop patch between the coins but also trims a cat's fur by 5 %).
    Edge clutter (``clutter_delta_e`` > 0): a component other than the largest that touches the
    frame's edge, is smaller than the largest and whose mean colour is more than
    ``clutter_delta_e`` (CIELAB ΔE) from the largest's is another object cut by the frame (a
    flag beside a person, a plant at the border) and is dropped; parts of the product that do
    not touch the edge (a lid, the second shoe) are kept whatever their colour. A shot with at
    least ``clutter_items`` separate items inside the frame besides the largest (each at least
    ``item_min`` of the frame) is a spread of items (sweets, a desk of objects): there nothing is
    dropped as clutter, the items cut by the frame's edge being more of them.
    Matte (``matte``, on): the trimap's unknown band is ``matte_band`` of the diagonal (at least
    2 px) either side of the outline, plus the pixels within three bands of it whose probability
    lies in ``matte_unsure``; there alpha is a colour-guided filter of the hard mask
    (:func:`gpu_kernels.retouch.matting.matte_band`, regulariser ``matte_eps``), elsewhere 0 or 255;
    outside the hard mask only where the probability and the matte are at least ``matte_outside``
    (and below one half): fur strands and a soft rim the model half sees (on the cut-out quality
    set, 0.15 lowers alpha SAD in every class: fur 2.37 to 2.26, multi 0.20 to 0.13; 1 keeps the
    alpha inside the hard mask). Colour line (``matte_colour``): in the band, where the model is
    unsure (``matte_unsure``), a pixel that is a mix of the sure subject's and the sure backdrop's
    mean colours around it (a window of ``matte_colour_reach`` bands, the means at least
    ``matte_colour_sep`` levels apart, the pixel within ``matte_colour_fit`` of that distance from
    the line between them; outside the hard mask only where the probability is at least
    ``matte_colour_outside``, not JPEG ringing beside a hard edge) takes the subject's share in
    it as alpha (:func:`gpu_kernels.retouch.matting.colour_line_alpha`): the rim of fur or hair, where the
    guided filter of the hard mask leaves backdrop-coloured pixels nearly opaque, goes as
    transparent as its colour says (on the cut-out quality set, fur alpha SAD 2.26 to 2.04).
    Backdrop (``backdrop_delta_e`` > 0): the backdrop's local colour is interpolated under the
    subject from the pixels the model calls background (``prob < backdrop_prob``; a normalised
    Gaussian of ``backdrop_sigma`` of the diagonal); a region of the hard mask within
    ``backdrop_delta_e`` (CIELAB ΔE) of it where ``prob < backdrop_unsure``, at least
    ``backdrop_min`` of the frame and with a mean probability below ``backdrop_region_prob``,
    is backdrop and dropped when its part thicker than
    ``backdrop_thick`` of the diagonal (a morphological opening) is that large: a soft rim or
    fur along the outline, backdrop-coloured but thin, stays; and only when the parts the model
    is sure of that it touches fall apart without it, the frame's edge counting as one (backdrop
    *between* items, or running out of the frame from one); it then grows into the
    unsure pixels next to it within twice that ΔE (the darker rim of backdrop it leaves round the
    items), and into a part the model is sure of within that ΔE when the part is at most
    ``backdrop_wedge`` of the dropped area (a wedge of backdrop the model calls subject where two
    items nearly touch; a larger part is the subject's own colour near the backdrop's).
    Items (``item_prob`` < 1): an island the island rule drops is kept when the model's mean
    probability on it is at least ``item_prob``, its mean ΔE from the local backdrop at least
    ``item_delta_e`` and its area at least ``item_min`` of the frame (the far coins of a tray of
    coins).
    Grow (``grow_prob`` < ``threshold``): the thick parts (an opening by a disk of
    ``backdrop_thick`` of the diagonal) of the pixels the model half sees (``grow_prob`` <= prob <
    ``threshold``) that are at least ``grow_delta_e`` (CIELAB ΔE) from the backdrop's local colour
    and connected to the mask join it, each part at least ``grow_min`` of the frame and its mean
    colour within ``grow_like_e`` of the mask's beside it, with the half-seen pixels within the
    opening's reach that join it to the mask: the rest of an item the model cut in two (a toy's
    wheel, an aircraft's tail, a notch in a car's window, more of a packet's white face). The
    backdrop-coloured haze round a subject, thin rims along its outline and another object the
    model half sees beside it (trees behind a car, a second animal) stay out.
    """

    threshold: float = 0.5  # probability at or above which a pixel is subject
    erode_px: int = 0  # how far the soft edge is pulled inside the outline (1 without the guided edge)
    feather_px: float = 1.0  # Gaussian sigma of the edge ramp; 0 gives a hard 0/255 mask
    min_component: float = 0.05  # drop islands smaller than this share of the largest; 0 keeps all
    far_component: float = 0.1
    near: float = 0.06
    speck_hole: float = 0.002
    max_hole: float = 0.15
    hole_delta_e: float = 15.0
    ring: float = 0.02
    guide_sigma: float = 3.0
    guide_eps: float = 1e-3
    guide_band: float = 0.45
    leak_prob: float = 0.0
    leak_delta_e: float = 10.0
    clutter_delta_e: float = 25.0
    clutter_items: int = 2  # 0: the clutter rule whatever the count of items
    matte: bool = True
    matte_band: float = 0.004
    matte_eps: float = 1e-3
    matte_unsure: tuple[float, float] = (0.1, 0.9)
    matte_outside: float = 0.15
    matte_colour: bool = True
    matte_colour_reach: float = 3.0  # the colour means' window, in bands
    matte_colour_sep: float = 60.0  # levels (RGB distance) the subject's and backdrop's means must differ by
    matte_colour_fit: float = 0.2  # share of that distance a pixel may lie off the line between them
    matte_colour_snap: float = 0.1
    matte_colour_outside: float = 0.3  # outside the hard mask, only where the model gives at least this
    backdrop_prob: float = 0.1
    backdrop_sigma: float = 0.05
    backdrop_delta_e: float = 10.0
    backdrop_unsure: float = 0.95
    backdrop_region_prob: float = 0.8
    backdrop_min: float = 0.002
    backdrop_thick: float = 0.015
    backdrop_wedge: float = 0.1
    item_prob: float = 0.9
    item_delta_e: float = 20.0
    item_min: float = 0.002
    grow_prob: float = 0.25  # at or above ``threshold``: off
    grow_delta_e: float = 20.0
    grow_like_e: float = 15.0
    grow_min: float = 0.002
    bay_edge: float = 0.1  # 0: bays at the frame's edge are never holes
    bay_prob: float = 0.15
    hole_prob: float = 0.4  # 0: a hole like the background always stays open

    def __post_init__(self) -> None:
        if not 0.0 < self.threshold < 1.0:
            raise ValueError(f"mask postprocess: threshold must be in (0, 1), got {self.threshold}")
        if self.erode_px < 0 or self.feather_px < 0:
            raise ValueError(
                f"mask postprocess: erode_px and feather_px must be >= 0, got {self.erode_px}, {self.feather_px}"
            )
        shares = (self.min_component, self.far_component, self.near, self.speck_hole, self.max_hole, self.ring,
                  self.backdrop_wedge, self.hole_prob)
        if not all(0.0 <= v <= 1.0 for v in shares):
            raise ValueError(f"mask postprocess: shares must be in [0, 1], got {self}")
        if (self.matte_colour_reach <= 0 or self.matte_colour_sep < 0 or self.matte_colour_fit < 0
                or not 0 <= self.matte_colour_snap < 0.5):
            raise ValueError(f"mask postprocess: bad colour-line settings in {self}")
        if self.guide_sigma < 0 or self.guide_eps <= 0 or not 0 <= self.guide_band <= 0.5:
            raise ValueError(f"mask postprocess: bad guided-filter settings in {self}")


def guided_probability(prob: Array, image: Array, cfg: MaskPostprocess, ops: ArrayOps) -> Array:
    """``prob`` refined by a guided filter on ``image``'s grey levels where the model is unsure.

    The fast guided filter (He and Sun, 2015): the linear coefficients ``a``, ``b`` are computed
    on a copy shrunk by ``s`` (window ``guide_sigma / s``) and enlarged back; the output
    ``a * I + b`` uses the full-resolution guide ``I``, so edges stay sharp at full resolution.
    """
    xp = ops.xp
    h, w = prob.shape[:2]
    rgb = image[..., :3] if image.ndim == 3 else image[..., None]
    grey = ops.resize_map(_grey(xp, rgb), h, w) if rgb.shape[:2] != (h, w) else _grey(xp, rgb)
    p = prob.astype(xp.float32)
    s = max(1, min(4, int(cfg.guide_sigma // 1.5)))
    sh, sw = max(1, h // s), max(1, w // s)
    gi, gp = ops.resize_map(grey, sh, sw), ops.resize_map(p, sh, sw)
    sigma = cfg.guide_sigma / s
    mean_i, mean_p = ops.blur(gi, sigma), ops.blur(gp, sigma)
    cov = ops.blur(gi * gp, sigma) - mean_i * mean_p
    var = ops.blur(gi * gi, sigma) - mean_i * mean_i
    a = cov / (var + xp.float32(cfg.guide_eps))
    b = mean_p - a * mean_i
    q = ops.resize_map(ops.blur(a, sigma), h, w)
    q *= grey
    q += ops.resize_map(ops.blur(b, sigma), h, w)
    xp.clip(q, xp.float32(0), xp.float32(1), out=q)
    sure = xp.abs(p - xp.float32(0.5)) >= xp.float32(cfg.guide_band)
    q[sure] = p[sure]
    return q


def _grey(xp: Any, rgb: Array) -> Array:
    """``(H, W, 1|3)`` uint8 → ``(H, W)`` float32 grey in [0, 1] (Rec. 601 weights)."""
    if rgb.shape[-1] == 1:
        return rgb[..., 0].astype(xp.float32) * xp.float32(1 / 255)
    out = rgb[..., 0] * xp.float32(0.299 / 255)
    out += rgb[..., 1] * xp.float32(0.587 / 255)
    out += rgb[..., 2] * xp.float32(0.114 / 255)
    return out


def backdrop_likeness(prob: Array, image: Array, cfg: MaskPostprocess, ops: ArrayOps) -> tuple[Array, int] | None:
    """``(ΔE, st)``: each pixel's CIELAB distance from the backdrop's local colour, on a grid
    strided by ``st`` (about 0.25 MP); None when the model calls (almost) nothing background."""
    xp = ops.xp
    h, w = prob.shape[:2]
    st = _stride(h, w)
    p = prob[::st, ::st]
    hs, ws = p.shape[:2]
    lab = _strided_lab(xp, image, st)
    bg = (p < xp.float32(cfg.backdrop_prob)).astype(xp.float32)
    if float(bg.mean()) < 0.02:
        return None
    sigma = max(1.0, cfg.backdrop_sigma * math.hypot(hs, ws))
    # the backdrop's colour varies slowly: the normalised blur runs on a copy shrunk so that its
    # window is ~3 px, then is enlarged back (a wide Gaussian at 0.25 MP cost ~10x more)
    f = max(1.0, sigma / 3.0)
    sh, sw = max(1, round(hs / f)), max(1, round(ws / f))
    planes = [bg, *(lab[..., c] * bg for c in range(3))]
    small = [ops.blur(ops.resize_map(a, sh, sw), sigma / f) for a in planes]
    den = ops.resize_map(small[0], hs, ws)
    local = xp.stack([ops.resize_map(a, hs, ws) for a in small[1:]], axis=-1)
    local /= xp.maximum(den, xp.float32(1e-4))[..., None]
    far = den < xp.float32(1e-3)  # no backdrop within reach: never backdrop-like
    delta = xp.sqrt(((lab - local) ** 2).sum(axis=-1))
    delta[far] = xp.float32(1e3)
    return delta, st


def _strided_lab(xp: Any, image: Array, st: int) -> Array:
    """``(H/st, W/st, 3)`` float32 CIELAB of every ``st``-th pixel of ``image`` (grey repeated)."""
    rgb = image[::st, ::st, :3] if image.ndim == 3 else xp.repeat(image[::st, ::st, None], 3, axis=2)
    flat = rgb.reshape(-1, 3)
    lab = srgb_to_lab(xp, flat.astype(xp.float64), levels=flat if flat.dtype == xp.uint8 else None)
    return lab.reshape(*rgb.shape[:2], 3).astype(xp.float32)


def _thick_radius(cfg: MaskPostprocess, h: int, w: int) -> int:
    """The radius (grid pixels) of the disk whose opening keeps a grid mask's thick parts:
    ``backdrop_thick`` of the ``(h, w)`` grid's diagonal, at least 1."""
    return max(1, round(cfg.backdrop_thick * math.hypot(h, w)))


def _opened(erode: Callable[[Array, int], Array], mask: Array, r: int) -> Array:
    """``mask`` opened by a disk of radius ``r`` with ``erode`` (one mask or a stack): its thick parts."""
    return ~erode(~erode(mask, r), r)


def _stride(h: int, w: int) -> int:
    """The grid stride of the backdrop rules (about 0.25 MP)."""
    return max(1, math.ceil(math.sqrt(h * w / 250_000)))


def drop_backdrop_regions(hard: Array, prob: Array, likeness: Likeness, cfg: MaskPostprocess,
                          ops: ArrayOps) -> Array:
    """``hard`` without the regions that look like the backdrop around them where the model was
    unsure (see :class:`MaskPostprocess`): the backdrop between the items of a multi-item shot.
    ``likeness``: :func:`backdrop_likeness`'s result, or a function giving it (called only when
    the model was unsure over a thick enough part of the mask: most photos never pay for it)."""
    xp = ops.xp
    if cfg.backdrop_delta_e <= 0:
        return hard
    h, w = hard.shape[:2]
    st = _stride(h, w)
    hard_s, prob_s = hard[::st, ::st], prob[::st, ::st]
    unsure = hard_s & (prob_s < xp.float32(cfg.backdrop_unsure))
    # only thick parts count (an opening by a disk of ``backdrop_thick`` of the diagonal): a soft
    # rim or fur along the outline, backdrop-coloured but thin, stays
    r = _thick_radius(cfg, *unsure.shape[:2])
    if float(xp.sum(_opened(ops.erode, unsure, r))) * st * st < cfg.backdrop_min * h * w:
        return hard
    found = likeness() if callable(likeness) else likeness
    if found is None:
        return hard
    delta, st = found
    cand = unsure & (delta < xp.float32(cfg.backdrop_delta_e))
    thick = _opened(ops.erode, cand, r)
    if not bool(thick.any()):
        return hard
    labels, n = ops.label(cand, 8)
    # a region goes whole (its thin arms between the items too) when its thick part is large
    flat = labels.ravel()
    areas = xp.bincount(flat, weights=thick.ravel().astype(xp.float64), minlength=n + 1)
    mean_p = xp.bincount(flat, weights=(prob_s * thick).ravel().astype(xp.float64), minlength=n + 1) / xp.maximum(
        areas, 1.0)  # over its thick part
    drop = (areas * st * st >= cfg.backdrop_min * h * w) & (mean_p < cfg.backdrop_region_prob)
    drop[0] = False
    if not bool(drop.any()):
        return hard
    # backdrop *between* items: the region must touch parts the model is sure of that are
    # separate without it (a patch between coins); one whose sure neighbours hold together
    # without it is kept (the grey body of a camera held between a face and a hand against a
    # grey sky, a saucer's shadowed side)
    sure = hard_s & (prob_s >= xp.float32(cfg.backdrop_unsure))
    for k in xp.nonzero(drop)[0].tolist():
        region = labels == k
        rim = ~ops.erode(~region, 2) & ~region & sure
        rest, _ = ops.label(hard_s & ~region, 8)
        touched = rest[rim]
        touched = touched[touched > 0]
        parts = 0 if int(touched.size) == 0 else 1 + int(int(touched.min()) != int(touched.max()))
        # the frame's edge counts as a part: a slab of backdrop that runs out of the frame from
        # one item goes too (and a crop that cuts away one of two items decides as the whole)
        if bool(region[0].any() or region[-1].any() or region[:, 0].any() or region[:, -1].any()):
            parts += 1
        if parts < 2:
            drop[k] = False
    if not bool(drop.any()):
        return hard
    gone = drop[labels]
    # grown by hysteresis into the unsure pixels next to it within twice the distance (the
    # darker rim of backdrop a dropped patch leaves around the items it touched), and into the
    # small parts of such pixels the model is sure of (a wedge between two nearly touching items)
    near = hard_s & (delta < xp.float32(2 * cfg.backdrop_delta_e))
    weak = gone | (near & ~sure)
    if cfg.backdrop_wedge > 0:
        sl, sn = ops.label(near & sure, 8)
        sizes = xp.bincount(sl.ravel(), minlength=sn + 1)
        small = sizes <= cfg.backdrop_wedge * float(xp.sum(gone))
        small[0] = False
        weak |= small[sl]
    wl, wn = ops.label(weak, 8)
    seeded = xp.zeros(wn + 1, dtype=bool)
    seeded[wl[gone]] = True
    seeded[0] = False
    gone = seeded[wl]
    if st > 1:
        gone = ops.resize_map(gone.astype(xp.float32), h, w) >= xp.float32(0.5)
    return hard & ~gone


def grow_unsure(hard: Array, prob: Array, image: Array, likeness: Likeness, cfg: MaskPostprocess,
                ops: ArrayOps) -> Array:
    """``hard`` with the thick parts the model half sees that are unlike the backdrop, like the
    mask beside them and touch it (see :class:`MaskPostprocess`). ``likeness`` as in
    :func:`drop_backdrop_regions` (called only when such a thick half-seen part is large enough)."""
    xp = ops.xp
    if cfg.grow_prob >= cfg.threshold:
        return hard
    h, w = hard.shape[:2]
    st = _stride(h, w)
    hard_s, prob_s = hard[::st, ::st], prob[::st, ::st]
    weak = ~hard_s & (prob_s >= xp.float32(cfg.grow_prob))
    r = _thick_radius(cfg, *weak.shape[:2])
    least = cfg.grow_min * h * w / (st * st)
    if float(xp.sum(weak)) < least or float(xp.sum(_opened(ops.erode, weak, r))) < least:
        return hard  # the usual case: nothing thick is half seen, no colour needed
    found = likeness() if callable(likeness) else likeness
    if found is None:
        return hard
    delta, st = found
    cand = weak & (delta >= xp.float32(cfg.grow_delta_e))
    thick = _opened(ops.erode, cand, r)
    labels, n = ops.label(cand | hard_s, 8)  # connected to the mask through the half-seen pixels
    seeded = xp.zeros(n + 1, dtype=bool)
    seeded[labels[hard_s]] = True
    seeded[0] = False
    joined = cand & seeded[labels]
    parts, m = ops.label(thick & joined, 8)
    areas = xp.bincount(parts.ravel(), minlength=m + 1)
    big = areas >= least
    big[0] = False
    if not bool(big.any()):
        return hard
    lab = _strided_lab(xp, image, st)
    for k in xp.nonzero(big)[0].tolist():  # a part must look like the mask it would join
        part = parts == k
        beside = hard_s & ~ops.erode(~part, 2 * r)
        if not bool(beside.any()):
            big[k] = False
            continue
        gap = lab[part].mean(axis=0) - lab[beside].mean(axis=0)
        big[k] = float(xp.sqrt((gap * gap).sum())) <= cfg.grow_like_e
    if not bool(big.any()):
        return hard
    # the thick parts with the half-seen pixels within their reach (the opening cut the thin
    # ones that join them to the mask; a rim farther along the outline stays out)
    grown = joined & ~ops.erode(~big[parts], r)
    if st > 1:
        grown = ops.resize_map(grown.astype(xp.float32), h, w) >= xp.float32(0.5)
    return hard | (grown & (prob >= xp.float32(cfg.grow_prob)))


def keep_items(hard: Array, kept: Array, prob: Array, likeness: Likeness, cfg: MaskPostprocess,
               ops: ArrayOps) -> Array:
    """``kept`` (``hard`` after the island rule) with the islands of ``hard`` it dropped back in
    when they are items: the model sure of them, unlike the backdrop, not tiny. ``likeness`` as
    in :func:`drop_backdrop_regions` (called only when an island was dropped)."""
    xp = ops.xp
    if cfg.item_prob >= 1.0:
        return kept
    dropped = hard & ~kept
    if not bool(dropped.any()):
        return kept
    h, w = hard.shape[:2]
    labels, n = ops.label(dropped, 8)
    flat = labels.ravel()
    areas = xp.bincount(flat, minlength=n + 1).astype(xp.float64)
    psum = xp.bincount(flat, weights=prob.ravel().astype(xp.float64), minlength=n + 1)
    back = (psum / xp.maximum(areas, 1.0) >= cfg.item_prob) & (areas >= cfg.item_min * h * w)
    back[0] = False
    if not bool(back.any()):  # the usual case: only specks were dropped, no colour needed
        return kept
    found = likeness() if callable(likeness) else likeness
    if found is None:
        return kept
    delta, st = found
    lab_s = labels[::st, ::st].ravel()
    cnt_s = xp.bincount(lab_s, minlength=n + 1).astype(xp.float64)
    dsum = xp.bincount(lab_s, weights=xp.minimum(delta, xp.float32(100)).ravel().astype(xp.float64), minlength=n + 1)
    back &= (cnt_s > 0) & (dsum / xp.maximum(cnt_s, 1.0) >= cfg.item_delta_e)
    if not bool(back.any()):
        return kept
    return kept | back[labels]


def drop_islands(hard: Array, cfg: MaskPostprocess, ops: ArrayOps) -> Array:
    """Keep the components of ``hard`` that are large beside the largest, or near it."""
    xp = ops.xp
    labels, n = ops.label(hard, 8)
    if n <= 1:
        return hard
    areas = xp.bincount(labels.ravel(), minlength=n + 1).astype(xp.float64)
    areas[0] = 0
    big = areas.max()
    large, far_enough = areas >= cfg.min_component * big, areas >= cfg.far_component * big
    keep = large & far_enough
    if bool((large & ~far_enough).any()):  # only these need to know how near the largest they are
        radius = cfg.near * math.hypot(*hard.shape[:2])
        near_main = (ops.distance_to(labels == xp.argmax(areas)) <= radius).astype(xp.float64)
        touches = xp.bincount(labels.ravel(), weights=near_main.ravel(), minlength=n + 1) > 0
        keep |= large & touches
    keep[0] = False
    return keep[labels]


def drop_edge_clutter(hard: Array, image: Array, cfg: MaskPostprocess, ops: ArrayOps) -> Array:
    """``hard`` without the edge clutter (see :class:`MaskPostprocess`); colours averaged on a
    strided grid (about 0.5 MP)."""
    xp = ops.xp
    labels, n = ops.label(hard, 8)
    if n <= 1:
        return hard
    frame = xp.zeros(n + 1, dtype=bool)
    frame[xp.concatenate([labels[0], labels[-1], labels[:, 0], labels[:, -1]])] = True
    frame[0] = False
    areas = xp.bincount(labels.ravel(), minlength=n + 1).astype(xp.float64)
    areas[0] = 0
    main = int(xp.argmax(areas))
    frame[main] = False
    if not bool(frame.any()):
        return hard
    h, w = hard.shape[:2]
    if cfg.clutter_items > 0:
        inner = ~frame & (areas >= cfg.item_min * h * w)
        inner[0] = inner[main] = False
        if int(inner.sum()) >= cfg.clutter_items:
            return hard
    st = max(1, math.ceil(math.sqrt(h * w / 500_000)))
    lab_s = labels[::st, ::st].ravel()
    rgb = image[::st, ::st, :3] if image.ndim == 3 else image[::st, ::st, None]
    rgb = rgb.astype(xp.float64)
    if rgb.shape[-1] == 1:
        rgb = xp.repeat(rgb, 3, axis=2)
    counts = xp.bincount(lab_s, minlength=n + 1).astype(xp.float64)
    sums = xp.stack([xp.bincount(lab_s, weights=rgb[..., c].ravel(), minlength=n + 1) for c in range(3)], axis=1)
    lab = srgb_to_lab(xp, sums / xp.maximum(counts, 1.0)[:, None])
    delta = xp.sqrt(((lab - lab[main][None, :]) ** 2).sum(axis=1))
    drop = frame & (delta > cfg.clutter_delta_e) & (counts > 0) & (areas < areas[main])
    if not bool(drop.any()):
        return hard
    return hard & ~drop[labels]


def clean_cutout(alpha: Array, cfg: MaskPostprocess, ops: ArrayOps) -> Array:
    """An already cut-out image's own alpha (RGBA with transparency) with faint specks far from
    the subject zeroed: the components of ``alpha > 0`` (8-connected) that :func:`drop_islands`
    would drop. Every pixel with alpha > 0 shows on the canvas and belongs to the subject box, so
    stray low-alpha dust left by a cut-out tool would otherwise shrink the product and dirty the
    white border. A soft drop shadow, connected to the product or large, is kept; so is every
    alpha value that is kept (nothing is thresholded). Returns ``alpha`` itself when nothing goes."""
    xp = ops.xp
    if cfg.min_component <= 0:
        return alpha
    shows = alpha > 0
    kept = drop_islands(shows, cfg, ops) if cfg.far_component > 0 else ops.keep_large_components(
        shows, cfg.min_component)
    if bool((kept == shows).all()):
        return alpha
    return xp.where(kept, alpha, xp.uint8(0)).astype(xp.uint8)


def fill_holes(hard: Array, image: Array | None, cfg: MaskPostprocess, ops: ArrayOps,
               prob: Array | None = None) -> Array:
    """``hard`` with its enclosed holes filled, and the bays at the frame's edge with them where
    ``prob`` (the model's probability) is given (see :class:`MaskPostprocess`). Colours are
    averaged on a strided grid (about 0.5 MP), enough for a hole's and the ring's means."""
    xp = ops.xp
    labels, n = ops.label(~hard, 4)
    if n == 0:
        return hard
    frame = _frame_ring(xp, labels)
    outside = xp.zeros(n + 1, dtype=bool)
    outside[frame] = True
    outside[0] = True  # label 0 is the subject itself
    bays = _bays(xp, frame, n, cfg) if cfg.bay_edge > 0 and image is not None and prob is not None else None
    if bool(outside.all()) and (bays is None or not bool(bays.any())):
        return hard  # nothing enclosed: the common case ends here
    flat = labels.ravel()
    areas = xp.bincount(flat, minlength=n + 1).astype(xp.float64)
    subject = xp.maximum(xp.sum(hard).astype(xp.float64), 1.0)
    fill = ~outside & (areas <= cfg.speck_hole * subject)
    medium = ~outside & ~fill & (areas <= cfg.max_hole * subject)
    if bays is not None:
        bays &= areas > cfg.speck_hole * subject  # a speck of a bay is left as it is
        medium |= bays & (areas <= cfg.max_hole * subject)  # the others are checked as larger holes are
        outside &= ~bays  # and are no background for the ring's colours
    if image is not None and cfg.max_hole > 0 and bool(medium.any()):
        h, w = hard.shape[:2]
        st = max(1, math.ceil(math.sqrt(h * w / 500_000)))
        lab_s, hard_s = labels[::st, ::st], hard[::st, ::st]
        rgb = image[::st, ::st, :3] if image.ndim == 3 else image[::st, ::st, None]
        rgb = rgb.astype(xp.float64)
        if rgb.shape[-1] == 1:
            rgb = xp.repeat(rgb, 3, axis=2)
        flat_s = lab_s.ravel()
        counts = xp.bincount(flat_s, minlength=n + 1).astype(xp.float64)
        sums = xp.stack([xp.bincount(flat_s, weights=rgb[..., c].ravel(), minlength=n + 1) for c in range(3)],
                        axis=1)
        means = sums / xp.maximum(counts, 1.0)[:, None]
        radius = max(1.0, cfg.ring * math.hypot(h, w) / st)
        ring = (~hard_s) & (ops.distance_to(hard_s) <= radius) & outside[lab_s]
        ring_n = xp.sum(ring)
        ring_mean = xp.stack([xp.sum(xp.where(ring, rgb[..., c], 0.0)) for c in range(3)]) / xp.maximum(ring_n, 1)
        delta = xp.sqrt(((srgb_to_lab(xp, means) - srgb_to_lab(xp, ring_mean)[None, :]) ** 2).sum(axis=1))
        unlike = (delta > cfg.hole_delta_e) & (counts > 0)
        unlike_bg = unlike | (ring_n == 0)
        prob_s = None if prob is None else prob[::st, ::st]
        holes = medium if bays is None else medium & ~bays  # (bays decide below, on their own terms)
        if prob_s is not None and cfg.hole_prob > 0 and bool((holes & ~unlike_bg).any()):
            # a hole like the background that the model never calls background (no pixel of it,
            # on the colours' grid, below hole_prob): the model only wavered under its threshold
            # there (a cat's pale cheek fur beside a pale wall), it did not see through the subject
            low = xp.bincount(flat_s, weights=(prob_s < cfg.hole_prob).ravel().astype(xp.float64), minlength=n + 1)
            unlike_bg = unlike_bg | ((low == 0) & (counts > 0))
        if bays is not None and prob_s is not None:  # (bays are found only with a probability)
            # a bay is filled when unlike the background beside the subject (none beside it: it
            # stays open) or when the model half sees it (its mean probability, on the colours'
            # grid): fur or a face the backdrop's colour, cut by the frame
            seen = xp.bincount(flat_s, weights=prob_s.ravel().astype(xp.float64),
                               minlength=n + 1) / xp.maximum(counts, 1.0)
            unlike_bg = xp.where(bays, (unlike & (ring_n > 0)) | (seen >= cfg.bay_prob), unlike_bg)
        fill = fill | (medium & unlike_bg)
    fill[0] = False
    return hard | fill[labels]


def _frame_ring(xp: Any, labels: Array) -> Array:
    """The labels along the frame's edge as one closed walk: the top row left to right, the right
    column down, the bottom row right to left, the left column up (each corner once)."""
    h, w = labels.shape[:2]
    if h == 1 or w == 1:
        return labels.ravel()
    return xp.concatenate([labels[0], labels[1:, -1], labels[-1, -2::-1], labels[-2:0:-1, 0]])


def _bays(xp: Any, frame: Array, n: int, cfg: MaskPostprocess) -> Array:
    """``(n + 1,)`` bool: the background components that meet the frame's edge (``frame``:
    :func:`_frame_ring`) in one stretch of at most ``bay_edge`` of its length, the subject on
    both sides of it, other than the one that meets it longest (the backdrop): bays the frame cut
    into the subject, such as the cheek of a face cut by the frame's side. :func:`fill_holes`
    treats them as holes."""
    starts = frame != xp.roll(frame, 1)  # where a stretch of one label along the edge begins
    stretches = xp.bincount(frame[starts], minlength=n + 1)
    contact = xp.bincount(frame, minlength=n + 1)
    contact[0] = 0  # the subject
    bay = (stretches == 1) & (contact > 0) & (contact <= cfg.bay_edge * frame.shape[0])
    bay[0] = False
    bay[int(xp.argmax(contact))] = False  # the backdrop stays outside
    return bay


def drop_leaks(hard: Array, prob: Array, image: Array, cfg: MaskPostprocess, ops: ArrayOps) -> Array:
    """``hard`` without the pixels the model was unsure of (``prob < leak_prob``) whose colour is
    within ``leak_delta_e`` of the background just around the subject: a patch of backdrop the
    model took for product (the dark blob between skimage's coins)."""
    xp = ops.xp
    unsure = hard & (prob < xp.float32(cfg.leak_prob))
    if not bool(unsure.any()):
        return hard
    h, w = hard.shape[:2]
    st = max(1, math.ceil(math.sqrt(h * w / 500_000)))
    hard_s = hard[::st, ::st]
    rgb_s = image[::st, ::st, :3].astype(xp.float64) if image.ndim == 3 else xp.repeat(
        image[::st, ::st, None].astype(xp.float64), 3, axis=2)
    radius = max(1.0, cfg.ring * math.hypot(h, w) / st)
    ring = (~hard_s) & (ops.distance_to(hard_s) <= radius)
    ring_n = xp.sum(ring)
    if int(ring_n) == 0:
        return hard
    ring_mean = xp.stack([xp.sum(xp.where(ring, rgb_s[..., c], 0.0)) for c in range(3)]) / ring_n
    ys, xs = xp.nonzero(unsure)
    rgb = image[ys, xs, :3].astype(xp.float64) if image.ndim == 3 else xp.repeat(
        image[ys, xs, None].astype(xp.float64), 3, axis=1)
    delta = xp.sqrt(((srgb_to_lab(xp, rgb) - srgb_to_lab(xp, ring_mean)[None, :]) ** 2).sum(axis=1))
    leak = delta < cfg.leak_delta_e
    out = hard.copy()
    out[ys[leak], xs[leak]] = False
    return out


def matte_alpha(prob: Array, hard: Array, image: Array, cfg: MaskPostprocess, ops: ArrayOps) -> Array:
    """``(H, W)`` uint8 alpha: the colour-guided matte of ``hard`` in the trimap's unknown band
    (see :class:`MaskPostprocess`), ``hard`` elsewhere."""
    xp = ops.xp
    h, w = hard.shape[:2]
    band = max(2, round(cfg.matte_band * math.hypot(h, w)))
    rows, cols = xp.nonzero(hard.any(axis=1))[0], xp.nonzero(hard.any(axis=0))[0]
    if int(rows.size) == 0:
        return xp.zeros((h, w), dtype=xp.uint8)
    # Far from the outline the alpha is the hard mask: only the subject's box is matted, with a
    # margin that holds the unknown band (3 band), the guided filter's two windows and its blocks
    # (the block grid kept on the image's), and the feather; the same values as the whole frame.
    s = matte_block(band)
    windows = max(2 * max(1, round(band / s)), _colour_radius(band, s, cfg) if cfg.matte_colour else 0)
    m = 3 * band + (windows + 2) * s + math.ceil(4 * max(cfg.feather_px, 0.5)) + 2
    y0, y1 = max(0, int(rows[0]) - m) // s * s, min(h, int(rows[-1]) + m + 1)
    x0, x1 = max(0, int(cols[0]) - m) // s * s, min(w, int(cols[-1]) + m + 1)
    if (y0, x0, y1, x1) == (0, 0, h, w):
        return _matte_box(prob, hard, image, band, cfg, ops)
    out = hard.astype(xp.uint8) * xp.uint8(255)
    out[y0:y1, x0:x1] = _matte_box(prob[y0:y1, x0:x1], hard[y0:y1, x0:x1], image[y0:y1, x0:x1], band, cfg, ops)
    return out


def erode_near_outline(mask: Array, radius: int, ops: ArrayOps, tile: int = 128) -> Array:
    """``ops.erode(mask, radius)``, the same values, filtered only where it can change ``mask``:
    on the ``tile`` squares that hold a foreground pixel and a background pixel within
    ``radius`` (each with a ``radius`` halo); every other square is ``mask`` itself. A thin
    outline in a large frame then costs its own area. On the device the frame is eroded whole
    (one filter call instead of a host read and a launch per tile)."""
    xp = ops.xp
    h, w = mask.shape[:2]
    nty, ntx = -(-h // tile), -(-w // tile)
    if radius <= 0 or nty * ntx <= 4 or ops.device == "gpu":
        return ops.erode(mask, radius)
    padded = xp.pad(mask, ((0, nty * tile - h), (0, ntx * tile - w)), constant_values=True)
    blocks = padded.reshape(nty, tile, ntx, tile)
    has_fg, has_bg = blocks.any(axis=(1, 3)), ~blocks.all(axis=(1, 3))
    k = -(-radius // tile)
    grown = xp.pad(has_bg, k)
    bg_near = xp.zeros_like(has_bg)
    for dy in range(2 * k + 1):
        for dx in range(2 * k + 1):
            bg_near |= grown[dy:dy + nty, dx:dx + ntx]
    todo = xp.nonzero((has_fg & bg_near).ravel())[0].tolist()
    if len(todo) * ((tile + 2 * radius) / tile) ** 2 > 0.8 * nty * ntx:  # halos cost more than the frame
        return ops.erode(mask, radius)
    out = mask.copy()
    for t in todo:
        ty, tx = divmod(int(t), ntx)
        cy0, cx0, cy1, cx1 = ty * tile, tx * tile, min(h, (ty + 1) * tile), min(w, (tx + 1) * tile)
        y0, x0 = max(0, cy0 - radius), max(0, cx0 - radius)
        y1, x1 = min(h, cy1 + radius), min(w, cx1 + radius)
        out[cy0:cy1, cx0:cx1] = ops.erode(mask[y0:y1, x0:x1], radius)[cy0 - y0:cy1 - y0, cx0 - x0:cx1 - x0]
    return out


def _matte_box(prob: Array, hard: Array, image: Array, band: int, cfg: MaskPostprocess, ops: ArrayOps) -> Array:
    """:func:`matte_alpha` on a box holding the whole outline (``band`` from the whole frame)."""
    xp = ops.xp
    h, w = hard.shape[:2]
    outer = ~erode_near_outline(~hard, band, ops)
    unknown = outer & ~erode_near_outline(hard, band, ops)
    lo, hi = cfg.matte_unsure
    # within three bands of the subject: one distance transform, where an erosion by a disk of
    # that radius cost ~5x more on a large frame (the band is ~12 px at 4 MP, the disk 71 px wide)
    near = ops.distance_to(hard) <= xp.float32(3 * band)
    unknown |= near & (prob > xp.float32(lo)) & (prob < xp.float32(hi))
    rgb = image[..., :3] if image.ndim == 3 and image.shape[2] >= 3 else xp.repeat(
        image.reshape(h, w, 1), 3, axis=2)
    alpha = matte_band(xp, rgb, hard, unknown, band, cfg.matte_eps)
    if cfg.matte_colour:
        ys, xs = xp.nonzero(_colour_gate(xp, prob, hard, unknown, cfg))
        if int(ys.size):
            s = matte_block(band)
            means = [box_blur(xp, xp.ascontiguousarray(p), _colour_radius(band, s, cfg))
                     for p in colour_line_planes(xp, rgb, hard, unknown, s)]
            by, bx = xp.minimum(ys // s, means[0].shape[0] - 1), xp.minimum(xs // s, means[0].shape[1] - 1)
            pix = rgb[ys, xs].astype(xp.float32)  # (n, 3): one gather
            alpha[ys, xs] = colour_line_alpha(
                xp, [pix[:, c] for c in range(3)], [m[by, bx] for m in means],
                alpha[ys, xs], cfg.matte_colour_sep, cfg.matte_colour_fit, cfg.matte_colour_snap)
    # outside the hard mask only where the model gave the pixel a chance (fur, a soft rim):
    # elsewhere the backdrop's texture would leave a speckled fringe on a white canvas
    outside_ok = (prob >= xp.float32(cfg.matte_outside)) & (alpha >= xp.float32(cfg.matte_outside))
    # below one half outside it: the cut-out's outline (alpha >= 128) stays the hard mask's
    alpha = xp.where(hard, alpha, xp.where(outside_ok, xp.minimum(alpha, xp.float32(127 / 255)), xp.float32(0)))
    # inside it, never below the feathered mask: a highlight near the outline is no hole
    floor = ops.blur(hard.astype(xp.float32), max(cfg.feather_px, 0.5))
    alpha = xp.where(hard, xp.maximum(alpha, floor), alpha)
    return xp.rint(alpha * xp.float32(255)).astype(xp.uint8)


def _colour_gate(xp: Any, prob: Array, hard: Array, unknown: Array, cfg: MaskPostprocess) -> Array:
    """Where the colour line may set alpha: the band's pixels the model is unsure of, outside the
    hard mask only from ``matte_colour_outside`` up (not JPEG ringing beside a hard edge)."""
    lo, hi = cfg.matte_unsure
    gate = unknown & (prob > xp.float32(lo)) & (prob < xp.float32(hi))
    gate &= hard | (prob >= xp.float32(cfg.matte_colour_outside))
    return gate


def _colour_radius(band: int, s: int, cfg: MaskPostprocess) -> int:
    """The colour line's window radius in ``s``-pixel blocks."""
    return max(1, round(cfg.matte_colour_reach * band / s))


def alpha_from_probability(prob: Array, cfg: MaskPostprocess, ops: ArrayOps, image: Array | None = None) -> Array:
    """``(H, W)`` float32 probability in [0, 1] -> ``(H, W)`` uint8 alpha (0 bg, 255 subject).

    ``image``: the photo ``(H, W, 3|4)`` uint8 (same device) for the guided edge and the hole
    colours; without it those steps are skipped.
    """
    xp = ops.xp
    if image is not None and cfg.guide_sigma > 0:
        prob = guided_probability(prob, image, cfg, ops)
    hard = prob >= cfg.threshold
    if image is not None and cfg.leak_prob > cfg.threshold:
        hard = drop_leaks(hard, prob, image, cfg, ops)
    found: list[tuple[Array, int] | None] = []

    def likeness() -> tuple[Array, int] | None:  # computed once, when a rule first needs it
        if not found:
            found.append(None if image is None else backdrop_likeness(prob, image, cfg, ops))
        return found[0]

    if image is not None and cfg.backdrop_delta_e > 0 and bool(hard.any()):
        hard = drop_backdrop_regions(hard, prob, likeness, cfg, ops)
    if image is not None and cfg.grow_prob < cfg.threshold and bool(hard.any()):
        hard = grow_unsure(hard, prob, image, likeness, cfg, ops)
    if cfg.min_component > 0:
        kept = drop_islands(hard, cfg, ops) if cfg.far_component > 0 else ops.keep_large_components(
            hard, cfg.min_component)
        hard = keep_items(hard, kept, prob, likeness, cfg, ops) if image is not None else kept
    if image is not None and cfg.clutter_delta_e > 0:
        hard = drop_edge_clutter(hard, image, cfg, ops)
    if cfg.speck_hole > 0 or (cfg.max_hole > 0 and image is not None):
        hard = fill_holes(hard, image, cfg, ops, prob)
    if cfg.matte and image is not None and image.shape[:2] == hard.shape[:2]:
        return matte_alpha(prob, hard, image, cfg, ops)
    if cfg.feather_px <= 0:
        return ops.erode(hard, cfg.erode_px).astype(xp.uint8) * xp.uint8(255)
    core = ops.erode(hard, cfg.erode_px).astype(xp.float32)
    soft = xp.minimum(ops.blur(core, cfg.feather_px), hard.astype(xp.float32))
    return xp.rint(soft * 255.0).astype(xp.uint8)
