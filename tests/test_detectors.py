"""Detectors: the single-output-channel weight round trip, the head found on a YOLO-shaped graph, the detection
metric, and a tiny YOLO built end to end with default settings."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
import tiny_yolo
from conftest import write_config
from onnx import TensorProto, helper, numpy_helper

from calibrators.qparams import activation_scale, bias_scales, weight_scales
from calibrators.scales.format import ScaleFile, TensorScale
from deploy_opt.autotune.head import float_head, head_nodes
from deploy_opt.evaluation.detection import detection_f1
from exporters.ort.qdq import compare_scales, read_qdq_scales, write_ort_qdq

HERE = Path(__file__).resolve().parent


def _dfl_model(path: Path) -> Path:
    """A conv, a softmax over 16 bins and the DFL conv (one output channel, the ramp 0…15, no bias), then a
    one-channel conv with a bias (ORT writes that bias's [1] scale without an axis)."""
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.normal(0, 0.3, (16, 4, 1, 1)).astype(np.float32), "w0"),
        numpy_helper.from_array(np.arange(16, dtype=np.float32).reshape(1, 16, 1, 1), "ramp"),
        numpy_helper.from_array(np.array([[[[0.5]]]], dtype=np.float32), "w1"),
        numpy_helper.from_array(np.array([0.25], dtype=np.float32), "b1"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w0"], ["bins"], name="box"),
        helper.make_node("Softmax", ["bins"], ["probs"], name="softmax", axis=1),
        helper.make_node("Conv", ["probs", "ramp"], ["distance"], name="dfl"),
        helper.make_node("Conv", ["distance", "w1", "b1"], ["scaled"], name="scale"),
    ]
    graph = helper.make_graph(
        nodes,
        "dfl",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4, 8, 8])],
        [helper.make_tensor_value_info("scaled", TensorProto.FLOAT, ["batch", 1, 8, 8])],
        inits,
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


@pytest.mark.parametrize("scheme", ["asymmetric", "symmetric"])
def test_a_weight_with_one_output_channel_reads_back_exactly(tmp_path: Path, scheme: str) -> None:
    path = _dfl_model(tmp_path / "dfl.onnx")
    model = onnx.load(str(path))
    ranges = (("x", -2, 3), ("bins", -4, 4), ("probs", 0, 1), ("distance", 0, 15), ("scaled", 0, 8))
    tensors = {n: activation_scale(n, lo, hi, scheme, "minmax") for n, lo, hi in ranges}
    tensors |= weight_scales(model, ["Conv"])
    tensors |= bias_scales(model, tensors, ["Conv"])
    assert tensors["ramp"].axis == 0 and len(tensors["ramp"].scale) == 1  # per-channel with one channel
    scales = ScaleFile(scheme, tensors, {})
    out = write_ort_qdq(path, scales, tmp_path / "int8.onnx", op_types=["Conv"])
    carried = read_qdq_scales(out)
    assert carried["ramp"].axis == 0 and carried["ramp"].scale == tensors["ramp"].scale
    assert carried["b1"].axis == 0 and carried["b1"].scale == tensors["b1"].scale
    diff = compare_scales(scales.restricted_to(carried).tensors, carried)
    assert diff.ok, diff.summary()


def test_a_drift_names_the_tensor_both_values_and_the_likely_cause() -> None:
    declared = TensorScale("w", "weight", "int8", (0.5,), (0,), 0)
    written = TensorScale("w", "weight", "int8", (0.5,), (0,), None)
    summary = compare_scales({"w": declared}, {"w": written}).summary()
    assert "drifted: w (1)" in summary and "axis 0" in summary and "axis None" in summary
    assert "3f000000" in summary and "per-channel against per-tensor" in summary


def _yolo_onnx(tmp_path: Path) -> onnx.ModelProto:
    import torch

    path = tmp_path / "yolo.onnx"
    torch.onnx.export(
        tiny_yolo.build_model(),
        (torch.zeros(1, 3, 32, 32),),
        str(path),
        input_names=["images"],
        output_names=["output0"],
        dynamo=False,
        opset_version=17,
    )
    return onnx.load(str(path))


def test_the_head_of_a_yolo_graph_is_its_last_convs_the_dfl_conv_and_the_decode(tmp_path: Path) -> None:
    model = _yolo_onnx(tmp_path)
    head = set(head_nodes(model, ("Conv", "MatMul", "Gemm")))
    by_name = {n.name: n for n in model.graph.node}
    convs = {n for n in head if by_name[n].op_type == "Conv"}
    weights = {by_name[n].input[1] for n in convs}
    # the last conv of each branch at each level (2 levels × box and class), and the DFL conv
    assert len(convs) == 5 and any(
        numpy_helper.to_array(i).shape == (1, 16, 1, 1) for i in model.graph.initializer if i.name in weights
    )
    kinds = {by_name[n].op_type for n in head}
    assert {"Softmax", "Sigmoid", "Concat"} <= kinds
    # the backbone and the branches' first convs stay out: 7 of the 12 convs
    assert sum(n.op_type == "Conv" for n in model.graph.node) - len(convs) == 7
    assert set(float_head(model, ("Conv",))) == convs  # what a quantizer of convs would exclude


def test_a_classifier_head_is_its_last_layer(tiny_model: Path) -> None:
    model = onnx.load(str(tiny_model))
    assert head_nodes(model, ("MatMul",)) == ("fc2", "fc2_bias")


def _yolo_output(boxes: list[tuple[float, float, float, float, int, float]], anchors: int = 20) -> np.ndarray:
    out = np.zeros((1, 4 + 3, anchors), dtype=np.float32)
    for i, (cx, cy, w, h, cls, score) in enumerate(boxes):
        out[0, :4, i] = (cx, cy, w, h)
        out[0, 4 + cls, i] = score
    return out


def test_detection_f1_matches_same_class_boxes_at_iou_half() -> None:
    reference = _yolo_output([(10, 10, 8, 8, 0, 0.9), (30, 30, 8, 8, 1, 0.8), (50, 50, 8, 8, 2, 0.1)])
    assert detection_f1(reference, reference).tolist() == [100.0]
    shifted = _yolo_output([(11, 10, 8, 8, 0, 0.7), (30, 30, 8, 8, 2, 0.8)])  # one moved a little, one relabelled
    assert detection_f1(shifted, reference).tolist() == pytest.approx([100.0 * 2 * 1 / 4])
    nothing = _yolo_output([])
    assert detection_f1(nothing, nothing).tolist() == [100.0]
    assert detection_f1(nothing, reference).tolist() == [0.0]
    # duplicates of one box are suppressed (class-aware NMS), as Ultralytics' predict does
    doubled = _yolo_output([(10, 10, 8, 8, 0, 0.9), (10, 10, 8, 8.2, 0, 0.85), (30, 30, 8, 8, 1, 0.8)])
    assert detection_f1(doubled, reference).tolist() == [100.0]
    # the transposed layout [batch, anchors, 4 + classes] reads the same
    assert detection_f1(shifted.transpose(0, 2, 1), reference.transpose(0, 2, 1)).tolist() == pytest.approx([50.0])


def test_detection_f1_refuses_an_output_that_is_no_detection() -> None:
    from dopt_common.errors import InputError

    with pytest.raises(InputError, match="not a YOLO detection output"):
        detection_f1(np.zeros((2, 10)), np.zeros((2, 10)))


@pytest.mark.slow
def test_a_tiny_yolo_builds_end_to_end_with_defaults(tmp_path: Path) -> None:
    from deploy_opt.config.profiles import load_build_config
    from deploy_opt.pipeline.build import run_build

    source = HERE / "tiny_yolo.py"
    text = f"""
name: tiny-yolo
model:
  factory: "{source}:build_model"
  inputs: [{{name: images, shape: [batch, 3, 32, 32], dtype: float32}}]
data: {{calibration: "{source}:calibration", evaluation: "{source}:evaluation", metric: detection_f1}}
benchmark: {{enabled: false}}
gate: {{max_drop: 5}}
"""
    config, profile = load_build_config(write_config(tmp_path, text), "ci", [])
    result = run_build(config, profile, tmp_path / "reports", progress=False)
    record = result.build.to_json()
    assert record["metrics"]["name"] == "detection_f1"
    assert record["quantization"]["scale_check"].startswith("pass")
    assert result.gate.passed, result.gate.lines()
    steps = [t["step"] for t in record["auto"]["trials"]]
    assert steps[0] == "placement"


def test_an_error_inside_a_stage_names_the_stage_and_the_time_spent() -> None:
    from dopt_common.errors import ScaleMismatchError
    from dopt_common.runs import Timings

    times = Timings()
    with pytest.raises(
        ScaleMismatchError,
        match=r"^stage 'auto_search' failed after 0 s \(the run had taken 0 s\): "
        r"model.int8.onnx drifted$",
    ):
        with times.stage("outer"), times.stage("auto_search"):  # the innermost stage names itself, once
            raise ScaleMismatchError("model.int8.onnx drifted")
    with pytest.raises(ScaleMismatchError, match=r"^bad$"), times.stage("load", explain=False):
        raise ScaleMismatchError("bad")


def test_a_model_that_fixes_its_batch_is_timed_at_that_batch_only(tmp_path: Path) -> None:
    from deploy_opt.config.profiles import load_build_config
    from deploy_opt.stages.benchmark import fixed_batch, respect_fixed_batch

    dynamic = onnx.load(str(_dfl_model(tmp_path / "dynamic.onnx")))
    dynamic.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 1  # an Ultralytics static export: [1, ...]
    onnx.save(dynamic, str(tmp_path / "static.onnx"))
    assert fixed_batch(tmp_path / "dynamic.onnx") is None and fixed_batch(tmp_path / "static.onnx") == 1
    text = """
name: fixed
model: {onnx: static.onnx, inputs: [{name: x, shape: [1, 4, 8, 8], dtype: float32}]}
data: {calibration: "@TINY@:calibration", evaluation: "@TINY@:evaluation", metric: cosine}
gate: {speedup_batch: 32}
"""
    config, _ = load_build_config(write_config(tmp_path, text), "ci", [])
    assert config.benchmark.batch_sizes == (1, 32)
    fixed = respect_fixed_batch(config, tmp_path / "static.onnx")
    assert fixed.benchmark.batch_sizes == (1,) and fixed.gate.speedup_batch is None
    assert respect_fixed_batch(config, tmp_path / "dynamic.onnx") is config


def test_the_proxy_reads_a_scalar_weight_that_ort_dequantizes_to_a_numpy_scalar() -> None:
    from deploy_opt.analysis.sensitivity.analyze import _sqnr

    # a YOLO head kept in float on a chained base leaves a quantized 0-d Mul constant (nudenet 3.4.2's 320n.onnx)
    assert _sqnr(np.float32(2.0), np.float32(2.0)) > 100
    assert _sqnr(np.float32(2.0), np.float32(1.0)) == pytest.approx(20 * np.log10(2.0))
