"""The torch evaluator of ONNX graphs matches ONNX Runtime, and says which operators it lacks."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import fragile_onnx
import numpy as np
import onnx
import pytest
import tiny_attention_onnx
import torch
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from deploy_opt.analysis.onnx_torch import (
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


_RNG = np.random.default_rng(7)


def _f(*shape: int, scale: float = 1.0) -> np.ndarray:
    return (_RNG.normal(0, scale, shape)).astype(np.float32)


def _i(*values: int) -> np.ndarray:
    return np.array(values, np.int64)


def _case(name: str, op: str, inputs: list, opset: int = 18, outputs: int = 1, ort: bool = True, **attrs: Any) -> Any:
    """One single-node graph; ``ort=False`` checks against onnx's reference evaluator (ONNX Runtime lacks it)."""
    return pytest.param(op, inputs, attrs, opset, outputs, ort, id=name)


_X = _f(2, 3, 4, 5)
_IMG = _f(1, 2, 7, 6)
_POS = np.abs(_f(2, 3, 4)) + 0.1
_TIES = np.array([[3, 1, 3, 2, 1], [0, 0, 5, 5, 1]], np.float32)
_MASK = np.array([[True, False, True], [False, False, True]])
_SPECIAL = np.array([1.0, np.nan, np.inf, -np.inf, -2.5, 0.5], np.float32)
_HALVES = np.array([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 0.49], np.float32)

_OP_CASES = [
    # element-wise arithmetic, broadcasting, integer semantics
    _case("add_broadcast", "Add", [_f(2, 3, 4), _f(4)]),
    _case("div_int_truncates", "Div", [_i(7, -7, 9, -9), _i(2, 2, -4, -4)]),
    _case("pow_float", "Pow", [_POS, _f(3, 1)]),
    _case("pow_int_exponent", "Pow", [_f(2, 3), _i(2)]),
    _case("pow_int_base", "Pow", [_i(2, 3, -4), _i(3, 2, 1)]),
    _case("mod_int_sign_of_divisor", "Mod", [_i(7, -7, 7, -7), _i(3, 3, -3, -3)]),
    _case("mod_fmod", "Mod", [_f(6, scale=5), _f(6) + 3], fmod=1),
    _case("max_three_inputs", "Max", [_f(2, 3), _f(3), _f(1, 3)]),
    _case("min_three_inputs", "Min", [_f(2, 3), _f(3), _f(1, 3)]),
    _case("sum_three_inputs", "Sum", [_f(2, 3), _f(3), _f(2, 1)]),
    _case("mean_three_inputs", "Mean", [_f(2, 3), _f(3), _f(2, 1)]),
    _case("max_one_input", "Max", [_f(4)]),
    _case("round_half_to_even", "Round", [_HALVES]),
    _case("sign", "Sign", [_HALVES]),
    *[
        _case(op.lower(), op, [_POS])
        for op in (
            "Sqrt",
            "Reciprocal",
            "Log",
            "Exp",
            "Erf",
            "Neg",
            "Abs",
            "Floor",
            "Ceil",
            "Sin",
            "Cos",
            "Tan",
            "Atan",
            "Sinh",
            "Cosh",
            "Asinh",
        )
    ],
    *[_case(op.lower(), op, [np.clip(_f(7), -0.9, 0.9)]) for op in ("Asin", "Acos", "Atanh")],
    _case("acosh", "Acosh", [_POS + 1]),
    # activations
    *[
        _case(op.lower(), op, [_f(3, 5, scale=3)])
        for op in ("Relu", "Sigmoid", "Tanh", "Softplus", "Softsign", "Mish", "HardSwish")
    ],
    _case("elu", "Elu", [_f(3, 5, scale=3)], alpha=0.7),
    _case("selu", "Selu", [_f(3, 5, scale=3)]),
    _case("celu", "Celu", [_f(3, 5, scale=3)], alpha=1.5),
    _case("leaky_relu", "LeakyRelu", [_f(3, 5)], alpha=0.2),
    _case("prelu_broadcast", "PRelu", [_f(2, 3, 4), np.abs(_f(3, 1))]),
    _case("thresholded_relu", "ThresholdedRelu", [_f(3, 5, scale=3)], alpha=0.5),
    _case("hard_sigmoid", "HardSigmoid", [_f(3, 5, scale=3)], alpha=0.3, beta=0.4),
    _case("shrink", "Shrink", [_f(3, 5, scale=3)], bias=0.3, lambd=0.7),
    _case("gelu_exact", "Gelu", [_f(3, 5, scale=3)], opset=20),
    _case("gelu_tanh", "Gelu", [_f(3, 5, scale=3)], opset=20, approximate="tanh"),
    _case("clip_inputs", "Clip", [_f(3, 5), np.array(-0.5, np.float32), np.array(0.7, np.float32)]),
    _case("clip_max_only", "Clip", [_f(3, 5), None, np.array(0.2, np.float32)]),
    _case("clip_int", "Clip", [_i(-5, 0, 5), _i(-2), _i(3)]),
    _case("clip_opset6_attrs", "Clip", [_f(3, 5)], opset=6, min=-0.1, max=0.3),
    _case("clip_opset6_default", "Clip", [_f(3, 5)], opset=6),
    # comparisons, logic, masks
    *[
        _case(op.lower(), op, [np.round(_f(3, 4)), np.round(_f(4))])
        for op in ("Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual")
    ],
    _case("equal_int", "Equal", [_i(1, 2, 3), _i(3, 2, 1)]),
    *[_case(op.lower(), op, [_MASK, _MASK[::-1]]) for op in ("And", "Or", "Xor")],
    _case("not", "Not", [_MASK]),
    _case("isnan", "IsNaN", [_SPECIAL]),
    _case("isinf", "IsInf", [_SPECIAL]),
    _case("isinf_positive_only", "IsInf", [_SPECIAL], detect_negative=0),
    _case("isinf_negative_only", "IsInf", [_SPECIAL], detect_positive=0),
    _case("where_broadcast", "Where", [_MASK, _f(2, 3), np.array(-1e9, np.float32)]),
    _case("bitshift", "BitShift", [np.array([16, 4, 1], np.uint8), np.array([1, 2, 3], np.uint8)], direction="RIGHT"),
    _case("bitwise_and", "BitwiseAnd", [_i(12, 10), _i(10, 6)]),
    # reductions: axes as attribute (before 13/18) and as input, keepdims, noop_with_empty_axes
    _case("reduce_sum_attr", "ReduceSum", [_X], opset=11, axes=[1, -1], keepdims=0),
    _case("reduce_sum_input", "ReduceSum", [_X, _i(-2)], opset=13),
    _case("reduce_sum_all", "ReduceSum", [_X], opset=13, keepdims=0),
    _case("reduce_sum_noop", "ReduceSum", [_X, np.zeros(0, np.int64)], opset=13, noop_with_empty_axes=1),
    _case("reduce_sum_int", "ReduceSum", [np.arange(12, dtype=np.int32).reshape(3, 4), _i(1)], opset=13),
    _case("reduce_mean_attr", "ReduceMean", [_X], opset=13, axes=[0, 2]),
    _case("reduce_mean_input", "ReduceMean", [_X, _i(0, 2)]),
    _case("reduce_max_input", "ReduceMax", [_X, _i(3)], keepdims=0),
    _case("reduce_min_attr", "ReduceMin", [_X], opset=13, axes=[1]),
    _case("reduce_prod", "ReduceProd", [_POS, _i(0, 2)]),
    _case("reduce_l1", "ReduceL1", [_X, _i(1)]),
    _case("reduce_l2", "ReduceL2", [_X, _i(1, 2)], keepdims=0),
    _case("reduce_sum_square", "ReduceSumSquare", [_X, _i(-1)]),
    _case("reduce_log_sum", "ReduceLogSum", [_POS, _i(1)]),
    _case("reduce_log_sum_exp", "ReduceLogSumExp", [_X, _i(1)]),
    _case("argmax_last_index", "ArgMax", [_TIES], axis=1, select_last_index=1),
    _case("argmax_first_index", "ArgMax", [_TIES], axis=1, keepdims=0),
    _case("argmin", "ArgMin", [_TIES], axis=-1),
    _case("cumsum", "CumSum", [_f(3, 4), _i(1)]),
    _case("cumsum_exclusive_reverse", "CumSum", [_f(3, 4), _i(-1)], exclusive=1, reverse=1),
    _case("cumsum_int", "CumSum", [np.arange(6, dtype=np.int32).reshape(2, 3), _i(0)], exclusive=1),
    # matrix products
    _case("matmul_batched_broadcast", "MatMul", [_f(2, 1, 3, 4), _f(5, 4, 2)]),
    _case("matmul_vector", "MatMul", [_f(4), _f(2, 4, 3)]),
    _case("gemm_transposes", "Gemm", [_f(4, 3), _f(5, 4), _f(5)], alpha=0.5, beta=2.0, transA=1, transB=1),
    _case("gemm_no_c", "Gemm", [_f(3, 4), _f(4, 5)]),
    _case("einsum_batch_matmul", "Einsum", [_f(2, 3, 4), _f(2, 4, 5)], equation="bij, bjk -> bik"),
    _case("einsum_ellipsis", "Einsum", [_f(2, 3, 4, 5), _f(2, 3, 5, 4)], equation="...ij,...jk->...ik"),
    _case("einsum_implicit", "Einsum", [_f(3, 4), _f(4, 5)], equation="ij,jk"),
    _case("einsum_trace_transpose", "Einsum", [_f(3, 3, 4)], equation="iij->j"),
]


_OP_CASES += [
    # shapes and constants
    _case("shape", "Shape", [_X]),
    _case("shape_start_end", "Shape", [_X], start=-3, end=-1),
    _case("size", "Size", [_X]),
    _case("constant_of_shape_int", "ConstantOfShape", [_i(2, 3)], value=numpy_helper.from_array(_i(7))),
    _case("constant_of_shape_default", "ConstantOfShape", [_i(3)]),
    _case(
        "constant_of_shape_scalar",
        "ConstantOfShape",
        [np.zeros(0, np.int64)],
        value=numpy_helper.from_array(np.array([True])),
    ),
    _case("constant_scalar", "Constant", [], value=numpy_helper.from_array(np.array(2.5, np.float32))),
    _case("constant_ints", "Constant", [], value_ints=[1, -1]),
    _case("constant_float", "Constant", [], value_float=0.25),
    _case("range_int", "Range", [np.array(10, np.int64), np.array(-3, np.int64), np.array(-3, np.int64)]),
    _case("range_float", "Range", [np.array(0.5, np.float32), np.array(2.1, np.float32), np.array(0.3, np.float32)]),
    _case("range_empty", "Range", [np.array(3, np.int32), np.array(1, np.int32), np.array(1, np.int32)]),
    _case("nonzero", "NonZero", [np.array([[0, 1.5, 0], [2, 0, -1]], np.float32)]),
    _case("cast_float_to_int_truncates", "Cast", [_HALVES * 3], to=TensorProto.INT64),
    _case("cast_to_bool", "Cast", [np.array([0, 0.5, -2, 0], np.float32)], to=TensorProto.BOOL),
    _case("cast_bool_to_float", "Cast", [_MASK], to=TensorProto.FLOAT),
    _case("cast_to_half", "Cast", [_f(5, scale=100)], to=TensorProto.FLOAT16),
    _case("cast_like", "CastLike", [_i(1, 2, 3), np.zeros(1, np.float32)]),
    _case("reshape_zero_and_minus_one", "Reshape", [_X, _i(0, -1, 5)]),
    _case("reshape_allowzero", "Reshape", [np.zeros((0, 4), np.float32), _i(4, 0)], allowzero=1),
    _case("flatten_axis0", "Flatten", [_X], axis=0),
    _case("flatten_negative_axis", "Flatten", [_X], axis=-1),
    _case("transpose_default", "Transpose", [_X]),
    _case("transpose_perm", "Transpose", [_X], perm=[2, 0, 3, 1]),
    _case("squeeze_attr", "Squeeze", [_f(1, 3, 1, 2)], opset=11, axes=[-2]),
    _case("squeeze_input", "Squeeze", [_f(1, 3, 1, 2), _i(0, 2)]),
    _case("squeeze_all", "Squeeze", [_f(1, 3, 1, 2)]),
    _case("unsqueeze_attr", "Unsqueeze", [_f(3, 2)], opset=11, axes=[0, -1]),
    _case("unsqueeze_input", "Unsqueeze", [_f(3, 2), _i(-1, 1)]),
    _case("unsqueeze_scalar", "Unsqueeze", [np.array(4, np.int64), _i(0)]),
    _case("concat_negative_axis", "Concat", [_f(2, 3), _f(2, 1), _f(2, 2)], axis=-1),
    _case("split_attr", "Split", [_f(6, 2)], opset=11, outputs=2, axis=0, split=[2, 4]),
    _case("split_input", "Split", [_f(2, 7), _i(3, 4)], outputs=2, axis=1),
    _case("split_equal_by_outputs", "Split", [_f(2, 6)], opset=13, outputs=3, axis=-1),
    _case("split_num_outputs_uneven", "Split", [_f(7, 2)], outputs=3, num_outputs=3),
    _case("slice_attr", "Slice", [_X], opset=9, starts=[1, -3], ends=[100, -1], axes=[1, 3]),
    _case("slice_negative_steps", "Slice", [_X, _i(-1, 10), _i(-100, 0), _i(2, 3), _i(-1, -2)]),
    _case("slice_clamped", "Slice", [_X, _i(-10), _i(2**62), _i(-1)]),
    _case("slice_empty", "Slice", [_X, _i(3), _i(1), _i(1)]),
    _case("gather_negative_indices", "Gather", [_f(5, 3), _i(-1, 0, -5)]),
    _case("gather_scalar_index", "Gather", [_X, np.array(-2, np.int64)], axis=-1),
    _case("gather_matrix_index", "Gather", [_f(4, 6), np.array([[0, 5], [-1, 2]], np.int32)], axis=1),
    _case("gather_elements", "GatherElements", [_f(3, 4), np.array([[0, -1], [2, 1], [3, 0]], np.int64)], axis=1),
    _case("gather_elements_axis0", "GatherElements", [_f(3, 4), np.array([[2, -1, 0, 1]], np.int64)], axis=0),
    _case("gather_nd", "GatherND", [_f(3, 4, 2), np.array([[0, 1], [-1, 3]], np.int64)]),
    _case(
        "gather_nd_batch_dims", "GatherND", [_f(2, 3, 4), np.array([[[1], [2]], [[0], [0]]], np.int64)], batch_dims=1
    ),
    _case("scatter_nd", "ScatterND", [_f(4, 3), _i(2, 0).reshape(2, 1), _f(2, 3)]),
    _case("scatter_nd_elements", "ScatterND", [_f(4, 3), np.array([[0, 1], [3, 2]], np.int64), _f(2)]),
    _case("scatter_nd_add", "ScatterND", [_f(4, 3), _i(1, 1).reshape(2, 1), _f(2, 3)], reduction="add"),
    _case("scatter_nd_mul", "ScatterND", [_f(4, 3), _i(1, 1).reshape(2, 1), _f(2, 3)], reduction="mul"),
    _case("scatter_nd_max", "ScatterND", [_f(4, 3), _i(3, 3).reshape(2, 1), _f(2, 3)], reduction="max"),
    _case("scatter_elements", "ScatterElements", [_f(3, 4), np.array([[1, -1], [0, 2]], np.int64), _f(2, 2)], axis=1),
    _case(
        "scatter_elements_add",
        "ScatterElements",
        [_f(3, 4), _i(0, 0, 2).reshape(3, 1), _f(3, 1)],
        axis=0,
        reduction="add",
    ),
    _case("expand_bidirectional", "Expand", [_f(3, 1), _i(2, 1, 4)]),
    _case("expand_smaller_shape", "Expand", [_f(2, 3), _i(3)]),
    _case("tile", "Tile", [_f(2, 3), _i(2, 3)]),
    _case("pad_constant", "Pad", [_f(2, 3), _i(1, 0, 2, 3), np.array(1.5, np.float32)]),
    _case("pad_negative", "Pad", [_f(4, 5), _i(-1, 2, 0, -2)]),
    _case("pad_reflect", "Pad", [_f(1, 2, 4, 5), _i(0, 0, 2, 3, 0, 0, 3, 1)], mode="reflect"),
    _case("pad_edge", "Pad", [_f(1, 2, 4, 5), _i(0, 0, 2, 3, 0, 0, 3, 1)], mode="edge"),
    _case("pad_wrap", "Pad", [_f(2, 4, 5), _i(0, 2, 3, 0, 3, 1)], opset=19, mode="wrap"),
    _case("pad_axes", "Pad", [_f(2, 4, 5), _i(1, 2, 3, 4), None, _i(-1, 0)]),
    _case("pad_opset2_attrs", "Pad", [_f(2, 3)], opset=2, pads=[0, 1, 1, 0], value=-2.0),
    _case("pad_opset2_reflect", "Pad", [_f(3, 4)], opset=2, pads=[1, 2, 2, 1], mode="reflect"),
    _case("trilu_upper", "Trilu", [_f(2, 4, 5), _i(1)]),
    _case("trilu_lower_negative_k", "Trilu", [_f(4, 5), _i(-1)], upper=0),
    _case("trilu_default_k", "Trilu", [_f(3, 3)], upper=0),
    _case(
        "one_hot",
        "OneHot",
        [np.array([[0, 2], [-1, 5]], np.int64), np.array(4, np.int64), np.array([-1.0, 3.0], np.float32)],
        axis=1,
    ),
    _case("top_k_ties", "TopK", [_TIES, _i(3)], outputs=2, axis=1),
    _case("top_k_smallest", "TopK", [_TIES, _i(2)], outputs=2, axis=-1, largest=0),
    _case("top_k_attr", "TopK", [_f(3, 6)], opset=9, outputs=2, k=2),
    _case("depth_to_space_dcr", "DepthToSpace", [_f(1, 8, 2, 3)], blocksize=2),
    _case("depth_to_space_crd", "DepthToSpace", [_f(1, 8, 2, 3)], blocksize=2, mode="CRD"),
    _case("space_to_depth", "SpaceToDepth", [_f(1, 2, 4, 6)], blocksize=2),
    _case("space_to_depth_crd", "SpaceToDepth", [_f(1, 2, 4, 6)], opset=28, ort=False, blocksize=2, mode="CRD"),
    _case(
        "range_half_stash",
        "Range",
        [np.array(0.1, np.float16), np.array(9, np.float16), np.array(0.7, np.float16)],
        opset=27,
        ort=False,
    ),
    _case("eye_like", "EyeLike", [_f(3, 5)], k=1),
    _case("eye_like_dtype", "EyeLike", [_f(4, 3)], k=-1, dtype=TensorProto.INT32),
    _case("compress", "Compress", [_f(3, 4), np.array([True, False, True])], axis=0),
    _case("compress_flat", "Compress", [_f(2, 3), np.array([False, True, True, False, True])]),
    _case("dropout_mask", "Dropout", [_f(3, 4)], opset=13, outputs=2),
    _case("dropout_opset7", "Dropout", [_f(3, 4)], opset=7, ratio=0.3),
    _case("identity", "Identity", [_i(1, 2)]),
]


_W = _f(4, 2, 3, 3, scale=0.3)
_OP_CASES += [
    # convolutions
    _case("conv_same_upper", "Conv", [_IMG, _W, _f(4)], auto_pad="SAME_UPPER", strides=[2, 2]),
    _case("conv_same_lower", "Conv", [_IMG, _W], auto_pad="SAME_LOWER", strides=[2, 2]),
    _case("conv_valid", "Conv", [_IMG, _W], auto_pad="VALID"),
    _case("conv_asymmetric_pads", "Conv", [_IMG, _W], pads=[0, 1, 2, 1]),
    _case(
        "conv_dilated_groups", "Conv", [_f(1, 4, 9, 9), _f(6, 2, 3, 3)], group=2, dilations=[2, 1], pads=[1, 1, 1, 1]
    ),
    _case("conv_1d", "Conv", [_f(2, 3, 10), _f(4, 3, 3)], strides=[3], pads=[1, 2]),
    _case("conv_3d", "Conv", [_f(1, 2, 4, 5, 6), _f(3, 2, 2, 3, 3)], pads=[1, 0, 1, 0, 1, 1]),
    _case(
        "conv_transpose", "ConvTranspose", [_f(1, 4, 3, 4), _f(4, 2, 3, 3), _f(2)], strides=[2, 2], pads=[1, 0, 0, 1]
    ),
    _case(
        "conv_transpose_output_padding",
        "ConvTranspose",
        [_f(1, 4, 3, 4), _f(4, 2, 3, 3)],
        strides=[2, 3],
        output_padding=[1, 2],
    ),
    _case(
        "conv_transpose_output_shape",
        "ConvTranspose",
        [_f(1, 4, 3, 4), _f(4, 2, 3, 3)],
        strides=[2, 2],
        output_shape=[6, 9],
    ),
    _case(
        "conv_transpose_same_upper",
        "ConvTranspose",
        [_f(1, 4, 3, 4), _f(4, 2, 3, 3)],
        strides=[2, 2],
        auto_pad="SAME_UPPER",
    ),
    _case(
        "conv_transpose_groups_dilation",
        "ConvTranspose",
        [_f(1, 4, 3, 4), _f(4, 3, 2, 2), _f(6)],
        group=2,
        dilations=[2, 2],
    ),
    _case("conv_transpose_1d", "ConvTranspose", [_f(2, 3, 5), _f(3, 2, 4)], strides=[2], pads=[1, 2]),
    # pooling
    _case("max_pool_ceil", "MaxPool", [_IMG], kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1),
    _case("max_pool_asymmetric", "MaxPool", [_IMG], kernel_shape=[3, 2], pads=[0, 1, 2, 0], strides=[2, 1]),
    _case("max_pool_same_upper", "MaxPool", [_IMG], kernel_shape=[2, 3], auto_pad="SAME_UPPER", strides=[2, 2]),
    _case("max_pool_dilated", "MaxPool", [_IMG], kernel_shape=[2, 2], dilations=[2, 2], pads=[1, 1, 1, 1]),
    _case(
        "max_pool_big_pad_ceil", "MaxPool", [_IMG], kernel_shape=[2, 2], pads=[1, 1, 1, 1], strides=[2, 2], ceil_mode=1
    ),
    _case("max_pool_1d", "MaxPool", [_f(2, 3, 9)], kernel_shape=[3], strides=[2]),
    _case("avg_pool_count_pad", "AveragePool", [_IMG], kernel_shape=[3, 3], pads=[1, 1, 1, 1], count_include_pad=1),
    _case("avg_pool_exclude_pad", "AveragePool", [_IMG], kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[2, 2]),
    _case("avg_pool_asymmetric", "AveragePool", [_IMG], kernel_shape=[3, 3], pads=[0, 2, 1, 0]),
    _case(
        "avg_pool_asymmetric_count_pad",
        "AveragePool",
        [_IMG],
        kernel_shape=[2, 3],
        pads=[0, 2, 1, 0],
        count_include_pad=1,
    ),
    _case("avg_pool_ceil", "AveragePool", [_IMG], kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1),
    _case(
        "avg_pool_ceil_pads_count_pad",
        "AveragePool",
        [_IMG],
        kernel_shape=[3, 3],
        strides=[2, 2],
        pads=[1, 1, 1, 1],
        ceil_mode=1,
        count_include_pad=1,
    ),
    _case("avg_pool_same_lower", "AveragePool", [_IMG], kernel_shape=[3, 2], auto_pad="SAME_LOWER", strides=[2, 2]),
    _case(
        "avg_pool_dilated", "AveragePool", [_IMG], opset=19, kernel_shape=[2, 2], dilations=[2, 2], pads=[1, 0, 1, 1]
    ),
    _case("global_average_pool", "GlobalAveragePool", [_IMG]),
    _case("global_max_pool", "GlobalMaxPool", [_IMG]),
    # normalizations
    _case("batch_norm", "BatchNormalization", [_IMG, _f(2), _f(2), _f(2), np.abs(_f(2)) + 0.5], epsilon=1e-3),
    _case("batch_norm_opset9_2d", "BatchNormalization", [_f(5, 2), _f(2), _f(2), _f(2), np.abs(_f(2)) + 0.5], opset=9),
    _case("instance_norm", "InstanceNormalization", [_IMG, _f(2), _f(2)], epsilon=1e-3),
    _case("layer_norm_axis", "LayerNormalization", [_X, _f(4, 5), _f(4, 5)], axis=-2),
    _case("layer_norm_broadcast_scale", "LayerNormalization", [_X, _f(5), None], axis=1, ort=False),
    _case("layer_norm_mean_inv_std", "LayerNormalization", [_X, _f(5), _f(5)], outputs=3),
    _case("group_norm", "GroupNormalization", [_f(2, 6, 3, 3), _f(6), _f(6)], opset=21, num_groups=3),
    _case("rms_norm", "RMSNormalization", [_X, _f(4, 5)], opset=23, axis=2),
    _case("lp_norm_l1", "LpNormalization", [np.concatenate([np.zeros((1, 3), np.float32), _f(2, 3)])], axis=1, p=1),
    _case("lp_norm_l2", "LpNormalization", [_X], axis=-2),
    _case("mean_variance_norm", "MeanVarianceNormalization", [_X]),
    _case("lrn_odd", "LRN", [_f(2, 7, 3, 3)], size=3, alpha=0.01, beta=0.6, bias=2.0),
    # softmax family: 2-D coercion before opset 13, a single axis after
    _case("softmax_opset11_coerced", "Softmax", [_X], opset=11, axis=1),
    _case("softmax_opset11_default", "Softmax", [_X], opset=11),
    _case("softmax_opset13_axis", "Softmax", [_X], opset=13, axis=1),
    _case("softmax_opset13_default", "Softmax", [_X], opset=13),
    _case("log_softmax_opset11", "LogSoftmax", [_X], opset=11, axis=2),
    _case("log_softmax_opset13", "LogSoftmax", [_X], opset=13, axis=-3),
    _case("hardmax_opset11", "Hardmax", [_TIES.reshape(2, 1, 5)], opset=11, axis=1),
    _case("hardmax_opset13", "Hardmax", [_TIES], opset=13, axis=1),
    # quantization
    _case(
        "quantize_block",
        "QuantizeLinear",
        [_f(2, 6), np.abs(_f(2, 3)) * 0.1, np.zeros((2, 3), np.int8)],
        opset=21,
        axis=1,
        block_size=2,
    ),
    _case(
        "dequantize_block",
        "DequantizeLinear",
        [_i(1, -3, 7, 0, 5, -9).astype(np.int8).reshape(2, 3), np.abs(_f(1, 3)) * 0.1],
        opset=21,
        axis=0,
        block_size=2,
    ),
    _case("dequantize_int32", "DequantizeLinear", [np.array([-300, 5, 1000], np.int32), np.array(0.01, np.float32)]),
]

_SCALES = np.array([1, 1, 1.7, 0.6], np.float32)
_SIZES = _i(1, 2, 9, 4)
_EMPTY = np.zeros(0, np.float32)
_OP_CASES += [
    _case(
        f"resize_{mode}_{coords}",
        "Resize",
        [_IMG, None, _SCALES if scale else None, None if scale else _SIZES],
        mode=mode,
        coordinate_transformation_mode=coords,
    )
    for mode in ("nearest", "linear", "cubic")
    for coords in ("half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric", "half_pixel_symmetric")
    for scale in (True, False)
] + [
    *[
        _case(f"resize_nearest_{m}", "Resize", [_IMG, None, np.array([1, 1, 2.5, 0.5], np.float32)], nearest_mode=m)
        for m in ("round_prefer_ceil", "floor", "ceil")
    ],
    _case(
        "resize_cubic_exclude_outside",
        "Resize",
        [_IMG, None, _SCALES],
        mode="cubic",
        exclude_outside=1,
        cubic_coeff_a=-0.5,
    ),
    _case(
        "resize_tf_crop",
        "Resize",
        [_IMG, np.array([0, 0, 0.2, 0.1, 1, 1, 1.3, 0.8], np.float32), None, _SIZES],
        mode="linear",
        coordinate_transformation_mode="tf_crop_and_resize",
        extrapolation_value=-7.0,
    ),
    _case(
        "resize_axes_not_larger",
        "Resize",
        [_IMG, None, None, _i(9, 9)],
        axes=[2, 3],
        keep_aspect_ratio_policy="not_larger",
        mode="linear",
    ),
    _case(
        "resize_axes_not_smaller",
        "Resize",
        [_IMG, None, None, _i(9, 9)],
        axes=[3, 2],
        keep_aspect_ratio_policy="not_smaller",
    ),
    _case("resize_opset11_empty_roi_scales", "Resize", [_IMG, _EMPTY, _EMPTY, _SIZES], opset=11, mode="linear"),
    _case("resize_opset10_nearest_up", "Resize", [_IMG, np.array([1, 1, 2, 3], np.float32)], opset=10),
    _case("resize_opset10_nearest_down", "Resize", [_IMG, np.array([1, 1, 0.6, 0.5], np.float32)], opset=10),
    _case("resize_opset10_linear", "Resize", [_IMG, _SCALES], opset=10, mode="linear"),
    _case("upsample_opset9", "Upsample", [_IMG, np.array([1, 1, 2, 3], np.float32)], opset=9),
    _case("upsample_opset9_linear", "Upsample", [_IMG, np.array([1, 1, 2, 1.5], np.float32)], opset=9, mode="linear"),
    _case("upsample_opset7", "Upsample", [_IMG], opset=7, scales=[1.0, 1.0, 2.0, 2.0]),
]


_OP_CASES += [
    _case("sub_int", "Sub", [_i(5, 3), _i(7)]),
    _case("mul_broadcast", "Mul", [_f(3, 1), _f(1, 4)]),
    _case("bitwise_or", "BitwiseOr", [_i(12, 10), _i(10, 6)]),
    _case("bitwise_xor", "BitwiseXor", [_i(12, 10), _i(10, 6)]),
    _case("bitwise_not", "BitwiseNot", [np.array([0, 5, 255], np.uint8)]),
    _case("swish", "Swish", [_f(3, 5, scale=3)], opset=24, alpha=0.5),
    _case("scatter_opset10", "Scatter", [_f(3, 4), np.array([[1, -1], [0, 2]], np.int64), _f(2, 2)], opset=10, axis=1),
]


def _single_node_model(op: str, inputs: list, attrs: dict[str, Any], opset: int, outputs: int) -> onnx.ModelProto:
    names = [f"in{k}" if value is not None else "" for k, value in enumerate(inputs)]
    node = helper.make_node(op, names, [f"out{k}" for k in range(outputs)], **attrs)
    graph = helper.make_graph(
        [node],
        op.lower(),
        [
            helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(value.dtype), value.shape)
            for name, value in zip(names, inputs, strict=True)
            if value is not None
        ],
        [onnx.ValueInfoProto(name=f"out{k}") for k in range(outputs)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10 if opset >= 21 else 8
    return model


@pytest.mark.parametrize(("op", "inputs", "attrs", "opset", "outputs", "ort"), _OP_CASES)
def test_each_operator_matches_onnxruntime(
    op: str, inputs: list, attrs: dict, opset: int, outputs: int, ort: bool
) -> None:
    model = _single_node_model(op, inputs, attrs, opset, outputs)
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
    covered = {case.values[0] for case in _OP_CASES} | {"If", "Loop"}
    assert set(supported_ops()) - covered == set()


def test_lrn_with_an_even_size_follows_the_spec() -> None:
    """ONNX Runtime refuses even sizes; the spec's window is [c - floor((size-1)/2), c + ceil((size-1)/2)]."""
    x, size, alpha, beta, bias = _f(2, 7, 3, 3), 4, 1e-3, 0.75, 1.5
    squares = np.zeros_like(x)
    for c in range(x.shape[1]):
        low, high = max(0, c - (size - 1) // 2), min(x.shape[1], c + math.ceil((size - 1) / 2) + 1)
        squares[:, c] = (x[:, low:high] ** 2).sum(axis=1)
    expected = x / (bias + alpha / size * squares) ** beta
    model = _single_node_model("LRN", [x], {"size": size, "alpha": alpha, "beta": beta, "bias": bias}, 18, 1)
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
    x = np.abs(_f(2, 3)) + 0.5
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
    from deploy_opt.analysis.onnx_torch.graph import _entries

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
        model = _single_node_model(op, [np.zeros(1, np.float32)], {}, 18, 1)
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
