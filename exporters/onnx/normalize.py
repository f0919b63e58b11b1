"""Graph normalisation of an imported ONNX file, before calibration.

A file from another exporter (Paddle2ONNX, tf2onnx, Caffe2, an old torch) differs from a fresh torch export in
ways the Q/DQ writer and the scale file cannot follow. Each function here fixes one, in place, and returns what it
changed so that ``build.json`` can record it:

- ``modernise_ir``: an IR version below what the opset needs (IR 3 lists every initializer as a graph input);
- ``constants_to_initializers``: weights held by ``Constant`` nodes, which no quantizer recognises as weights;
- ``fold_weight_chains``: weights computed from constants (a Transpose or Reshape of an initializer);
- ``name_dimensions``: dimensions named ``?`` or ``-1``, or not named at all;
- ``unshare_biases``: one bias read by several nodes.

ONNX Runtime's quantizer gives a bias initializer shared by several nodes one copy per node under new names
(``conv2_b_0`` → ``conv2_b_00``, ``conv2_b_01``, …), because an int32 bias scale is input scale × weight scale and
so differs per node. A scale file keyed by the shared name cannot describe those copies, and the bit-exact
read-back then refuses the artifact. Simplifiers create such sharing (onnxsim merges identical constants), and
so do some exporters. Un-sharing them first gives every node its own, stably named bias.
"""

from __future__ import annotations

import logging
import re

import numpy as np
import onnx
from onnx import numpy_helper

from calibrators.qparams import BIAS_INPUT, WEIGHT_INPUT
from exporters.onnx.io import default_opset

log = logging.getLogger(__name__)


def unshare_biases(model: onnx.ModelProto) -> int:
    """Give each node its own copy of a bias initializer that several nodes (or inputs) read; returns the count.

    Copies are named ``<bias>__<node name or index>``; the model is changed in place.
    """
    inits = {i.name: i for i in model.graph.initializer}
    readers: dict[str, int] = {}
    for node in model.graph.node:
        for name in node.input:
            if name in inits:
                readers[name] = readers.get(name, 0) + 1
    copies = 0
    for index, node in enumerate(model.graph.node):
        position = BIAS_INPUT.get(node.op_type)
        if position is None or len(node.input) <= position or readers.get(node.input[position], 0) < 2:
            continue
        source = node.input[position]
        copy = onnx.TensorProto()
        copy.CopyFrom(inits[source])
        copy.name = f"{source}__{node.name or index}"
        model.graph.initializer.append(copy)
        node.input[position] = copy.name
        copies += 1
    if copies:
        log.info("normalised: %d shared bias reads given their own copies (the INT8 writer copies them)", copies)
    return copies


# Operators that turn constants into a weight without reading data: folded when every leaf is a constant.
FOLDABLE = frozenset(
    {
        "Transpose",
        "Reshape",
        "Cast",
        "Identity",
        "Squeeze",
        "Unsqueeze",
        "Flatten",
        "Mul",
        "Div",
        "Add",
        "Sub",
        "Neg",
        "Concat",
        "Slice",
        "Gather",
        "Expand",
        "Tile",
        "ConstantOfShape",
        "Constant",
    }
)
UNNAMED = frozenset({"", "?", "-1", "None"})


def modernise_ir(model: onnx.ModelProto) -> str | None:
    """Raise the IR version to what the opset needs and drop initializers from the graph inputs (IR < 4).

    An IR-3 file lists every initializer as a graph input, so ORT treats its weights as inputs a caller may
    override: it neither folds them nor lets the quantizer treat them as constant weights.
    """
    opset = default_opset(model) or 0
    needed = min((row[1] for row in onnx.helper.VERSION_TABLE if row[2] >= opset), default=onnx.IR_VERSION)
    inits = {i.name for i in model.graph.initializer}
    listed = [v for v in model.graph.input if v.name in inits]
    before = model.ir_version
    if before >= needed and not listed:
        return None
    model.ir_version = max(before, needed)
    kept = [v for v in model.graph.input if v.name not in inits]
    del model.graph.input[:]
    model.graph.input.extend(kept)
    change = f"IR {before} -> {model.ir_version}"
    if listed:
        change += f"; {len(listed)} initializers no longer graph inputs"
    log.info("normalised: %s", change)
    return change


def constants_to_initializers(model: onnx.ModelProto) -> int:
    """Move the value of each top-level ``Constant`` node into an initializer of the same name; returns the count.

    Paddle2ONNX and some tf2onnx versions hold every weight in a ``Constant`` node. A quantizer looks for weights
    among the initializers, so it would see a Conv with no weight at all and leave it float.
    """
    outputs = {o.name for o in model.graph.output}
    kept, moved = [], 0
    for node in model.graph.node:
        value = _constant_value(node) if node.op_type == "Constant" and node.output[0] not in outputs else None
        if value is None:
            kept.append(node)
            continue
        model.graph.initializer.append(numpy_helper.from_array(value, node.output[0]))
        moved += 1
    if moved:
        del model.graph.node[:]
        model.graph.node.extend(kept)
        log.info("normalised: %d Constant nodes moved into initializers", moved)
    return moved


def _constant_value(node: onnx.NodeProto) -> np.ndarray | None:
    """A Constant node's value as an array; None for a sparse value (left as a node)."""
    for attr in node.attribute:
        if attr.name == "value":
            return numpy_helper.to_array(attr.t)
        if attr.name == "value_float":
            return np.array(attr.f, np.float32)
        if attr.name == "value_int":
            return np.array(attr.i, np.int64)
        if attr.name == "value_floats":
            return np.array(list(attr.floats), np.float32)
        if attr.name == "value_ints":
            return np.array(list(attr.ints), np.int64)
        if attr.name in ("value_string", "value_strings"):
            return np.array(attr.s if attr.name == "value_string" else list(attr.strings), dtype=object)
    return None


def fold_weight_chains(model: onnx.ModelProto, max_nodes: int = 8) -> int:
    """Fold a Conv/Gemm/MatMul weight computed from constants (a Transpose of an initializer, …) into an initializer.

    Only chains of at most ``max_nodes`` shape and arithmetic operators whose leaves are all initializers are
    folded, by onnx's reference evaluator; returns how many weights were folded.
    """
    from onnx.reference import ReferenceEvaluator

    inits = {i.name: i for i in model.graph.initializer}
    producers = {out: node for node in model.graph.node for out in node.output}
    order = {id(node): index for index, node in enumerate(model.graph.node)}
    folded: list[str] = []
    for node in model.graph.node:
        position = WEIGHT_INPUT.get(node.op_type)
        if position is None or len(node.input) <= position or node.input[position] in inits:
            continue
        chain = _constant_chain(node.input[position], producers, inits, max_nodes, order)
        if not chain:
            continue
        leaves = [inits[n] for n in dict.fromkeys(i for c in chain for i in c.input) if n in inits]
        graph = onnx.helper.make_graph(
            chain, "fold", [], [onnx.helper.make_tensor_value_info(node.input[position], 0, None)], leaves
        )
        probe = onnx.helper.make_model(graph, opset_imports=list(model.opset_import), ir_version=model.ir_version)
        value = ReferenceEvaluator(probe).run(None, {})[0]
        inits[node.input[position]] = numpy_helper.from_array(np.asarray(value), node.input[position])
        model.graph.initializer.append(inits[node.input[position]])
        folded.append(node.input[position])
    if folded:
        _drop_dead_nodes(model, set(folded))
        log.info("normalised: %d weights computed from constants folded into initializers", len(folded))
    return len(folded)


def _constant_chain(
    name: str,
    producers: dict[str, onnx.NodeProto],
    inits: dict[str, onnx.TensorProto],
    max_nodes: int,
    order: dict[int, int],
) -> list[onnx.NodeProto]:
    """The nodes (in graph order) that compute ``name`` from initializers only; [] when it reads anything else."""
    chain: dict[int, onnx.NodeProto] = {}
    stack = [name]
    while stack:
        current = stack.pop()
        if not current or current in inits:
            continue
        node = producers.get(current)
        if node is None or node.op_type not in FOLDABLE or len(chain) >= max_nodes:
            return []
        if id(node) not in chain:
            chain[id(node)] = node
            stack.extend(node.input)
    return sorted(chain.values(), key=lambda n: order[id(n)])


def _drop_dead_nodes(model: onnx.ModelProto, folded: set[str]) -> None:
    """Remove the producers of folded tensors, then any node and initializer nothing reads any more."""
    nodes = [n for n in model.graph.node if not set(n.output) & folded]
    graph_outputs = {o.name for o in model.graph.output}
    while True:
        read = {i for n in nodes for i in n.input} | graph_outputs
        alive = [n for n in nodes if n.op_type not in FOLDABLE or set(n.output) & read]
        if len(alive) == len(nodes):
            break
        nodes = alive
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    read = {i for n in nodes for i in n.input} | graph_outputs
    inits = [i for i in model.graph.initializer if i.name in read]
    del model.graph.initializer[:]
    model.graph.initializer.extend(inits)


def name_dimensions(model: onnx.ModelProto) -> list[str]:
    """Give each graph input/output dimension named ``?``, ``-1`` or nothing a stable name; returns them.

    The name is ``<tensor>_dim<i>``, so two unknown dimensions are never taken for the same one, and reports,
    the scale file and the compatibility check all say the same thing.
    """
    named = []
    for value in [*model.graph.input, *model.graph.output]:
        for index, dim in enumerate(value.type.tensor_type.shape.dim):
            if dim.dim_value > 0 or dim.dim_param not in UNNAMED:
                continue
            dim.dim_param = f"{re.sub(r'[^0-9A-Za-z_]', '_', value.name)}_dim{index}"
            named.append(dim.dim_param)
    if named:
        log.info("normalised: unnamed dimensions named %s", named)
    return named
