"""The torch evaluator of ONNX graphs matches ONNX Runtime, and says which operators it lacks."""

from __future__ import annotations

from pathlib import Path

import fragile_onnx
import numpy as np
import onnx
import pytest
import tiny_attention_onnx
import torch
from onnx import TensorProto, helper, numpy_helper

from deploy_opt.analysis.onnx_torch import UnsupportedOpError, run_graph, unsupported_ops
from dopt_common.ort import create_session


def _model(nodes, inputs, outputs, inits, opset: int = 18) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, [numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 9
    return model


def _compare(model: onnx.ModelProto, feeds: dict[str, np.ndarray], atol: float = 1e-5) -> None:
    expected = create_session(model.SerializeToString()).run(None, feeds)
    with torch.no_grad():
        env = run_graph(model, feeds)
    for output, reference in zip(model.graph.output, expected, strict=True):
        got = env[output.name].numpy()
        assert got.shape == reference.shape, output.name
        np.testing.assert_allclose(got, reference, atol=atol, rtol=1e-5, err_msg=output.name)


def test_an_attention_block_and_an_mlp_match_onnxruntime(tmp_path: Path) -> None:
    for module in (tiny_attention_onnx, fragile_onnx):
        model = onnx.load(str(module.make_model(tmp_path / "m.onnx")))
        assert unsupported_ops(model) == []
        _compare(model, module.evaluation()[0][0], atol=1e-4)


def test_a_cnn_matches_onnxruntime() -> None:
    rng = np.random.default_rng(0)
    inits = {
        "w": rng.normal(0, 0.3, (4, 2, 3, 3)).astype(np.float32),
        "b": rng.normal(0, 0.1, 4).astype(np.float32),
        "wd": rng.normal(0, 0.3, (4, 2, 3, 3)).astype(np.float32),
        "fc": rng.normal(0, 0.3, (5, 4)).astype(np.float32),
        "fcb": rng.normal(0, 0.1, 5).astype(np.float32),
        "bn_s": rng.uniform(0.5, 1.5, 4).astype(np.float32),
        "bn_b": rng.normal(0, 0.1, 4).astype(np.float32),
        "bn_m": rng.normal(0, 0.1, 4).astype(np.float32),
        "bn_v": rng.uniform(0.5, 1.5, 4).astype(np.float32),
    }
    node = helper.make_node
    nodes = [
        node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], strides=[1, 1]),
        node("BatchNormalization", ["c", "bn_s", "bn_b", "bn_m", "bn_v"], ["bn"]),
        node("Relu", ["bn"], ["r"]),
        node("Conv", ["x", "wd"], ["c2"], pads=[0, 0, 1, 1], strides=[2, 2]),
        node("Sigmoid", ["c2"], ["s2"]),
        node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
        node("AveragePool", ["p"], ["a"], kernel_shape=[2, 2], strides=[1, 1], pads=[1, 1, 1, 1]),
        node("GlobalAveragePool", ["a"], ["g"]),
        node("Flatten", ["g"], ["f"], axis=1),
        node("Gemm", ["f", "fc", "fcb"], ["y"], transB=1, alpha=0.5),
        node("Softmax", ["y"], ["prob"], axis=-1),
    ]
    model = _model(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 2, 8, 8])],
        [
            helper.make_tensor_value_info("prob", TensorProto.FLOAT, shape=None),
            helper.make_tensor_value_info("s2", TensorProto.FLOAT, shape=None),
        ],
        inits,
    )
    _compare(model, {"x": rng.normal(0, 1, (3, 2, 8, 8)).astype(np.float32)})


def test_shape_arithmetic_matches_onnxruntime() -> None:
    """The shape plumbing exporters emit: Shape, Gather, Unsqueeze, Concat, Reshape, Slice, Expand, CumSum, Where."""
    ints = lambda *v: np.array(v, np.int64)  # noqa: E731
    inits = {"zero": ints(0), "one": ints(1), "minus1": ints(-1), "starts": ints(1), "ends": ints(2**62), "ax": ints(1)}
    node = helper.make_node
    nodes = [
        node("Shape", ["x"], ["shape"]),
        node("Gather", ["shape", "zero"], ["batch"], axis=0),
        node("Shape", ["x"], ["seq"], start=1, end=2),
        node("Concat", ["batch", "seq", "minus1"], ["new_shape"], axis=0),
        node("Reshape", ["x", "new_shape"], ["r"]),
        node("Slice", ["r", "starts", "ends", "ax"], ["sl"]),
        node("CumSum", ["sl", "ax"], ["cs"], exclusive=1),
        node("ReduceSum", ["cs", "minus1"], ["rs"], keepdims=1),
        node("Expand", ["rs", "shape3"], ["ex"]),
        node("Greater", ["ex", "thresh"], ["mask"]),
        node("Where", ["mask", "ex", "neg"], ["w"]),
        node("Cast", ["batch"], ["batch_f"], to=TensorProto.FLOAT),
        node("Unsqueeze", ["batch_f", "zero"], ["bu"]),
        node("Div", ["w", "bu"], ["y"]),
        node("Split", ["y"], ["y1", "y2"], axis=2, num_outputs=2),
        node("Erf", ["y1"], ["e1"]),
        node("Pow", ["y2", "two"], ["p2"]),
        node("ReduceL2", ["p2"], ["l2"], keepdims=0),
    ]
    inits.update(
        shape3=ints(1, 1, 4),
        thresh=np.array(0.0, np.float32),
        neg=np.array(-1.0, np.float32),
        two=np.array(2.0, np.float32),
    )
    model = _model(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3, 2, 2])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape=None) for n in ("e1", "l2")],
        inits,
    )
    _compare(model, {"x": np.random.default_rng(1).normal(0, 1, (2, 3, 2, 2)).astype(np.float32)})


def test_quantize_and_dequantize_match_onnxruntime() -> None:
    """Per-tensor uint8 with a zero point, per-channel int8 on axis 0, and saturation at both ends."""
    rng = np.random.default_rng(2)
    inits = {
        "s": np.array(0.05, np.float32),
        "z": np.array(100, np.uint8),
        "sc": rng.uniform(0.01, 0.1, 3).astype(np.float32),
        "zc": np.zeros(3, np.int8),
    }
    node = helper.make_node
    nodes = [
        node("QuantizeLinear", ["x", "s", "z"], ["q"]),
        node("DequantizeLinear", ["q", "s", "z"], ["dq"]),
        node("QuantizeLinear", ["x", "sc", "zc"], ["qc"], axis=0),
        node("DequantizeLinear", ["qc", "sc", "zc"], ["dqc"], axis=0),
    ]
    model = _model(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 50])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape=None) for n in ("dq", "dqc")],
        inits,
    )
    _compare(model, {"x": rng.normal(0, 4, (3, 50)).astype(np.float32)}, atol=0)


def test_an_operator_it_lacks_is_named() -> None:
    model = _model(
        [helper.make_node("Det", ["x"], ["y"], name="det")],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape=None)],
        {},
    )
    assert unsupported_ops(model) == ["Det"]
    with pytest.raises(UnsupportedOpError, match=r"ai\.onnx\.Det \(node 'det'\)"):
        run_graph(model, {"x": np.eye(2, dtype=np.float32)})


def test_gradients_flow_through_the_graph(tmp_path: Path) -> None:
    """The point of the evaluator: d(output)/d(node output) by autograd equals a finite difference."""
    model = onnx.load(str(tiny_attention_onnx.make_model(tmp_path / "m.onnx")))
    feeds = {"x": tiny_attention_onnx.evaluation()[0][0]["x"][:2]}
    taps = {}

    def hook(node, inputs, outputs):
        if node.name == "q_proj":
            taps["q"] = torch.zeros_like(outputs[0], requires_grad=True)
            return [outputs[0] + taps["q"]]
        return None

    env = run_graph(model, feeds, hook)
    direction = torch.randn(env["y"].shape, generator=torch.Generator().manual_seed(0))
    (grad,) = torch.autograd.grad((env["y"] * direction).sum(), [taps["q"]])
    bump = torch.randn(grad.shape, generator=torch.Generator().manual_seed(1)) * 1e-2

    def shifted(sign: float) -> torch.Tensor:
        def push(node, inputs, outputs):
            return [outputs[0] + sign * bump] if node.name == "q_proj" else None

        with torch.no_grad():
            return (run_graph(model, feeds, push)["y"].double() * direction).sum()

    finite = (shifted(1.0) - shifted(-1.0)) / 2
    assert float((grad * bump).sum()) == pytest.approx(float(finite), rel=1e-2)
