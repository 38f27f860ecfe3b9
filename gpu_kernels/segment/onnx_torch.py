"""An ONNX segmentation model as a PyTorch module: its nodes run as ``torch.nn.functional`` calls.

:func:`load_onnx_module` reads an ONNX file (the same checksum-verified u2netp the ONNX Runtime
runner uses) and returns an :class:`OnnxGraphModule`: the graph's initializers become the
module's parameters and its nodes a fixed program of PyTorch calls. Only the nodes the chosen
output needs are kept (u2netp's six side outputs are dropped).

Shape arithmetic stays in Python. u2netp computes every ``Resize`` target from
``Shape``/``Gather``/``Unsqueeze``/``Concat``/``Slice``/``Cast`` nodes; here those nodes work on
Python ints taken from ``tensor.shape``, never on device tensors, so a forward pass makes no
host-device round trip: it can be captured in a CUDA graph and traced by ``torch.compile``
whole, and it takes any batch size even when the file declares a fixed batch of 1.

Supported operators (what u2netp and similar fully-convolutional models use): Conv, Relu,
Sigmoid, MaxPool, AveragePool, Resize (linear/nearest), Concat, Add, Sub, Mul, Div, Clip,
BatchNormalization, and the shape operators above with Constant. Any other operator raises
:class:`~schemas.errors.ProcessingFailed` naming it, at load time, so a runtime choice can skip
this runtime for that model instead of failing on the first image. Requires ``torch`` (the
``[torch]`` extra) and ``onnx``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from schemas.errors import ProcessingFailed

__all__ = ["SUPPORTED_OPS", "import_torch", "load_onnx_module"]

STAGE = "segment"
TENSOR_OPS = frozenset({"Conv", "Relu", "Sigmoid", "MaxPool", "AveragePool", "Resize", "Concat", "Add", "Sub",
                        "Mul", "Div", "Clip", "BatchNormalization"})
SHAPE_OPS = frozenset({"Shape", "Gather", "Unsqueeze", "Slice", "Cast", "Constant", "Concat"})
SUPPORTED_OPS = TENSOR_OPS | SHAPE_OPS


def import_torch() -> Any:
    """``torch``, first imported with idle OpenMP threads set to sleep (``OMP_WAIT_POLICY=PASSIVE``
    unless the environment sets it; OpenMP reads it once, when torch loads). Spinning threads
    cost a machine shared with other work several times the model's CPU time
    (``gpu_kernels.segment.torch_runner``)."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    import torch

    return torch


@dataclass(frozen=True, slots=True)
class _Step:
    op: str
    inputs: tuple[str, ...]
    output: str
    fn: Callable[..., Any]


def _attrs(node: Any) -> dict[str, Any]:
    import onnx

    out: dict[str, Any] = {}
    for a in node.attribute:
        v = onnx.helper.get_attribute_value(a)
        out[a.name] = v.decode() if isinstance(v, bytes) else v
    return out


def _refuse(node: Any, why: str) -> ProcessingFailed:
    return ProcessingFailed(f"the torch runtime cannot run ONNX node {node.name or node.op_type} "
                            f"({node.op_type}): {why}", stage=STAGE)


def _symmetric_pads(node: Any, pads: Sequence[int]) -> tuple[int, int]:
    if len(pads) != 4 or pads[0] != pads[2] or pads[1] != pads[3]:
        raise _refuse(node, f"only symmetric 2-D padding is supported, got pads={list(pads)}")
    return int(pads[0]), int(pads[1])


def _as_shape_value(a: np.ndarray) -> Any:
    """A constant used in shape arithmetic: an int (0-d) or a list of ints; floats stay lists."""
    return a.item() if a.ndim == 0 else a.tolist()


def _module_class() -> type:
    import_torch()
    import torch

    class OnnxGraphModule(torch.nn.Module):  # type: ignore[misc,unused-ignore]
        """``forward(x)`` runs the program on the NCHW float batch ``x`` and returns the output."""

        def __init__(self, input_name: str, output_name: str, steps: list[_Step],
                     params: dict[str, np.ndarray], constants: dict[str, Any]) -> None:
            super().__init__()
            self.input_name, self.output_name = input_name, output_name
            self.steps = steps
            self.constants = constants
            self.names: dict[str, str] = {}  # ONNX initializer name -> parameter attribute
            for k, (name, value) in enumerate(sorted(params.items())):
                attr = f"p{k}"
                self.register_parameter(attr, torch.nn.Parameter(torch.from_numpy(value.copy()),
                                                                 requires_grad=False))
                self.names[name] = attr

        def forward(self, x: Any) -> Any:
            env: dict[str, Any] = dict(self.constants)
            for name, attr in self.names.items():
                env[name] = getattr(self, attr)
            env[self.input_name] = x
            for step in self.steps:
                env[step.output] = step.fn(*[env.get(i) for i in step.inputs])
            return env[self.output_name]

    return OnnxGraphModule


def load_onnx_module(path: Path | str, output_index: int = 0) -> Any:
    """The ONNX model at ``path`` as a ``torch.nn.Module`` in eval mode on the CPU (float32).

    ``output_index``: which graph output ``forward`` returns. Raises ProcessingFailed for a file
    that does not load, an unsupported operator or attribute, or a missing output.
    """
    import onnx
    from onnx import numpy_helper

    try:
        model = onnx.load(str(path))
    except Exception as exc:  # a truncated or foreign file: onnx raises DecodeError and others
        raise ProcessingFailed(f"cannot read ONNX model {str(path)!r}: {exc}", stage=STAGE) from exc
    graph = model.graph
    inits = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    inputs = [v.name for v in graph.input if v.name not in inits]
    if not inputs:
        raise ProcessingFailed(f"model {Path(path).name}: no graph input", stage=STAGE)
    if output_index >= len(graph.output):
        raise ProcessingFailed(f"model {Path(path).name}: output_index {output_index} but the model has "
                               f"{len(graph.output)} outputs", stage=STAGE)
    output = graph.output[output_index].name
    producers = {o: n for n in graph.node for o in n.output}
    needed: set[str] = set()
    todo = [output]
    while todo:  # keep only what the chosen output depends on
        name = todo.pop()
        if name in needed:
            continue
        needed.add(name)
        if name in producers:
            todo.extend(i for i in producers[name].input if i)
    nodes = [n for n in graph.node if any(o in needed for o in n.output)]
    unsupported = sorted({n.op_type for n in nodes} - SUPPORTED_OPS)
    if unsupported:
        raise ProcessingFailed(f"model {Path(path).name}: the torch runtime does not support ONNX operator(s) "
                               f"{unsupported}", stage=STAGE)
    shape_valued: set[str] = set()  # values that are Python ints/lists, not tensors
    constants: dict[str, Any] = {}
    steps: list[_Step] = []
    for node in nodes:
        step = _convert(node, _attrs(node), inits, shape_valued, constants)
        if step is not None:
            steps.append(step)
    params = {k: v for k, v in inits.items() if k in needed and k not in shape_valued and v.dtype.kind == "f"}
    for k, v in inits.items():  # integer initializers feed shape arithmetic
        if k in needed and k not in params:
            constants[k] = _as_shape_value(v)
    module = _module_class()(inputs[0], output, steps, {k: v.astype(np.float32) for k, v in params.items()},
                             constants)
    module.eval()
    return module


def _convert(node: Any, attrs: dict[str, Any], inits: dict[str, np.ndarray], shape_valued: set[str],
             constants: dict[str, Any]) -> _Step | None:
    torch = import_torch()
    import torch.nn.functional as F

    op, ins, out = node.op_type, tuple(node.input), node.output[0]
    is_shape = bool(ins) and all(i in shape_valued or (i in inits and inits[i].dtype.kind in "iu") for i in ins if i)

    def step(fn: Callable[..., Any], inputs: tuple[str, ...] = ins) -> _Step:
        return _Step(op, inputs, out, fn)

    if op == "Constant":
        value = attrs.get("value")
        if value is None:
            raise _refuse(node, "only tensor-valued Constant nodes are supported")
        from onnx import numpy_helper

        arr = numpy_helper.to_array(value)
        if arr.dtype.kind in "iu" or arr.size == 0:  # shape arithmetic, or an absent scales/roi
            constants[out] = _as_shape_value(arr)
            shape_valued.add(out)
        else:  # a float tensor: kept as a parameter (it moves with the module)
            inits[out] = arr
        return None
    if op == "Shape":
        shape_valued.add(out)
        return step(lambda x: list(x.shape))
    if op in ("Gather", "Unsqueeze", "Slice", "Cast") or (op == "Concat" and is_shape):
        if not is_shape:
            raise _refuse(node, "only shape arithmetic (on Shape outputs and integer constants) is supported")
        shape_valued.add(out)
        return _shape_step(node, attrs, ins, out)
    if op == "Conv":
        if attrs.get("auto_pad", "NOTSET") != "NOTSET":
            raise _refuse(node, "auto_pad is not supported")
        pad = _symmetric_pads(node, attrs.get("pads", [0, 0, 0, 0]))
        stride, dil, groups = tuple(attrs.get("strides", [1, 1])), tuple(attrs.get("dilations", [1, 1])), \
            int(attrs.get("group", 1))
        if len(ins) > 2 and ins[2]:
            return step(lambda x, w, b: F.conv2d(x, w, b, stride, pad, dil, groups))
        return step(lambda x, w: F.conv2d(x, w, None, stride, pad, dil, groups), ins[:2])
    if op in ("MaxPool", "AveragePool"):
        if attrs.get("auto_pad", "NOTSET") != "NOTSET" or attrs.get("storage_order", 0):
            raise _refuse(node, "auto_pad / storage_order are not supported")
        kernel = tuple(attrs["kernel_shape"])
        stride = tuple(attrs.get("strides", [1] * len(kernel)))
        pad = _symmetric_pads(node, attrs.get("pads", [0, 0, 0, 0]))
        ceil = bool(attrs.get("ceil_mode", 0))
        if op == "MaxPool":
            dil = tuple(attrs.get("dilations", [1, 1]))
            return step(lambda x: F.max_pool2d(x, kernel, stride, pad, dil, ceil), ins[:1])
        include = bool(attrs.get("count_include_pad", 0))
        return step(lambda x: F.avg_pool2d(x, kernel, stride, pad, ceil, include), ins[:1])
    if op == "Resize":
        return _resize_step(node, attrs, ins, out)
    if op == "Concat":
        axis = int(attrs["axis"])
        return step(lambda *xs: torch.cat(xs, dim=axis))
    simple: dict[str, Callable[..., Any]] = {
        "Relu": F.relu, "Sigmoid": torch.sigmoid, "Add": torch.add, "Sub": torch.sub, "Mul": torch.mul,
        "Div": torch.div,
    }
    if op in simple:
        return step(simple[op])
    if op == "Clip":
        bounds = [inits[i].item() if i in inits else None for i in (*ins[1:3], "", "")[:2]]
        lo, hi = attrs.get("min", bounds[0]), attrs.get("max", bounds[1])
        return step(lambda x: torch.clamp(x, lo, hi), ins[:1])
    if op == "BatchNormalization":
        eps = float(attrs.get("epsilon", 1e-5))
        return step(lambda x, s, b, m, v: F.batch_norm(x, m, v, s, b, False, 0.0, eps))
    raise _refuse(node, "unsupported operator")


def _shape_step(node: Any, attrs: dict[str, Any], ins: tuple[str, ...], out: str) -> _Step:
    op = node.op_type
    if op == "Cast":
        return _Step(op, ins[:1], out, lambda v: v)
    if op == "Gather":
        if int(attrs.get("axis", 0)) != 0:
            raise _refuse(node, "Gather on shapes only along axis 0")

        def gather(data: list[int], idx: Any) -> Any:
            return [data[int(i)] for i in idx] if isinstance(idx, list) else data[int(idx)]

        return _Step(op, ins[:2], out, gather)
    if op == "Unsqueeze":
        axes = attrs.get("axes")
        if axes is not None and list(axes) != [0]:
            raise _refuse(node, "Unsqueeze on shapes only along axis 0")
        def unsqueeze(v: Any) -> list[Any]:
            if isinstance(v, list):
                raise ProcessingFailed("the torch runtime unsqueezes only scalar shape values", stage=STAGE)
            return [v]

        return _Step(op, ins[:1], out, unsqueeze)
    if op == "Concat":
        return _Step(op, ins, out, lambda *vs: [x for v in vs for x in (v if isinstance(v, list) else [v])])
    if op == "Slice":
        def slice_(data: list[int], starts: list[int], ends: list[int], axes: list[int] | None = None,
                   steps: list[int] | None = None) -> list[int]:
            if axes is not None and list(axes) != [0]:
                raise ProcessingFailed("the torch runtime slices shapes only along axis 0", stage=STAGE)
            end = ends[0] if ends[0] < 2**62 else None
            return data[starts[0]:end:(steps[0] if steps else 1)]

        return _Step(op, ins, out, slice_)
    raise _refuse(node, "unsupported shape operator")


def _resize_step(node: Any, attrs: dict[str, Any], ins: tuple[str, ...], out: str) -> _Step:
    import torch.nn.functional as F

    mode = attrs.get("mode", "nearest")
    ctm = attrs.get("coordinate_transformation_mode", "half_pixel")
    if mode == "linear":
        if ctm not in ("half_pixel", "pytorch_half_pixel", "align_corners"):
            raise _refuse(node, f"linear Resize with coordinate_transformation_mode={ctm!r}")
        kwargs: dict[str, Any] = {"mode": "bilinear", "align_corners": ctm == "align_corners"}
    elif mode == "nearest":
        if ctm != "asymmetric" or attrs.get("nearest_mode", "round_prefer_floor") != "floor":
            raise _refuse(node, "nearest Resize is supported only with asymmetric coordinates and floor")
        kwargs = {"mode": "nearest"}
    else:
        raise _refuse(node, f"Resize mode {mode!r}")

    def resize(x: Any, roi: Any = None, scales: Any = None, sizes: Any = None) -> Any:
        if sizes:
            return F.interpolate(x, size=(int(sizes[2]), int(sizes[3])), **kwargs)
        if scales:
            return F.interpolate(x, scale_factor=(float(scales[2]), float(scales[3])), **kwargs)
        raise ProcessingFailed("Resize without scales or sizes", stage=STAGE)

    padded = (*ins, "", "", "")[:4]
    return _Step("Resize", padded, out, resize)
