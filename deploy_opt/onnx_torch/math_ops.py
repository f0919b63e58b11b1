"""Element-wise arithmetic, comparisons, logic and activations, and the reductions (ONNX semantics in torch).

Comparisons, logic, IsNaN/IsInf and the integer ops produce bool or int tensors: autograd never tracks them, so
they act as constants of the differentiated graph while still computing the exact values.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from deploy_opt.onnx_torch._common import OpSpec, axes_of, ints, one_of

_SELU_ALPHA = 1.67326319217681884765625
_SELU_GAMMA = 1.05070102214813232421875


def _variadic(fn: Callable[[Any, Any], Any]) -> Callable[..., Any]:
    """An n-input op (Max, Min, Sum) folded from a two-input one, broadcasting like numpy."""

    def run(*xs: Any) -> Any:
        return functools.reduce(fn, xs)

    return run


def _mean(*xs: Any) -> Any:
    return functools.reduce(torch.add, xs) / len(xs)


def _div(a: Any, b: Any) -> Any:
    return a / b if a.is_floating_point() else torch.div(a, b, rounding_mode="trunc")


def _pow(a: Any, b: Any) -> Any:
    """The result has the base's type (torch would promote an int base with a float exponent)."""
    out = torch.pow(a, b)
    return out if out.dtype == a.dtype else out.to(a.dtype)


def _mod(a: Any, b: Any, fmod: int = 0) -> Any:
    """fmod=0: the sign of the divisor (integers only); fmod=1: C fmod, the sign of the dividend."""
    return torch.fmod(a, b) if fmod else torch.remainder(a, b)


def _clip(x: Any, min: Any = None, max: Any = None) -> Any:
    if min is None and max is None:
        return x
    return torch.clamp(x, min, max)


def _is_inf(x: Any, detect_negative: int = 1, detect_positive: int = 1) -> Any:
    if detect_negative and detect_positive:
        return torch.isinf(x)
    if detect_negative:
        return torch.isneginf(x)
    if detect_positive:
        return torch.isposinf(x)
    return torch.zeros_like(x, dtype=torch.bool)


def _bit_shift(x: Any, y: Any, direction: str) -> Any:
    return torch.bitwise_left_shift(x, y) if direction == "LEFT" else torch.bitwise_right_shift(x, y)


def _gelu(x: Any, approximate: str = "none") -> Any:
    return F.gelu(x, approximate=approximate)


def _elu(x: Any, alpha: float = 1.0) -> Any:
    return torch.where(x > 0, x, alpha * torch.expm1(x))


def _selu(x: Any, alpha: float = _SELU_ALPHA, gamma: float = _SELU_GAMMA) -> Any:
    return gamma * torch.where(x > 0, x, alpha * torch.expm1(x))


def _celu(x: Any, alpha: float = 1.0) -> Any:
    return x.clamp(min=0) + (alpha * torch.expm1(x / alpha)).clamp(max=0)


def _prelu(x: Any, slope: Any) -> Any:
    return torch.where(x < 0, x * slope, x)


def _shrink(x: Any, bias: float = 0.0, lambd: float = 0.5) -> Any:
    return torch.where(x < -lambd, x + bias, torch.where(x > lambd, x - bias, torch.zeros_like(x)))


def _hard_sigmoid(x: Any, alpha: float = 0.2, beta: float = 0.5) -> Any:
    return (alpha * x + beta).clamp(0, 1)


def _hard_swish(x: Any) -> Any:
    return x * (x * (1.0 / 6.0) + 0.5).clamp(0, 1)


def _thresholded_relu(x: Any, alpha: float = 1.0) -> Any:
    return torch.where(x > alpha, x, torch.zeros_like(x))


def _swish(x: Any, alpha: float = 1.0) -> Any:
    return x * torch.sigmoid(alpha * x)


def _reduce_dims(x: Any, axes: Any, noop_with_empty_axes: int) -> list[int] | None:
    """The dims to reduce; None means return ``x`` unchanged (empty axes with noop_with_empty_axes)."""
    dims = axes_of(axes, x.dim()) if axes is not None else []
    if not dims:
        return None if noop_with_empty_axes else list(range(x.dim()))
    return sorted(set(dims))


def _prod(x: Any, dims: list[int], keep: bool) -> Any:
    for dim in sorted(dims, reverse=True):
        x = x.prod(dim=dim, keepdim=keep)
    return x


_REDUCERS: dict[str, Callable[[Any, list[int], bool], Any]] = {
    "ReduceSum": lambda x, d, k: x.sum(dim=d, keepdim=k, dtype=x.dtype),
    "ReduceMean": lambda x, d, k: x.mean(dim=d, keepdim=k),
    "ReduceMax": lambda x, d, k: x.amax(dim=d, keepdim=k),
    "ReduceMin": lambda x, d, k: x.amin(dim=d, keepdim=k),
    "ReduceProd": lambda x, d, k: _prod(x, d, k),
    "ReduceL1": lambda x, d, k: x.abs().sum(dim=d, keepdim=k, dtype=x.dtype),
    "ReduceL2": lambda x, d, k: (x * x).sum(dim=d, keepdim=k).sqrt(),
    "ReduceSumSquare": lambda x, d, k: (x * x).sum(dim=d, keepdim=k, dtype=x.dtype),
    "ReduceLogSum": lambda x, d, k: x.sum(dim=d, keepdim=k).log(),
    "ReduceLogSumExp": lambda x, d, k: torch.logsumexp(x, dim=d, keepdim=k),
}


def _reduce(kind: str) -> Callable[..., Any]:
    reducer = _REDUCERS[kind]

    def run(x: Any, axes: Any = None, keepdims: int = 1, noop_with_empty_axes: int = 0) -> Any:
        dims = _reduce_dims(x, axes, noop_with_empty_axes)
        if dims is None:
            return x
        if x.dim() == 0:
            return reducer(x.reshape(1), [0], False)
        return reducer(x, dims, bool(keepdims))

    return run


def _arg(largest: bool) -> Callable[..., Any]:
    def run(x: Any, axis: int = 0, keepdims: int = 1, select_last_index: int = 0) -> Any:
        fn = torch.argmax if largest else torch.argmin
        axis = axis % x.dim()
        if not select_last_index:
            return fn(x, dim=axis, keepdim=bool(keepdims))
        flipped = fn(x.flip(axis), dim=axis, keepdim=bool(keepdims))
        return x.shape[axis] - 1 - flipped

    return run


def _cumsum(x: Any, axis: Any, exclusive: int = 0, reverse: int = 0) -> Any:
    dim = ints(axis)[0] % x.dim()
    y = x.flip(dim) if reverse else x
    out = y.cumsum(dim, dtype=x.dtype)
    if exclusive:
        zero = torch.zeros_like(out.narrow(dim, 0, 1))
        out = torch.cat([zero, out.narrow(dim, 0, out.shape[dim] - 1)], dim)
    return out.flip(dim) if reverse else out


def _gemm(
    a: Any,
    b: Any,
    c: Any = None,
    alpha: float = 1.0,
    beta: float = 1.0,
    transA: int = 0,
    transB: int = 0,
    broadcast: int = 0,
) -> Any:
    out = (a.t() if transA else a) @ (b.t() if transB else b)
    if alpha != 1.0:
        out = out * alpha
    if c is None or beta == 0.0:
        return out
    return out + (c if beta == 1.0 else beta * c)


def _einsum(*xs: Any, equation: str) -> Any:
    return torch.einsum(equation.replace(" ", ""), *xs)


_ELEMENTWISE: dict[str, Callable[..., Any]] = {
    "Add": torch.add,
    "Sub": torch.sub,
    "Mul": torch.mul,
    "Div": _div,
    "Pow": _pow,
    "Mod": _mod,
    "Max": _variadic(torch.maximum),
    "Min": _variadic(torch.minimum),
    "Sum": _variadic(torch.add),
    "Mean": _mean,
    "Equal": torch.eq,
    "Less": torch.lt,
    "LessOrEqual": torch.le,
    "Greater": torch.gt,
    "GreaterOrEqual": torch.ge,
    "And": torch.logical_and,
    "Or": torch.logical_or,
    "Xor": torch.logical_xor,
    "Not": torch.logical_not,
    "BitwiseAnd": torch.bitwise_and,
    "BitwiseOr": torch.bitwise_or,
    "BitwiseXor": torch.bitwise_xor,
    "BitwiseNot": torch.bitwise_not,
    "BitShift": _bit_shift,
    "IsNaN": torch.isnan,
    "IsInf": _is_inf,
    "Where": torch.where,
    "Identity": lambda x: x,
    "Neg": torch.neg,
    "Abs": torch.abs,
    "Sign": torch.sign,
    "Reciprocal": torch.reciprocal,
    "Sqrt": torch.sqrt,
    "Exp": torch.exp,
    "Log": torch.log,
    "Erf": torch.erf,
    "Floor": torch.floor,
    "Ceil": torch.ceil,
    "Round": torch.round,
    "Sin": torch.sin,
    "Cos": torch.cos,
    "Tan": torch.tan,
    "Asin": torch.asin,
    "Acos": torch.acos,
    "Atan": torch.atan,
    "Sinh": torch.sinh,
    "Cosh": torch.cosh,
    "Asinh": torch.asinh,
    "Acosh": torch.acosh,
    "Atanh": torch.atanh,
    "Relu": torch.relu,
    "Sigmoid": torch.sigmoid,
    "Tanh": torch.tanh,
    "Softplus": F.softplus,
    "Softsign": lambda x: x / (1 + x.abs()),
    "Mish": F.mish,
    "Gelu": _gelu,
    "Elu": _elu,
    "Selu": _selu,
    "Celu": _celu,
    "LeakyRelu": lambda x, alpha=0.01: F.leaky_relu(x, alpha),
    "PRelu": _prelu,
    "ThresholdedRelu": _thresholded_relu,
    "HardSigmoid": _hard_sigmoid,
    "HardSwish": _hard_swish,
    "Swish": _swish,
    "Shrink": _shrink,
    "MatMul": torch.matmul,
    "Gemm": _gemm,
    "Einsum": _einsum,
    "ArgMax": _arg(largest=True),
    "ArgMin": _arg(largest=False),
}

_CHECKS = {
    "Gelu": one_of("approximate", "none", ("none", "tanh")),
    "BitShift": one_of("direction", None, ("LEFT", "RIGHT")),
}

OPS: dict[str, OpSpec] = {
    **{name: OpSpec(fn, check=_CHECKS.get(name)) for name, fn in _ELEMENTWISE.items()},
    "Clip": OpSpec(_clip, keywords=("min", "max")),
    "CumSum": OpSpec(_cumsum, keywords=("axis",)),
    **{name: OpSpec(_reduce(name), keywords=("axes",)) for name in _REDUCERS},
}
