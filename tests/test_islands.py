"""Speed-aware placement: INT8 islands between float nodes are kept in float where their conversions cost more."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from deploy_opt.autotune.islands import CONVERSION_MACS, Islands

OPS = ("Conv", "MatMul", "Gemm")


def _chain(widths: list[int], depthwise: set[int]) -> onnx.ModelProto:
    """conv0 → Relu → conv1 → Relu → ...; conv i is a 3×3 depthwise conv where i is in ``depthwise``."""
    rng = np.random.default_rng(0)
    nodes, inits, current, channels = [], [], "x", widths[0]
    for i, width in enumerate(widths[1:]):
        group = channels if i in depthwise else 1
        out = channels if i in depthwise else width
        weight = rng.normal(0, 0.1, (out, channels // group, 3, 3)).astype(np.float32)
        inits.append(numpy_helper.from_array(weight, f"w{i}"))
        nodes += [
            helper.make_node("Conv", [current, f"w{i}"], [f"c{i}"], name=f"conv{i}", pads=[1, 1, 1, 1], group=group),
            helper.make_node("Relu", [f"c{i}"], [f"r{i}"], name=f"relu{i}"),
        ]
        current, channels = f"r{i}", out
    graph = helper.make_graph(
        nodes,
        "chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, widths[0], 16, 16])],
        [helper.make_tensor_value_info(current, TensorProto.FLOAT, None)],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_cheap_int8_node_between_float_ones_joins_them() -> None:
    # conv1 is depthwise: 9 MACs an output element cannot pay for converting its input and output
    assert 9 < 2 * CONVERSION_MACS
    islands = Islands(_chain([32, 32, 32, 32], depthwise={1}), OPS)
    assert islands.fill(("conv0", "conv2")) == ("conv1",)


def test_a_heavy_int8_node_between_float_ones_stays_int8() -> None:
    # conv1 is 3×3 over 256 channels: 2304 MACs an output element pay for its two conversions
    assert 2304 > 2 * CONVERSION_MACS
    islands = Islands(_chain([32, 256, 256, 32], depthwise=set()), OPS)
    assert islands.fill(("conv0", "conv2")) == ()


def test_a_cheap_int8_run_between_float_nodes_joins_them_whole() -> None:
    islands = Islands(_chain([32, 32, 32, 32, 32], depthwise={1, 2}), OPS)
    # conv1 → conv2 run in INT8 with no conversion between them; with conv3 float too the pair converts at
    # both ends and saves 2 × 9 MACs an element: both join the float region
    assert islands.fill(("conv0", "conv3")) == ("conv1", "conv2")


def test_a_region_that_touches_no_excluded_node_is_left_alone() -> None:
    # only depthwise convs: INT8 pays nowhere, but with nothing excluded the boundary is the model's own
    islands = Islands(_chain([16, 16, 16, 16], depthwise={0, 1, 2}), OPS)
    assert islands.fill(()) == ()
    # conv0 float: conv1 → conv2 is a cheap run from a float node to the graph output, and joins it
    assert islands.fill(("conv0",)) == ("conv1", "conv2")


def test_a_heavy_node_pays_for_a_cheap_neighbour_in_its_region() -> None:
    # conv1 depthwise then conv2 dense 3×3 over 256: the run converts at its ends and saves on conv2's MACs
    islands = Islands(_chain([256, 256, 256, 256, 256], depthwise={1}), OPS)
    assert islands.fill(("conv0", "conv3")) == ()
