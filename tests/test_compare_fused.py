"""Per-layer comparison pairs tensors by producer: a Relu that ORT's quantizer removed into the Gemm before it (the
Gemm then carries the Relu's output name) is never compared pre-Relu against post-Relu (issue 31)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest
import tiny_onnx
from onnx import TensorProto, helper, numpy_helper

from calibrators.activations.collect import select_tensors
from calibrators.qparams import activation_scale, bias_scales, weight_scales
from calibrators.scales.format import ScaleFile
from deploy_opt.analysis.compare import compare_backends
from deploy_opt.analysis.compare_layers import plan_rows
from deploy_opt.analysis.comparison import ComparedModels
from deploy_opt.config.build import CompareConfig
from exporters.ort.qdq import write_ort_qdq

FEATURES, HIDDEN, CLASSES = 16, 32, 4
OPS = ["Gemm", "Relu"]


def _weights() -> dict[str, np.ndarray]:
    return tiny_onnx.seeded_weights(3, w1=(HIDDEN, FEATURES), b1=HIDDEN, w2=(CLASSES, HIDDEN), b2=CLASSES)


def _gemm_relu(path: Path) -> Path:
    """x → Gemm fc1 → h → Relu act → r → Gemm fc2 → logits (opset 17, dynamic batch)."""
    nodes = [
        helper.make_node("Gemm", ["x", "w1", "b1"], ["h"], name="fc1", transB=1),
        helper.make_node("Relu", ["h"], ["r"], name="act"),
        helper.make_node("Gemm", ["r", "w2", "b2"], ["logits"], name="fc2", transB=1),
    ]
    graph = helper.make_graph(
        nodes,
        "gemm_relu",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", FEATURES])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", CLASSES])],
        [numpy_helper.from_array(v, k) for k, v in _weights().items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def _numpy(x: np.ndarray) -> dict[str, np.ndarray]:
    """The FP32 graph's tensors, computed in numpy (the independent reference)."""
    w = _weights()
    h = x @ w["w1"].T + w["b1"]
    r = np.maximum(h, 0)
    return {"x": x, "h": h, "r": r, "logits": r @ w["w2"].T + w["b2"]}


def _x(seed: int, n: int) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, 1, (n, FEATURES)).astype(np.float32)


def _sqnr(reference: np.ndarray, test: np.ndarray) -> float:
    a, b = reference.astype(np.float64), test.astype(np.float64)
    return float(10 * np.log10((a**2).sum() / ((a - b) ** 2).sum()))


@pytest.fixture
def models(tmp_path: Path) -> tuple[Path, Path]:
    """The FP32 graph and its asymmetric Q/DQ model with Relu among the op types: ORT removes the Relu."""
    fp32 = _gemm_relu(tmp_path / "gemm_relu.onnx")
    model = onnx.load(str(fp32))
    acts = _numpy(_x(1, 256))
    tensors = {
        n: activation_scale(n, float(acts[n].min()), float(acts[n].max()), "asymmetric", "minmax")
        for n in select_tensors(model, OPS)
    }
    tensors |= weight_scales(model, OPS)
    tensors |= bias_scales(model, tensors, OPS)
    qdq = write_ort_qdq(fp32, ScaleFile("asymmetric", tensors, {}), tmp_path / "gemm_relu.int8.onnx", op_types=OPS)
    return fp32, qdq


def _run_tensors(path: Path, names: list[str], x: np.ndarray) -> list[np.ndarray]:
    """Named tensors of a model, exposed as graph outputs and run unoptimized on ORT's CPU provider."""
    model = onnx.load(str(path))
    model.graph.output.extend(helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in names)
    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = onnxruntime.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(names, {"x": x})


def _dequantized(model: onnx.ModelProto, name: str) -> str:
    """The output of the DequantizeLinear that follows the QuantizeLinear of ``name``."""
    quantized = next(n.output[0] for n in model.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == name)
    return next(n.output[0] for n in model.graph.node if n.op_type == "DequantizeLinear" and n.input[0] == quantized)


def _q_nodes(path: Path) -> dict[str, onnx.NodeProto]:
    return {n.name: n for n in onnx.load(str(path)).graph.node}


def test_ort_removed_the_relu_and_gave_the_gemm_its_name(models: tuple[Path, Path]) -> None:
    # The situation the pairing must survive: without it the checks below would compare pre- against post-Relu.
    nodes = _q_nodes(models[1])
    assert "act" not in nodes and not any(n.op_type == "Relu" for n in nodes.values())
    assert list(nodes["fc1"].output) == ["r"]


def test_rows_pair_by_producer_not_by_name(models: tuple[Path, Path]) -> None:
    fp32, qdq = (onnx.load(str(p)) for p in models)
    rows = {r.name: r for r in plan_rows(fp32, qdq)[0]}
    dq_of_r = _dequantized(qdq, "r")
    # FP32's Gemm output h pairs with the Q/DQ model's Gemm output (named r there), and owns no Q/DQ of its own.
    assert (rows["h"].pre, rows["h"].post, rows["h"].clip) == ("r", None, None)
    # FP32's post-Relu r pairs with that tensor clipped as the Relu would, and owns the Q/DQ pair that clips.
    assert (rows["r"].pre, rows["r"].post, rows["r"].clip) == ("r", dq_of_r, (0.0, float("inf")))


def test_compare_json_sets_pre_relu_against_pre_relu(models: tuple[Path, Path], tmp_path: Path) -> None:
    fp32, qdq = models
    x = _x(2, 64)
    out = tmp_path / "report"
    compare_backends(ComparedModels(fp32, qdq), {"x": x}, out, config=CompareConfig())
    written = json.loads((out / "compare.json").read_text())
    layers = {row["name"]: row for row in written["layers"]}
    # The Q/DQ model's own tensors, read by ORT (graph optimizations off: the Q/DQ graph as written), against numpy.
    dq_of_r = _dequantized(onnx.load(str(qdq)), "r")
    gemm_out, dequantized = _run_tensors(qdq, ["r", dq_of_r], x)  # r is computed by fc1 there: pre-Relu
    reference = _numpy(x)
    assert gemm_out.min() < 0 < reference["h"].max()
    assert layers["h"]["sqnr_db"] == pytest.approx(_sqnr(reference["h"], gemm_out), abs=0.01)
    assert layers["r"]["sqnr_db"] == pytest.approx(_sqnr(reference["r"], np.maximum(gemm_out, 0)), abs=0.01)
    assert layers["h"]["quant_sqnr_db"] is None  # its Q/DQ is the Relu's
    # r's own quantization noise is healthy; set against the pre-Relu tensor it would read ~0 dB.
    assert layers["r"]["quant_sqnr_db"] > CompareConfig().min_quant_sqnr_db + 10
    assert _sqnr(gemm_out, dequantized) < CompareConfig().min_quant_sqnr_db
    assert written["first_divergence"] is None and written["verdict"] == "pass", written["failures"]


def test_a_wrong_scale_on_the_removed_relu_still_diverges(models: tuple[Path, Path], tmp_path: Path) -> None:
    fp32, qdq = models
    model = onnx.load(str(qdq))
    quantize = next(n for n in model.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == "r")
    scale = next(i for i in model.graph.initializer if i.name == quantize.input[1])
    scale.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(scale) / np.float32(50), scale.name))
    broken = tmp_path / "broken.onnx"
    onnx.save(model, str(broken))
    record = compare_backends(ComparedModels(fp32, broken), {"x": _x(2, 64)}, tmp_path, config=CompareConfig())
    first = record.first_divergence
    assert first is not None and (first["tensor"], first["reason"]) == ("r", "quantization")
    assert record.verdict == "fail"
