"""Weight levels: full int8, or 7-bit (ORT's reduce_range) where ORT's u8×s8 CPU kernels saturate (no VNNI)."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from calibrators.qparams import weight_scale
from deploy_opt.config.build import QuantizationConfig
from deploy_opt.stages import quantize as quantize_stage
from dopt_common.errors import ConfigError
from dopt_common.ort import int8_pairs_saturate


def test_reduced_weights_stay_within_63_levels() -> None:
    weight = np.random.default_rng(0).normal(size=(8, 32)).astype(np.float32)
    full, reduced = weight_scale("w", weight, 0), weight_scale("w", weight, 0, levels=63)
    codes = np.round(weight / np.asarray(reduced.scale, np.float32)[:, None])
    assert np.abs(codes).max() <= 63
    # the same amax over half the levels: twice the step
    np.testing.assert_allclose(np.asarray(reduced.scale) / np.asarray(full.scale), 127 / 63, rtol=1e-6)


def _matmul_integer(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    graph = helper.make_graph(
        [helper.make_node("MatMulInteger", ["a", "b"], ["y"])],
        "g",
        [helper.make_tensor_value_info("a", TensorProto.UINT8, list(a.shape))],
        [helper.make_tensor_value_info("y", TensorProto.INT32, None)],
        [numpy_helper.from_array(b, "b")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"a": a})[0]


def test_the_probe_agrees_with_a_large_integer_matmul() -> None:
    """The one-pair probe predicts whether ORT's full-range u8×s8 GEMM is exact here; 7-bit weights always are."""
    rng = np.random.default_rng(1)
    a = rng.integers(200, 256, size=(16, 64), dtype=np.uint8)
    b = rng.integers(100, 128, size=(64, 16), dtype=np.int8)
    exact = a.astype(np.int64) @ b.astype(np.int64)
    assert (not np.array_equal(_matmul_integer(a, b), exact)) == int8_pairs_saturate()
    b7 = (b // 2).astype(np.int8)  # within ±63
    np.testing.assert_array_equal(_matmul_integer(a, b7), a.astype(np.int64) @ b7.astype(np.int64))


@pytest.mark.parametrize("saturates", [True, False])
def test_auto_reduces_only_for_ort_cpu_on_a_saturating_machine(monkeypatch, saturates: bool) -> None:
    monkeypatch.setattr(quantize_stage, "int8_pairs_saturate", lambda: saturates)
    assert quantize_stage.weight_levels("auto", ("ort-cpu",))[0] == (63 if saturates else 127)
    assert quantize_stage.weight_levels("auto", ("tensorrt", "ort-cuda"))[0] == 127
    assert quantize_stage.weight_levels("full", ("ort-cpu",))[0] == 127
    assert quantize_stage.weight_levels("reduced", ("tensorrt",))[0] == 63


def test_an_unknown_weight_range_is_a_config_error() -> None:
    from deploy_opt.config.loader import build_dataclass

    with pytest.raises(ConfigError, match="weight_range"):
        build_dataclass(QuantizationConfig, {"weight_range": "8bit"}, "quantization")


def test_mse_weights_fall_back_to_absmax_with_7_bit_weights(tmp_path) -> None:
    """ORT clips weight codes to ±127, so a clipped 7-bit scale would let outliers past ±63: absmax is used."""
    from conftest import build_tiny

    from calibrators.scales.format import load_scale_file

    sections = "calibration: {weights: mse}\nquantization: {op_types: [MatMul], weight_range: reduced}"
    result = build_tiny(tmp_path, sections)
    scales = load_scale_file(result.out_dir / "scales.json")
    weights = [t for t in scales.tensors.values() if t.role == "weight"]
    assert weights and {t.method for t in weights} == {"absmax"}
    # What was used, not what was asked, in the provenance and build.json alike.
    assert scales.provenance["calibration"]["weights"] == result.build.quantization.weights == "absmax"
    assert result.build.to_json()["quantization"]["weight_range"].startswith("reduced")


@pytest.mark.slow
def test_a_build_that_quantizes_no_node_fails_the_gate(tmp_path) -> None:
    """op_types that match nothing leave model.int8.onnx without a quantized node: the gate says so and fails."""
    from conftest import build_tiny

    result = build_tiny(tmp_path, "quantization: {op_types: [Conv]}")
    assert result.build.quantization.quantized_nodes == 0
    assert not result.gate.passed and "0 nodes" in (result.out_dir / "summary.md").read_text()
    assert build_tiny(tmp_path, "quantization: {op_types: [Conv]}", ["gate.allow_fp32=true"]).gate.passed
