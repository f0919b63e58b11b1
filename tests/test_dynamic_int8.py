"""Dynamic-range INT8 for ORT CPU: the writer against ORT's own quantize_dynamic, its scale file, align and compat.

The models are built with onnx.helper: an MLP of MatMul + Add (tiny_onnx), one of Gemm (transB=1, the way torch
exports nn.Linear), a recurrent model, LSTM then GRU (ORT has a dynamic kernel for the first only), and ORT's
contrib Attention (what its transformer optimizer fuses a BERT layer's attention into).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import tiny_onnx
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import QuantType, quantize_dynamic

from calibrators.qparams import weight_scale
from calibrators.scales.format import load_scale_file, save_scale_file
from deploy_opt.analysis.align import verify_alignment
from deploy_opt.analysis.compat import check_compat
from deploy_opt.analysis.compat_report import render_compat_markdown
from dopt_common.errors import ConfigError, DeployOptError
from exporters.ort.dynamic import NO_KERNEL, NothingToQuantize, dynamic_scale_file, write_ort_dynamic
from exporters.ort.dynamic_read import compare_dynamic, read_dynamic_model

SEQ, BATCH, FEATURES, HIDDEN = 6, 8, 12, 16
# What write_ort_dynamic's defaults mean to ORT, written out by hand: the reference must not reuse our mapping.
ORT_SETTINGS = {
    "op_types_to_quantize": ["MatMul", "LSTM", "Attention"],
    "reduce_range": False,
    "weight_type": QuantType.QInt8,
}


def _save(nodes, inputs, outputs, inits, path: Path, domains=()) -> Path:
    graph = helper.make_graph(nodes, path.stem, inputs, outputs, [numpy_helper.from_array(v, k) for k, v in inits])
    opsets = [helper.make_opsetid("", 17), *(helper.make_opsetid(d, 1) for d in domains)]
    model = helper.make_model(graph, opset_imports=opsets)
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def _float(name: str, shape: list) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def gemm_mlp(path: Path) -> Path:
    """Gemm(transB=1) → Relu → Gemm(transB=1): nn.Linear as torch exports it."""
    rng = np.random.default_rng(3)
    inits = [
        ("fc1.weight", rng.normal(0, 0.3, (HIDDEN, FEATURES)).astype(np.float32)),
        ("fc1.bias", rng.normal(0, 0.1, HIDDEN).astype(np.float32)),
        ("fc2.weight", rng.normal(0, 0.3, (4, HIDDEN)).astype(np.float32)),
        ("fc2.bias", rng.normal(0, 0.1, 4).astype(np.float32)),
    ]
    nodes = [
        helper.make_node("Gemm", ["x", "fc1.weight", "fc1.bias"], ["h"], name="fc1", transB=1),
        helper.make_node("Relu", ["h"], ["r"], name="relu"),
        helper.make_node("Gemm", ["r", "fc2.weight", "fc2.bias"], ["y"], name="fc2", transB=1),
    ]
    return _save(nodes, [_float("x", ["batch", FEATURES])], [_float("y", ["batch", 4])], inits, path)


def lstm_gru(path: Path) -> Path:
    """LSTM → Squeeze → GRU, the shape of a small voice-activity detector."""
    rng = np.random.default_rng(5)
    h = HIDDEN
    inits = [
        ("lstm.W", rng.normal(0, 0.3, (1, 4 * h, FEATURES)).astype(np.float32)),
        ("lstm.R", rng.normal(0, 0.3, (1, 4 * h, h)).astype(np.float32)),
        ("lstm.B", rng.normal(0, 0.1, (1, 8 * h)).astype(np.float32)),
        ("gru.W", rng.normal(0, 0.3, (1, 3 * h, h)).astype(np.float32)),
        ("gru.R", rng.normal(0, 0.3, (1, 3 * h, h)).astype(np.float32)),
        ("axis1", np.array([1], dtype=np.int64)),
    ]
    nodes = [
        helper.make_node("LSTM", ["x", "lstm.W", "lstm.R", "lstm.B"], ["lstm_y"], name="lstm", hidden_size=h),
        helper.make_node("Squeeze", ["lstm_y", "axis1"], ["seq"], name="squeeze"),
        helper.make_node("GRU", ["seq", "gru.W", "gru.R"], ["", "y"], name="gru", hidden_size=h),
    ]
    inputs = [_float("x", [SEQ, "batch", FEATURES])]
    return _save(nodes, inputs, [_float("y", [1, "batch", h])], inits, path)


def attention(path: Path) -> Path:
    """com.microsoft Attention, 2 heads: ORT writes QAttention for it."""
    rng = np.random.default_rng(9)
    inits = [
        ("qkv.weight", rng.normal(0, 0.3, (HIDDEN, 3 * HIDDEN)).astype(np.float32)),
        ("qkv.bias", rng.normal(0, 0.1, 3 * HIDDEN).astype(np.float32)),
    ]
    node = helper.make_node(
        "Attention", ["x", "qkv.weight", "qkv.bias"], ["y"], name="attn", domain="com.microsoft", num_heads=2
    )
    shape = ["batch", SEQ, HIDDEN]
    return _save([node], [_float("x", shape)], [_float("y", shape)], inits, path, domains=["com.microsoft"])


def mlp(path: Path) -> Path:
    return tiny_onnx.make_model(path)


MODELS = {"mlp": mlp, "gemm_mlp": gemm_mlp, "lstm_gru": lstm_gru, "attention": attention}


def _feed(model: Path) -> dict[str, np.ndarray]:
    shape = [d.dim_value or BATCH for d in onnx.load(str(model)).graph.input[0].type.tensor_type.shape.dim]
    return {"x": np.random.default_rng(11).normal(0, 1, shape).astype(np.float32)}


def _run(model: Path, feed: dict[str, np.ndarray]) -> np.ndarray:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1  # one thread: the same kernel partition in both sessions
    session = ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
    return session.run(None, feed)[0]


@pytest.mark.parametrize("per_channel", [True, False])
@pytest.mark.parametrize("name", list(MODELS))
def test_dynamic_int8_runs_in_ort_and_equals_orts_own_quantize_dynamic(
    tmp_path: Path, name: str, per_channel: bool
) -> None:
    fp32 = MODELS[name](tmp_path / f"{name}.onnx")
    ours = write_ort_dynamic(fp32, tmp_path / "ours.onnx", per_channel=per_channel)
    quantize_dynamic(fp32, tmp_path / "ort.onnx", per_channel=per_channel, **ORT_SETTINGS)
    feed = _feed(fp32)
    got, expected, full = (_run(p, feed) for p in (ours.path, tmp_path / "ort.onnx", fp32))
    assert np.array_equal(got, expected)  # bit for bit: the same graph on the same kernels
    assert np.abs(got - full).max() > 1e-4  # and really quantized: it differs from FP32 ...
    assert np.abs(got - full).max() < 0.1 * np.abs(full).max()  # ... by quantization noise only
    expected_nodes = {"mlp": ("fc1", "fc2"), "gemm_mlp": ("fc1", "fc2"), "lstm_gru": ("lstm",), "attention": ("attn",)}
    assert ours.quantized_nodes == expected_nodes[name]
    assert ours.left_float == ({"gru": NO_KERNEL} if name == "lstm_gru" else {})
    assert ours.dynamic_tensors and set(ours.weights) == set(read_dynamic_model(tmp_path / "ort.onnx").weights)


def test_written_weight_scales_equal_an_independent_absmax(tmp_path: Path) -> None:
    """ORT's weight parameters, read back, against calibrators.qparams (its own absmax formula, not ORT's code)."""
    written = {}
    for name in MODELS:
        model = write_ort_dynamic(MODELS[name](tmp_path / f"{name}.onnx"), tmp_path / f"{name}.dyn.onnx")
        inits = {i.name: numpy_helper.to_array(i) for i in onnx.load(str(tmp_path / f"{name}.onnx")).graph.initializer}
        for key, entry in model.weights.items():
            weight = inits[key.removesuffix("_Transposed")]
            if weight.ndim == 3:  # LSTM W/R [directions, 4·hidden, input]: one scale per gate row
                reference = weight_scale(key, weight.reshape(-1, weight.shape[-1]), 0)
            else:  # MatMul B and Attention's [in, out]: per column; a Gemm's transB weight [out, in]: per row
                reference = weight_scale(key, weight, 0 if key.endswith("_Transposed") else 1)
            written[key] = (entry.scale_bits, entry.zero_point, entry.dtype)
            assert written[key] == (reference.scale_bits, reference.zero_point, "int8"), key
    assert {"w1", "w2", "fc1.weight_Transposed", "lstm.W", "lstm.R", "qkv.weight"} <= set(written)
    assert "gru.W" not in written


def test_scale_file_round_trip_and_readback(tmp_path: Path) -> None:
    fp32 = lstm_gru(tmp_path / "rnn.onnx")
    model = write_ort_dynamic(fp32, tmp_path / "rnn.dyn.onnx")
    scales = dynamic_scale_file(model, fp32)
    loaded = load_scale_file(save_scale_file(scales, tmp_path / "scales.json"))
    assert loaded == scales
    assert set(loaded.dynamic) == {"x"} and loaded.dynamic["x"].method == "DynamicQuantizeLSTM"
    assert {t.role for t in loaded.tensors.values()} == {"weight"}
    assert loaded.provenance["quantization"]["per_channel"] is True
    assert compare_dynamic(loaded, read_dynamic_model(model.path)).ok


def test_an_old_scale_file_without_dynamic_entries_still_loads(tmp_path: Path) -> None:
    old = {
        "format": "deploy_opt.scales/1",
        "activations": "symmetric",
        "provenance": {},
        "excluded": [],
        "tensors": {
            "x": {
                "role": "activation",
                "dtype": "int8",
                "symmetric": True,
                "axis": None,
                "scale": [0.5],
                "scale_hex": ["3f000000"],
                "zero_point": [0],
                "method": "minmax",
            }
        },
    }
    path = tmp_path / "scales.json"
    path.write_text(json.dumps(old), encoding="utf-8")
    loaded = load_scale_file(path)
    assert loaded.dynamic == {} and loaded.tensors["x"].scale == (0.5,)
    assert load_scale_file(save_scale_file(loaded, tmp_path / "again.json")).to_json() == old  # written as before


def _bump_scale(model_path: Path, weight: str) -> None:
    model = onnx.load(str(model_path))
    scale = next(i for i in model.graph.initializer if i.name == f"{weight}_scale")
    values = numpy_helper.to_array(scale)
    scale.CopyFrom(numpy_helper.from_array(np.nextafter(values, np.float32(np.inf)).astype(np.float32), scale.name))
    onnx.save(model, str(model_path))


def test_the_readback_comparison_catches_a_tampered_weight_scale(tmp_path: Path) -> None:
    fp32 = gemm_mlp(tmp_path / "gemm.onnx")
    model = write_ort_dynamic(fp32, tmp_path / "gemm.dyn.onnx")
    scales = dynamic_scale_file(model, fp32)
    _bump_scale(model.path, "fc2.weight_Transposed")  # one ulp on one channel's scale
    diff = compare_dynamic(scales, read_dynamic_model(model.path))
    assert not diff.ok and diff.weights.drifted == ("fc2.weight_Transposed",)
    assert "fc2.weight_Transposed" in diff.summary()


def _dynamic_build(tmp_path: Path) -> Path:
    out = tmp_path / "build"
    fp32 = tiny_onnx.make_model(tmp_path / "tiny.onnx")
    model = write_ort_dynamic(fp32, out / "model.int8.onnx")
    save_scale_file(dynamic_scale_file(model, fp32), out / "scales.json")
    return out


def test_align_verify_shows_dynamic_tensors_and_fails_on_drift(tmp_path: Path) -> None:
    out = _dynamic_build(tmp_path)
    check = next(c for c in verify_alignment(out).checks if c.artifact == "model.int8.onnx")
    assert check.status == "pass" and check.checked == 2 and check.dynamic == ("h2", "x")
    assert "dynamic (quantized at run time" in check.line() and check.to_json()["dynamic"] == ["h2", "x"]
    _bump_scale(out / "model.int8.onnx", "w1")
    report = verify_alignment(out)
    check = next(c for c in report.checks if c.artifact == "model.int8.onnx")
    assert not report.ok and check.drifted == ("w1",)


def test_align_verify_fails_when_scales_json_omits_a_dynamic_tensor(tmp_path: Path) -> None:
    out = _dynamic_build(tmp_path)
    scales = load_scale_file(out / "scales.json")
    save_scale_file(scales.restricted_to(["w1", "w2", "x"]), out / "scales.json")
    check = next(c for c in verify_alignment(out).checks if c.artifact == "model.int8.onnx")
    assert check.status == "fail" and check.extra == ("h2",) and check.dynamic == ("x",)


def test_compat_marks_dynamic_tensors_and_tensorrt_as_unsupported(tmp_path: Path) -> None:
    fp32 = lstm_gru(tmp_path / "rnn.onnx")
    model = write_ort_dynamic(gemm_mlp(tmp_path / "gemm.onnx"), tmp_path / "gemm.dyn.onnx")
    report = check_compat(model.path, ("ort-cpu", "tensorrt"))
    dynamic = {r["name"]: r for r in report.nodes if r["dynamic"]}
    assert {r["op_type"] for r in dynamic.values()} == {"DynamicQuantizeLinear", "MatMulInteger"}
    assert {t for r in dynamic.values() for t in r["dynamic"]} == {"x", "r"}
    for row in dynamic.values():
        assert row["status"]["ort-cpu"] == "ok"
        assert row["status"]["tensorrt"] == "fail" and "dynamic INT8" in row["reasons"]["tensorrt"]
    assert any("2 activations are quantized at run time" in w for w in report.warnings)
    assert "## Dynamic INT8" in render_compat_markdown(report)
    rnn = check_compat(write_ort_dynamic(fp32, tmp_path / "rnn.dyn.onnx").path, ("ort-cpu", "tensorrt"))
    lstm = next(r for r in rnn.nodes if r["op_type"] == "DynamicQuantizeLSTM")
    assert lstm["dynamic"] == ["x"] and lstm["status"]["tensorrt"] == "fail"
    plain = check_compat(fp32, ("ort-cpu", "tensorrt"))
    assert not any(r["dynamic"] for r in plain.nodes) and "## Dynamic INT8" not in render_compat_markdown(plain)


def test_an_excluded_gemm_stays_float_as_ort_excludes_its_split(tmp_path: Path) -> None:
    fp32 = gemm_mlp(tmp_path / "gemm.onnx")
    ours = write_ort_dynamic(fp32, tmp_path / "ours.onnx", exclude_nodes=["fc2"])
    quantize_dynamic(fp32, tmp_path / "ort.onnx", per_channel=True, nodes_to_exclude=["fc2_MatMul"], **ORT_SETTINGS)
    assert ours.quantized_nodes == ("fc1",) and ours.left_float == {"fc2": "excluded (exclude_nodes)"}
    feed = _feed(fp32)
    assert np.array_equal(_run(ours.path, feed), _run(tmp_path / "ort.onnx", feed))


def _relu_only(path: Path) -> Path:
    return _save(
        [helper.make_node("Relu", ["x"], ["y"], name="relu")], [_float("x", [2])], [_float("y", [2])], [], path
    )


def _gru_only(path: Path) -> Path:
    w = np.full((1, 3 * HIDDEN, FEATURES), 0.1, np.float32)
    r = np.full((1, 3 * HIDDEN, HIDDEN), 0.1, np.float32)
    node = helper.make_node("GRU", ["x", "W", "R"], ["", "y"], name="gru", hidden_size=HIDDEN)
    inputs, outputs = [_float("x", [SEQ, 1, FEATURES])], [_float("y", [1, 1, HIDDEN])]
    return _save([node], inputs, outputs, [("W", w), ("R", r)], path)


@pytest.mark.parametrize(
    "build,kwargs,error,match",
    [
        (_relu_only, {}, NothingToQuantize, r"has no MatMul/Gemm/LSTM/GRU/Attention node .*its ops: Relu.*fix: "),
        (_gru_only, {}, NothingToQuantize, r"1 GRU nodes .*no dynamic INT8 GRU kernel.*fix: keep it FP32"),
        (mlp, {"exclude_nodes": ["fc1", "fc2"]}, NothingToQuantize, r"quantized no node .*excluded .*fix: "),
        (mlp, {"op_types": ["Gather"]}, ConfigError, r"op_types \['Gather'\] are not supported; use any of MatMul"),
    ],
)
def test_a_model_without_a_quantizable_op_is_a_clear_error(tmp_path: Path, build, kwargs, error, match) -> None:
    fp32 = build(tmp_path / "model.onnx")
    with pytest.raises(error, match=match) as raised:
        write_ort_dynamic(fp32, tmp_path / "out.onnx", **kwargs)
    assert isinstance(raised.value, DeployOptError) and "\n" not in str(raised.value)
    assert not (tmp_path / "out.onnx").exists() and [p.name for p in tmp_path.iterdir()] == ["model.onnx"]


@pytest.mark.parametrize(
    "edit,match",
    [
        (lambda d: d["dynamic"].update({"w1": {"dtype": "uint8", "method": "DynamicQuantizeLinear"}}), "both"),
        (lambda d: d["dynamic"]["x"].update({"dtype": "int4"}), r"tensor 'x': field 'dtype'"),
    ],
)
def test_the_schema_refuses_a_bad_dynamic_entry(tmp_path: Path, edit, match: str) -> None:
    data = json.loads((_dynamic_build(tmp_path) / "scales.json").read_text())
    edit(data)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(ConfigError, match=match):
        load_scale_file(path)
