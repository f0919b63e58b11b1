"""TensorRT's rules for QuantizeLinear and DequantizeLinear nodes, which the operator table does not state.

onnx-tensorrt's operator table lists QuantizeLinear and DequantizeLinear as supported, but its importer
(``onnxOpImporters.cpp``, ``QuantDequantLinearHelper``) and TensorRT's ``IQuantizeLayer``/``IDequantizeLayer``
refuse most of what ONNX allows. A model that breaks one of these rules fails at parse time, so a report that
judges op types alone says "ok" for a model TensorRT cannot load. The rules checked here, per node:

- the quantized side is INT8 (or FP8/INT4/FP4): an int32 DequantizeLinear (ORT's quantized bias) is the parse
  error "input has type Int32 but must have type FP8, FP4, Int4, or Int8", and so is a uint8 DequantizeLinear;
  a uint8 QuantizeLinear parses (with a warning) when its zero point is all zeros, so only its zero point judges it;
- the zero point is a constant of zeros (TensorRT is symmetric only);
- the scale is a constant, positive and finite;
- per-channel scales only on constant weights, on the output-channel axis TensorRT fuses: Conv axis 0,
  ConvTranspose axis 1, MatMul's constant B its last axis, Gemm axis 0 with transB=1 and 1 without; per-tensor
  scales for activations;
- per-channel needs opset 13 (the ``axis`` attribute); blocked quantization is for INT4/FP4 weights only.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import onnx
from onnx import numpy_helper

PARSE_ERROR = "TensorRT parse error"
_TRT_TYPES = {"tensor(int8)", "tensor(float8e4m3fn)", "tensor(int4)", "tensor(float4e2m1)"}
_WEIGHT_AXIS = {"Conv": 0, "ConvTranspose": 1}


def qdq_problem(
    node: onnx.NodeProto,
    types: Mapping[str, str],
    constants: Mapping[str, onnx.TensorProto],
    readers: Mapping[str, list[tuple[onnx.NodeProto, int]]],
    opset: int,
) -> str | None:
    """Why TensorRT refuses this Q/DQ node, or None when it follows TensorRT's rules (or is not a Q/DQ node)."""
    if node.op_type not in ("QuantizeLinear", "DequantizeLinear") or not node.input:
        return None
    quantized = _quantized_type(node, types, constants)
    uint8_quantize = quantized == "tensor(uint8)" and node.op_type == "QuantizeLinear"
    if quantized is not None and quantized not in _TRT_TYPES and not uint8_quantize:
        short = quantized.removeprefix("tensor(").removesuffix(")")
        if node.op_type == "DequantizeLinear" and short == "int32":
            return (
                f"int32 DequantizeLinear: {PARSE_ERROR} (input has type Int32 but must have type FP8, FP4, Int4, "
                "or Int8); fix: keep biases float (a TensorRT target writes them so)"
            )
        return (
            f"{short} {node.op_type}: {PARSE_ERROR} (TensorRT quantizes to signed int8 only); fix: build with "
            "quantization.activations: symmetric"
        )
    return _zero_point_problem(node, constants) or _scale_problem(node, constants, readers, opset)


def _quantized_type(
    node: onnx.NodeProto, types: Mapping[str, str], constants: Mapping[str, onnx.TensorProto]
) -> str | None:
    """The element type of the quantized side: DQ's input, else the zero point's (Q's output type)."""
    if node.op_type == "DequantizeLinear":
        name = node.input[0]
    else:
        name = node.input[2] if len(node.input) > 2 and node.input[2] else ""
        if not name:
            return None  # no zero point (ONNX says uint8 output): not judged here
    if name in constants:
        return f"tensor({onnx.TensorProto.DataType.Name(constants[name].data_type).lower()})"
    return types.get(name)


def _zero_point_problem(node: onnx.NodeProto, constants: Mapping[str, onnx.TensorProto]) -> str | None:
    name = node.input[2] if len(node.input) > 2 else ""
    if not name:
        return None
    if name not in constants:
        return f"{node.op_type} zero point '{name}' is computed: {PARSE_ERROR} (it must be a constant of zeros)"
    if numpy_helper.to_array(constants[name]).astype(np.int64).any():
        return (
            f"{node.op_type} with a non-zero zero point: {PARSE_ERROR} (TensorRT is symmetric only); fix: build "
            "with quantization.activations: symmetric"
        )
    return None


def _scale_problem(
    node: onnx.NodeProto,
    constants: Mapping[str, onnx.TensorProto],
    readers: Mapping[str, list[tuple[onnx.NodeProto, int]]],
    opset: int,
) -> str | None:
    scale_name = node.input[1] if len(node.input) > 1 else ""
    if scale_name not in constants:
        return f"{node.op_type} scale '{scale_name}' is computed: TensorRT needs a build-time constant scale"
    scale = numpy_helper.to_array(constants[scale_name]).astype(np.float64).reshape(-1)
    if not (np.isfinite(scale).all() and (scale > 0).all()):
        return f"{node.op_type} scale '{scale_name}' holds a zero, negative or non-finite value"
    if _attribute(node, "block_size", 0):
        return f"blocked {node.op_type}: TensorRT takes block quantization only for INT4/FP4 weights"
    if scale.size == 1:
        return None
    if opset < 13:
        return f"per-channel {node.op_type} at opset {opset}: the axis attribute needs opset 13"
    if node.input[0] not in constants:
        return f"per-channel {node.op_type} on activation '{node.input[0]}': TensorRT takes per-tensor activations"
    return _axis_problem(node, constants, readers)


def _axis_problem(
    node: onnx.NodeProto,
    constants: Mapping[str, onnx.TensorProto],
    readers: Mapping[str, list[tuple[onnx.NodeProto, int]]],
) -> str | None:
    """Per-channel weights: the axis TensorRT fuses for the reading op (the DQ's first reader)."""
    rank = len(constants[node.input[0]].dims)
    axis = _attribute(node, "axis", 1)
    axis = axis + rank if axis < 0 else axis
    found = readers.get(node.output[0]) if node.output else None
    if not found:
        return None
    reader, index = found[0]
    if reader.op_type in _WEIGHT_AXIS and index == 1:
        wanted = _WEIGHT_AXIS[reader.op_type]
    elif reader.op_type == "MatMul" and index == 1:
        wanted = rank - 1
    elif reader.op_type == "Gemm" and index == 1:
        wanted = 0 if _attribute(reader, "transB", 0) else 1
    else:
        return None
    if axis != wanted:
        return (
            f"per-channel weight of {reader.op_type} '{reader.name}' on axis {axis}: TensorRT fuses axis {wanted} "
            "(the output channels)"
        )
    return None


def _attribute(node: onnx.NodeProto, name: str, default: int) -> int:
    return next((int(a.i) for a in node.attribute if a.name == name), default)
