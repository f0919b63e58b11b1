"""The layer pairs cross-layer equalization can rescale, found on an ONNX graph.

A pair is a producer and a consumer of one family (Conv → Conv, depthwise and grouped included; Gemm/MatMul →
Gemm/MatMul) with constant float32 weights, joined by Identity nodes and at most one activation that commutes with
a positive per-channel scale (Relu, LeakyRelu, PRelu, Clip(0, hi) whose hi the caller may replace by Relu). Every
tensor between them has exactly one reader and is no graph output, and every weight and bias is read by its layer
alone, so rescaling changes nothing else. A producer's bias is its own input or, as Paddle and torch's exporter write
it, the per-channel constant of an Add that alone reads its output.

Not looked through: BatchNormalization (fold it into its Conv first, as ORT's basic optimizations or onnxsim do)
and activations that are not positively homogeneous (HardSwish, Sigmoid, SiLU, GELU): f(z / s) != f(z) / s there.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

_DEFAULT_DOMAINS = ("", "ai.onnx")
_SCALE_FREE = ("Relu", "LeakyRelu", "PRelu")  # f(z / s) = f(z) / s for any s > 0, per element


@dataclass(frozen=True)
class Layer:
    """A Conv, Gemm or MatMul with constant float weights: y_c = gain·(W·x)_c + bias_gain·bias_c."""

    index: int
    name: str
    family: str  # "conv" | "linear": a pair joins two layers of one family
    weight: str
    bias: str | None  # its per-channel bias initializer: its own input, or a following Add's constant
    output: str  # the tensor after its bias (the Add's output where the bias is an Add)
    in_axis: int  # of the weight: Conv 1 (per group), Gemm 1 if transB else 0, MatMul 0
    out_axis: int
    group: int
    gain: float  # Gemm alpha
    bias_gain: float  # Gemm beta for its own C, else 1
    creatable: bool  # a missing bias can be added as an input (Conv, Gemm with beta != 0)
    padded: bool  # a Conv that pads its input


@dataclass(frozen=True)
class LayerPair:
    """A producer and a consumer whose shared channels can be rescaled, with what lies between them."""

    producer: Layer
    consumer: Layer
    activation: str  # op type between, "" for none
    activation_index: int | None
    pre_activation: str  # the activation's input (the producer's output after its bias)
    tensor: str  # what the consumer reads
    channels: int
    clip_max: float | None  # the finite max of a Clip(0, hi) to replace by Relu


class GraphView:
    """Read-only lookups over a graph: constants, readers of each tensor, graph outputs."""

    def __init__(self, graph: onnx.GraphProto) -> None:
        self.graph = graph
        overridable = {i.name for i in graph.input}
        self.consts = {i.name: i for i in graph.initializer if i.name not in overridable}
        self.outputs = {o.name for o in graph.output}
        self.readers: dict[str, list[tuple[int, int]]] = {}
        self.constant_nodes: dict[str, onnx.TensorProto] = {}
        for index, node in enumerate(graph.node):
            for slot, name in enumerate(node.input):
                if name:
                    self.readers.setdefault(name, []).append((index, slot))
            for name in subgraph_reads(node):
                self.readers.setdefault(name, []).append((index, -1))
            if node.op_type == "Constant" and node.domain in _DEFAULT_DOMAINS:
                value = next((a for a in node.attribute if a.name == "value"), None)
                if value is not None:
                    self.constant_nodes[node.output[0]] = value.t

    def sole_reader(self, tensor: str) -> tuple[int, int] | None:
        """(node index, input slot) of the one reader of ``tensor``; None if it has others or is a graph output."""
        readers = self.readers.get(tensor, [])
        return readers[0] if len(readers) == 1 and tensor not in self.outputs else None

    def private(self, name: str, index: int) -> onnx.TensorProto | None:
        """The float32 initializer ``name`` if node ``index`` alone reads it, else None."""
        init = self.consts.get(name)
        if init is None or init.data_type != onnx.TensorProto.FLOAT or self.sole_reader(name) is None:
            return None
        return init if self.readers[name][0][0] == index else None

    def value(self, name: str) -> np.ndarray | None:
        """A constant's value (initializer or Constant node), None for a computed tensor."""
        tensor = self.consts.get(name) or self.constant_nodes.get(name)
        return None if tensor is None else numpy_helper.to_array(tensor)


def subgraph_reads(node: onnx.NodeProto) -> set[str]:
    """Every tensor name read inside the subgraphs of ``node`` (outer-scope references included)."""
    names: set[str] = set()
    for attr in node.attribute:
        for graph in [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs):
            for inner in graph.node:
                names |= set(inner.input) | subgraph_reads(inner)
    return names


def node_label(node: onnx.NodeProto) -> str:
    """A readable name for a node, unnamed ones included."""
    return node.name or f"{node.op_type}:{node.output[0] if node.output else '?'}"


def _attrs(node: onnx.NodeProto) -> dict[str, Any]:
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def _per_channel(dims: Iterable[int], channels: int, trailing: int) -> bool:
    """Whether shape ``dims`` holds one value per channel, the channel axis ``trailing`` axes before the last."""
    dims, tail = list(dims), [channels] + [1] * trailing
    return len(dims) >= len(tail) and dims[len(dims) - len(tail) :] == tail and all(d == 1 for d in dims[: -len(tail)])


def _bias_add(view: GraphView, node: onnx.NodeProto, channels: int, trailing: int) -> tuple[str, int] | None:
    """(constant, Add index) where the node's output only feeds an Add of a per-channel constant."""
    reader = view.sole_reader(node.output[0])
    if reader is None or view.graph.node[reader[0]].op_type != "Add":
        return None
    add = view.graph.node[reader[0]]
    other = add.input[1 - reader[1]] if len(add.input) == 2 else ""
    init = view.private(other, reader[0])
    return (other, reader[0]) if init is not None and _per_channel(init.dims, channels, trailing) else None


def _layer(view: GraphView, index: int) -> Layer | None:
    """The node at ``index`` as a layer CLE can rescale, or None."""
    node = view.graph.node[index]
    if node.domain not in _DEFAULT_DOMAINS or node.op_type not in ("Conv", "Gemm", "MatMul") or len(node.input) < 2:
        return None
    attrs, weight = _attrs(node), view.private(node.input[1], index)
    if weight is None or node.input[0] in view.consts or len(weight.dims) < 2:
        return None
    conv = node.op_type == "Conv"
    if (conv and len(weight.dims) < 3) or (not conv and (len(weight.dims) != 2 or attrs.get("transA", 0))):
        return None
    in_axis = 1 if conv or attrs.get("transB", 0) else 0
    out_axis = 0 if conv else 1 - in_axis
    channels, trailing = weight.dims[out_axis], len(weight.dims) - 2 if conv else 0
    own = node.input[2] if len(node.input) > 2 and node.input[2] else None
    if own is not None and (view.private(own, index) is None or not _per_channel(view.consts[own].dims, channels, 0)):
        return None  # a computed, shared or broadcast bias cannot follow its channels
    added = None if own is not None else _bias_add(view, node, channels, trailing)
    pads = any(attrs.get("pads", [])) or attrs.get("auto_pad", b"NOTSET") not in (b"NOTSET", b"VALID")
    return Layer(
        index=index,
        name=node_label(node),
        family="conv" if conv else "linear",
        weight=node.input[1],
        bias=own or (added[0] if added else None),
        output=view.graph.node[added[1]].output[0] if added else node.output[0],
        in_axis=in_axis,
        out_axis=out_axis,
        group=int(attrs.get("group", 1)),
        gain=float(attrs.get("alpha", 1.0)),
        bias_gain=1.0 if added else float(attrs.get("beta", 1.0)),
        creatable=node.op_type in ("Conv", "Gemm") and attrs.get("beta", 1.0) != 0.0,
        padded=conv and pads,
    )


def _clip_bounds(view: GraphView, node: onnx.NodeProto, opset: int) -> tuple[float, float] | None:
    """A Clip's (min, max), from attributes (opset < 11) or constant inputs; None where an input is computed."""
    if opset < 11:
        attrs = _attrs(node)
        return float(attrs.get("min", -np.inf)), float(attrs.get("max", np.inf))
    bounds = []
    for slot, default in ((1, -np.inf), (2, np.inf)):
        name = node.input[slot] if len(node.input) > slot else ""
        value = view.value(name) if name else np.array(default)
        if value is None or value.size != 1:
            return None
        bounds.append(float(value.reshape(())))
    return bounds[0], bounds[1]


def _activation(view: GraphView, node: onnx.NodeProto, opset: int) -> tuple[str, float | None] | None:
    """(op type, finite max of a Clip(0, hi)) for an op that commutes with per-channel scaling by s > 0, else None."""
    if node.domain not in _DEFAULT_DOMAINS:
        return None
    if node.op_type in _SCALE_FREE:
        return node.op_type, None
    bounds = _clip_bounds(view, node, opset) if node.op_type == "Clip" else None
    if bounds is None or bounds[0] != 0.0:
        return None
    return "Clip", (bounds[1] if np.isfinite(bounds[1]) else None)


def _channels(view: GraphView, producer: Layer, consumer: Layer) -> int | None:
    """The channel count a pair shares, or None where the weights disagree (or a group does not divide)."""
    w1, w2 = view.consts[producer.weight].dims, view.consts[consumer.weight].dims
    channels = w1[producer.out_axis]
    if consumer.family == "conv":
        fits = w2[0] % consumer.group == 0 and w2[1] * consumer.group == channels
    else:
        fits = w2[consumer.in_axis] == channels
    return channels if fits and producer.family == consumer.family else None


def _pair_from(view: GraphView, producer: Layer, layers: dict[int, Layer], opset: int) -> LayerPair | None:
    """Walk from a producer through Identity nodes and at most one activation to a consumer layer."""
    tensor, pre, activation, act_index, clip_max = producer.output, producer.output, "", None, None
    while True:
        reader = view.sole_reader(tensor)
        if reader is None or reader[1] != 0:
            return None
        node = view.graph.node[reader[0]]
        found = _activation(view, node, opset) if act_index is None else None
        if node.op_type == "Identity" and node.domain in _DEFAULT_DOMAINS:
            tensor = node.output[0]
        elif found is not None:
            pre, tensor, (activation, clip_max), act_index = tensor, node.output[0], found, reader[0]
        else:
            break
    consumer = layers.get(reader[0])
    channels = None if consumer is None else _channels(view, producer, consumer)
    if consumer is None or channels is None:
        return None
    return LayerPair(producer, consumer, activation, act_index, pre, tensor, channels, clip_max)


def find_pairs(model: onnx.ModelProto, relu6: str = "replace") -> tuple[list[LayerPair], list[str]]:
    """The pairs CLE can equalize in graph order, and one line per pair left alone because of a Clip(0, hi)."""
    view = GraphView(model.graph)
    opset = next((o.version for o in model.opset_import if o.domain in _DEFAULT_DOMAINS), 1)
    layers = {i: layer for i in range(len(model.graph.node)) if (layer := _layer(view, i)) is not None}
    pairs, skipped = [], []
    for layer in layers.values():
        pair = _pair_from(view, layer, layers, opset)
        if pair is not None and pair.clip_max is not None and relu6 == "skip":
            skipped.append(
                f"{pair.producer.name} -> {pair.consumer.name}: Clip(0, {pair.clip_max:g}) between is not "
                "scale-equivariant (relu6=skip)"
            )
        elif pair is not None:
            pairs.append(pair)
    return pairs, skipped
