"""Reading a dynamic-range INT8 model back: its int8 weights with their parameters, and what it quantizes at run time.

Everything is read from the written graph, never from the writer's settings, so comparing it with scales.json
proves that the file and the model agree. ORT's dynamic mode (``quantize_dynamic``) writes:

- MatMul (and Gemm, which it first splits into MatMul + Add): ``DynamicQuantizeLinear(A)`` → ``MatMulInteger(A_q,
  B_q, a_zero, b_zero)`` → ``Cast`` → ``Mul(·, a_scale × b_scale)``; ORT CPU fuses the chain into
  ``DynamicQuantizeMatMul`` when it loads the model;
- Conv: the same chain with ``ConvInteger``;
- LSTM: ``com.microsoft.DynamicQuantizeLSTM(X, W_q, R_q, …, W_scale, W_zero, R_scale, R_zero)``, which quantizes X
  and the hidden state itself at each step;
- Attention: ``DynamicQuantizeLinear(A)`` → ``com.microsoft.QAttention(A_q, W_q, bias, a_scale, w_scale, mask,
  a_zero, w_zero)``.

A weight entry is keyed by the float initializer ORT quantized (the written name less ``_quantized``); a Gemm's
weight with ``transB=1`` is ORT's transposed copy, ``<name>_Transposed``. An LSTM weight ``W`` is
``[directions, 4·hidden, input]``: its per-channel scales are one per direction and gate row (axis 1, flattened
direction-major); per-tensor it has one per direction (axis 0).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from calibrators.scales.format import DynamicTensor, ScaleFile, TensorScale
from dopt_common.errors import ModelError
from dopt_common.names import named_counts
from exporters.ort.graph import INITIALIZER_SUFFIX
from exporters.ort.qdq import ScaleDiff, compare_scales

QTYPE_NAMES = {onnx.TensorProto.INT8: "int8", onnx.TensorProto.UINT8: "uint8"}
# Op -> (input index of the quantized weight, of its scale, of its zero point); -1: found through the Mul chain.
INTEGER_OPS = {"MatMulInteger": (1, -1, 3), "ConvInteger": (1, -1, 3), "QAttention": (1, 4, 7)}
LSTM_WEIGHTS = ((1, 8, 9), (2, 10, 11))  # DynamicQuantizeLSTM: (W, W_scale, W_zero), (R, R_scale, R_zero)
DYNAMIC_OPS = ("DynamicQuantizeLinear", "DynamicQuantizeLSTM")


@dataclass(frozen=True)
class DynamicReadback:
    """What a dynamic INT8 model carries: weight parameters, run-time quantized activations, quantized nodes."""

    weights: Mapping[str, TensorScale]
    dynamic: Mapping[str, DynamicTensor]
    outputs: Mapping[str, str]  # each quantized node of the written model -> the float tensor it produces


@dataclass(frozen=True)
class DynamicDiff:
    """Where a dynamic INT8 model and its scale file disagree: weights bit for bit, the run-time activations by name."""

    weights: ScaleDiff
    dynamic_missing: tuple[str, ...] = ()  # listed in scales.json, not quantized at run time by the model
    dynamic_extra: tuple[str, ...] = ()  # quantized at run time by the model, not listed in scales.json
    dynamic_changed: tuple[str, ...] = ()  # another integer type or op than scales.json says

    @property
    def ok(self) -> bool:
        """True when the model carries exactly the scale file."""
        return self.weights.ok and not (self.dynamic_missing or self.dynamic_extra or self.dynamic_changed)

    def summary(self) -> str:
        """One line naming the first offending tensors."""
        parts = [] if self.weights.ok else [self.weights.summary()]
        parts += named_counts(
            (
                ("dynamic, missing from the model", self.dynamic_missing),
                ("dynamic in the model, missing from scales.json", self.dynamic_extra),
                ("dynamic with another dtype or op", self.dynamic_changed),
            )
        )
        return "; ".join(parts) or "all equal"


def compare_dynamic(scales: ScaleFile, readback: DynamicReadback) -> DynamicDiff:
    """Compare a scale file with what a dynamic INT8 model carries (``read_dynamic_model``)."""
    declared, found = scales.dynamic, readback.dynamic
    return DynamicDiff(
        compare_scales(scales.tensors, readback.weights),
        tuple(sorted(set(declared) - set(found))),
        tuple(sorted(set(found) - set(declared))),
        tuple(sorted(n for n in set(declared) & set(found) if declared[n] != found[n])),
    )


@dataclass(frozen=True)
class _Graph:
    inits: Mapping[str, onnx.TensorProto]
    readers: Mapping[str, tuple[onnx.NodeProto, ...]]
    producers: Mapping[str, onnx.NodeProto]


def read_dynamic_model(path: str | Path, model: onnx.ModelProto | None = None) -> DynamicReadback:
    """The quantization the dynamic INT8 model at ``path`` really carries (``model``: that file already loaded)."""
    model = model if model is not None else onnx.load(str(path))
    nodes = list(_nodes(model.graph))
    graph = _index(model.graph, nodes)
    weights: dict[str, TensorScale] = {}
    dynamic: dict[str, DynamicTensor] = {}
    outputs: dict[str, str] = {}
    for node in nodes:
        if node.op_type in DYNAMIC_OPS and node.input and node.input[0]:
            dynamic[node.input[0]] = DynamicTensor(node.input[0], "uint8", node.op_type)
        found = _node_weights(node, graph, path)
        if not found:
            continue
        outputs[node.name or node.output[0]] = _float_output(node, graph)
        for entry in found:
            if weights.get(entry.name, entry) != entry:  # one weight shared by two nodes, quantized two ways
                raise ModelError(f"dynamic model '{path}': weight '{entry.name}' is quantized twice, differently")
            weights[entry.name] = entry
    return DynamicReadback(weights, dynamic, outputs)


def _nodes(graph: onnx.GraphProto) -> Iterator[onnx.NodeProto]:
    """Every node, control-flow sub-graphs included (ORT quantizes them with EnableSubgraph)."""
    for node in graph.node:
        yield node
        for attr in node.attribute:
            for sub in [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs):
                yield from _nodes(sub)


def _index(graph: onnx.GraphProto, nodes: list[onnx.NodeProto]) -> _Graph:
    inits: dict[str, onnx.TensorProto] = {i.name: i for i in graph.initializer}
    for node in nodes:  # a sub-graph's own initializers
        for attr in node.attribute:
            for sub in [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs):
                inits.update({i.name: i for i in sub.initializer})
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in nodes:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    producers = {out: node for node in nodes for out in node.output}
    return _Graph(inits, {k: tuple(v) for k, v in readers.items()}, producers)


def _node_weights(node: onnx.NodeProto, graph: _Graph, path: str | Path) -> list[TensorScale]:
    if node.op_type == "DynamicQuantizeLSTM":
        return [_entry(node, graph, w, s, z, "DynamicQuantizeLSTM") for w, s, z in LSTM_WEIGHTS]
    if node.op_type not in INTEGER_OPS or len(node.input) < 2 or node.input[1] not in graph.inits:
        return []
    weight, scale, zero = INTEGER_OPS[node.op_type]
    if scale < 0:
        scale_name = _chain_weight_scale(node, graph)
        if scale_name is None:
            raise ModelError(
                f"dynamic model '{path}': {node.op_type} '{node.name}' has no Cast → Mul(scale) after it, the form "
                "ORT's quantize_dynamic writes; fix: write the model again with write_ort_dynamic"
            )
        return [_entry(node, graph, weight, scale_name, zero, node.op_type)]
    return [_entry(node, graph, weight, scale, zero, node.op_type)]


def _after(name: str, graph: _Graph, op_type: str) -> onnx.NodeProto | None:
    return next((n for n in graph.readers.get(name, ()) if n.op_type == op_type), None)


def _chain_weight_scale(node: onnx.NodeProto, graph: _Graph) -> str | None:
    """The weight scale of a MatMulInteger/ConvInteger: the initializer factor of the Mul that scales its output."""
    cast = _after(node.output[0], graph, "Cast")
    mul = _after(cast.output[0], graph, "Mul") if cast is not None else None
    if mul is None:
        return None
    factor = next((i for i in mul.input if i != cast.output[0]), "")
    product = graph.producers.get(factor)
    if factor in graph.inits:  # a weight scale alone, where the activation scale was folded elsewhere
        return factor
    if product is None or product.op_type != "Mul":
        return None
    return next((i for i in product.input if i in graph.inits), None)


def _float_output(node: onnx.NodeProto, graph: _Graph) -> str:
    """The float tensor a quantized node stands for: after MatMulInteger/ConvInteger, the output of its scaling Mul."""
    if node.op_type not in ("MatMulInteger", "ConvInteger"):
        return node.output[0]
    cast = _after(node.output[0], graph, "Cast")
    mul = _after(cast.output[0], graph, "Mul") if cast is not None else None
    return mul.output[0] if mul is not None else node.output[0]


def _entry(node: onnx.NodeProto, graph: _Graph, weight: int, scale: int | str, zero: int, op: str) -> TensorScale:
    """One weight's parameters; ``scale`` is an input index or the scale initializer's name."""
    q_name = node.input[weight]
    scale_name = node.input[scale] if isinstance(scale, int) else scale
    scale_init = graph.inits[scale_name]
    values = numpy_helper.to_array(scale_init).astype(np.float32).reshape(-1)
    zero_name = node.input[zero] if len(node.input) > zero else ""
    zeros = (
        numpy_helper.to_array(graph.inits[zero_name]).reshape(-1)
        if zero_name
        else np.zeros(values.size, dtype=np.int64)
    )
    dtype = QTYPE_NAMES.get(graph.inits[q_name].data_type, str(graph.inits[q_name].data_type))
    return TensorScale(
        q_name.removesuffix(INITIALIZER_SUFFIX),
        "weight",
        dtype,
        tuple(float(s) for s in values),
        tuple(int(z) for z in zeros),
        _axis(op, len(scale_init.dims), len(graph.inits[q_name].dims)),
        method="readback",
    )


def _axis(op: str, scale_rank: int, weight_rank: int) -> int | None:
    """The channel axis of the float weight: None for a scalar scale (per-tensor)."""
    if op == "DynamicQuantizeLSTM":
        return 1 if scale_rank == 2 else 0  # [directions, 4·hidden] per channel, [directions] per tensor
    if scale_rank == 0:
        return None
    return 0 if op == "ConvInteger" else weight_rank - 1  # Conv: output channels; MatMul/Attention: columns
