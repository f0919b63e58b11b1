"""Weight and bias parameters: per-channel symmetric int8 weights from absmax, int32 biases derived.

Axes follow ONNX Runtime's and TensorRT's conventions: the output-channel axis of each op's weight.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import onnx
from onnx import numpy_helper

from calibrators.scale_file import TensorScale, bias_scale, weight_scale

# Which input of each op holds the weight, and its output-channel axis (matching ORT's own defaults).
WEIGHT_INPUT = {"Conv": 1, "ConvTranspose": 1, "Gemm": 1, "MatMul": 1}
BIAS_INPUT = {"Conv": 2, "ConvTranspose": 2, "Gemm": 2}


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
    model: onnx.ModelProto, op_types: Iterable[str], exclude: Iterable[str] = (), method: str = "absmax"
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
                out[name] = weight_scale(name, array, channel_axis(node, array.ndim), method)
    return out


def bias_scales(
    model: onnx.ModelProto, tensors: Mapping[str, TensorScale], op_types: Iterable[str], exclude: Iterable[str] = ()
) -> dict[str, TensorScale]:
    """int32 bias parameters derived from the node's input and weight scales, as ORT quantizes biases."""
    inits = {i.name for i in model.graph.initializer}
    wanted, skipped = set(op_types), set(exclude)
    out: dict[str, TensorScale] = {}
    for node in model.graph.node:
        index = BIAS_INPUT.get(node.op_type)
        if node.op_type not in wanted or node.name in skipped or index is None or len(node.input) <= index:
            continue
        bias, act, weight = node.input[index], node.input[0], node.input[1]
        if bias in inits and act in tensors and weight in tensors:
            beta = next((a.f for a in node.attribute if a.name == "beta"), 1.0) if node.op_type == "Gemm" else 1.0
            out[bias] = bias_scale(bias, tensors[act], tensors[weight], beta)
    return out
