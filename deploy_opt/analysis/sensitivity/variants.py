"""Partially quantized variants of a Q/DQ model, for sensitivity analysis.

Every variant is derived from the one fully quantized model that ORT wrote: a node keeps the quantization of
an input (activation, weight, bias) by reading it through its DequantizeLinear, or drops it by reading the
float tensor instead (for weights and biases, the FP32 initializer). The scales stay those of ``scales.json``,
so each variant measures exactly the deployed parameters, and no variant needs the quantizer to run again.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import onnx

from exporters.ort.qdq import INITIALIZER_SUFFIX, OUTPUT_SUFFIX

FLOAT_SUFFIX = "__fp32"


@dataclass(frozen=True)
class QuantizedInput:
    """One input of a node that is read through a DequantizeLinear."""

    index: int
    role: str
    float_name: str


@dataclass(frozen=True)
class QuantizedNode:
    """A compute node of the Q/DQ model and its quantized inputs."""

    name: str
    op_type: str
    order: int
    inputs: tuple[QuantizedInput, ...]
    weight: str | None = None
    outputs: tuple[str, ...] = field(default=())

    @property
    def roles(self) -> set[str]:
        """Which kinds of input this node quantizes."""
        return {i.role for i in self.inputs}


def quantized_nodes(qdq: onnx.ModelProto) -> list[QuantizedNode]:
    """The nodes (not Q/DQ themselves) that read at least one input through a DequantizeLinear, in graph order."""
    producer = {o: n for n in qdq.graph.node for o in n.output}
    inits = {i.name: i for i in qdq.graph.initializer}
    nodes = []
    for order, node in enumerate(n for n in qdq.graph.node if n.op_type not in ("QuantizeLinear", "DequantizeLinear")):
        found = []
        for index, name in enumerate(node.input):
            dq = producer.get(name)
            if dq is None or dq.op_type != "DequantizeLinear":
                continue
            source = dq.input[0]
            if source in inits:
                role = "bias" if inits[source].data_type == onnx.TensorProto.INT32 else "weight"
                found.append(QuantizedInput(index, role, source.removesuffix(INITIALIZER_SUFFIX)))
            elif source in producer and producer[source].op_type == "QuantizeLinear":
                found.append(QuantizedInput(index, "activation", producer[source].input[0]))
        if found:
            weight = next((i.float_name for i in found if i.role == "weight"), None)
            nodes.append(QuantizedNode(node.name, node.op_type, order, tuple(found), weight, tuple(node.output)))
    return nodes


def make_variant(qdq: onnx.ModelProto, fp32: onnx.ModelProto, keep: Mapping[str, set[str]]) -> onnx.ModelProto:
    """A copy of ``qdq`` where each node quantizes only the input roles in ``keep[node]`` (absent: none).

    Graph outputs that ORT quantized stay quantized only if their producer keeps its activations.
    """
    variant = onnx.ModelProto()
    variant.CopyFrom(qdq)
    by_name = {n.name: n for n in variant.graph.node}
    float_inits = {i.name: i for i in fp32.graph.initializer}
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
            if q.float_name in float_inits and q.float_name not in restored:
                restored.add(q.float_name)
                copy = onnx.TensorProto()
                copy.CopyFrom(float_inits[q.float_name])
                copy.name = f"{q.float_name}{FLOAT_SUFFIX}"
                variant.graph.initializer.append(copy)
    _unquantize_outputs(variant, keep)
    return _prune(variant)


def _unquantize_outputs(variant: onnx.ModelProto, keep: Mapping[str, set[str]]) -> None:
    """Turn a graph output's DequantizeLinear into an Identity of the float tensor when its producer is float."""
    producer = {o: n for n in variant.graph.node for o in n.output}
    outputs = {o.name for o in variant.graph.output}
    for node in variant.graph.node:
        if node.op_type != "DequantizeLinear" or node.output[0] not in outputs:
            continue
        quantize = producer.get(node.input[0])
        if quantize is None or quantize.op_type != "QuantizeLinear" or not quantize.input[0].endswith(OUTPUT_SUFFIX):
            continue
        owner = producer.get(quantize.input[0])
        if owner is not None and "activation" not in keep.get(owner.name, set()):
            node.op_type, node.domain = "Identity", ""
            del node.input[:]
            node.input.append(quantize.input[0])
            del node.attribute[:]


def _prune(model: onnx.ModelProto) -> onnx.ModelProto:
    """Drop nodes and initializers that no longer reach a graph output."""
    needed = {o.name for o in model.graph.output}
    kept = []
    for node in reversed(model.graph.node):
        if any(o in needed for o in node.output):
            kept.append(node)
            needed.update(i for i in node.input if i)
    del model.graph.node[:]
    model.graph.node.extend(reversed(kept))
    inits = [i for i in model.graph.initializer if i.name in needed]
    del model.graph.initializer[:]
    model.graph.initializer.extend(inits)
    return model


def all_roles(nodes: list[QuantizedNode]) -> dict[str, set[str]]:
    """Every node keeping every role it has: the fully quantized model."""
    return {n.name: n.roles for n in nodes}
