"""The model's head: the nodes that turn the last weighted layers into the outputs, kept float as a unit.

A detector's head mixes quantities of very different scales in one output: YOLO's box regression passes through
a softmax over 16 distance bins and the DFL conv (a fixed ramp 0…15) into pixel coordinates, and is concatenated
with sigmoid class scores in [0, 1]. One int8 step on the concatenated tensor is a pixel; on the scores' logits
it moves detections across the threshold. The recipe users apply by hand is to keep the head in float: the last
convs of the box and class branches, the DFL conv, and the decode ops after them. The same cut is the
"last layer in float" recipe of a classifier.

``head_nodes`` finds that cut on any graph: walking back from the graph outputs, every node met is in the head,
and the walk stops at (and includes) the first weighted node on each path that has more than one output channel
(a one-channel projection such as the DFL ramp is part of the decode, so the walk goes on to the box conv).
The auto search tries each placement with the head in float as one trial (``search.py``), measured on the task
metric like every other trial.
"""

from __future__ import annotations

from collections.abc import Iterable

import onnx

from calibrators.qparams import WEIGHT_INPUT, channel_axis

# A head is a small part of the model: a cut that keeps more of its weighted nodes float than this is no head
# (a recurrent model's state outputs lead back through the whole network).
MAX_SHARE = 0.5


def head_nodes(model: onnx.ModelProto, op_types: Iterable[str]) -> tuple[str, ...]:
    """Names of the head's nodes, in graph order: every node between the last weighted nodes and the outputs.

    Weighted means an op of ``op_types`` with a weight input (Conv, Gemm, MatMul, …) whose weight is a constant.
    Empty when an output is a graph input or no weighted node precedes any output.
    """
    weighted = set(op_types) & set(WEIGHT_INPUT)
    constants = {i.name for i in model.graph.initializer}
    constants |= {o for n in model.graph.node if n.op_type == "Constant" for o in n.output}
    producer = {out: node for node in model.graph.node for out in node.output if out}
    shapes = {i.name: tuple(i.dims) for i in model.graph.initializer}
    head: set[str] = set()
    stops = 0
    pending = [o.name for o in model.graph.output]
    seen: set[str] = set()
    while pending:
        tensor = pending.pop()
        node = producer.get(tensor)
        if tensor in seen or node is None or node.op_type == "Constant":
            continue
        seen.add(tensor)
        head.add(node.name)
        index = WEIGHT_INPUT.get(node.op_type)
        is_weighted = node.op_type in weighted and index is not None and len(node.input) > index
        if is_weighted and node.input[index] in constants and _channels(node, shapes.get(node.input[index])) != 1:
            stops += 1
            continue
        pending.extend(i for i in node.input if i and i not in constants)
    if not stops:
        return ()
    return tuple(n.name for n in model.graph.node if n.name in head)


def _channels(node: onnx.NodeProto, shape: tuple[int, ...] | None) -> int | None:
    """The weight's output channels: a one-channel projection (YOLO's DFL ramp) is decode, not the head's edge."""
    if not shape:
        return None
    return shape[channel_axis(node, len(shape))]


def float_head(model: onnx.ModelProto, op_types: Iterable[str]) -> tuple[str, ...]:
    """The head's nodes of ``op_types`` (those a quantizer would touch), when the head keeps at most
    ``MAX_SHARE`` of the weighted nodes float; else empty."""
    wanted = set(op_types)
    names = set(head_nodes(model, wanted))
    weighted = wanted & set(WEIGHT_INPUT)
    inside = sum(n.name in names and n.op_type in weighted for n in model.graph.node)
    total = sum(n.op_type in weighted for n in model.graph.node)
    if not names or inside > MAX_SHARE * total:
        return ()
    return tuple(n.name for n in model.graph.node if n.name in names and n.op_type in wanted)
