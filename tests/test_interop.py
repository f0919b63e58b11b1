"""scales.json to and from TensorRT calibration caches, AIMET encodings and ORT TensorQuantOverrides, bit for bit."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnxruntime.quantization.quant_utils import QuantType
from onnxruntime.quantization.tensor_quant_overrides import TensorQuantOverridesHelper
from scale_files import scales_for_model

from calibrators.scales.format import ScaleFile, TensorScale, load_scale_file, save_scale_file
from deploy_opt.analysis.scale_interop import detect_format, export_scales, import_scales
from dopt_common.errors import ConfigError, ScaleMismatchError
from exporters.aimet import read_aimet_encodings, write_aimet_encodings
from exporters.ort.overrides import ort_quant_overrides, read_ort_overrides, write_ort_overrides
from exporters.ort.qdq import compare_scales, read_qdq_scales, write_ort_qdq
from exporters.tensorrt.cache import (
    parse_trt_cache,
    read_trt_cache,
    trt_version_number,
    trt_version_string,
    write_trt_cache,
)

TABLES = Path(__file__).resolve().parent / "data" / "trt_tables"
# Awkward float32 scales: the smallest normal and subnormals, 1.0, and values whose shortest decimal is long.
AWKWARD = [
    float(np.finfo(np.float32).tiny),
    float(np.float32(2.0**-149)),
    float(np.float32(3e-41)),
    1.0,
    float(np.float32(1 / 3)),
    float(np.float32(0.1)),
    float(np.nextafter(np.float32(1.0), np.float32(2.0))),
    float(np.float32(7.874015718698502e-3)),
    float(np.float32(3.0e38)),
]


def _random_scales(seed: int, scheme: str) -> ScaleFile:
    """Activations (int8 or uint8), per-channel and per-tensor weights, int32 biases, awkward values included."""
    rng = np.random.default_rng(seed)
    tensors: dict[str, TensorScale] = {}
    for i, value in enumerate(AWKWARD + [float(v) for v in np.exp(rng.uniform(-30, 10, 20)).astype(np.float32)]):
        name = f"/layer{i}/act:0" if i % 3 else f"act_{i}"
        zero = (0,) if scheme == "symmetric" else (int(rng.integers(0, 256)),)
        dtype = "int8" if scheme == "symmetric" else "uint8"
        tensors[name] = TensorScale(name, "activation", dtype, (value,), zero, method="minmax")
    for i in range(4):
        channels = int(rng.integers(1, 9))
        scale = tuple(float(s) for s in np.exp(rng.uniform(-20, 2, channels)).astype(np.float32))
        tensors[f"w{i}"] = TensorScale(f"w{i}", "weight", "int8", scale, (0,) * channels, i % 2, 1.5, None, "absmax")
        tensors[f"b{i}"] = TensorScale(
            f"b{i}", "bias", "int32", scale, (0,) * channels, 0, method="derived", derived_from=("a", f"w{i}")
        )
    tensors["w_pt"] = TensorScale("w_pt", "weight", "int8", (AWKWARD[4],), (0,), method="absmax")
    return ScaleFile(scheme, tensors, {"test": True})


def _same(expected: dict[str, TensorScale], found: dict[str, TensorScale], roles: bool = True) -> None:
    diff = compare_scales(expected, found)
    assert diff.ok, diff.summary()
    for name, entry in expected.items():
        assert found[name].scale_bits == entry.scale_bits
        # ORT overrides carry no role: a per-tensor weight reads back as an activation.
        assert found[name].role == entry.role or (not roles and name == "w_pt")


# ---- TensorRT calibration cache -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "version,number",
    [("8.6.1", 8601), ("8.5.2.2", 8502), ("7.2.3", 7203), ("10.0.1", 100001), ("10.3.0", 100300), ("10.13", 101300)],
)
def test_trt_version_encoding(version: str, number: int) -> None:
    assert trt_version_number(version) == number
    assert trt_version_number(trt_version_string(number)) == number


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_trt_cache_round_trip_is_bit_exact(tmp_path: Path, seed: int) -> None:
    scales = _random_scales(seed, "symmetric")
    path = write_trt_cache(scales, tmp_path / "calibration.cache", trt_version="8.6.1")
    lines = path.read_text().splitlines()
    assert lines[0] == "TRT-8601-EntropyCalibration2"
    activations = {n: t for n, t in scales.tensors.items() if t.role == "activation"}
    assert [line.rpartition(": ")[0] for line in lines[1:]] == list(activations)  # scales.json order, no weights
    cache = read_trt_cache(path)
    assert (cache.version, cache.algorithm) == ("8.6.1", "EntropyCalibration2")
    _same(activations, dict(cache.scales))
    # Each value is the big-endian float32 bits of the scale, decoded here without our helpers.
    for line in lines[1:]:
        name, _, bits = line.rpartition(": ")
        assert struct.unpack(">f", bytes.fromhex(bits))[0] == activations[name].scale[0]


def test_trt_cache_round_trip_through_scales_json(tmp_path: Path) -> None:
    scales = _random_scales(3, "symmetric")
    save_scale_file(scales, tmp_path / "scales.json")
    cache = export_scales(tmp_path / "scales.json", "trt-cache")
    assert cache == tmp_path / "calibration.cache"
    assert cache.read_text().startswith("TRT-100001-EntropyCalibration2\n")
    back = import_scales(cache)
    imported = back.provenance["imported"]
    assert imported["format"] == "trt-cache" and imported["trt_version"] == "10.0.1" and len(imported["sha256"]) == 64
    _same({n: t for n, t in scales.tensors.items() if t.role == "activation"}, dict(back.tensors))
    save_scale_file(back, tmp_path / "imported.json")
    _same(dict(back.tensors), dict(load_scale_file(tmp_path / "imported.json").tensors))


def test_trt_cache_refuses_asymmetric_activations(tmp_path: Path) -> None:
    scales = _random_scales(0, "asymmetric")
    first = next(n for n, t in scales.tensors.items() if t.role == "activation")
    with pytest.raises(ScaleMismatchError, match=rf"'{first}'.*symmetric activations"):
        write_trt_cache(scales, tmp_path / "calibration.cache")
    assert not (tmp_path / "calibration.cache").exists()


@pytest.mark.parametrize("name", sorted(p.name for p in TABLES.glob("*.cache")))
def test_real_trt_tables_parse(name: str) -> None:
    text = (TABLES / name).read_text()
    cache = read_trt_cache(TABLES / name)
    header = text.splitlines()[0]
    assert header == f"TRT-{trt_version_number(cache.version)}-{cache.algorithm}"
    assert len(cache.scales) == len(text.strip().splitlines()) - 1
    for entry in cache.scales.values():
        assert entry.dtype == "int8" and entry.zero_point == (0,) and entry.axis is None
        assert 0 < entry.scale[0] < 1e3 and entry.amax == pytest.approx(127 * entry.scale[0], rel=1e-6)


def test_real_trt_tables_decode_to_plausible_ranges() -> None:
    cuda = read_trt_cache(TABLES / "yolov5_cudla_trt8600.cache").scales
    # The image input is normalised to [0, 1] and sigmoid outputs lie in (0, 1): both ranges are ~1.0.
    assert cuda["images"].amax == pytest.approx(1.0, rel=2e-3)
    deepstream = read_trt_cache(TABLES / "yolov5_deepstream_trt8502.cache").scales
    assert deepstream["/0/model.0/act/Sigmoid_output_0"].amax == pytest.approx(1.0, rel=2e-3)
    assert "(Unnamed Layer* 225) [Shuffle]_output" in deepstream
    ssd = read_trt_cache(TABLES / "ssd_tf_trt7203.cache")
    assert ssd.version == "7.2.3"
    assert ssd.scales["(Unnamed Layer* 51) [Softmax]_output"].amax == pytest.approx(1.0, rel=5e-3)
    assert "ssd_300_vgg/Relu:0" in ssd.scales and "Max__306:0" in ssd.scales  # split on the last ': '
    vgg = read_trt_cache(TABLES / "vgg16_minmax_trt8400.cache")
    assert (vgg.version, vgg.algorithm) == ("8.4.0", "MinMaxCalibration")


@pytest.mark.parametrize(
    "header,version,algorithm",
    [
        ("TRT-100300-EntropyCalibration2", "10.3.0", "EntropyCalibration2"),
        ("TRT-5105-EntropyCalibration", "5.1.5", "EntropyCalibration"),
        ("TRT-8602-MinMaxCalibration", "8.6.2", "MinMaxCalibration"),
        ("TRT-6001-LegacyCalibration", "6.0.1", "LegacyCalibration"),
    ],
)
def test_trt_cache_header_variants_and_blank_lines(header: str, version: str, algorithm: str) -> None:
    cache = parse_trt_cache(f"\n{header}\r\n\ndata: 3c008912\r\n\na:b: c: 3f800000\n\n")
    assert (cache.version, cache.algorithm) == (version, algorithm)
    assert cache.scales["a:b: c"].scale == (1.0,)
    assert list(cache.scales) == ["data", "a:b: c"]


@pytest.mark.parametrize(
    "text,match",
    [
        ("TRT-8601-EntropyCalibration2\ndata: 3c0089120\n", r"line 2: 'data: 3c0089120'.*1 to 8 hex digits"),
        ("TRT-8601-EntropyCalibration2\ndata 3c008912\n", r"line 2: 'data 3c008912'"),
        ("TRT-8601-EntropyCalibration2\n\nok: 3c008912\n: 3c008912\n", r"line 4: ': 3c008912'"),
        ("TRT-8601-EntropyCalibration2\ndata: zz008912\n", r"line 2"),
        ("TRT-8601-EntropyCalibration2\nneg: bf800000\n", r"line 2: 'neg: bf800000'.*positive"),
        ("TRT-8601-EntropyCalibration2\nnan: 7fc00000\n", r"line 2.*positive"),
        ("data: 3c008912\n", r"line 1: 'data: 3c008912' is not a TensorRT calibration cache header"),
        ("TRT-8601-Percentile\n", r"line 1: calibration algorithm 'Percentile'"),
        ("TRT-8601-EntropyCalibration2\nx: 3c008912\nx: 3c008913\n", r"line 3: tensor 'x' appears twice"),
        ("", r"empty"),
    ],
)
def test_malformed_trt_cache_lines_are_named(text: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        parse_trt_cache(text)


# ---- AIMET encodings ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("scheme", ["symmetric", "asymmetric"])
def test_aimet_round_trip_is_bit_exact(tmp_path: Path, scheme: str) -> None:
    scales = _random_scales(5, scheme)
    path = write_aimet_encodings(scales, tmp_path / "encodings.json")
    data = json.loads(path.read_text())
    assert data["version"] == "1.0.0"
    entry = data["param_encodings"][0]
    assert set(entry) == {"name", "dtype", "enc_type", "is_sym", "bw", "scale", "offset"}
    back = read_aimet_encodings(path)
    _same(dict(scales.tensors), back)
    activation_dtype = "int8" if scheme == "symmetric" else "uint8"
    assert {t.dtype for t in back.values()} == {activation_dtype, "int8", "int32"}


def test_aimet_offsets_dequantize_like_onnx(tmp_path: Path) -> None:
    """AIMET: real = (q + offset) * scale with q unsigned; ONNX: real = (q - zero_point) * scale, same grid."""
    scales = _random_scales(6, "asymmetric")
    data = json.loads(write_aimet_encodings(scales, tmp_path / "e.json").read_text())
    by_name = {e["name"]: e for e in data["activation_encodings"] + data["param_encodings"]}
    for name, t in scales.tensors.items():
        e = by_name[name]
        signed = t.dtype in ("int8", "int32")
        bits = 8 if t.dtype != "int32" else 32
        q_onnx = np.array([-(2 ** (bits - 1)), -1, 0, 1, 2 ** (bits - 1) - 1]) if signed else np.array([0, 1, 128, 255])
        q_aimet = q_onnx + (2 ** (bits - 1) if signed else 0)
        for s, z, off in zip(t.scale, t.zero_point, e["offset"], strict=True):
            np.testing.assert_array_equal((q_aimet + off) * np.float64(s), (q_onnx - z) * np.float64(s))
        assert e["bw"] == bits and e["is_sym"] == t.symmetric


def test_aimet_reads_files_without_the_axis_extension_and_the_older_format(tmp_path: Path) -> None:
    v1 = {
        "version": "1.0.0",
        "activation_encodings": [
            {
                "name": "input",
                "dtype": "INT",
                "enc_type": "PER_TENSOR",
                "is_sym": False,
                "bw": 8,
                "scale": [0.03099999949336052],
                "offset": [0.0],
            },
        ],
        "param_encodings": [
            {
                "name": "conv1.weight",
                "dtype": "INT",
                "enc_type": "PER_CHANNEL",
                "is_sym": True,
                "bw": 8,
                "scale": [0.012000000104308128, 0.014999999664723873],
                "offset": [-128.0, -128.0],
            },
            {"name": "fp16", "dtype": "FLOAT", "enc_type": "PER_TENSOR", "bw": 16},
        ],
    }
    (tmp_path / "v1.json").write_text(json.dumps(v1))
    got = read_aimet_encodings(tmp_path / "v1.json")
    assert set(got) == {"input", "conv1.weight"}
    assert (got["input"].dtype, got["input"].zero_point) == ("uint8", (0,))
    assert (got["conv1.weight"].dtype, got["conv1.weight"].axis, got["conv1.weight"].role) == ("int8", 0, "weight")
    legacy = {
        "version": "0.6.1",
        "activation_encodings": {
            "20": [
                {
                    "bitwidth": 8,
                    "dtype": "int",
                    "is_symmetric": "False",
                    "max": 2.6,
                    "min": -2.1,
                    "offset": -114,
                    "scale": 0.018501389771699905,
                }
            ],
        },
        "param_encodings": {
            "fc1.weight": [
                {
                    "bitwidth": 8,
                    "dtype": "int",
                    "is_symmetric": "True",
                    "max": 0.5,
                    "min": -0.5,
                    "offset": -128,
                    "scale": 0.0039,
                }
            ]
            * 3,
        },
    }
    (tmp_path / "legacy.json").write_text(json.dumps(legacy))
    got = read_aimet_encodings(tmp_path / "legacy.json")
    assert (got["20"].dtype, got["20"].zero_point, got["20"].role) == ("uint8", (114,), "activation")
    assert (got["fc1.weight"].zero_point, got["fc1.weight"].axis) == ((0, 0, 0), 0)


@pytest.mark.parametrize(
    "entry,match",
    [
        ({"enc_type": "PER_BLOCK", "is_sym": True, "bw": 8, "scale": [1.0], "offset": [-128]}, "PER_BLOCK"),
        ({"enc_type": "PER_TENSOR", "is_sym": True, "bw": 16, "scale": [1.0], "offset": [-32768]}, "bit width 16"),
        ({"enc_type": "PER_TENSOR", "is_sym": False, "bw": 8, "scale": [1.0], "offset": [5]}, "offsets"),
        ({"enc_type": "PER_TENSOR", "is_sym": True, "bw": 8, "scale": [1.0], "offset": [-1.5]}, "whole numbers"),
        ({"enc_type": "PER_TENSOR", "is_sym": True, "bw": 8, "scale": [1.0, 2.0], "offset": [-128]}, "same"),
        ({"enc_type": "PER_TENSOR", "is_sym": True, "bw": 8, "scale": [1.0]}, "'offset' is missing"),
    ],
)
def test_aimet_refuses_what_onnx_cannot_hold(tmp_path: Path, entry: dict, match: str) -> None:
    doc = {"version": "1.0.0", "activation_encodings": [{"name": "t", "dtype": "INT", **entry}]}
    (tmp_path / "e.json").write_text(json.dumps(doc))
    with pytest.raises(ConfigError, match=rf"tensor 't'.*{match}"):
        read_aimet_encodings(tmp_path / "e.json")


# ---- ORT TensorQuantOverrides --------------------------------------------------------------------------------


@pytest.mark.parametrize("scheme", ["symmetric", "asymmetric"])
def test_ort_overrides_round_trip_is_bit_exact(tmp_path: Path, scheme: str) -> None:
    scales = _random_scales(7, scheme)
    path = write_ort_overrides(scales, tmp_path / "overrides.json")
    data = json.loads(path.read_text())
    assert all(d["quant_type"] in ("QInt8", "QUInt8") for entries in data.values() for d in entries)
    back = read_ort_overrides(path)
    _same({n: t for n, t in scales.tensors.items() if t.role != "bias"}, back, roles=False)
    assert back["w_pt"].role == "activation" and back["w0"].role == "weight"


@pytest.mark.parametrize("scheme", ["symmetric", "asymmetric"])
def test_ort_accepts_the_overrides_file(tiny_model: Path, tmp_path: Path, scheme: str) -> None:
    """ORT's own validator takes the file, and a Q/DQ model written from it carries the original scales."""
    scales = scales_for_model(tiny_model, scheme, 1, {})
    path = write_ort_overrides(scales, tmp_path / "overrides.json")
    model = onnx.load(str(tiny_model))
    inits = {i.name: i for i in model.graph.initializer}
    activations = {n for node in model.graph.node for n in (*node.input, *node.output)} - set(inits)
    helper = TensorQuantOverridesHelper(ort_quant_overrides(json.loads(path.read_text())))
    assert helper.is_valid(inits, activations, QuantType.QInt8) == (True, None)
    from_file = dict(read_ort_overrides(path)) | {n: t for n, t in scales.tensors.items() if t.role == "bias"}
    out = write_ort_qdq(tiny_model, ScaleFile(scheme, from_file), tmp_path / "m.onnx", op_types=["MatMul", "Gemm"])
    carried = read_qdq_scales(out)
    assert compare_scales(scales.restricted_to(carried).tensors, carried).ok


@pytest.mark.parametrize(
    "data,match",
    [
        ({"t": {"scale": 1.0}}, "non-empty list"),
        ({"t": [{"quant_type": "QInt8", "scale": 1.0}]}, r"\[0\] lacks 'zero_point'"),
        ({"t": [{"quant_type": "QInt16", "scale": 1.0, "zero_point": 0}]}, "QInt16"),
        ({"t": [{"quant_type": "QInt8", "scale": 0.0, "zero_point": 0}]}, "positive"),
        ({"t": [{"quant_type": "QInt8", "scale": 1.0, "zero_point": 0}] * 2}, "without 'axis'"),
    ],
)
def test_malformed_ort_overrides_are_named(tmp_path: Path, data: dict, match: str) -> None:
    (tmp_path / "o.json").write_text(json.dumps(data))
    with pytest.raises(ConfigError, match=rf"tensor 't'.*{match}"):
        read_ort_overrides(tmp_path / "o.json")


# ---- import / export -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["aimet", "ort-overrides"])
def test_import_and_export_detect_formats(tmp_path: Path, fmt: str) -> None:
    scales = _random_scales(8, "asymmetric")
    save_scale_file(scales, tmp_path / "scales.json")
    out = export_scales(tmp_path / "scales.json", fmt, tmp_path / "sub" / f"{fmt}.json")
    assert detect_format(out) == fmt and detect_format(tmp_path / "scales.json") == "scales"
    back = import_scales(out)
    assert back.activations == "asymmetric" and back.provenance["imported"]["format"] == fmt
    expected = {n: t for n, t in scales.tensors.items() if fmt == "aimet" or t.role != "bias"}
    _same(expected, dict(back.tensors), roles=fmt == "aimet")
    save_scale_file(back, tmp_path / "again.json")  # what was imported is a valid scales.json
    _same(expected, dict(load_scale_file(tmp_path / "again.json").tensors), roles=fmt == "aimet")


def test_import_refuses_unknown_content(tmp_path: Path) -> None:
    (tmp_path / "x.json").write_text('{"hello": 1}')
    with pytest.raises(ConfigError, match="not scales.json"):
        import_scales(tmp_path / "x.json")
    (tmp_path / "x.txt").write_text("hello")
    with pytest.raises(ConfigError, match="neither a TensorRT calibration cache"):
        import_scales(tmp_path / "x.txt")
    with pytest.raises(ConfigError, match="export format 'onnx'"):
        export_scales(tmp_path / "x.json", "onnx")  # type: ignore[arg-type]
