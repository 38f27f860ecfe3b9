"""The mask refinement of a whole batch on the device: :func:`alpha_from_probability` for each
image, the same values, in a few hundred array calls per batch and three host reads.

:func:`~gpu_kernels.segment.postprocess.alpha_from_probability` is written for one image and
takes data-dependent turns (is there a thick unsure region? more than one component? an
enclosed hole?), each a host read, and on a GPU each array call is a launch from the one
device thread: a few hundred launches and a dozen waits per image. Here images of one size are
stacked ``(B, H, W)`` and run as one:

* the guided edge, over the stack (batched resampling products, blurs with no smoothing across
  the stack);
* islands and holes from one labelling each of all the batch's masks (padded to one size, a
  structuring element of one plane: no component crosses images; per-label sums by ``add.at``,
  per-image values by a label-to-image map, no host read): specks dropped and filled as the
  per-image rules would;
* what only the per-image rules can decide is *flagged*, per image: a thick unsure part with a
  thick part within the rule's ΔE of the local backdrop (backdrop between items?), a thick part
  the model half sees (a part to grow into?), an island
  between the two size limits (how near the largest is it?), a dropped island the model is sure
  of and not tiny (an item?), more than one component left (clutter at the frame's edge?), a
  hole between the speck and the largest size (its colour);
* the matte over each whole frame (the unknown band by stacked erosions, "near the subject" by
  one distance transform of the images laid out with gaps wider than the reach, the guided
  filter and the colour line evaluated everywhere and kept in the band with ``where``): the same
  values as the per-image matte on the subject's box, whose margin holds every window;
* the flags come back in one read; an image whose flag is set (a multi-item shot, a large
  island or hole) is refined again on its own by :func:`alpha_from_probability`, so every image
  gets the per-image result. (Of nine of scikit-image's colour photos with u2netp,
  four were flagged: backdrop between items, a second large component, a larger hole.)

The host reads per batch: the two labellings' counts and the flags. A stack holds at most
:data:`STACK_PIXELS` pixels (more images of one size make several stacks, still labelled and
flagged together), which bounds the matte's device memory (about two dozen float32 copies of a
stack at once, most of them the colour line's, 6 GiB for a full stack).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from gpu_kernels.array import Array
from gpu_kernels.retouch.color import srgb_to_lab
from gpu_kernels.retouch.matting import colour_line_alpha, colour_line_planes, guided_coefficients, matte_block
from gpu_kernels.segment.ops import ArrayOps, XpOps
from gpu_kernels.segment.postprocess import (
    MaskPostprocess,
    _colour_gate,
    _colour_radius,
    _grey,
    _opened,
    _stride,
    _thick_radius,
    alpha_from_probability,
)

__all__ = ["STACK_PIXELS", "alpha_batch", "batchable"]

STACK_PIXELS = 1 << 26  # pixels per stack at most (64 MP: 64 images of 1 MP, 16 of 4 MP): bounds device memory


def batchable(prob: Array, image: Array | None, cfg: MaskPostprocess) -> bool:
    """Whether :func:`alpha_batch` refines this pair in a stack (else on its own)."""
    return (image is not None and prob.ndim == 2 and image.ndim == 3 and image.shape[2] >= 3
            and image.shape[:2] == prob.shape and cfg.matte and cfg.leak_prob <= cfg.threshold)


def alpha_batch(probs: Sequence[Array], images: Sequence[Array | None], cfg: MaskPostprocess,
                ops: ArrayOps) -> list[Array]:
    """``[alpha_from_probability(p, cfg, ops, image) for p, image in zip(probs, images)]``, the
    same values; on a device backend (:class:`XpOps` on ``"gpu"``) images of one size are
    refined as one stack (see the module docstring), elsewhere one by one."""
    out: list[Array | None] = [None] * len(probs)
    if not (isinstance(ops, XpOps) and ops.device == "gpu"):
        return [alpha_from_probability(p, cfg, ops, im) for p, im in zip(probs, images, strict=True)]
    groups: dict[tuple[Any, ...], list[int]] = {}
    for i, (p, im) in enumerate(zip(probs, images, strict=True)):
        if im is not None and batchable(p, im, cfg):
            groups.setdefault((p.shape, im.shape, str(im.dtype)), []).append(i)
        else:
            out[i] = alpha_from_probability(p, cfg, ops, im)
    if groups:
        xp = ops.xp
        chunks = [members[c:c + depth] for members in groups.values()
                  for depth in [max(1, STACK_PIXELS // math.prod(probs[members[0]].shape))]
                  for c in range(0, len(members), depth)]
        stacks = [_Stack(xp.stack([probs[i] for i in members]), xp.stack([images[i] for i in members]), cfg, ops)
                  for members in chunks]
        need = _checks(stacks, cfg, ops)
        flags = ops.asnumpy(need).tolist()  # the one read of the flags
        k = 0
        for members, stack in zip(chunks, stacks, strict=True):
            alphas = stack.matte()
            for j, i in enumerate(members):
                out[i] = alpha_from_probability(probs[i], cfg, ops, images[i]) if flags[k + j] else alphas[j]
            k += len(members)
    return [a for a in out if a is not None]


class _Stack:
    """One size's images: the guided probability and the hard mask, stacked."""

    def __init__(self, probs: Array, images: Array, cfg: MaskPostprocess, ops: XpOps) -> None:
        self.cfg, self.ops, self.images = cfg, ops, images
        self.prob = _guided(probs, images, cfg, ops) if cfg.guide_sigma > 0 else probs
        self.hard = self.prob >= cfg.threshold

    def backdrop_flags(self) -> Array:
        """Per image: the backdrop rule could drop a region (a thick enough unsure part, and a
        thick part of it within the rule's ΔE of the backdrop's local colour)."""
        cfg, ops, xp = self.cfg, self.ops, self.ops.xp
        _, h, w = self.hard.shape
        st = _stride(h, w)
        unsure = self.hard[:, ::st, ::st] & (self.prob[:, ::st, ::st] < xp.float32(cfg.backdrop_unsure))
        r = _thick_radius(cfg, *unsure.shape[1:3])
        thick = _opened(ops.erode_masks, unsure, r).sum(axis=(1, 2))
        flags = self.hard.any(axis=(1, 2)) & (thick.astype(xp.float64) * (st * st) >= cfg.backdrop_min * h * w)
        # then, as the rule goes on: no backdrop to compare with, or no thick backdrop-like part
        delta, known = self._likeness(st)
        cand = unsure & (delta < xp.float32(cfg.backdrop_delta_e))
        return flags & known & _opened(ops.erode_masks, cand, r).any(axis=(1, 2))

    def grow_flags(self) -> Array:
        """Per image: the grow rule could add a part (the half-seen pixels have a thick part as
        large as the rule asks; the rule itself then looks at colour and contact)."""
        cfg, ops, xp = self.cfg, self.ops, self.ops.xp
        _, h, w = self.hard.shape
        st = _stride(h, w)
        weak = ~self.hard[:, ::st, ::st] & (self.prob[:, ::st, ::st] >= xp.float32(cfg.grow_prob))
        r = _thick_radius(cfg, *weak.shape[1:3])
        thick = _opened(ops.erode_masks, weak, r).sum(axis=(1, 2))
        return self.hard.any(axis=(1, 2)) & (thick.astype(xp.float64) >= cfg.grow_min * h * w / (st * st))

    def _likeness(self, st: int) -> tuple[Array, Array]:
        """:func:`~gpu_kernels.segment.postprocess.backdrop_likeness` of each slice: ``(ΔE, known)``
        with ``known`` False where that returns None (the model calls almost nothing background)."""
        cfg, ops, xp = self.cfg, self.ops, self.ops.xp
        p = self.prob[:, ::st, ::st]
        rgb = self.images[:, ::st, ::st, :3]
        n, hs, ws = p.shape
        flat = rgb.reshape(-1, 3)
        lab = srgb_to_lab(xp, flat.astype(xp.float64), levels=flat if flat.dtype == xp.uint8 else None)
        lab = lab.reshape(n, hs, ws, 3).astype(xp.float32)
        bg = (p < xp.float32(cfg.backdrop_prob)).astype(xp.float32)
        mean = bg.sum(axis=(1, 2)) / xp.float32(hs * ws)  # counts are exact: the slice's float32 mean
        known = mean.astype(xp.float64) >= 0.02
        sigma = max(1.0, cfg.backdrop_sigma * math.hypot(hs, ws))
        f = max(1.0, sigma / 3.0)
        sh, sw = max(1, round(hs / f)), max(1, round(ws / f))
        planes = [bg, *(lab[..., c] * bg for c in range(3))]
        small = [ops.blur_maps(ops.resize_maps(a, sh, sw), sigma / f) for a in planes]
        den = ops.resize_maps(small[0], hs, ws)
        local = xp.stack([ops.resize_maps(a, hs, ws) for a in small[1:]], axis=-1)
        local /= xp.maximum(den, xp.float32(1e-4))[..., None]
        far = den < xp.float32(1e-3)
        delta = xp.sqrt(((lab - local) ** 2).sum(axis=-1))
        return xp.where(far, xp.float32(1e3), delta), known

    def matte(self) -> Array:
        """``(B, H, W)`` uint8: :func:`~gpu_kernels.segment.postprocess.matte_alpha` of each image."""
        cfg, ops, xp = self.cfg, self.ops, self.ops.xp
        prob, hard = self.prob, self.hard
        _, h, w = hard.shape
        band = max(2, round(cfg.matte_band * math.hypot(h, w)))
        outer = ~ops.erode_masks(~hard, band)
        unknown = outer & ~ops.erode_masks(hard, band)
        lo, hi = cfg.matte_unsure
        unknown |= _near(hard, 3 * band, ops) & (prob > xp.float32(lo)) & (prob < xp.float32(hi))
        alpha = _matte_band(ops, self.images[..., :3], hard, unknown, band, cfg.matte_eps)
        if cfg.matte_colour:
            alpha = xp.where(_colour_gate(xp, prob, hard, unknown, cfg),
                             _colour_line(ops, self.images[..., :3], hard, unknown, alpha, band, cfg), alpha)
        outside_ok = (prob >= xp.float32(cfg.matte_outside)) & (alpha >= xp.float32(cfg.matte_outside))
        alpha = xp.where(hard, alpha, xp.where(outside_ok, xp.minimum(alpha, xp.float32(127 / 255)), xp.float32(0)))
        floor = ops.blur_maps(hard.astype(xp.float32), max(cfg.feather_px, 0.5))
        alpha = xp.where(hard, xp.maximum(alpha, floor), alpha)
        return xp.rint(alpha * xp.float32(255)).astype(xp.uint8)


def _checks(stacks: list[_Stack], cfg: MaskPostprocess, ops: XpOps) -> Array:
    """``(N,)`` bool over the stacks' images in order: the image needs the per-image refinement
    (a rule would do more than drop specks). The specks themselves are dealt with here, as the
    per-image rules would: islands small beside their image's largest component dropped, holes
    small beside its subject filled; each stack's ``hard`` is left as those rules leave it."""
    xp = ops.xp
    total = sum(int(s.hard.shape[0]) for s in stacks)
    need = xp.concatenate([s.backdrop_flags() for s in stacks]) if cfg.backdrop_delta_e > 0 else xp.zeros(
        total, dtype=bool)
    if cfg.grow_prob < cfg.threshold:
        need |= xp.concatenate([s.grow_flags() for s in stacks])
    sizes = [tuple(int(v) for v in s.hard.shape) for s in stacks]
    hh, ww = max(b[1] for b in sizes), max(b[2] for b in sizes)
    frame = xp.asarray(np.repeat([float(h * w) for b, h, w in sizes], [b for b, _, _ in sizes]))  # pixels per image
    hard = _padded([s.hard for s in stacks], hh, ww, ops)
    if cfg.min_component > 0 or cfg.clutter_delta_e > 0:
        labels, n = ops.label_masks(hard, 8)
        own, areas = _per_label(labels, n, total, ops)
        top = xp.where(own, areas[None, :], 0.0).max(axis=1)  # each image's largest component
        if cfg.min_component > 0 and cfg.far_component > 0:  # drop_islands, keep_items
            big = (own * top[:, None]).sum(axis=0)  # per label: its image's largest
            large, far_enough = areas >= cfg.min_component * big, areas >= cfg.far_component * big
            keep = large & far_enough
            keep[0] = False
            need |= (own & (large & ~far_enough)[None, :]).any(axis=1)  # how near the largest: per image
            if cfg.item_prob < 1.0:  # a dropped island the model is sure of and not tiny: an item?
                prob = _padded([s.prob for s in stacks], hh, ww, ops, dtype=xp.float32)
                psum = xp.zeros(n + 1, dtype=xp.float64)
                xp.add.at(psum, labels.ravel(), prob.ravel().astype(xp.float64))
                back = (psum / xp.maximum(areas, 1.0) >= cfg.item_prob) & ~keep
                back[0] = False
                need |= (own & back[None, :]).any(axis=1) & (own * areas[None, :] * back[None, :] >= (
                    cfg.item_min * frame)[:, None]).any(axis=1)
            hard = keep[labels]
            kept = (own & keep[None, :]).sum(axis=1)
        else:
            kept = (own & (areas > 0)[None, :]).sum(axis=1)
        if cfg.clutter_delta_e > 0 or not (cfg.min_component > 0 and cfg.far_component > 0):
            need |= kept > 1  # more than one component left: clutter at the frame's edge, or the other rule
    if cfg.speck_hole > 0 or cfg.max_hole > 0:  # fill_holes
        labels, n = ops.label_masks(~hard, 4)
        touches = xp.zeros(n + 1, dtype=bool)
        sides = []
        k = 0
        for b, h, w in sizes:
            part = labels[k:k + b]
            sides += [part[:, 0, :w], part[:, h - 1, :w], part[:, :h, 0], part[:, :h, w - 1]]
            k += b
        touches[xp.concatenate([v.ravel() for v in sides])] = True
        touches[0] = True  # the masks and the padding
        own, areas = _per_label(labels, n, total, ops)
        subject = xp.maximum(hard.sum(axis=(1, 2)).astype(xp.float64), 1.0)
        per_label = (own * subject[:, None]).sum(axis=0)
        fill = ~touches & (areas <= cfg.speck_hole * per_label)
        if cfg.max_hole > 0:  # a larger hole is filled when unlike the background: per image
            medium = ~touches & ~fill & (areas <= cfg.max_hole * per_label)
            need |= (own & medium[None, :]).any(axis=1)
            if cfg.bay_edge > 0:  # a bay may be filled: an image whose backdrop meets the frame in parts
                edge = touches.copy()
                edge[0] = False
                small = edge & (areas <= cfg.max_hole * per_label)
                need |= (own & small[None, :]).any(axis=1) & ((own & edge[None, :]).sum(axis=1) >= 2)
        fill[0] = False
        hard = hard | fill[labels]
    k = 0
    for stack, (b, h, w) in zip(stacks, sizes, strict=True):
        stack.hard = hard[k:k + b, :h, :w]
        k += b
    return need


def _per_label(labels: Array, n: int, images: int, ops: XpOps) -> tuple[Array, Array]:
    """``(own, areas)``: ``(images, n + 1)`` bool, label ``l`` is in image ``i``; ``(n + 1,)``
    float64 pixels per label (0 for the background label 0)."""
    xp = ops.xp
    image_of = xp.full(n + 1, -1, dtype=xp.int32)
    image_of[labels] = xp.arange(images, dtype=xp.int32)[:, None, None]
    image_of[0] = -1
    counts = xp.zeros(n + 1, dtype=xp.int32)  # int32: the atomic add every device has
    xp.add.at(counts, labels.ravel(), xp.int32(1))
    counts[0] = 0
    return image_of[None, :] == xp.arange(images, dtype=xp.int32)[:, None], counts.astype(xp.float64)


def _padded(masks: list[Array], hh: int, ww: int, ops: XpOps, dtype: Any = bool) -> Array:
    """The stacks' masks (or maps) in one ``(N, hh, ww)`` stack, False (0) where an image is smaller."""
    xp = ops.xp
    if all(m.shape[1:] == (hh, ww) for m in masks):
        return masks[0] if len(masks) == 1 else xp.concatenate(masks)
    out = xp.zeros((sum(int(m.shape[0]) for m in masks), hh, ww), dtype=dtype)
    k = 0
    for m in masks:
        out[k:k + m.shape[0], :m.shape[1], :m.shape[2]] = m
        k += int(m.shape[0])
    return out


def _guided(probs: Array, images: Array, cfg: MaskPostprocess, ops: XpOps) -> Array:
    """:func:`~gpu_kernels.segment.postprocess.guided_probability` of each slice."""
    xp = ops.xp
    _, h, w = probs.shape
    grey = _grey(xp, images[..., :3])
    p = probs.astype(xp.float32)
    s = max(1, min(4, int(cfg.guide_sigma // 1.5)))
    sh, sw = max(1, h // s), max(1, w // s)
    gi, gp = ops.resize_maps(grey, sh, sw), ops.resize_maps(p, sh, sw)
    sigma = cfg.guide_sigma / s
    mean_i, mean_p = ops.blur_maps(gi, sigma), ops.blur_maps(gp, sigma)
    cov = ops.blur_maps(gi * gp, sigma) - mean_i * mean_p
    var = ops.blur_maps(gi * gi, sigma) - mean_i * mean_i
    a = cov / (var + xp.float32(cfg.guide_eps))
    b = mean_p - a * mean_i
    q = ops.resize_maps(ops.blur_maps(a, sigma), h, w)
    q *= grey
    q += ops.resize_maps(ops.blur_maps(b, sigma), h, w)
    xp.clip(q, xp.float32(0), xp.float32(1), out=q)
    sure = xp.abs(p - xp.float32(0.5)) >= xp.float32(cfg.guide_band)
    return xp.where(sure, p, q)


def _near(hard: Array, reach: int, ops: XpOps) -> Array:
    """Per slice, ``distance_to(hard) <= reach``: one 2-D distance transform of the slices laid
    one under the other with ``2 reach + 3`` empty rows between them (a feature in the gap's
    middle row, ``reach + 2`` from each image, so no slice is ever without one): a pixel within
    ``reach`` of its own mask is nearer to it than to anything else, with the same distance."""
    xp = ops.xp
    b, h, w = hard.shape
    gap = 2 * reach + 3
    canvas = xp.zeros((b, h + gap, w), dtype=bool)
    canvas[:, :h] = hard
    canvas[:, h + reach + 1, 0] = True
    dist = ops.ndi.distance_transform_edt(~canvas.reshape(b * (h + gap), w)).astype(xp.float32)
    return dist.reshape(b, h + gap, w)[:, :h] <= xp.float32(reach)


def _shrink(xp: Any, a: Array, s: int, scale: Any = 1.0) -> Array:
    """:func:`gpu_kernels.retouch.matting._shrink` of each slice (the same sums in the same order)."""
    if s == 1:
        return a.astype(xp.float32) * xp.float32(scale)
    h, w = (a.shape[1] // s) * s, (a.shape[2] // s) * s
    total = None
    for i in range(s):
        for j in range(s):
            part = a[:, i:h:s, j:w:s].astype(xp.float32) * xp.float32(scale)
            total = part if total is None else total + part
    assert total is not None
    return (total / xp.float32(s * s)).astype(xp.float32)


def _colour_line(ops: XpOps, image: Array, hard: Array, unknown: Array, alpha: Array, band: int,
                 cfg: MaskPostprocess) -> Array:
    """:func:`gpu_kernels.retouch.matting.colour_line_alpha` at every pixel of each slice (the
    per-image refinement evaluates it at the gated band's pixels: the same arithmetic)."""
    xp = ops.xp
    s = matte_block(band)
    r = _colour_radius(band, s, cfg)
    means = [ops.box_means(p, r) for p in colour_line_planes(xp, image, hard, unknown, s)]
    _, h, w = hard.shape
    by = xp.minimum(xp.arange(h) // s, means[0].shape[1] - 1)[:, None]
    bx = xp.minimum(xp.arange(w) // s, means[0].shape[2] - 1)[None, :]
    return colour_line_alpha(xp, [image[..., c].astype(xp.float32) for c in range(3)],
                             [m[:, by, bx] for m in means], alpha, cfg.matte_colour_sep, cfg.matte_colour_fit,
                             cfg.matte_colour_snap)


def _matte_band(ops: XpOps, image: Array, hard: Array, unknown: Array, radius: int, eps: float,
                snap: float = 0.1) -> Array:
    """:func:`gpu_kernels.retouch.matting.matte_band` of each slice, the filter evaluated at every
    pixel and kept where ``unknown`` (the same arithmetic per pixel)."""
    xp = ops.xp
    s = matte_block(radius)
    r = max(1, round(radius / s))
    guide = _shrink(xp, image, s, xp.float32(1 / 255))
    p = _shrink(xp, hard, s)

    def mean(a: Array) -> Array:
        return ops.box_means(a, r)

    coef_s, b_s = guided_coefficients(xp, guide, p, mean, eps)
    _, h, w = hard.shape
    by = xp.minimum(xp.arange(h) // s, coef_s.shape[1] - 1)[:, None]
    bx = xp.minimum(xp.arange(w) // s, coef_s.shape[2] - 1)[None, :]
    guide_at = image.astype(xp.float32) * xp.float32(1 / 255)
    q = (coef_s[:, by, bx] * guide_at).sum(axis=-1) + b_s[:, by, bx]
    q = xp.clip(q, xp.float32(0), xp.float32(1)).astype(xp.float32)
    q = xp.where(q < xp.float32(snap), xp.float32(0), xp.where(q > xp.float32(1 - snap), xp.float32(1), q))
    return xp.where(unknown, q, hard.astype(xp.float32))
