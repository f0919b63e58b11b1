"""Shape, indexing and data-movement operators (ONNX semantics in torch).

Shape, Size, ConstantOfShape, Range, NonZero and Cast to an integer type produce int or bool tensors that autograd
never tracks: the shape arithmetic of an export runs as constants, with exact values.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from onnx import numpy_helper

from deploy_opt.onnx_torch._common import (
    OpSpec,
    UnsupportedOpError,
    axes_of,
    dtype_attr,
    ints,
    known_dtype,
    one_of,
    scalar,
    to_tensor,
    torch_dtype,
    type_name,
)

_SCATTER_REDUCE = {"add": "sum", "mul": "prod", "max": "amax", "min": "amin"}


def _positive(index: Any, size: int) -> Any:
    """Indices with negatives counted from the end (index_select and gather reject negatives)."""
    index = index.long()
    return torch.where(index < 0, index + size, index)


def _constant(
    value: Any = None,
    value_float: float | None = None,
    value_floats: list[float] | None = None,
    value_int: int | None = None,
    value_ints: list[int] | None = None,
) -> Any:
    if value is not None:
        return to_tensor(numpy_helper.to_array(value))
    if value_float is not None or value_floats is not None:
        return torch.tensor(value_float if value_floats is None else value_floats, dtype=torch.float32)
    if value_int is not None or value_ints is not None:
        return torch.tensor(value_int if value_ints is None else value_ints, dtype=torch.int64)
    raise UnsupportedOpError("Constant without a value attribute")


def _constant_of_shape(shape: Any, value: Any = None) -> Any:
    dims = ints(shape)
    if value is None:
        return torch.zeros(dims, dtype=torch.float32)
    fill = to_tensor(numpy_helper.to_array(value)).reshape(-1)[0]
    return torch.full(dims, fill.item(), dtype=fill.dtype)


def _range(start: Any, limit: Any, delta: Any, stash_type: int = 1, _opset: int = 0, _outputs: int = 1) -> Any:
    """start + i * delta for i < ceil((limit - start) / delta), none when that is negative.

    From opset 27, float16 and bfloat16 ranges are computed in ``stash_type`` (float32 unless told) and cast back.
    """
    first, stop, step = scalar(start), scalar(limit), scalar(delta)
    if start.is_floating_point():
        count = math.ceil((stop - first) / step)
    else:
        count = -((first - stop) // step)
    dtype = start.dtype
    if _opset >= 27 and dtype.itemsize == 2 and dtype.is_floating_point:
        dtype = torch_dtype(stash_type)
    return (torch.arange(max(count, 0), dtype=dtype) * step + first).to(start.dtype)


def _cast(x: Any, to: int, saturate: int = 1, round_mode: str = "up") -> Any:
    dtype = torch_dtype(to)
    if saturate and dtype.is_floating_point and dtype.itemsize == 1 and x.is_floating_point():
        info = torch.finfo(dtype)
        x = torch.where(x.isfinite(), x.clamp(info.min, info.max), x)
    return x.to(dtype)


def _reshape(x: Any, shape: Any, allowzero: int = 0) -> Any:
    dims = ints(shape)
    if not allowzero:
        dims = [x.shape[i] if d == 0 else d for i, d in enumerate(dims)]
    return x.reshape(dims)


def _flatten(x: Any, axis: int = 1) -> Any:
    axis = axis + x.dim() if axis < 0 else axis
    return x.reshape(math.prod(x.shape[:axis]), math.prod(x.shape[axis:]))


def _transpose(x: Any, perm: list[int] | None = None) -> Any:
    return x.permute(perm if perm is not None else list(reversed(range(x.dim()))))


def _squeeze(x: Any, axes: Any = None) -> Any:
    dims = axes_of(axes, x.dim()) if axes is not None else []
    return x.squeeze(tuple(dims)) if dims else x.squeeze()


def _unsqueeze(x: Any, axes: Any) -> Any:
    wanted = ints(axes)
    rank = x.dim() + len(wanted)
    shape = list(x.shape)
    for axis in sorted(a % rank for a in wanted):
        shape.insert(axis, 1)
    return x.reshape(shape)


def _concat(*xs: Any, axis: int) -> Any:
    return torch.cat(xs, dim=axis)


def _split(
    x: Any, split: Any = None, axis: int = 0, num_outputs: int | None = None, _opset: int = 0, _outputs: int = 1
) -> tuple:
    axis %= x.dim()
    if split is not None and ints(split):
        sizes = ints(split)
    else:  # equal parts, the last smaller (opset 18 num_outputs) or as many as the node has outputs
        count = num_outputs or _outputs
        chunk = math.ceil(x.shape[axis] / count)
        sizes = [min(chunk, max(0, x.shape[axis] - i * chunk)) for i in range(count)]
    return tuple(torch.split(x, sizes, dim=axis))


def _slice_bounds(start: int, end: int, step: int, size: int) -> tuple[slice, bool]:
    """The ascending torch slice of ONNX's (start, end, step) on an axis of ``size``, and whether to flip it."""
    start = start + size if start < 0 else start
    end = end + size if end < 0 else end
    if step > 0:
        return slice(min(max(start, 0), size), min(max(end, 0), size), step), False
    start, end = min(max(start, 0), size - 1), min(max(end, -1), size - 1)
    count = len(range(start, end, step))
    if count == 0:
        return slice(0, 0), False
    return slice(start + (count - 1) * step, start + 1, -step), True


def _slice(x: Any, starts: Any, ends: Any, axes: Any = None, steps: Any = None) -> Any:
    first, last = ints(starts), ints(ends)
    dims = axes_of(axes, x.dim()) if axes is not None else list(range(len(first)))
    strides = ints(steps) if steps is not None else [1] * len(first)
    index: list[slice] = [slice(None)] * x.dim()
    flips = []
    for start, end, axis, step in zip(first, last, dims, strides, strict=True):
        if step == 0:
            raise UnsupportedOpError("Slice with step 0")
        index[axis], flip = _slice_bounds(start, end, step, x.shape[axis])
        if flip:
            flips.append(axis)
    out = x[tuple(index)]
    return out.flip(flips) if flips else out


def _gather(x: Any, indices: Any, axis: int = 0) -> Any:
    axis %= x.dim()
    index = _positive(indices, x.shape[axis])
    out = x.index_select(axis, index.reshape(-1))
    return out.reshape(x.shape[:axis] + index.shape + x.shape[axis + 1 :])


def _gather_elements(x: Any, indices: Any, axis: int = 0) -> Any:
    axis %= x.dim()
    return torch.gather(x, axis, _positive(indices, x.shape[axis]))


def _gather_nd(x: Any, indices: Any, batch_dims: int = 0) -> Any:
    index = indices.long()
    if batch_dims == 0:
        return x[tuple(index.unbind(-1))]
    batch = math.prod(x.shape[:batch_dims])
    depth = index.shape[-1]
    flat_x = x.reshape(batch, *x.shape[batch_dims:])
    flat_i = index.reshape(batch, -1, depth)
    rows = torch.arange(batch).unsqueeze(1).expand(batch, flat_i.shape[1])
    out = flat_x[(rows, *flat_i.unbind(-1))]
    return out.reshape(*index.shape[:-1], *x.shape[batch_dims + depth :])


def _scatter_nd(data: Any, indices: Any, updates: Any, reduction: str = "none") -> Any:
    index = indices.long()
    depth = index.shape[-1]
    parts = tuple(_positive(i, data.shape[k]) for k, i in enumerate(index.unbind(-1)))
    if reduction in ("none", "add"):
        return data.index_put(parts, updates, accumulate=reduction == "add")
    strides = [math.prod(data.shape[k + 1 : depth]) for k in range(depth)]
    linear = sum(p * s for p, s in zip(parts, strides, strict=True)).reshape(-1)
    rest = data.shape[depth:]
    flat = data.reshape(-1, *rest)
    values = updates.reshape(-1, *rest)
    target = linear.reshape(-1, *([1] * len(rest))).expand(values.shape)
    out = flat.scatter_reduce(0, target, values, _SCATTER_REDUCE[reduction], include_self=True)
    return out.reshape(data.shape)


def _scatter_elements(data: Any, indices: Any, updates: Any, axis: int = 0, reduction: str = "none") -> Any:
    axis %= data.dim()
    index = _positive(indices, data.shape[axis])
    if reduction == "none":
        return data.scatter(axis, index, updates)
    return data.scatter_reduce(axis, index, updates, _SCATTER_REDUCE[reduction], include_self=True)


def _expand(x: Any, shape: Any) -> Any:
    return x.expand(torch.broadcast_shapes(tuple(x.shape), tuple(ints(shape))))


def _pad_index(size: int, begin: int, end: int, mode: str) -> Any:
    """Source positions along one axis for the non-constant pad modes (negative pads crop)."""
    position = torch.arange(-begin, size + end)
    if mode == "edge":
        return position.clamp(0, size - 1)
    if mode == "wrap":
        return position.remainder(size)
    if size == 1:
        return torch.zeros_like(position)
    period = 2 * (size - 1)
    folded = position.remainder(period)
    return torch.where(folded < size, folded, period - folded)


def _pad(
    x: Any, pads: Any, constant_value: Any = None, axes: Any = None, mode: str = "constant", value: float = 0.0
) -> Any:
    amounts = ints(pads)
    dims = axes_of(axes, x.dim()) if axes is not None else list(range(x.dim()))
    begins, ends = [0] * x.dim(), [0] * x.dim()
    for i, axis in enumerate(dims):
        begins[axis], ends[axis] = amounts[i], amounts[i + len(dims)]
    if mode == "constant":
        fill = scalar(constant_value) if constant_value is not None else value
        flat = [p for axis in reversed(range(x.dim())) for p in (begins[axis], ends[axis])]
        return F.pad(x, flat, value=fill)
    for axis in range(x.dim()):
        if begins[axis] or ends[axis]:
            x = x.index_select(axis, _pad_index(x.shape[axis], begins[axis], ends[axis], mode))
    return x


def _trilu(x: Any, k: Any = None, upper: int = 1) -> Any:
    diagonal = int(scalar(k)) if k is not None else 0
    return torch.triu(x, diagonal) if upper else torch.tril(x, diagonal)


def _one_hot(indices: Any, depth: Any, values: Any, axis: int = -1) -> Any:
    size = int(scalar(depth))
    index = _positive(indices, size)
    axis %= index.dim() + 1
    classes = torch.arange(size).reshape([size] + [1] * (index.dim() - axis))
    return torch.where(index.unsqueeze(axis) == classes, values[1], values[0])


def _top_k(x: Any, k: Any, axis: int = -1, largest: int = 1, sorted: int = 1) -> tuple:
    axis %= x.dim()
    count = ints(k)[0]
    values, order = torch.sort(x, dim=axis, descending=bool(largest), stable=True)  # ties: lower index first
    return values.narrow(axis, 0, count), order.narrow(axis, 0, count)


def _depth_to_space(x: Any, blocksize: int, mode: str = "DCR") -> Any:
    n, c, h, w = x.shape
    b = blocksize
    if mode == "DCR":
        moved = x.reshape(n, b, b, c // (b * b), h, w).permute(0, 3, 4, 1, 5, 2)
    else:
        moved = x.reshape(n, c // (b * b), b, b, h, w).permute(0, 1, 4, 2, 5, 3)
    return moved.reshape(n, c // (b * b), h * b, w * b)


def _space_to_depth(x: Any, blocksize: int, mode: str = "DCR") -> Any:
    n, c, h, w = x.shape
    b = blocksize
    order = (0, 3, 5, 1, 2, 4) if mode == "DCR" else (0, 1, 3, 5, 2, 4)
    moved = x.reshape(n, c, h // b, b, w // b, b).permute(order)
    return moved.reshape(n, c * b * b, h // b, w // b)


def _eye_like(x: Any, dtype: int | None = None, k: int = 0) -> Any:
    rows, cols = x.shape
    eye = torch.arange(cols).unsqueeze(0) - torch.arange(rows).unsqueeze(1) == k
    return eye.to(torch_dtype(dtype) if dtype is not None else x.dtype)


def _compress(x: Any, condition: Any, axis: int | None = None) -> Any:
    flat = x.reshape(-1) if axis is None else x
    dim = 0 if axis is None else axis % x.dim()
    keep = torch.nonzero(condition[: flat.shape[dim]]).reshape(-1)
    return flat.index_select(dim, keep)


def _dropout(
    x: Any,
    ratio: Any = None,
    training_mode: Any = None,
    seed: int | None = None,
    is_test: int | None = None,
    _opset: int = 0,
    _outputs: int = 1,
) -> Any:
    """Inference: the identity, and an all-true mask when the node asks for one."""
    return (x, torch.ones_like(x, dtype=torch.bool)) if _outputs > 1 else x


_REDUCTION = one_of("reduction", "none", ("none", "add", "mul", "max", "min"))


OPS: dict[str, OpSpec] = {
    "Constant": OpSpec(_constant),
    "ConstantOfShape": OpSpec(_constant_of_shape),
    "Shape": OpSpec(lambda x, start=0, end=None: torch.tensor(list(x.shape)[start:end], dtype=torch.int64)),
    "Size": OpSpec(lambda x: torch.tensor(x.numel(), dtype=torch.int64)),
    "Range": OpSpec(_range, context=True),
    "NonZero": OpSpec(lambda x: torch.nonzero(x).t().contiguous()),
    "Cast": OpSpec(
        _cast,
        check=lambda attrs, outputs: None if known_dtype(attrs.get("to", 0)) else f"to={type_name(attrs.get('to', 0))}",
    ),
    "CastLike": OpSpec(lambda x, target, saturate=1, round_mode="up": x.to(target.dtype)),
    "Reshape": OpSpec(_reshape, keywords=("shape",)),
    "Flatten": OpSpec(_flatten),
    "Transpose": OpSpec(_transpose),
    "Squeeze": OpSpec(_squeeze, keywords=("axes",)),
    "Unsqueeze": OpSpec(_unsqueeze, keywords=("axes",)),
    "Concat": OpSpec(_concat),
    "Split": OpSpec(_split, keywords=("split",), context=True),
    "Slice": OpSpec(_slice, keywords=("starts", "ends", "axes", "steps")),
    "Gather": OpSpec(_gather),
    "GatherElements": OpSpec(_gather_elements),
    "GatherND": OpSpec(_gather_nd),
    "ScatterND": OpSpec(_scatter_nd, check=_REDUCTION),
    "ScatterElements": OpSpec(_scatter_elements, check=_REDUCTION),
    "Scatter": OpSpec(_scatter_elements),
    "Expand": OpSpec(_expand, keywords=("shape",)),
    "Tile": OpSpec(lambda x, repeats: x.repeat(ints(repeats))),
    "Pad": OpSpec(
        _pad,
        keywords=("pads", "constant_value", "axes"),
        check=one_of("mode", "constant", ("constant", "reflect", "edge", "wrap")),
    ),
    "Trilu": OpSpec(_trilu, keywords=("k",)),
    "OneHot": OpSpec(_one_hot),
    "TopK": OpSpec(_top_k, keywords=("k",)),
    "DepthToSpace": OpSpec(_depth_to_space, check=one_of("mode", "DCR", ("DCR", "CRD"))),
    "SpaceToDepth": OpSpec(_space_to_depth, check=one_of("mode", "DCR", ("DCR", "CRD"))),
    "EyeLike": OpSpec(_eye_like, check=dtype_attr("dtype")),
    "Compress": OpSpec(_compress),
    "Dropout": OpSpec(_dropout, keywords=("ratio", "training_mode"), context=True),
}
