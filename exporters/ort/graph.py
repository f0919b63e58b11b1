"""Reading and rewiring a Q/DQ graph: which nodes read which inputs through a DequantizeLinear.

Two placements of activation Q/DQ exist, and :func:`keep_quantized` reproduces either for any set of kept nodes:

- ``outputs`` (ORT's default): a tensor is quantized when a kept node reads it or a kept node produces it, and
  then *every* reader takes the dequantized value, a float op (a residual Add) or an excluded node included;
- ``inputs``: a tensor is quantized only on its edges into kept nodes. Every other reader takes the float
  tensor, so a residual stream or a LayerNorm input keeps its precision, and excluding a node really keeps its
  inputs float.

The writer applies it to ORT's output (``inputs``), and the fallback search applies it to the fully quantized
model: a variant is then exactly the model that the quantizer writes with those nodes excluded.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import onnx

# ORT's naming (quant_utils): a quantized graph output is renamed to <name>_QuantizeLinear_Input, a quantized
# initializer to <name>_quantized.
OUTPUT_SUFFIX, INITIALIZER_SUFFIX = "_QuantizeLinear_Input", "_quantized"
FLOAT_SUFFIX = "__fp32"
PLACEMENTS = ("inputs", "outputs")


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


def kept_nodes(qdq: onnx.ModelProto, op_types: Iterable[str], exclude: Iterable[str] = ()) -> set[str]:
    """The quantized nodes of ``op_types`` that are not excluded: the nodes that run in INT8."""
    wanted, skipped = set(op_types), set(exclude)
    return {n.name for n in quantized_nodes(qdq) if n.op_type in wanted and n.name not in skipped}


def keep_quantized(
    qdq: onnx.ModelProto, float_inits: Iterable[onnx.TensorProto], kept: set[str], placement: str
) -> onnx.ModelProto:
    """A copy of ``qdq`` where only the ``kept`` nodes are quantized, placed as ``placement`` says.

    ``float_inits`` are the FP32 model's initializers, restored for a weight or bias no kept node reads.
    """
    if placement not in PLACEMENTS:
        raise ValueError(f"placement {placement!r} is not one of {PLACEMENTS}")
    model = onnx.ModelProto()
    model.CopyFrom(qdq)
    nodes = quantized_nodes(model)
    producer = {o: n.name for n in model.graph.node for o in n.output}
    read = {q.float_name for n in nodes if n.name in kept for q in n.inputs if q.role == "activation"}
    weights = {q.float_name for n in nodes if n.name in kept for q in n.inputs if q.role == "weight"}
    quantized = read | ({t for t in producer if producer[t] in kept} if placement == "outputs" else set())
    by_name = {n.name: n for n in model.graph.node}
    restore: set[str] = set()
    for qnode in nodes:
        node = by_name[qnode.name]
        for q in qnode.inputs:
            if q.role == "activation":
                dq = quantized_activation(q.float_name, quantized) and (placement == "outputs" or qnode.name in kept)
                if not dq:
                    node.input[q.index] = q.float_name
            elif (q.role == "weight" and q.float_name not in weights) or (q.role == "bias" and qnode.name not in kept):
                node.input[q.index] = f"{q.float_name}{FLOAT_SUFFIX}"
                restore.add(q.float_name)
    model.graph.initializer.extend(float_copies(float_inits, restore))
    unquantize_outputs(model, lambda tensor: quantized_activation(tensor, quantized))
    return prune(model)


def quantized_activation(float_name: str, quantized: set[str]) -> bool:
    """Whether an activation stays quantized; a renamed graph output counts under its own name too."""
    return float_name in quantized or float_name.removesuffix(OUTPUT_SUFFIX) in quantized


def float_copies(inits: Iterable[onnx.TensorProto], names: set[str]) -> list[onnx.TensorProto]:
    """Copies of the named float initializers under ``<name>__fp32``, for readers that drop their DQ."""
    copies = []
    for init in inits:
        if init.name in names:
            copy = onnx.TensorProto()
            copy.CopyFrom(init)
            copy.name = f"{init.name}{FLOAT_SUFFIX}"
            copies.append(copy)
    return copies


def unquantize_outputs(model: onnx.ModelProto, stays_quantized: Callable[[str], bool]) -> None:
    """Turn a graph output's DequantizeLinear into an Identity of its float tensor (``<name>_QuantizeLinear_Input``)
    unless ``stays_quantized(that float tensor)``."""
    producer = {o: n for n in model.graph.node for o in n.output}
    outputs = {o.name for o in model.graph.output}
    for node in model.graph.node:
        if node.op_type != "DequantizeLinear" or node.output[0] not in outputs:
            continue
        quantize = producer.get(node.input[0])
        if quantize is None or quantize.op_type != "QuantizeLinear" or not quantize.input[0].endswith(OUTPUT_SUFFIX):
            continue
        if not stays_quantized(quantize.input[0]):
            node.op_type, node.domain = "Identity", ""
            del node.input[:]
            node.input.append(quantize.input[0])
            del node.attribute[:]


def prune(model: onnx.ModelProto) -> onnx.ModelProto:
    """Drop nodes and initializers that no longer reach a graph output (in place; returns ``model``)."""
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
