"""TensorRT's form of a Q/DQ model: ORT's int32 bias DequantizeLinear nodes become the float biases they stand for.

ORT's quantizer writes each quantized node's bias as an int32 initializer and a DequantizeLinear, which ORT
CPU's integer kernels fuse. TensorRT's ONNX parser refuses any int32 DequantizeLinear ("input has type Int32
but must have type FP8, FP4, Int4, or Int8") and fuses a float bias into the layer itself. When one build
targets both, ``model.int8.onnx`` keeps ORT's form and the engine is built from this copy. Activation and
weight Q/DQ nodes are untouched, so both files carry the same scales bit for bit; each bias becomes exactly
the float32 value ORT's DequantizeLinear computes from it.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from exporters.onnx.io import save_onnx

log = logging.getLogger(__name__)


def int32_dequantize_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """The DequantizeLinear nodes whose input is an int32 initializer (ORT's quantized biases)."""
    int32 = {i.name for i in model.graph.initializer if i.data_type == onnx.TensorProto.INT32}
    return [n for n in model.graph.node if n.op_type == "DequantizeLinear" and n.input and n.input[0] in int32]


def to_tensorrt_form(qdq_path: str | Path, out_path: str | Path, external_data_mb: int = 1024) -> tuple[Path, int]:
    """Write ``qdq_path`` with each int32 bias DequantizeLinear folded into a float32 initializer.

    Returns the written path and how many nodes were folded.
    """
    model = onnx.load(str(qdq_path))
    nodes = int32_dequantize_nodes(model)
    inits = {i.name: i for i in model.graph.initializer}
    for node in nodes:
        value = _dequantized(node, inits)
        model.graph.initializer.append(numpy_helper.from_array(value, node.output[0]))
        model.graph.node.remove(node)
    used = {name for n in model.graph.node for name in n.input} | {o.name for o in model.graph.output}
    kept = [i for i in model.graph.initializer if i.name in used]
    del model.graph.initializer[:]
    model.graph.initializer.extend(kept)
    path = save_onnx(model, out_path, external_data_mb=external_data_mb)
    log.info("TensorRT form: %d int32 bias DequantizeLinear nodes folded into float biases: %s", len(nodes), path)
    return path, len(nodes)


def _dequantized(node: onnx.NodeProto, inits: dict[str, onnx.TensorProto]) -> np.ndarray:
    """(q - zero point) × scale in float32, as ONNX's DequantizeLinear defines it (per-tensor or per-axis)."""
    q = numpy_helper.to_array(inits[node.input[0]]).astype(np.int64)
    scale = numpy_helper.to_array(inits[node.input[1]]).astype(np.float32)
    zero = numpy_helper.to_array(inits[node.input[2]]).astype(np.int64) if len(node.input) > 2 and node.input[2] else 0
    if scale.size > 1:
        axis = next((a.i for a in node.attribute if a.name == "axis"), 1)
        shape = [1] * q.ndim
        shape[axis] = -1
        scale = scale.reshape(shape)
        zero = np.asarray(zero).reshape(shape) if np.ndim(zero) else zero
    return ((q - zero).astype(np.float32) * scale).astype(np.float32)
