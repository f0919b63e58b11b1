"""Run an ONNX graph with torch tensors, so autograd can see through it.

The sensitivity proxy needs the gradient of the model's output with respect to every quantized node's output.
ONNX Runtime has no backward pass for inference graphs, so this evaluates the graph node by node with torch ops
(eager, CPU, float32), for the operators that exported CNNs and transformers use. An operator outside that set
raises :class:`UnsupportedOpError`, and the caller falls back to what it can do without gradients.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from dopt_common.errors import DeployOptError

log = logging.getLogger(__name__)
NodeHook = Callable[[onnx.NodeProto, list[Any], list[Any]], list[Any] | None]


class UnsupportedOpError(DeployOptError):
    """The graph holds an operator this evaluator does not implement."""


def _attrs(node: onnx.NodeProto) -> dict[str, Any]:
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def _torch_dtype(onnx_type: int) -> Any:
    import torch

    return torch.from_numpy(np.zeros(0, dtype=onnx.helper.tensor_dtype_to_np_dtype(onnx_type))).dtype


def to_tensor(array: np.ndarray) -> Any:
    """A torch tensor of a numpy array (float64 becomes float32, as the graph computes in float32)."""
    import torch

    array = np.ascontiguousarray(array)
    return torch.from_numpy(array if array.flags.writeable else array.copy())


def _ints(value: Any) -> list[int]:
    return [int(v) for v in value.reshape(-1).tolist()]


def _axis_view(value: Any, axis: int, rank: int) -> Any:
    """A per-axis vector reshaped to broadcast along ``axis`` of a rank-``rank`` tensor."""
    if value.dim() == 0:
        return value
    shape = [1] * rank
    shape[axis % rank] = -1
    return value.reshape(shape)


def _quantize(x: Any, scale: Any, zero: Any = None, axis: int = 1, **_: Any) -> Any:
    import torch

    dtype = zero.dtype if zero is not None else torch.uint8
    info = torch.iinfo(dtype)
    zp = _axis_view(zero.float(), axis, x.dim()) if zero is not None else 0.0
    q = torch.round(x / _axis_view(scale, axis, x.dim())) + zp
    return q.clamp(info.min, info.max).to(dtype)


def _dequantize(x: Any, scale: Any, zero: Any = None, axis: int = 1, **_: Any) -> Any:
    zp = _axis_view(zero.float(), axis, x.dim()) if zero is not None else 0.0
    return (x.float() - zp) * _axis_view(scale, axis, x.dim())


def _reduce(kind: str) -> Callable[..., Any]:
    def run(x: Any, axes: Any = None, keepdims: int = 1, noop_with_empty_axes: int = 0, **attrs: Any) -> Any:
        dims = _ints(axes) if axes is not None else list(attrs.get("axes", []))
        if not dims:
            if noop_with_empty_axes:
                return x
            dims = list(range(x.dim()))
        keep = bool(keepdims)
        if kind == "sum":
            return x.sum(dim=dims, keepdim=keep)
        if kind == "mean":
            return x.mean(dim=dims, keepdim=keep)
        if kind == "l2":
            return (x * x).sum(dim=dims, keepdim=keep).sqrt()
        return x.amax(dim=dims, keepdim=keep)

    return run


def _slice(x: Any, starts: Any, ends: Any, axes: Any = None, steps: Any = None, **_: Any) -> Any:
    index = [slice(None)] * x.dim()
    starts, ends = _ints(starts), _ints(ends)
    axes_list = _ints(axes) if axes is not None else list(range(len(starts)))
    steps_list = _ints(steps) if steps is not None else [1] * len(starts)
    for start, end, axis, step in zip(starts, ends, axes_list, steps_list, strict=True):
        if step < 0:
            raise UnsupportedOpError(f"Slice with a negative step ({step}) is not supported by the torch evaluator")
        size = x.shape[axis]
        index[axis % x.dim()] = slice(max(-size, min(start, size)), max(-size - 1, min(end, size)), step)
    return x[tuple(index)]


def _reshape(x: Any, shape: Any, allowzero: int = 0, **_: Any) -> Any:
    dims = _ints(shape)
    if not allowzero:
        dims = [x.shape[i] if d == 0 else d for i, d in enumerate(dims)]
    return x.reshape(dims)


def _conv(x: Any, w: Any, b: Any = None, **a: Any) -> Any:
    import torch.nn.functional as F

    if a.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET", b"VALID", "VALID"):
        raise UnsupportedOpError(f"Conv auto_pad={a['auto_pad']!r} is not supported by the torch evaluator")
    spatial = w.dim() - 2
    pads = list(a.get("pads", [0] * 2 * spatial))
    if pads[:spatial] != pads[spatial:]:
        x = F.pad(x, [p for i in reversed(range(spatial)) for p in (pads[i], pads[i + spatial])])
        pads = [0] * 2 * spatial
    conv = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[spatial]
    return conv(x, w, b, a.get("strides", 1), pads[:spatial], a.get("dilations", 1), a.get("group", 1))


def _pool(kind: str) -> Callable[..., Any]:
    def run(x: Any, **a: Any) -> Any:
        import torch.nn.functional as F

        spatial = x.dim() - 2
        kernel = list(a["kernel_shape"])
        pads = list(a.get("pads", [0] * 2 * spatial))
        if pads[:spatial] != pads[spatial:]:
            raise UnsupportedOpError(f"{kind} with asymmetric pads {pads} is not supported by the torch evaluator")
        strides = a.get("strides", [1] * spatial)
        ceil = bool(a.get("ceil_mode", 0))
        if kind == "MaxPool":
            pool = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}[spatial]
            return pool(x, kernel, strides, pads[:spatial], a.get("dilations", 1), ceil)
        pool = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}[spatial]
        return pool(x, kernel, strides, pads[:spatial], ceil, bool(a.get("count_include_pad", 0)))

    return run


def _gemm(
    a: Any, b: Any, c: Any = None, alpha: float = 1.0, beta: float = 1.0, transA: int = 0, transB: int = 0
) -> Any:
    a = a.t() if transA else a
    b = b.t() if transB else b
    out = alpha * (a @ b)
    return out + beta * c if c is not None else out


def _layer_norm(x: Any, scale: Any, bias: Any = None, axis: int = -1, epsilon: float = 1e-5, **_: Any) -> Any:
    import torch.nn.functional as F

    shape = list(x.shape[axis % x.dim() :])
    return F.layer_norm(x, shape, scale, bias, epsilon)


def _batch_norm(x: Any, scale: Any, bias: Any, mean: Any, var: Any, epsilon: float = 1e-5, **_: Any) -> Any:
    import torch.nn.functional as F

    return F.batch_norm(x, mean, var, scale, bias, False, 0.0, epsilon)


def _gelu(x: Any, approximate: Any = b"none") -> Any:
    import torch.nn.functional as F

    mode = approximate.decode() if isinstance(approximate, bytes) else approximate
    return F.gelu(x, approximate=mode)


def _cumsum(x: Any, axis: Any, exclusive: int = 0, reverse: int = 0) -> Any:
    dim = int(axis.reshape(-1)[0])
    y = x.flip(dim) if reverse else x
    out = y.cumsum(dim)
    if exclusive:
        out = out - y
    return out.flip(dim) if reverse else out


def _gather(x: Any, indices: Any, axis: int = 0) -> Any:
    idx = indices.long()
    idx = idx.where(idx >= 0, idx + x.shape[axis])
    return x.index_select(axis, idx.reshape(-1)).reshape(x.shape[:axis] + idx.shape + x.shape[axis + 1 :])


def _gather_nd(x: Any, indices: Any, batch_dims: int = 0) -> Any:
    if batch_dims:
        raise UnsupportedOpError("GatherND with batch_dims > 0 is not supported by the torch evaluator")
    return x[tuple(indices.long().unbind(-1))]


def _split(x: Any, split: Any = None, axis: int = 0, num_outputs: int | None = None, **_: Any) -> tuple:
    if split is not None:
        return tuple(x.split(_ints(split), dim=axis))
    count = num_outputs or 1
    return tuple(x.split(math.ceil(x.shape[axis] / count), dim=axis))


@functools.cache
def _build_ops() -> dict[str, Callable[..., Any]]:
    """Operator type → torch implementation (built once: the hot path runs a node at a time)."""
    import torch

    def variadic(fn: Callable[[Any, Any], Any]) -> Callable[..., Any]:
        def run(*xs: Any) -> Any:
            out = xs[0]
            for x in xs[1:]:
                out = fn(out, x)
            return out

        return run

    return {
        "Add": lambda a, b: a + b,
        "Sub": lambda a, b: a - b,
        "Mul": lambda a, b: a * b,
        "Div": lambda a, b: a / b if a.is_floating_point() else torch.div(a, b, rounding_mode="trunc"),
        "Pow": lambda a, b: a**b,
        "Max": variadic(torch.maximum),
        "Min": variadic(torch.minimum),
        "Sum": variadic(torch.add),
        "Equal": torch.eq,
        "Less": torch.lt,
        "Greater": torch.gt,
        "And": torch.logical_and,
        "Or": torch.logical_or,
        "Not": torch.logical_not,
        "Where": torch.where,
        "Relu": torch.relu,
        "Sigmoid": torch.sigmoid,
        "Tanh": torch.tanh,
        "Erf": torch.erf,
        "Exp": torch.exp,
        "Log": torch.log,
        "Sqrt": torch.sqrt,
        "Neg": torch.neg,
        "Abs": torch.abs,
        "Reciprocal": torch.reciprocal,
        "Sin": torch.sin,
        "Cos": torch.cos,
        "Floor": torch.floor,
        "Ceil": torch.ceil,
        "Identity": lambda x: x,
        "Dropout": lambda x, *_, **__: x,
        "Softplus": torch.nn.functional.softplus,
        "LeakyRelu": lambda x, alpha=0.01: torch.nn.functional.leaky_relu(x, alpha),
        "HardSigmoid": lambda x, alpha=0.2, beta=0.5: (alpha * x + beta).clamp(0, 1),
        "Gelu": _gelu,
        "Clip": lambda x, lo=None, hi=None: x.clamp(lo, hi),
        "Cast": lambda x, to: x.to(_torch_dtype(to)),
        "Shape": lambda x, start=0, end=None: torch.tensor(list(x.shape)[start:end], dtype=torch.int64),
        "Size": lambda x: torch.tensor(x.numel(), dtype=torch.int64),
        "Reshape": _reshape,
        "Flatten": lambda x, axis=1: x.reshape(int(np.prod(x.shape[:axis])), -1),
        "Transpose": lambda x, perm=None: x.permute(perm if perm is not None else list(reversed(range(x.dim())))),
        "Unsqueeze": lambda x, axes: x.reshape(_unsqueezed(list(x.shape), _ints(axes))),
        "Squeeze": lambda x, axes=None: x.squeeze(_ints(axes)) if axes is not None else x.squeeze(),
        "Concat": lambda *xs, axis: torch.cat(xs, dim=axis),
        "Slice": _slice,
        "Gather": _gather,
        "GatherND": _gather_nd,
        "Expand": lambda x, shape: x * torch.ones(_ints(shape), dtype=x.dtype),
        "CumSum": _cumsum,
        "Range": lambda start, limit, delta: torch.arange(start.item(), limit.item(), delta.item(), dtype=start.dtype),
        "ConstantOfShape": lambda shape, value=None: torch.full(
            _ints(shape), float(numpy_helper.to_array(value)[0]) if value is not None else 0.0
        ),
        "Split": _split,
        "MatMul": torch.matmul,
        "Gemm": _gemm,
        "Conv": _conv,
        "MaxPool": _pool("MaxPool"),
        "AveragePool": _pool("AveragePool"),
        "GlobalAveragePool": lambda x: x.mean(dim=list(range(2, x.dim())), keepdim=True),
        "BatchNormalization": _batch_norm,
        "LayerNormalization": _layer_norm,
        "Softmax": lambda x, axis=-1: torch.softmax(x, dim=axis),
        "LogSoftmax": lambda x, axis=-1: torch.log_softmax(x, dim=axis),
        "ReduceSum": _reduce("sum"),
        "ReduceMean": _reduce("mean"),
        "ReduceMax": _reduce("max"),
        "ReduceL2": _reduce("l2"),
        "QuantizeLinear": _quantize,
        "DequantizeLinear": _dequantize,
    }


def _unsqueezed(shape: list[int], axes: list[int]) -> list[int]:
    rank = len(shape) + len(axes)
    for axis in sorted(a % rank for a in axes):
        shape.insert(axis, 1)
    return shape


# Inputs that older opsets gave as attributes and newer ones as tensors, by position.
_KEYWORD_INPUTS = {
    "Reshape": ("shape",),
    "Slice": ("starts", "ends", "axes", "steps"),
    "Unsqueeze": ("axes",),
    "Squeeze": ("axes",),
    "ReduceSum": ("axes",),
    "ReduceMean": ("axes",),
    "ReduceMax": ("axes",),
    "ReduceL2": ("axes",),
    "Split": ("split",),
    "CumSum": ("axis",),
    "Expand": ("shape",),
}


def _implementation(node: onnx.NodeProto) -> Callable[..., Any] | None:
    """The torch implementation of ``node``'s operator, or None when this evaluator lacks it."""
    return _build_ops().get(node.op_type) if node.domain in ("", "ai.onnx") else None


def unsupported_ops(model: onnx.ModelProto) -> list[str]:
    """The operator types of ``model`` this evaluator cannot run (empty when it can run all)."""
    return sorted({n.op_type for n in model.graph.node if _implementation(n) is None})


def run_node(node: onnx.NodeProto, inputs: list[Any]) -> list[Any]:
    """One node's outputs for the given input tensors (None for an absent optional input)."""
    fn = _implementation(node)
    if fn is None:
        raise UnsupportedOpError(f"operator {node.domain or 'ai.onnx'}.{node.op_type} (node {node.name!r})")
    attrs = _attrs(node)
    if node.op_type in _KEYWORD_INPUTS:
        named = _KEYWORD_INPUTS[node.op_type]
        attrs.update({k: v for k, v in zip(named, inputs[1:], strict=False) if v is not None})
        inputs = inputs[:1]
    while inputs and inputs[-1] is None:
        inputs = inputs[:-1]
    out = fn(*inputs, **attrs)
    return list(out) if isinstance(out, tuple | list) else [out]


def run_graph(
    model: onnx.ModelProto,
    feeds: Mapping[str, np.ndarray],
    hook: NodeHook | None = None,
    constants: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Evaluate ``model`` on ``feeds``; returns every tensor by name. ``hook`` may replace a node's outputs.

    ``constants`` are the initializers as torch tensors (:func:`initializer_tensors`), to convert them once.
    """
    env: dict[str, Any] = dict(constants) if constants is not None else initializer_tensors(model)
    env.update({name: to_tensor(np.asarray(value)) for name, value in feeds.items()})
    for node in model.graph.node:
        if node.op_type == "Constant":
            env[node.output[0]] = to_tensor(numpy_helper.to_array(node.attribute[0].t))
            continue
        inputs = [env[name] if name else None for name in node.input]
        outputs = run_node(node, inputs)
        if hook is not None:
            outputs = hook(node, inputs, outputs) or outputs
        env.update(zip(node.output, outputs, strict=False))
    missing = [o.name for o in model.graph.output if o.name not in env]
    if missing:
        raise DeployOptError(f"torch evaluation produced no value for graph output(s) {missing}")
    return env


def initializer_tensors(model: onnx.ModelProto, names: Iterable[str] | None = None) -> dict[str, Any]:
    """The model's initializers (or the named ones) as torch tensors."""
    wanted = set(names) if names is not None else None
    inits = [i for i in model.graph.initializer if wanted is None or i.name in wanted]
    return {i.name: to_tensor(numpy_helper.to_array(i)) for i in inits}
