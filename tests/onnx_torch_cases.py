"""The single-node cases the torch evaluator of ONNX graphs is checked on, one or more per supported operator.

Each case is a ``pytest.param(op, inputs, attrs, opset, outputs, ort)``; ``single_node_model`` builds its graph.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

_RNG = np.random.default_rng(7)


def floats(*shape: int, scale: float = 1.0) -> np.ndarray:
    """Seeded normal float32 values (one stream for the whole module, so every case is reproducible)."""
    return (_RNG.normal(0, scale, shape)).astype(np.float32)


def ints(*values: int) -> np.ndarray:
    """An int64 vector."""
    return np.array(values, np.int64)


def case(name: str, op: str, inputs: list, opset: int = 18, outputs: int = 1, ort: bool = True, **attrs: Any) -> Any:
    """One single-node graph; ``ort=False`` checks against onnx's reference evaluator (ONNX Runtime lacks it)."""
    return pytest.param(op, inputs, attrs, opset, outputs, ort, id=name)


# Short names for the table below, whose rows are long.
_f, _i, _case = floats, ints, case

_X = _f(2, 3, 4, 5)
_IMG = _f(1, 2, 7, 6)
_POS = np.abs(_f(2, 3, 4)) + 0.1
_TIES = np.array([[3, 1, 3, 2, 1], [0, 0, 5, 5, 1]], np.float32)
_MASK = np.array([[True, False, True], [False, False, True]])
_SPECIAL = np.array([1.0, np.nan, np.inf, -np.inf, -2.5, 0.5], np.float32)
_HALVES = np.array([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 0.49], np.float32)

OP_CASES = [
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


OP_CASES += [
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
_TX, _TW = _f(1, 4, 3, 4), _f(4, 2, 3, 3)  # a transposed convolution's input and weight
OP_CASES += [
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
    _case("conv_transpose_output_padding", "ConvTranspose", [_TX, _TW], strides=[2, 3], output_padding=[1, 2]),
    _case("conv_transpose_output_shape", "ConvTranspose", [_TX, _TW], strides=[2, 2], output_shape=[6, 9]),
    _case("conv_transpose_same_upper", "ConvTranspose", [_TX, _TW], strides=[2, 2], auto_pad="SAME_UPPER"),
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
_TO9 = [_IMG, None, None, _i(9, 9)]  # Resize to sizes 9x9 on the axes named
_EMPTY = np.zeros(0, np.float32)
OP_CASES += [
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
    _case("resize_axes_not_larger", "Resize", _TO9, axes=[2, 3], keep_aspect_ratio_policy="not_larger", mode="linear"),
    _case("resize_axes_not_smaller", "Resize", _TO9, axes=[3, 2], keep_aspect_ratio_policy="not_smaller"),
    _case("resize_opset11_empty_roi_scales", "Resize", [_IMG, _EMPTY, _EMPTY, _SIZES], opset=11, mode="linear"),
    _case("resize_opset10_nearest_up", "Resize", [_IMG, np.array([1, 1, 2, 3], np.float32)], opset=10),
    _case("resize_opset10_nearest_down", "Resize", [_IMG, np.array([1, 1, 0.6, 0.5], np.float32)], opset=10),
    _case("resize_opset10_linear", "Resize", [_IMG, _SCALES], opset=10, mode="linear"),
    _case("upsample_opset9", "Upsample", [_IMG, np.array([1, 1, 2, 3], np.float32)], opset=9),
    _case("upsample_opset9_linear", "Upsample", [_IMG, np.array([1, 1, 2, 1.5], np.float32)], opset=9, mode="linear"),
    _case("upsample_opset7", "Upsample", [_IMG], opset=7, scales=[1.0, 1.0, 2.0, 2.0]),
]


OP_CASES += [
    _case("sub_int", "Sub", [_i(5, 3), _i(7)]),
    _case("mul_broadcast", "Mul", [_f(3, 1), _f(1, 4)]),
    _case("bitwise_or", "BitwiseOr", [_i(12, 10), _i(10, 6)]),
    _case("bitwise_xor", "BitwiseXor", [_i(12, 10), _i(10, 6)]),
    _case("bitwise_not", "BitwiseNot", [np.array([0, 5, 255], np.uint8)]),
    _case("swish", "Swish", [_f(3, 5, scale=3)], opset=24, alpha=0.5),
    _case("scatter_opset10", "Scatter", [_f(3, 4), np.array([[1, -1], [0, 2]], np.int64), _f(2, 2)], opset=10, axis=1),
]


def single_node_model(op: str, inputs: list, attrs: dict[str, Any], opset: int, outputs: int) -> onnx.ModelProto:
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
