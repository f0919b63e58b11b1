"""TensorRT's form of the Q/DQ model: float biases, int8 zero points of 0, weights on the output-channel axis.

TensorRT's parser refuses an int32 DequantizeLinear (ORT's quantized bias) and any non-zero zero point, so a
build for a TensorRT target writes neither, and the compat report fails a model that has them. A build for ORT
CPU and TensorRT keeps ORT's form in model.int8.onnx and writes model.trt.onnx beside it, with the same scales.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import tiny_onnx
from conftest import tiny_cnn_config
from onnx import numpy_helper

from calibrators.scales.format import load_scale_file
from deploy_opt.analysis.align import verify_alignment
from deploy_opt.analysis.compat import check_compat
from deploy_opt.analysis.compat_report import CompatReport
from deploy_opt.config.profiles import load_build_config
from deploy_opt.pipeline.build import run_build
from exporters.ort.qdq import compare_scales, read_qdq_scales
from exporters.tensorrt.form import int32_dequantize_nodes, to_tensorrt_form

HERE = Path(__file__).resolve().parent
INT32_REASON = "int32 DequantizeLinear: TensorRT parse error"


def _build(tmp_path: Path, profile: str, *overrides: str):
    source = HERE / "tiny_torch.py"
    path = tiny_cnn_config(tmp_path, f"{source}:calibration", f"{source}:evaluation")
    settings = ["quantization.mode=manual", "quantization.keep_head=false", "gate.min_speedup=null", *overrides]
    config, prof = load_build_config(path, profile, settings)
    return run_build(config, prof, tmp_path / "reports", progress=False)


def _zero_points(model: onnx.ModelProto) -> list[np.ndarray]:
    inits = {i.name: i for i in model.graph.initializer}
    qdq = [n for n in model.graph.node if n.op_type in ("QuantizeLinear", "DequantizeLinear")]
    return [numpy_helper.to_array(inits[n.input[2]]) for n in qdq if len(n.input) > 2 and n.input[2]]


def _tensorrt_fails(report: CompatReport) -> list[Mapping[str, Any]]:
    return [f for f in report.flagged if f["target"] == "tensorrt" and f["status"] == "fail"]


@pytest.mark.slow
def test_a_tensorrt_profile_writes_float_biases_and_zero_points_of_zero(tmp_path: Path) -> None:
    # An impossible speed target: a GPU profile is never timed on ORT CPU, which it does not target; with no GPU
    # here its speed is not measured, and the gate says why instead of showing a CPU figure.
    timed = ("benchmark.enabled=true", "benchmark.batch_sizes=[1,4]", "benchmark.repeats=3", "benchmark.warmup=1")
    result = _build(tmp_path, "a100", *timed, "gate.min_speedup=100")
    out, build = result.out_dir, result.build.to_json()
    speed = next(c for c in result.gate.criteria if c.name == "min_speedup")
    assert result.gate.passed and not speed.judged and build["benchmark"] is None
    assert speed.text.startswith("speed not measured: no GPU timing here (tensorrt: ")
    assert "deploys to tensorrt, ort-cuda" in speed.text and "x at batch" not in speed.text
    assert build["targets"]["ort-cuda"].startswith("ships model.onnx (FP32): ORT's CUDA EP runs Q/DQ in float")
    assert "ORT's CUDA EP runs Q/DQ in float" in (out / "summary.md").read_text()
    model = onnx.load(str(out / "model.int8.onnx"))
    assert build["quantization"]["quantized_nodes"] > 0
    assert not int32_dequantize_nodes(model) and not (out / "model.trt.onnx").exists()
    zeros = _zero_points(model)
    assert zeros and all(z.dtype == np.int8 and not z.any() for z in zeros)
    scales = load_scale_file(out / "scales.json")
    assert not any(t.role == "bias" for t in scales.tensors.values())  # no bias is quantized, none is listed
    assert build["backends"]["compat"]["compat.int8"]["summary"]["tensorrt"]["fail"] == 0
    assert not _tensorrt_fails(check_compat(out / "model.int8.onnx", ("tensorrt",)))
    assert verify_alignment(out).ok
    conv = next(n for n in model.graph.node if n.op_type == "Conv")
    weight_dq = next(n for n in model.graph.node if n.output and n.output[0] == conv.input[1])
    assert next(a.i for a in weight_dq.attribute if a.name == "axis") == 0  # Conv weights: output channels


@pytest.mark.slow
def test_ort_cpu_and_tensorrt_get_one_scale_file_and_two_forms(tmp_path: Path) -> None:
    result = _build(tmp_path, "ci", "deploy.targets=[ort-cpu,tensorrt]")
    out = result.out_dir
    ort_form, trt_form = onnx.load(str(out / "model.int8.onnx")), onnx.load(str(out / "model.trt.onnx"))
    assert int32_dequantize_nodes(ort_form) and not int32_dequantize_nodes(trt_form)
    # The old form fails TensorRT by its parser's rules; the TensorRT form passes them.
    old = _tensorrt_fails(check_compat(out / "model.int8.onnx", ("tensorrt",)))
    assert old and all(INT32_REASON in f["reason"] for f in old)
    assert not _tensorrt_fails(check_compat(out / "model.trt.onnx", ("tensorrt",)))
    assert result.build.to_json()["backends"]["compat"]["compat.trt"]["summary"]["tensorrt"]["fail"] == 0
    # The same scales, bit for bit: the TensorRT form carries every non-bias entry of scales.json.
    scales = load_scale_file(out / "scales.json")
    expected = {n: t for n, t in scales.tensors.items() if t.role != "bias"}
    assert compare_scales(expected, read_qdq_scales(out / "model.trt.onnx")).ok
    checks = {c.artifact: c for c in verify_alignment(out).checks}
    assert checks["model.trt.onnx"].status == "pass" and checks["model.int8.onnx"].status == "pass"
    # And the same function: ORT's reference kernels (no fusion) give the same outputs from both forms.
    x = np.random.default_rng(3).normal(0, 1, (4, 1, 8, 8)).astype(np.float32)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    run = {
        name: ort.InferenceSession(str(out / name), options, providers=["CPUExecutionProvider"]).run(None, {"image": x})
        for name in ("model.int8.onnx", "model.trt.onnx")
    }
    np.testing.assert_array_equal(run["model.int8.onnx"][0], run["model.trt.onnx"][0])


def test_each_int32_bias_becomes_the_float_its_dequantize_computes(tmp_path: Path) -> None:
    from onnx import helper

    q = np.array([[-3, 7], [100000, -5]], np.int32)
    scale = np.array([0.5, 0.25], np.float32)
    inits = [
        numpy_helper.from_array(q, "b_quantized"),
        numpy_helper.from_array(scale, "b_scale"),
        numpy_helper.from_array(np.zeros(2, np.int32), "b_zero"),
    ]
    nodes = [
        helper.make_node("DequantizeLinear", ["b_quantized", "b_scale", "b_zero"], ["b"], axis=1, name="dq"),
        helper.make_node("Add", ["x", "b"], ["y"], name="add"),
    ]
    src = tiny_onnx.save_xy_model(tmp_path / "m.onnx", nodes, "g", [2, 2], [2, 2], inits, opset=13)
    path, folded = to_tensorrt_form(src, tmp_path / "m.trt.onnx")
    model = onnx.load(str(path))
    assert folded == 1 and [n.op_type for n in model.graph.node] == ["Add"]
    assert {i.name for i in model.graph.initializer} == {"b"}  # the int32 tensor and its parameters are gone
    x = np.zeros((2, 2), np.float32)
    expected = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_array_equal(got, expected)


def _weight_qdq_model(
    axis: int, zero_type: int = onnx.TensorProto.INT8, activation_scales: int = 1, zero_value: int = 0
) -> onnx.ModelProto:
    """x -> Q/DQ -> MatMul(x, DQ(w)): w is [16, 8]; the activation scale has ``activation_scales`` values."""
    from onnx import TensorProto, helper

    zero = np.int8 if zero_type == TensorProto.INT8 else np.uint8
    shape = (activation_scales,) if activation_scales > 1 else ()
    inits = [
        numpy_helper.from_array(np.full(shape, 0.1, np.float32), "xs"),
        numpy_helper.from_array(np.full(shape, zero_value, zero), "xz"),
        numpy_helper.from_array(np.ones((16, 8), np.int8), "w_quantized"),
        numpy_helper.from_array(np.full(8 if axis == 1 else 16, 0.01, np.float32), "ws"),
        numpy_helper.from_array(np.zeros(8 if axis == 1 else 16, np.int8), "wz"),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"], name="q", axis=1),
        helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"], name="dq", axis=1),
        helper.make_node("DequantizeLinear", ["w_quantized", "ws", "wz"], ["w"], name="w_dq", axis=axis),
        helper.make_node("MatMul", ["xd", "w"], ["y"], name="fc"),
    ]
    return tiny_onnx.xy_model(nodes, "g", [2, 16], [2, 8], inits, opset=13)


@pytest.mark.parametrize(
    "model,node,reason",
    [
        (_weight_qdq_model(1), None, None),  # TensorRT's form: per-channel on MatMul's output axis
        (_weight_qdq_model(0), "w_dq", "per-channel weight of MatMul 'fc' on axis 0: TensorRT fuses axis 1"),
        # The parser takes a uint8 QuantizeLinear whose zero point is all zeros (with a warning); its uint8
        # DequantizeLinear is the parse error, and a non-zero uint8 zero point fails on the Q as well.
        (_weight_qdq_model(1, onnx.TensorProto.UINT8), "dq", "uint8 DequantizeLinear: TensorRT parse error"),
        (_weight_qdq_model(1, onnx.TensorProto.UINT8, zero_value=128), "q", "non-zero zero point: TensorRT parse"),
        (_weight_qdq_model(1, activation_scales=16), "q", "per-channel QuantizeLinear on activation 'x'"),
    ],
    ids=["trt-form", "wrong-axis", "uint8-zero", "uint8-asymmetric", "per-channel-activation"],
)
def test_compat_judges_tensorrt_s_qdq_rules(model: onnx.ModelProto, node: str | None, reason: str | None) -> None:
    report = check_compat(model, ("tensorrt",))
    fails = {f["name"]: f["reason"] for f in _tensorrt_fails(report)}
    if node is None:
        assert not fails, fails
    else:
        assert node in fails and reason in fails[node], fails
    if reason and reason.startswith("uint8 Dequantize"):
        assert "q" not in fails, fails  # the Q with zero point 0 parses
