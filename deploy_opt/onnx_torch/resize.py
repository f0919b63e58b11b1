"""Resize and Upsample: nearest, linear and cubic, one axis at a time (ONNX semantics, as ONNX Runtime computes).

Each resized axis maps output positions to source coordinates with the coordinate transformation, then gathers
the nearest source (nearest) or blends 2 (linear) or 4 (cubic) neighbours, so N-d linear is separable linear.
Coordinates are float32, as ONNX Runtime computes them. Opset 10 Resize and Upsample use the asymmetric transform
and ONNX Runtime's legacy nearest rounding (truncate when upsampling, round up when downsampling).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from deploy_opt.onnx_torch._common import OpSpec, axes_of, ints

_COORDINATE_MODES = (
    "half_pixel",
    "half_pixel_symmetric",
    "pytorch_half_pixel",
    "align_corners",
    "asymmetric",
    "tf_crop_and_resize",
)
_NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")


def _sources(out_len: int, in_len: int, scale: float, mode: str, roi: tuple[float, float]) -> Any:
    """The source coordinate of each output position along one axis (float32)."""
    x = torch.arange(out_len, dtype=torch.float32)
    if mode == "asymmetric":
        return x / scale
    if mode == "align_corners":
        return x * ((in_len - 1) / (out_len - 1)) if out_len > 1 else torch.zeros_like(x)
    if mode == "pytorch_half_pixel" and out_len <= 1:
        return torch.zeros_like(x)
    if mode == "tf_crop_and_resize":
        start, end = roi
        if out_len <= 1:
            return torch.full_like(x, 0.5 * (start + end) * (in_len - 1))
        return start * (in_len - 1) + x * ((end - start) * (in_len - 1) / (out_len - 1))
    centred = (x + 0.5) / scale - 0.5
    if mode == "half_pixel_symmetric":
        adjustment = out_len / (scale * in_len)
        return centred + in_len / 2 * (1 - adjustment)
    return centred


def _nearest(position: Any, mode: str, scale: float) -> Any:
    if mode == "round_prefer_floor":
        return torch.ceil(position - 0.5)
    if mode == "round_prefer_ceil":
        return torch.floor(position + 0.5)
    if mode == "floor":
        return torch.floor(position)
    if mode == "ceil":
        return torch.ceil(position)
    return torch.ceil(position) if scale < 1 else torch.trunc(position)  # legacy (opset 10, Upsample)


def _cubic_weights(t: Any, a: float) -> list[Any]:
    """Keys' cubic convolution weights of the neighbours at offsets -1, 0, 1, 2 for fractions ``t``."""
    s = 1 - t
    return [
        ((a * (t + 1) - 5 * a) * (t + 1) + 8 * a) * (t + 1) - 4 * a,
        ((a + 2) * t - (a + 3)) * t * t + 1,
        ((a + 2) * s - (a + 3)) * s * s + 1,
        ((a * (s + 1) - 5 * a) * (s + 1) + 8 * a) * (s + 1) - 4 * a,
    ]


def _blend(x: Any, dim: int, position: Any, linear: bool, a: float, exclude_outside: int) -> Any:
    """Linear or cubic interpolation of ``x`` along ``dim`` at the source positions."""
    size = x.shape[dim]
    if linear:
        position = position.clamp(0, size - 1)
    base = torch.floor(position)
    t = position - base
    offsets = (0, 1) if linear else (-1, 0, 1, 2)
    weights = [1 - t, t] if linear else _cubic_weights(t, a)
    sources = [base.long() + k for k in offsets]
    if exclude_outside and not linear:
        weights = [
            torch.where((s >= 0) & (s < size), w, torch.zeros_like(w)) for s, w in zip(sources, weights, strict=True)
        ]
        total = sum(weights)
        weights = [w / total for w in weights]
    view = [-1 if i == dim else 1 for i in range(x.dim())]
    out = None
    for source, weight in zip(sources, weights, strict=True):
        term = x.index_select(dim, source.clamp(0, size - 1)) * weight.to(x.dtype).reshape(view)
        out = term if out is None else out + term
    return out


def _resample(x: Any, dim: int, out_len: int, scale: float, how: dict[str, Any], roi: tuple[float, float]) -> Any:
    size = x.shape[dim]
    position = _sources(out_len, size, scale, how["coordinates"], roi)
    if how["mode"] == "nearest":
        out = x.index_select(dim, _nearest(position, how["nearest"], scale).long().clamp(0, size - 1))
    else:
        out = _blend(x, dim, position, how["mode"] == "linear", how["cubic_a"], how["exclude_outside"])
    if how["coordinates"] == "tf_crop_and_resize":
        outside = ((position < 0) | (position > size - 1)).reshape([-1 if i == dim else 1 for i in range(x.dim())])
        out = torch.where(outside, torch.tensor(how["extrapolation"], dtype=out.dtype), out)
    return out


def _targets(x: Any, dims: list[int], scales: Any, sizes: Any, policy: str) -> tuple[list[int], list[float]]:
    """Output lengths and the scales the coordinate transform uses, per resized axis."""
    inputs = [x.shape[d] for d in dims]
    if sizes is None:
        factors = [float(np.float32(s)) for s in scales.reshape(-1).tolist()]
        return [math.floor(n * f) for n, f in zip(inputs, factors, strict=True)], factors
    wanted = ints(sizes)
    if policy != "stretch":
        pick = min if policy == "not_larger" else max
        ratio = pick(float(np.float32(w) / np.float32(n)) for w, n in zip(wanted, inputs, strict=True))
        return [math.floor(n * ratio + 0.5) for n in inputs], [ratio] * len(dims)
    return wanted, [float(np.float32(w) / np.float32(n)) for w, n in zip(wanted, inputs, strict=True)]


def _present(value: Any) -> Any:
    """Resize's optional inputs may be given as empty tensors."""
    return value if value is not None and value.numel() else None


def _resize(
    x: Any,
    roi: Any = None,
    scales: Any = None,
    sizes: Any = None,
    antialias: int = 0,
    axes: list[int] | None = None,
    coordinate_transformation_mode: str = "half_pixel",
    cubic_coeff_a: float = -0.75,
    exclude_outside: int = 0,
    extrapolation_value: float = 0.0,
    keep_aspect_ratio_policy: str = "stretch",
    mode: str = "nearest",
    nearest_mode: str = "round_prefer_floor",
    _opset: int = 0,
    _outputs: int = 1,
) -> Any:
    if _opset < 11:  # Resize-10: (X, scales), asymmetric, legacy nearest rounding
        roi, scales = None, roi
        coordinate_transformation_mode, nearest_mode = "asymmetric", "legacy"
    dims = axes_of(axes, x.dim()) if axes else list(range(x.dim()))
    lengths, factors = _targets(x, dims, _present(scales), _present(sizes), keep_aspect_ratio_policy)
    bounds = [float(v) for v in roi.reshape(-1).tolist()] if _present(roi) is not None else []
    half = len(bounds) // 2
    how = {
        "coordinates": coordinate_transformation_mode,
        "nearest": nearest_mode,
        "mode": mode,
        "cubic_a": cubic_coeff_a,
        "exclude_outside": exclude_outside,
        "extrapolation": extrapolation_value,
    }
    for i, (dim, length, factor) in enumerate(zip(dims, lengths, factors, strict=True)):
        crop = coordinate_transformation_mode == "tf_crop_and_resize"
        if length == x.shape[dim] and factor == 1.0 and not crop:
            continue
        window = (bounds[i], bounds[i + half]) if bounds else (0.0, 1.0)
        x = _resample(x, dim, length, factor, how, window)
    return x


def _upsample(x: Any, scales: Any, mode: str = "nearest") -> Any:
    """Upsample (opset 7-9): Resize-10 with scales (an attribute in opset 7, an input in 9)."""
    factors = torch.tensor(scales, dtype=torch.float32) if isinstance(scales, list) else scales
    return _resize(x, factors, mode="linear" if mode in ("linear", "bilinear") else mode, _opset=10)


def _resize_check(attrs: dict[str, Any], outputs: int) -> str | None:
    if attrs.get("antialias", 0):
        return "antialias=1"
    if attrs.get("mode", "nearest") not in ("nearest", "linear", "cubic"):
        return f"mode={attrs['mode']}"
    if attrs.get("coordinate_transformation_mode", "half_pixel") not in _COORDINATE_MODES:
        return f"coordinate_transformation_mode={attrs['coordinate_transformation_mode']}"
    if attrs.get("nearest_mode", "round_prefer_floor") not in _NEAREST_MODES:
        return f"nearest_mode={attrs['nearest_mode']}"
    return None


def _upsample_check(attrs: dict[str, Any], outputs: int) -> str | None:
    mode = attrs.get("mode", "nearest")
    return None if mode in ("nearest", "linear", "bilinear") else f"mode={mode}"


OPS: dict[str, OpSpec] = {
    "Resize": OpSpec(_resize, keywords=("roi", "scales", "sizes"), context=True, check=_resize_check),
    "Upsample": OpSpec(_upsample, keywords=("scales",), check=_upsample_check),
}
