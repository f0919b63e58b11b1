"""Arithmetic intensity of quantizable nodes: where INT8 can pay for its Q/DQ.

INT8 saves time in proportion to a node's multiply-accumulates; its Q/DQ costs time in proportion to the
elements it converts. Per output element a node does ``K`` MACs (its reduction length: the input width of a
MatMul or Gemm, ``C_in / groups × kh × kw`` of a convolution), so ``K`` ranks nodes by what INT8 can win there:
a depthwise 3×3 conv (K = 9) or a small attention MatMul rarely beats its conversions, a 384-wide projection does.
"""

from __future__ import annotations

import math

import onnx


def tensor_shapes(model: onnx.ModelProto) -> dict[str, list[int]]:
    """Tensor name → its inferred dims (0 where a dim is symbolic or unknown), initializers included."""
    inferred = onnx.shape_inference.infer_shapes(model)
    shapes = {
        v.name: [d.dim_value if d.HasField("dim_value") else 0 for d in v.type.tensor_type.shape.dim]
        for v in [*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output]
    }
    return shapes | {i.name: list(i.dims) for i in model.graph.initializer}


def reduction_lengths(
    model: onnx.ModelProto, op_types: tuple[str, ...], shapes: dict[str, list[int]] | None = None
) -> dict[str, int]:
    """Node name → its reduction length ``K`` (0 when the shapes are unknown)."""
    shapes = tensor_shapes(model) if shapes is None else shapes
    found = {}
    for node in model.graph.node:
        if node.op_type in op_types:
            found[node.name] = _length(node, shapes)
    return found


def _length(node: onnx.NodeProto, shapes: dict[str, list[int]]) -> int:
    weight = shapes.get(node.input[1], []) if len(node.input) > 1 else []
    if node.op_type in ("Conv", "ConvTranspose") and len(weight) >= 3:
        # Conv weights are [C_out, C_in/groups, k...]; ConvTranspose's are [C_in, C_out/groups, k...].
        channels = weight[1] if node.op_type == "Conv" else weight[0]
        return channels * math.prod(weight[2:])
    if node.op_type == "Gemm" and len(weight) == 2:
        trans_b = any(a.name == "transB" and a.i for a in node.attribute)
        return weight[1] if trans_b else weight[0]
    if node.op_type == "MatMul" and len(weight) >= 2:
        return weight[-2]
    return 0


def intensity_groups(lengths: dict[str, int], steps: int = 3) -> list[tuple[int, tuple[str, ...]]]:
    """Nested sets of low-intensity nodes to keep in FP32: ``(threshold, nodes with K < threshold)``, smallest first.

    Thresholds are the distinct reduction lengths (at most ``steps`` of them, skipping the largest, so every
    set leaves some node in INT8).
    """
    distinct = sorted(set(lengths.values()))
    if len(distinct) < 2:
        return []
    thresholds = distinct[1:]
    if len(thresholds) > steps:
        picks = [round(i * (len(thresholds) - 1) / (steps - 1)) for i in range(steps)] if steps > 1 else [0]
        thresholds = [thresholds[i] for i in sorted(set(picks))]
    groups = []
    for threshold in thresholds:
        nodes = tuple(n for n, k in lengths.items() if k < threshold)
        if nodes and (not groups or len(nodes) > len(groups[-1][1])):
            groups.append((threshold, nodes))
    return groups
