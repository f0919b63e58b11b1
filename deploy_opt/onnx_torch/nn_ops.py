"""Convolutions, pooling, normalizations, softmax and quantization (ONNX semantics in torch).

Padding follows ONNX: explicit begin/end pads (asymmetric allowed), ``auto_pad`` SAME_UPPER/SAME_LOWER/VALID,
and ``ceil_mode`` windows that must start inside the input or its left padding. The common symmetric case runs
torch's own padding; anything else pads explicitly first.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from deploy_opt.onnx_torch._common import OpSpec, all_of, dtype_attr, one_of, torch_dtype

_CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
_CONV_T = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}
_MAX_POOL = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}
_AVG_POOL = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}
Pairs = list[tuple[int, int]]


def _pad_pairs(
    sizes: Any, kernel: list[int], strides: list[int], dilations: list[int], pads: list[int] | None, auto_pad: str
) -> Pairs:
    """(begin, end) padding per spatial axis, from explicit pads or auto_pad."""
    spatial = len(kernel)
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        pairs = []
        for size, k, s, d in zip(sizes, kernel, strides, dilations, strict=True):
            total = max(0, (math.ceil(size / s) - 1) * s + (k - 1) * d + 1 - size)
            small = total // 2
            pairs.append((small, total - small) if auto_pad == "SAME_UPPER" else (total - small, small))
        return pairs
    if auto_pad == "VALID" or not pads:
        return [(0, 0)] * spatial
    return list(zip(pads[:spatial], pads[spatial:], strict=True))


def _ceil_extra(size: int, k: int, s: int, d: int, begin: int, end: int) -> int:
    """Extra end padding that makes a floor-mode pool produce ceil_mode's last window."""
    reach = (k - 1) * d + 1
    count = math.ceil((size + begin + end - reach) / s) + 1
    if (count - 1) * s >= size + begin:  # a window may not start in the end padding
        count -= 1
    return max(0, (count - 1) * s + reach - (size + begin + end))


def _torch_pads(pairs: Pairs) -> list[int]:
    """F.pad's order: the last axis first."""
    return [p for begin, end in reversed(pairs) for p in (begin, end)]


def _native(pairs: Pairs, kernel: list[int], dilations: list[int]) -> bool:
    """torch's pooling pads symmetrically and at most half the (dilated) kernel."""
    return all(b == e and 2 * b <= (k - 1) * d + 1 for (b, e), k, d in zip(pairs, kernel, dilations, strict=True))


def _geometry(
    x: Any,
    kernel: list[int],
    strides: list[int] | None,
    dilations: list[int] | None,
    pads: list[int] | None,
    auto_pad: str,
) -> tuple[list[int], list[int], Pairs]:
    """Strides and dilations with their defaults, and the (begin, end) pads per spatial axis."""
    spatial = len(kernel)
    strides = list(strides or [1] * spatial)
    dilations = list(dilations or [1] * spatial)
    return strides, dilations, _pad_pairs(x.shape[2:], kernel, strides, dilations, pads, auto_pad)


def _conv(
    x: Any,
    w: Any,
    b: Any = None,
    auto_pad: str = "NOTSET",
    dilations: list[int] | None = None,
    group: int = 1,
    kernel_shape: list[int] | None = None,
    pads: list[int] | None = None,
    strides: list[int] | None = None,
) -> Any:
    strides, dilations, pairs = _geometry(x, list(w.shape[2:]), strides, dilations, pads, auto_pad)
    padding: Any = [p for p, _ in pairs]
    if any(begin != end for begin, end in pairs):
        x, padding = F.pad(x, _torch_pads(pairs)), 0
    return _CONV[w.dim() - 2](x, w, b, strides, padding, dilations, group)


def _conv_transpose(
    x: Any,
    w: Any,
    b: Any = None,
    auto_pad: str = "NOTSET",
    dilations: list[int] | None = None,
    group: int = 1,
    kernel_shape: list[int] | None = None,
    output_padding: list[int] | None = None,
    output_shape: list[int] | None = None,
    pads: list[int] | None = None,
    strides: list[int] | None = None,
) -> Any:
    spatial = w.dim() - 2
    strides = list(strides or [1] * spatial)
    dilations = list(dilations or [1] * spatial)
    extra = list(output_padding or [0] * spatial)
    full = _CONV_T[spatial](x, w, None, strides, 0, 0, group, dilations)
    if any(extra):
        full = F.pad(full, _torch_pads([(0, e) for e in extra]))
    pairs = _transpose_crop(list(x.shape[2:]), list(full.shape[2:]), strides, pads, output_shape, auto_pad)
    kept = [slice(begin, size - end) for (begin, end), size in zip(pairs, full.shape[2:], strict=True)]
    out = full[(slice(None), slice(None), *kept)]
    return out if b is None else out + b.reshape(1, -1, *([1] * spatial))


def _transpose_crop(
    sizes: list[int],
    full: list[int],
    strides: list[int],
    pads: list[int] | None,
    shape: list[int] | None,
    auto_pad: str,
) -> Pairs:
    """What ConvTranspose removes from each end of its full output: pads, or what output_shape/auto_pad imply."""
    spatial = len(sizes)
    if shape is None and auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        shape = [size * s for size, s in zip(sizes, strides, strict=True)]
    if shape is None:
        pads = list(pads or [0] * 2 * spatial)
        return list(zip(pads[:spatial], pads[spatial:], strict=True))
    pairs = []
    for total_size, want in zip(full, list(shape)[-spatial:], strict=True):
        total = total_size - want
        half = total // 2
        pairs.append((half, total - half) if auto_pad == "SAME_UPPER" else (total - half, half))
    return pairs


def _max_pool(
    x: Any,
    kernel_shape: list[int],
    auto_pad: str = "NOTSET",
    ceil_mode: int = 0,
    dilations: list[int] | None = None,
    pads: list[int] | None = None,
    storage_order: int = 0,
    strides: list[int] | None = None,
) -> Any:
    kernel = list(kernel_shape)
    strides, dilations, pairs = _geometry(x, kernel, strides, dilations, pads, auto_pad)
    pool = _MAX_POOL[len(kernel)]
    if _native(pairs, kernel, dilations):
        return pool(x, kernel, strides, [p for p, _ in pairs], dilations, bool(ceil_mode))
    if ceil_mode:
        pairs = _with_ceil(x, kernel, strides, dilations, pairs)
    low = -math.inf if x.is_floating_point() else torch.iinfo(x.dtype).min
    return pool(F.pad(x, _torch_pads(pairs), value=low), kernel, strides, 0, dilations)


def _with_ceil(x: Any, kernel: list[int], strides: list[int], dilations: list[int], pairs: Pairs) -> Pairs:
    sizes = x.shape[2:]
    return [
        (b, e + _ceil_extra(n, k, s, d, b, e))
        for n, k, s, d, (b, e) in zip(sizes, kernel, strides, dilations, pairs, strict=True)
    ]


def _average_pool(
    x: Any,
    kernel_shape: list[int],
    auto_pad: str = "NOTSET",
    ceil_mode: int = 0,
    count_include_pad: int = 0,
    dilations: list[int] | None = None,
    pads: list[int] | None = None,
    strides: list[int] | None = None,
) -> Any:
    kernel = list(kernel_shape)
    strides, dilations, pairs = _geometry(x, kernel, strides, dilations, pads, auto_pad)
    if _native(pairs, kernel, dilations) and all(d == 1 for d in dilations):
        padding = [p for p, _ in pairs]
        return _AVG_POOL[len(kernel)](x, kernel, strides, padding, bool(ceil_mode), bool(count_include_pad))
    grown = _with_ceil(x, kernel, strides, dilations, pairs) if ceil_mode else pairs
    extra = [(0, e2 - e) for (_, e), (_, e2) in zip(pairs, grown, strict=True)]
    ones = torch.ones((1, 1, *x.shape[2:]), dtype=x.dtype)
    mask = F.pad(F.pad(ones, _torch_pads(pairs), value=1.0 if count_include_pad else 0.0), _torch_pads(extra))
    total = _sum_pool(F.pad(x, _torch_pads(grown)), kernel, strides, dilations)
    return total / _sum_pool(mask, kernel, strides, dilations)


def _sum_pool(x: Any, kernel: list[int], strides: list[int], dilations: list[int]) -> Any:
    """Window sums without padding (a ones-kernel convolution per channel, so dilation works)."""
    n, c, *sizes = x.shape
    ones = torch.ones((1, 1, *kernel), dtype=x.dtype)
    out = _CONV[len(kernel)](x.reshape(n * c, 1, *sizes), ones, None, strides, 0, dilations)
    return out.reshape(n, c, *out.shape[2:])


def _batch_norm(
    x: Any,
    scale: Any,
    bias: Any,
    mean: Any,
    var: Any,
    epsilon: float = 1e-5,
    momentum: float = 0.9,
    spatial: int = 1,
    training_mode: int = 0,
    is_test: int = 0,
) -> Any:
    if scale.dim() == 1 and x.dim() >= 2:
        return F.batch_norm(x, mean, var, scale, bias, False, 0.0, epsilon)
    view = [1, *scale.shape] + [1] * (x.dim() - 1 - scale.dim())  # spatial=0: per-activation statistics
    shaped = [t.reshape(view) for t in (scale, bias, mean, var)]
    return (x - shaped[2]) / torch.sqrt(shaped[3] + epsilon) * shaped[0] + shaped[1]


def _layer_norm(
    x: Any,
    scale: Any,
    bias: Any = None,
    axis: int = -1,
    epsilon: float = 1e-5,
    stash_type: int = 1,
    _opset: int = 0,
    _outputs: int = 1,
) -> Any:
    axis %= x.dim()
    shape = tuple(x.shape[axis:])
    if _outputs == 1 and tuple(scale.shape) == shape and (bias is None or tuple(bias.shape) == shape):
        return F.layer_norm(x, shape, scale, bias, epsilon)
    dims = list(range(axis, x.dim()))
    mean = x.mean(dim=dims, keepdim=True)
    inv_std = torch.rsqrt(((x - mean) ** 2).mean(dim=dims, keepdim=True) + epsilon)
    y = (x - mean) * inv_std * scale
    return (y if bias is None else y + bias, mean, inv_std)[:_outputs]


def _group_norm(x: Any, scale: Any, bias: Any, num_groups: int, epsilon: float = 1e-5, stash_type: int = 1) -> Any:
    channels = x.shape[1]
    if scale.numel() != channels:  # opset 18: one scale and bias per group
        scale = scale.repeat_interleave(channels // num_groups)
        bias = bias.repeat_interleave(channels // num_groups)
    return F.group_norm(x, num_groups, scale, bias, epsilon)


def _rms_norm(x: Any, scale: Any, axis: int = -1, epsilon: float = 1e-5, stash_type: int = 1) -> Any:
    dims = list(range(axis % x.dim(), x.dim()))
    return x * torch.rsqrt((x * x).mean(dim=dims, keepdim=True) + epsilon) * scale


def _mean_variance_norm(x: Any, axes: list[int] | None = None) -> Any:
    dims = list(axes) if axes is not None else [0, 2, 3]
    mean = x.mean(dim=dims, keepdim=True)
    std = torch.sqrt((x * x).mean(dim=dims, keepdim=True) - mean * mean)
    return (x - mean) / (std + 1e-9)


def _lp_norm(x: Any, axis: int = -1, p: int = 2) -> Any:
    """x / ||x||_p along ``axis``; a zero vector stays zero (as ONNX Runtime does)."""
    norm = x.abs().sum(dim=axis, keepdim=True) if p == 1 else (x * x).sum(dim=axis, keepdim=True).sqrt()
    return x / torch.where(norm == 0, torch.ones_like(norm), norm)


def _lrn(x: Any, size: int, alpha: float = 1e-4, beta: float = 0.75, bias: float = 1.0) -> Any:
    """Across channels, the window [c - floor((size-1)/2), c + ceil((size-1)/2)] (torch centres it otherwise)."""
    n, c = x.shape[:2]
    square = (x * x).reshape(n, 1, c, -1)
    front = (size - 1) // 2
    window = F.pad(square, (0, 0, front, size - 1 - front))
    mean = F.avg_pool2d(window, (size, 1), stride=1)
    return x / (bias + alpha * mean.reshape(x.shape)) ** beta


def _hardmax(x: Any, dim: int) -> Any:
    return torch.zeros_like(x).scatter(dim, x.argmax(dim, keepdim=True), 1.0)


def _softmax_like(fn: Callable[[Any, int], Any]) -> Callable[..., Any]:
    """Opset 13+: along ``axis`` (default -1). Before: over the 2-D coercion [:axis] x [axis:] (default axis 1)."""

    def run(x: Any, axis: int | None = None, _opset: int = 0, _outputs: int = 1) -> Any:
        if _opset >= 13:
            return fn(x, -1 if axis is None else axis)
        axis = (1 if axis is None else axis) % max(x.dim(), 1)
        if axis >= x.dim() - 1:
            return fn(x, -1)
        return fn(x.reshape(math.prod(x.shape[:axis]), -1), 1).reshape(x.shape)

    return run


def _axis_param(value: Any, x: Any, axis: int, block_size: int) -> Any:
    """A scale or zero point, shaped to broadcast over ``x``: per tensor, per ``axis``, or per block on it."""
    if value.numel() == 1 and block_size == 0:
        return value.reshape(())
    axis %= x.dim()
    if block_size:
        return value.repeat_interleave(block_size, dim=axis).narrow(axis, 0, x.shape[axis])
    return value.reshape([-1 if i == axis else 1 for i in range(x.dim())])


def _quantize(
    x: Any,
    scale: Any,
    zero: Any = None,
    axis: int = 1,
    block_size: int = 0,
    output_dtype: int = 0,
    saturate: int = 1,
    precision: int = 0,
) -> Any:
    dtype = zero.dtype if zero is not None else torch_dtype(output_dtype) if output_dtype else torch.uint8
    step = _axis_param(scale, x, axis, block_size)
    if dtype.is_floating_point:  # float8: the zero point is 0 by definition
        info = torch.finfo(dtype)
        return (x / step).clamp(info.min, info.max).to(dtype) if saturate else (x / step).to(dtype)
    offset = _axis_param(zero.float(), x, axis, block_size) if zero is not None else 0.0
    info = torch.iinfo(dtype)
    return (torch.round(x / step) + offset).clamp(info.min, info.max).to(dtype)


def _dequantize(x: Any, scale: Any, zero: Any = None, axis: int = 1, block_size: int = 0, output_dtype: int = 0) -> Any:
    offset = _axis_param(zero.float(), x, axis, block_size) if zero is not None else 0.0
    out = (x.float() - offset) * _axis_param(scale, x, axis, block_size)
    return out.to(scale.dtype) if out.dtype != scale.dtype else out


_AUTO_PAD = one_of("auto_pad", "NOTSET", ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"))


def _training_check(attrs: dict[str, Any], outputs: int) -> str | None:
    return "training_mode=1" if attrs.get("training_mode", 0) else None


def _indices_check(attrs: dict[str, Any], outputs: int) -> str | None:
    return "the Indices output" if outputs > 1 else None


OPS: dict[str, OpSpec] = {
    "Conv": OpSpec(_conv, check=_AUTO_PAD),
    "ConvTranspose": OpSpec(_conv_transpose, check=_AUTO_PAD),
    "MaxPool": OpSpec(_max_pool, check=all_of(_AUTO_PAD, _indices_check)),
    "AveragePool": OpSpec(_average_pool, check=_AUTO_PAD),
    "GlobalAveragePool": OpSpec(lambda x: x.mean(dim=list(range(2, x.dim())), keepdim=True)),
    "GlobalMaxPool": OpSpec(lambda x: x.amax(dim=list(range(2, x.dim())), keepdim=True)),
    "BatchNormalization": OpSpec(_batch_norm, check=_training_check),
    "InstanceNormalization": OpSpec(lambda x, s, b, epsilon=1e-5: F.instance_norm(x, None, None, s, b, eps=epsilon)),
    "LayerNormalization": OpSpec(_layer_norm, context=True),
    "GroupNormalization": OpSpec(_group_norm),
    "RMSNormalization": OpSpec(_rms_norm),
    "MeanVarianceNormalization": OpSpec(_mean_variance_norm),
    "LpNormalization": OpSpec(_lp_norm, check=one_of("p", 2, (1, 2))),
    "LRN": OpSpec(_lrn),
    "Softmax": OpSpec(_softmax_like(torch.softmax), context=True),
    "LogSoftmax": OpSpec(_softmax_like(torch.log_softmax), context=True),
    "Hardmax": OpSpec(_softmax_like(_hardmax), context=True),
    "QuantizeLinear": OpSpec(_quantize, check=dtype_attr("output_dtype")),
    "DequantizeLinear": OpSpec(_dequantize, check=dtype_attr("output_dtype")),
}
