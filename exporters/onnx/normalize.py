"""Graph normalisation before calibration, so that the Q/DQ writer does nothing the scale file cannot follow.

ONNX Runtime's quantizer gives a bias initializer shared by several nodes one copy per node under new names
(``conv2_b_0`` → ``conv2_b_00``, ``conv2_b_01``, …), because an int32 bias scale is input scale × weight scale and
so differs per node. A scale file keyed by the shared name cannot describe those copies, and the bit-exact
read-back then refuses the artifact. Simplifiers create such sharing (onnxsim merges identical constants), and
so do some exporters. Un-sharing them first gives every node its own, stably named bias.
"""

from __future__ import annotations

import logging

import onnx

log = logging.getLogger(__name__)
# Operator → the input position of its bias (what ORT quantizes to int32).
BIAS_INPUT = {"Conv": 2, "ConvTranspose": 2, "Gemm": 2}


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
