"""Partially quantized variants of a Q/DQ model, for sensitivity analysis and the fallback search.

Every variant is derived from the one fully quantized model that ORT wrote: a node keeps the quantization of
an input (activation, weight, bias) by reading it through its DequantizeLinear, or drops it by reading the
float tensor instead (for weights and biases, the FP32 initializer). The scales stay those of ``scales.json``,
so each variant measures exactly the deployed parameters, and no variant needs the quantizer to run again.
:func:`make_variant` drops roles node by node (the sensitivity splits); :func:`exclusion_variant` drops whole
nodes with the placement's own rules, and so equals the model the quantizer writes with them excluded.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import onnx

from calibrators.qparams import PASSTHROUGH
from exporters.ort.graph import (
    FLOAT_SUFFIX,
    QuantizedInput,
    QuantizedNode,
    float_copies,
    keep_quantized,
    prune,
    quantized_nodes,
    unquantize_outputs,
)

__all__ = ["QuantizedInput", "QuantizedNode", "all_roles", "exclusion_variant", "make_variant", "quantized_nodes"]

# Ops ORT quantizes only when their input already is (QDQDirect8BitOp and kin, and the removable activations).
FOLLOWERS = PASSTHROUGH | {"Relu", "Clip"}


def make_variant(qdq: onnx.ModelProto, fp32: onnx.ModelProto, keep: Mapping[str, set[str]]) -> onnx.ModelProto:
    """A copy of ``qdq`` where each node quantizes only the input roles in ``keep[node]`` (absent: none).

    Graph outputs that ORT quantized stay quantized only if their producer keeps its activations.
    """
    variant = onnx.ModelProto()
    variant.CopyFrom(qdq)
    by_name = {n.name: n for n in variant.graph.node}
    restored: set[str] = set()
    for qnode in quantized_nodes(qdq):
        node = by_name[qnode.name]
        roles = keep.get(qnode.name, set())
        for q in qnode.inputs:
            if q.role in roles:
                continue
            if q.role == "activation":
                node.input[q.index] = q.float_name
                continue
            # ORT may name a DequantizeLinear's output after the float tensor: restore it under a new name.
            node.input[q.index] = f"{q.float_name}{FLOAT_SUFFIX}"
            restored.add(q.float_name)
    variant.graph.initializer.extend(float_copies(fp32.graph.initializer, restored))
    owner = {o: n.name for n in variant.graph.node for o in n.output}
    unquantize_outputs(variant, lambda tensor: tensor not in owner or "activation" in keep.get(owner[tensor], set()))
    return prune(variant)


def all_roles(nodes: list[QuantizedNode]) -> dict[str, set[str]]:
    """Every node keeping every role it has: the fully quantized model."""
    return {n.name: n.roles for n in nodes}


def exclusion_variant(
    qdq: onnx.ModelProto, fp32: onnx.ModelProto, op_types: Iterable[str], excluded: Iterable[str], placement: str
) -> onnx.ModelProto:
    """``qdq`` with the ``excluded`` nodes in high precision, exactly as the quantizer would write it."""
    wanted, skipped = set(op_types), set(excluded)
    kept = {n.name for n in quantized_nodes(qdq) if n.op_type in wanted and n.name not in skipped}
    return keep_quantized(qdq, fp32.graph.initializer, _followers_kept(fp32, kept, placement), placement)


def _followers_kept(fp32: onnx.ModelProto, kept: set[str], placement: str) -> set[str]:
    """``kept`` without the followers (Relu, Clip, Reshape, MaxPool, …) whose input the writer leaves float.

    ONNX Runtime quantizes such a node only when its input is already quantized when it gets there (in graph
    order): by its producer's output, or by an earlier reader. Excluding the producer leaves the follower float.
    """
    marked: set[str] = set()
    out = set(kept)
    for node in fp32.graph.node:
        if node.name not in out:
            continue
        if node.op_type in FOLLOWERS and (not node.input or node.input[0] not in marked):
            out.discard(node.name)
            continue
        marked.update(i for i in node.input if i)
        if placement == "outputs":
            marked.update(node.output)
    return out
