"""Quantization parameters: an activation range or a weight -> scale and zero point; int32 bias scales derived.

Every formula is bit-identical to ONNX Runtime's (``compute_scale_zp``, its bias quantization). Axes follow ONNX
Runtime's and TensorRT's conventions: the output-channel axis of each op's weight.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator, Mapping

import numpy as np
import onnx
from onnx import numpy_helper

from calibrators.scales.format import TensorScale
from dopt_common.errors import ConfigError

# Which input of each op holds the weight, and its output-channel axis (matching ORT's own defaults).
WEIGHT_INPUT = {"Conv": 1, "ConvTranspose": 1, "Gemm": 1, "MatMul": 1}
BIAS_INPUT = {"Conv": 2, "ConvTranspose": 2, "Gemm": 2}
# Data-movement ops whose quantized output ONNX Runtime gives its input's parameters (QDQDirect8BitOp and kin).
PASSTHROUGH = frozenset(
    {"AveragePool", "Flatten", "MaxPool", "Reshape", "Resize", "Slice", "Split", "Squeeze", "Transpose", "Unsqueeze"}
)


def channel_axis(node: onnx.NodeProto, rank: int) -> int:
    """The output-channel axis of a node's weight: Conv 0, ConvTranspose 1, Gemm by transB, MatMul last."""
    if node.op_type == "Conv":
        return 0
    if node.op_type == "ConvTranspose":
        return 1
    if node.op_type == "Gemm":
        trans_b = next((a.i for a in node.attribute if a.name == "transB"), 0)
        return 0 if trans_b else 1
    return rank - 1


def weight_scales(
    model: onnx.ModelProto,
    op_types: Iterable[str],
    exclude: Iterable[str] = (),
    method: str = "absmax",
    levels: int = 127,
) -> dict[str, TensorScale]:
    """Per-channel int8 parameters (``absmax`` or ``mse``) for every weight feeding a quantizable node."""
    inits = {i.name: i for i in model.graph.initializer}
    wanted, skipped = set(op_types), set(exclude)
    out: dict[str, TensorScale] = {}
    for node in model.graph.node:
        index = WEIGHT_INPUT.get(node.op_type)
        if node.op_type not in wanted or node.name in skipped or index is None or len(node.input) <= index:
            continue
        name = node.input[index]
        if name in inits and name not in out:
            array = numpy_helper.to_array(inits[name])
            if array.dtype.kind == "f" and array.ndim >= 2:
                out[name] = weight_scale(name, array, channel_axis(node, array.ndim), method, levels)
    return out


def bias_scales(
    model: onnx.ModelProto, tensors: Mapping[str, TensorScale], op_types: Iterable[str], exclude: Iterable[str] = ()
) -> dict[str, TensorScale]:
    """int32 bias parameters derived from the node's input and weight scales, as ORT quantizes biases."""
    out: dict[str, TensorScale] = {}
    for node, bias, act, weight in _bias_reads(model, tensors, op_types, exclude):
        beta = next((a.f for a in node.attribute if a.name == "beta"), 1.0) if node.op_type == "Gemm" else 1.0
        out[bias.name] = bias_scale(bias.name, tensors[act], tensors[weight], beta)
    return out


def _bias_reads(
    model: onnx.ModelProto, tensors: Mapping[str, TensorScale], op_types: Iterable[str], exclude: Iterable[str]
) -> Iterator[tuple[onnx.NodeProto, onnx.TensorProto, str, str]]:
    """(node, bias initializer, input name, weight name) of each quantized node whose input and weight have scales."""
    inits = {i.name: i for i in model.graph.initializer}
    wanted, skipped = set(op_types), set(exclude)
    for node in model.graph.node:
        index = BIAS_INPUT.get(node.op_type)
        if node.op_type not in wanted or node.name in skipped or index is None or len(node.input) <= index:
            continue
        bias, act, weight = node.input[index], node.input[0], node.input[1]
        if bias in inits and act in tensors and weight in tensors:
            yield node, inits[bias], act, weight


def share_passthrough_scales(
    model: onnx.ModelProto, tensors: Mapping[str, TensorScale], op_types: Iterable[str], exclude: Iterable[str] = ()
) -> dict[str, TensorScale]:
    """The outputs of data-movement nodes (Reshape, Transpose, MaxPool, …) with their input's parameters.

    ONNX Runtime's writer quantizes such an output with its input's scale and zero point (``quantize_output_same_as_
    input``), so an integer tensor passes through unchanged; the scale file says the same, in graph order so that
    chains follow.
    """
    wanted, skipped = set(op_types) & PASSTHROUGH, set(exclude)
    current = dict(tensors)
    out: dict[str, TensorScale] = {}
    for node in model.graph.node:
        if node.op_type not in wanted or node.name in skipped or not node.input or node.input[0] not in current:
            continue
        source = current[node.input[0]]
        if source.role != "activation":
            continue
        for name in node.output:
            shared = dataclasses.replace(source, name=name, method="shared", derived_from=(source.name,))
            current[name] = out[name] = shared
    return out


def widen_weights_for_bias(
    model: onnx.ModelProto, tensors: Mapping[str, TensorScale], op_types: Iterable[str], exclude: Iterable[str] = ()
) -> dict[str, TensorScale]:
    """Weight scales widened where the int32 bias would overflow; returns only the widened ones.

    A channel whose weights are almost zero (a dead channel: |w| ~ 1e-15) gets a tiny weight scale, so input scale
    × weight scale is too fine for its bias to fit in int32 and the bias would be clipped to nothing. Each such
    channel's weight scale is raised until ``2 |b| × 1.0001 / (2^32 - 2)`` fits, ONNX Runtime's own rule
    (``_adjust_weight_scale_for_int32_bias``); its writer's adjustment is then switched off, so the artifact
    carries exactly these scales.
    """
    qrange = float(np.iinfo(np.int32).max) - float(np.iinfo(np.int32).min + 1)
    out: dict[str, TensorScale] = {}
    for _, bias, act, weight in _bias_reads(model, tensors, op_types, exclude):
        current = out.get(weight, tensors[weight])
        values = np.abs(numpy_helper.to_array(bias).astype(np.float64)).reshape(-1)
        if current.axis is None:
            values = np.array([values.max(initial=0.0)])
        smallest = 1.0001 * 2.0 * values / qrange
        candidate = float(tensors[act].scale[0]) * np.asarray(current.scale, dtype=np.float64)
        low = (candidate > 0) & (candidate < smallest)
        if low.any():
            wider = np.asarray(current.scale, dtype=np.float64)
            exact = wider[low] * smallest[low] / candidate[low]
            rounded = exact.astype(np.float32)
            wider[low] = np.where(rounded < exact, np.nextafter(rounded, np.float32(np.inf)), rounded)
            out[weight] = dataclasses.replace(current, scale=tuple(float(np.float32(s)) for s in wider))
    return out


def symmetric_scale(amax: np.ndarray | float, levels: int = 127) -> np.ndarray:
    """amax / levels (127; 63 for 7-bit weights) rounded once to float32 (in float64, as ONNX Runtime does).

    1.0 for empty ranges.
    """
    exact = np.asarray(amax, dtype=np.float32).astype(np.float64) / float(levels)
    return np.where(exact < np.finfo(np.float32).tiny, 1.0, exact).astype(np.float32)


def activation_scale(name: str, low: float, high: float, scheme: str, method: str) -> TensorScale:
    """Quantization parameters for an activation range, bit-identical to ORT's ``compute_scale_zp``.

    ``symmetric``: int8, zero point 0, scale = amax / 127 (what TensorRT accepts).
    ``asymmetric``: uint8, the range widened to include 0, scale = (max - min) / 255, zp = round(-min / scale).
    """
    low32, high32 = np.float32(min(low, 0.0)), np.float32(max(high, 0.0))
    amax = float(max(abs(low32), abs(high32)))
    if scheme == "symmetric":
        scale = float(symmetric_scale(amax))
        return TensorScale(name, "activation", "int8", (scale,), (0,), None, amax, (low, high), method)
    if scheme != "asymmetric":
        raise ConfigError(f"quantization.activations '{scheme}' is unknown; use symmetric or asymmetric")
    exact = (np.float64(high32) - np.float64(low32)) / 255.0
    if exact < np.finfo(np.float32).tiny:
        scale, zero = 1.0, 0
    else:
        scale, zero = float(np.float32(exact)), int(np.round(-np.float64(low32) / exact))
    return TensorScale(name, "activation", "uint8", (scale,), (zero,), None, amax, (low, high), method)


def weight_scale(name: str, weight: np.ndarray, axis: int, method: str = "absmax", levels: int = 127) -> TensorScale:
    """Per-channel symmetric int8 parameters along ``axis``: each channel's absmax, or its MSE-optimal clip."""
    axis = axis % weight.ndim
    moved = np.moveaxis(np.asarray(weight, dtype=np.float32), axis, 0).reshape(weight.shape[axis], -1)
    amax = np.abs(moved).max(axis=1).astype(np.float32)
    if method == "mse":
        amax = mse_clip(moved, amax, levels=levels)
    elif method != "absmax":
        raise ConfigError(f"calibration.weights '{method}' is unknown; use absmax or mse")
    scale = symmetric_scale(amax, levels)
    return TensorScale(
        name,
        "weight",
        "int8",
        tuple(float(s) for s in scale),
        (0,) * len(scale),
        axis,
        float(amax.max()) if amax.size else 0.0,
        None,
        method,
    )


def mse_clip(rows: np.ndarray, amax: np.ndarray, steps: int = 50, levels: int = 127) -> np.ndarray:
    """Per row, the clip in [amax/2, amax] whose int8 round trip has the least squared error."""
    best, best_err = amax.copy(), np.full(amax.shape, np.inf)
    for fraction in np.linspace(1.0, 0.5, steps + 1):  # from no clipping down: ties keep the larger clip
        clip = (amax * np.float32(fraction)).astype(np.float32)
        scale = symmetric_scale(clip, levels)[:, None]
        err = ((rows - np.clip(np.round(rows / scale), -levels, levels) * scale) ** 2).sum(axis=1)
        better = err < best_err
        best[better], best_err[better] = clip[better], err[better]
    return best


def bias_scale(name: str, activation: TensorScale, weight: TensorScale, beta: float = 1.0) -> TensorScale:
    """int32 bias parameters: scale = input scale × weight scale (× Gemm beta), zero point 0, in float32."""
    product = np.float32(activation.scale[0]) * np.asarray(weight.scale, dtype=np.float32) * np.float32(beta)
    product = product.astype(np.float32)
    axis = 0 if weight.axis is not None else None
    return TensorScale(
        name,
        "bias",
        "int32",
        tuple(float(s) for s in product),
        (0,) * product.size,
        axis,
        None,
        None,
        "derived",
        (activation.name, weight.name),
    )
