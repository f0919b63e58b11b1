"""scales.json: the parameter maths against ORT's own, bit-exact round trips, and the Q/DQ read-back."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, numpy_helper
from onnxruntime.quantization.quant_utils import compute_scale_zp, get_qmin_qmax_for_qType
from scale_files import scales_for_model

from calibrators.qparams import activation_scale, weight_scale
from calibrators.scales.format import (
    ScaleFile,
    float32_hex,
    hex_float32,
    load_scale_file,
    save_scale_file,
)
from dopt_common.errors import ConfigError, ScaleMismatchError
from exporters.ort.qdq import compare_scales, read_qdq_scales, write_ort_qdq

RANGES = [(-1.0, 1.0), (-0.3, 2.7), (0.0, 5.5), (-7.25, -0.5), (-1e-3, 3e-4), (0.0, 0.0), (-123.4, 56.7)]


@pytest.mark.parametrize("low,high", RANGES)
def test_symmetric_params_equal_ort(low: float, high: float) -> None:
    ours = activation_scale("t", low, high, "symmetric", "minmax")
    qmin, qmax = get_qmin_qmax_for_qType(TensorProto.INT8, symmetric=True)
    zp, scale = compute_scale_zp(np.float32(low), np.float32(high), qmin, qmax, symmetric=True)
    assert ours.dtype == "int8" and ours.zero_point == (0,)
    assert float32_hex(ours.scale[0]) == float32_hex(float(scale))
    assert int(zp) == 0


@pytest.mark.parametrize("low,high", RANGES)
def test_asymmetric_params_equal_ort(low: float, high: float) -> None:
    ours = activation_scale("t", low, high, "asymmetric", "minmax")
    qmin, qmax = get_qmin_qmax_for_qType(TensorProto.UINT8, symmetric=False)
    zp, scale = compute_scale_zp(np.float32(low), np.float32(high), qmin, qmax, symmetric=False)
    assert ours.dtype == "uint8"
    assert float32_hex(ours.scale[0]) == float32_hex(float(scale))
    assert ours.zero_point == (int(zp),)


def test_weight_scales_are_per_channel_absmax() -> None:
    w = np.random.default_rng(0).normal(0, 1, (8, 3, 3, 3)).astype(np.float32)
    w[5] = 0.0  # an all-zero channel must not give a zero scale
    entry = weight_scale("w", w, 0)
    expected = (np.abs(w).reshape(8, -1).max(axis=1).astype(np.float64) / 127).astype(np.float32)
    assert entry.axis == 0 and entry.symmetric and len(entry.scale) == 8
    np.testing.assert_array_equal(np.float32(entry.scale)[np.arange(8) != 5], expected[np.arange(8) != 5])
    assert entry.scale[5] == 1.0
    # every channel's largest weight lands exactly on ±127
    q = np.round(w / np.float32(entry.scale)[:, None, None, None])
    assert np.abs(q).max() == 127


def test_hex_round_trip_is_exact() -> None:
    for value in [0.1, 1 / 3, 1e-38, 3.4e38, 2.0**-149, 0.007874016]:
        assert float32_hex(float(hex_float32(float32_hex(value)))) == float32_hex(value)
    assert float32_hex(1.0) == "3f800000"  # big-endian IEEE bits, as the TensorRT cache stores them


def _scale_file(model_path: Path, scheme: str) -> ScaleFile:
    return scales_for_model(model_path, scheme, 0, {"test": True})


def test_scale_file_json_round_trip_is_bit_exact(tiny_model: Path, tmp_path: Path) -> None:
    scales = _scale_file(tiny_model, "asymmetric")
    path = save_scale_file(scales, tmp_path / "scales.json")
    loaded = load_scale_file(path)
    assert compare_scales(scales.tensors, loaded.tensors).ok
    for name, entry in scales.tensors.items():
        assert loaded.tensors[name].scale_bits == entry.scale_bits
        assert loaded.tensors[name].zero_point == entry.zero_point


def test_scale_file_refuses_other_format_and_disagreeing_hex(tiny_model: Path, tmp_path: Path) -> None:
    path = save_scale_file(_scale_file(tiny_model, "symmetric"), tmp_path / "scales.json")
    data = json.loads(path.read_text())
    data["format"] = "deploy_opt.scales/999"
    (tmp_path / "other.json").write_text(json.dumps(data))
    with pytest.raises(ConfigError, match="format 'deploy_opt.scales/999'"):
        load_scale_file(tmp_path / "other.json")
    data = json.loads(path.read_text())
    name = next(iter(data["tensors"]))
    data["tensors"][name]["scale"][0] *= 1.5
    (tmp_path / "bad.json").write_text(json.dumps(data))
    with pytest.raises(ScaleMismatchError, match=name):
        load_scale_file(tmp_path / "bad.json")


@pytest.mark.parametrize("scheme", ["symmetric", "asymmetric"])
def test_qdq_model_carries_the_scale_file_exactly(tiny_model: Path, tmp_path: Path, scheme: str) -> None:
    scales = _scale_file(tiny_model, scheme)
    out = write_ort_qdq(tiny_model, scales, tmp_path / "int8.onnx", op_types=["MatMul", "Gemm"])
    carried = read_qdq_scales(out)
    assert carried, "the quantizer inserted no Q/DQ"
    diff = compare_scales(scales.restricted_to(carried).tensors, carried)
    assert diff.ok, diff.summary()
    assert {t.role for t in carried.values()} >= {"activation", "weight"}
    if scheme == "symmetric":
        assert all(t.symmetric for t in carried.values())
    # Writing again from the read-back file is idempotent.
    again = write_ort_qdq(tiny_model, scales.restricted_to(carried), tmp_path / "again.onnx", op_types=["MatMul"])
    assert compare_scales(carried, read_qdq_scales(again)).ok


def test_a_corrupted_scale_is_named(tiny_model: Path, tmp_path: Path) -> None:
    scales = _scale_file(tiny_model, "symmetric")
    out = write_ort_qdq(tiny_model, scales, tmp_path / "int8.onnx", op_types=["MatMul"])
    model = onnx.load(str(out))
    quantize = next(n for n in model.graph.node if n.op_type == "QuantizeLinear")
    scale_init = next(i for i in model.graph.initializer if i.name == quantize.input[1])
    value = numpy_helper.to_array(scale_init)
    scale_init.CopyFrom(numpy_helper.from_array(np.nextafter(value, np.float32(np.inf)), scale_init.name))
    onnx.save(model, str(tmp_path / "corrupt.onnx"))
    carried = read_qdq_scales(tmp_path / "corrupt.onnx")
    diff = compare_scales(scales.restricted_to(carried).tensors, carried)
    assert diff.drifted == (quantize.input[0],)
    assert quantize.input[0] in diff.summary()


def test_params_equal_ort_on_many_random_ranges() -> None:
    rng = np.random.default_rng(42)
    lows = -np.exp(rng.uniform(-20, 8, 2000)) * (rng.random(2000) < 0.9)
    highs = np.exp(rng.uniform(-20, 8, 2000))
    int8 = get_qmin_qmax_for_qType(TensorProto.INT8, symmetric=True)
    uint8 = get_qmin_qmax_for_qType(TensorProto.UINT8, symmetric=False)
    for low, high in zip(lows.astype(np.float32), highs.astype(np.float32), strict=True):
        _, s_ref = compute_scale_zp(low, high, *int8, symmetric=True)
        assert float32_hex(activation_scale("t", float(low), float(high), "symmetric", "m").scale[0]) == float32_hex(
            float(s_ref)
        )
        z_ref, a_ref = compute_scale_zp(low, high, *uint8, symmetric=False)
        ours = activation_scale("t", float(low), float(high), "asymmetric", "m")
        assert (float32_hex(ours.scale[0]), ours.zero_point[0]) == (float32_hex(float(a_ref)), int(z_ref))
