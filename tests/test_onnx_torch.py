"""The torch evaluator of ONNX graphs matches ONNX Runtime, and says which operators it lacks."""

from __future__ import annotations

import math
from pathlib import Path

import fragile_onnx
import numpy as np
import onnx
import pytest
import tiny_attention_onnx
import torch
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator
from onnx_torch_cases import OP_CASES, floats, single_node_model

from deploy_opt.onnx_torch import (
    UnsupportedOpError,
    run_graph,
    run_node,
    supported_ops,
    to_tensor,
    unsupported_ops,
)
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


@pytest.mark.parametrize(("op", "inputs", "attrs", "opset", "outputs", "ort"), OP_CASES)
def test_each_operator_matches_onnxruntime(
    op: str, inputs: list, attrs: dict, opset: int, outputs: int, ort: bool
) -> None:
    model = single_node_model(op, inputs, attrs, opset, outputs)
    feeds = {f"in{k}": value for k, value in enumerate(inputs) if value is not None}
    assert unsupported_ops(model) == []
    if ort:
        expected = create_session(model.SerializeToString()).run(None, feeds)
    else:
        expected = ReferenceEvaluator(model).run(None, feeds)
    with torch.no_grad():
        env = run_graph(model, feeds)
    for k, reference in enumerate(expected):
        got = env[f"out{k}"].numpy()
        assert got.dtype == reference.dtype, (k, got.dtype, reference.dtype)
        assert got.shape == reference.shape, (k, got.shape, reference.shape)
        np.testing.assert_allclose(got, reference, rtol=1e-5, atol=1e-5, err_msg=f"output {k}")


def test_every_operator_has_a_case() -> None:
    covered = {case.values[0] for case in OP_CASES} | {"If", "Loop"}
    assert set(supported_ops()) - covered == set()


def test_lrn_with_an_even_size_follows_the_spec() -> None:
    """ONNX Runtime refuses even sizes; the spec's window is [c - floor((size-1)/2), c + ceil((size-1)/2)]."""
    x, size, alpha, beta, bias = floats(2, 7, 3, 3), 4, 1e-3, 0.75, 1.5
    squares = np.zeros_like(x)
    for c in range(x.shape[1]):
        low, high = max(0, c - (size - 1) // 2), min(x.shape[1], c + math.ceil((size - 1) / 2) + 1)
        squares[:, c] = (x[:, low:high] ** 2).sum(axis=1)
    expected = x / (bias + alpha / size * squares) ** beta
    model = single_node_model("LRN", [x], {"size": size, "alpha": alpha, "beta": beta, "bias": bias}, 18, 1)
    with torch.no_grad():
        got = run_graph(model, {"in0": x})["out0"].numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def _branch(name: str, node: onnx.NodeProto) -> onnx.GraphProto:
    return helper.make_graph([node], name, [], [onnx.ValueInfoProto(name=node.output[0])])


def test_if_and_loop_match_onnxruntime() -> None:
    """Subgraphs read the enclosing scope; Loop carries values, stops on its condition and stacks scan outputs."""
    node = helper.make_node
    body = helper.make_graph(
        [
            node("Cast", ["i"], ["i_f"], to=TensorProto.FLOAT),
            node("Mul", ["x", "i_f"], ["step"]),
            node("Add", ["acc_in", "step"], ["acc_out"]),
            node("ReduceSum", ["acc_out"], ["total"], keepdims=0),
            node("Less", ["total", "limit"], ["going"]),
            node("Identity", ["acc_out"], ["scan"]),
        ],
        "body",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("acc_in", TensorProto.FLOAT, None),
        ],
        [onnx.ValueInfoProto(name=n) for n in ("going", "acc_out", "scan")],
    )
    nodes = [
        node("Greater", ["flag", "zero"], ["cond"]),
        node(
            "If",
            ["cond"],
            ["picked"],
            then_branch=_branch("then", node("Add", ["x", "x"], ["twice"])),
            else_branch=_branch("else", node("Neg", ["x"], ["negated"])),
        ),
        node("Loop", ["trips", "", "picked"], ["final", "history"], body=body),
    ]
    inits = {"zero": np.array(0.0, np.float32), "trips": np.array(6, np.int64), "limit": np.array(20.0, np.float32)}
    model = _model(
        nodes,
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]),
            helper.make_tensor_value_info("flag", TensorProto.FLOAT, []),
        ],
        [onnx.ValueInfoProto(name=n) for n in ("final", "history")],
        inits,
    )
    assert unsupported_ops(model) == []
    x = np.abs(floats(2, 3)) + 0.5
    for flag in (1.0, -1.0):
        _compare(model, {"x": x, "flag": np.array(flag, np.float32)})


def test_unsupported_ops_names_what_run_graph_cannot_run() -> None:
    """Missing operators (subgraphs included), other domains, model-local functions and unhandled settings."""
    node = helper.make_node
    inner = _branch("then", node("Det", ["m"], ["d"]))
    nodes = [
        node("If", ["c"], ["r"], then_branch=inner, else_branch=_branch("else", node("Identity", ["m"], ["e"]))),
        node("FusedMatMul", ["m", "m"], ["f"], domain="com.microsoft"),
        node("Resize", ["img", "", "scales"], ["big"], antialias=1, mode="linear"),
        node("MaxPool", ["img"], ["p", "where"], kernel_shape=[2, 2]),
        node("Cast", ["m"], ["s"], to=TensorProto.STRING),
        node("Relu", ["m"], ["relu"], legacy_flag=1),
        node("Scan", ["m"], ["scanned"], body=_branch("scan", node("Sin", ["m"], ["sin"])), num_scan_inputs=1),
        node("MyBlock", ["m"], ["mine"], domain="my.local"),
        node("BatchNormalization", ["img", "s", "s", "s", "s"], ["bn"], training_mode=1),
        node("Pad", ["m", "pads"], ["padded"], mode="symmetric"),
        node("ScatterND", ["m", "i", "u"], ["scattered"], reduction="xor"),
        node("Conv", ["img", "w"], ["conv"], auto_pad="SAME_MIDDLE"),
    ]
    model = _model(
        nodes,
        [helper.make_tensor_value_info("m", TensorProto.FLOAT, [2, 2])],
        [onnx.ValueInfoProto(name="r")],
        {"scales": np.ones(4, np.float32)},
    )
    model.functions.append(helper.make_function("my.local", "MyBlock", ["m"], ["mine"], [], []))
    assert unsupported_ops(model) == [
        "BatchNormalization (training_mode=1)",
        "Cast (to=STRING)",
        "Conv (auto_pad=SAME_MIDDLE)",
        "Det",
        "MaxPool (the Indices output)",
        "Pad (mode=symmetric)",
        "Relu (attribute legacy_flag)",
        "Resize (antialias=1)",
        "Scan",
        "ScatterND (reduction=xor)",
        "com.microsoft.FusedMatMul",
        "my.local.MyBlock (model-local function; inline it with onnx.inliner)",
    ]
    for bad in [*nodes[1:6], nodes[-1]]:
        with pytest.raises(UnsupportedOpError):
            run_node(bad, [torch.ones(1, 1, 4, 4), None, torch.ones(4)])
    with pytest.raises(UnsupportedOpError, match=r"ai\.onnx\.Det"):
        run_graph(model, {"m": np.eye(2, dtype=np.float32), "c": np.array(True)})


def test_every_attribute_of_every_supported_opset_is_taken() -> None:
    """Each supported operator's function takes every attribute its schemas (opset 7 on) define.

    An attribute it did not take would make unsupported_ops name the operator; only Constant's string and sparse
    values are left out on purpose.
    """
    from deploy_opt.onnx_torch.graph import _entries

    gaps = []
    for schema in onnx.defs.get_all_schemas_with_history():
        entry = _entries().get(schema.name) if schema.domain == "" and schema.since_version >= 7 else None
        if entry is not None and entry[1] is not None:
            gaps += [f"{schema.name}-{schema.since_version}.{a}" for a in sorted(set(schema.attributes) - entry[1])]
    assert {g.split(".")[-1] for g in gaps} <= {"sparse_value", "value_string", "value_strings"}, gaps
    assert all(g.startswith("Constant-") for g in gaps), gaps


def test_every_operator_it_lacks_is_named_and_refused() -> None:
    """unsupported_ops and run_node agree on every operator of the default domain outside the table."""
    supported = set(supported_ops())
    lacking = sorted({s.name for s in onnx.defs.get_all_schemas_with_history() if s.domain == ""} - supported)
    for op in lacking:
        model = single_node_model(op, [np.zeros(1, np.float32)], {}, 18, 1)
        assert unsupported_ops(model) == [op]
        with pytest.raises(UnsupportedOpError, match=op):
            run_node(model.graph.node[0], [torch.zeros(1)])


def test_types_torch_cannot_hold_are_named() -> None:
    """A string initializer, and QuantizeLinear into int4 (widened to int8 here, it would saturate wrongly)."""
    int4_zero = helper.make_tensor("z4", TensorProto.INT4, [], [0])
    words = helper.make_tensor("words", TensorProto.STRING, [1], [b"a"])
    node = helper.make_node
    model = _model(
        [node("QuantizeLinear", ["x", "s", "z4"], ["q"]), node("DequantizeLinear", ["q", "s", "z4"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
        [onnx.ValueInfoProto(name="y")],
        {"s": np.array(0.5, np.float32)},
        opset=21,
    )
    model.graph.initializer.extend([int4_zero, words])
    assert unsupported_ops(model) == ["QuantizeLinear (4-bit output)", "STRING tensors"]


def test_to_tensor_keeps_dtypes_and_scalars() -> None:
    import ml_dtypes

    assert to_tensor(np.array(3.0, np.float32)).shape == ()
    assert to_tensor(np.arange(6, dtype=np.int64).reshape(2, 3).T).tolist() == [[0, 3], [1, 4], [2, 5]]
    half = np.array([1.5, -2.0], ml_dtypes.bfloat16)
    assert to_tensor(half).dtype == torch.bfloat16 and to_tensor(half).tolist() == [1.5, -2.0]
    eight = np.array([0.5, 448.0], ml_dtypes.float8_e4m3fn)
    assert to_tensor(eight).float().tolist() == [0.5, 448.0]
    assert to_tensor(np.array([-8, 7], ml_dtypes.int4)).tolist() == [-8, 7]
