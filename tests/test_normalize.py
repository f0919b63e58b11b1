"""Graph normalisation before calibration: shared biases get their own copies, so the INT8 writer copies none."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from calibrators.qparams import activation_scale, bias_scales, weight_scales
from calibrators.scales.format import ScaleFile
from dopt_common.ort import create_session
from exporters.onnx.normalize import unshare_biases
from exporters.ort.qdq import compare_scales, read_qdq_scales, write_ort_qdq


def _two_convs_one_bias() -> onnx.ModelProto:
    """Two convolutions reading one bias initializer, as onnxsim leaves identical constants merged."""
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.normal(size=(4, 3, 3, 3)).astype(np.float32), "w1"),
        numpy_helper.from_array(rng.normal(size=(4, 4, 3, 3)).astype(np.float32), "w2"),
        numpy_helper.from_array(np.full(4, 0.02, np.float32), "b"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b"], ["h"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["h"], ["r"], name="relu"),
        helper.make_node("Conv", ["r", "w2", "b"], ["y"], name="conv2", pads=[1, 1, 1, 1]),
    ]
    graph = helper.make_graph(
        nodes,
        "shared",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_shared_biases_are_unshared_and_the_scale_file_then_matches_the_artifact(tmp_path: Path) -> None:
    model = _two_convs_one_bias()
    assert unshare_biases(model) == 2
    assert [n.input[2] for n in model.graph.node if n.op_type == "Conv"] == ["b__conv1", "b__conv2"]
    onnx.checker.check_model(model)
    path = tmp_path / "fp32.onnx"
    onnx.save(model, str(path))
    x = np.random.default_rng(1).uniform(0, 1, (1, 3, 8, 8)).astype(np.float32)
    h = create_session(path, threads=1).run(None, {"x": x})[0]
    tensors = {
        "x": activation_scale("x", 0.0, 1.0, "asymmetric", "minmax"),
        "r": activation_scale("r", 0.0, float(np.maximum(h, 0).max()) * 3, "asymmetric", "minmax"),
    }
    tensors |= weight_scales(model, ("Conv",), (), "absmax", 127)
    tensors |= bias_scales(model, tensors, ("Conv",), ())
    scales = ScaleFile("asymmetric", tensors)
    out = write_ort_qdq(path, scales, tmp_path / "int8.onnx", op_types=("Conv",), quantize_outputs=False)
    carried = read_qdq_scales(out)
    assert compare_scales(scales.restricted_to(carried).tensors, carried).ok
    assert {"b__conv1", "b__conv2"} <= set(carried)
