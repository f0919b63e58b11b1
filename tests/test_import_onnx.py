"""Bring your own ONNX: a file written the way other exporters write it is normalised, recognised and built."""

from __future__ import annotations

import json
from pathlib import Path

import foreign_onnx
import numpy as np
import onnx
from conftest import HERE, write_config

from calibrators.qparams import activation_scale, bias_scales, weight_scales, widen_weights_for_bias
from calibrators.scales.format import ScaleFile
from dopt_common.ort import create_session
from exporters.onnx.normalize import (
    constants_to_initializers,
    fold_weight_chains,
    modernise_ir,
    name_dimensions,
)
from exporters.ort.qdq import compare_scales, read_qdq_scales, write_ort_qdq


def _run(path: Path, x: np.ndarray) -> np.ndarray:
    return create_session(path, threads=1).run(None, {"x": x})[0]


def test_each_normalisation_changes_what_it_says_and_not_the_outputs(tmp_path: Path) -> None:
    original = foreign_onnx.make_model(tmp_path / "foreign.onnx")
    model = onnx.version_converter.convert_version(onnx.load(str(original)), 13)
    assert modernise_ir(model) == "IR 3 -> 7; 3 initializers no longer graph inputs"
    assert [i.name for i in model.graph.input] == ["x"]
    assert constants_to_initializers(model) == 3
    assert not [n for n in model.graph.node if n.op_type == "Constant"]
    assert fold_weight_chains(model) == 1
    assert not [n for n in model.graph.node if n.op_type == "Transpose"]
    assert {"conv1_w", "conv2_w", "fc_w"} <= {i.name for i in model.graph.initializer}
    assert "fc_w_t" not in {i.name for i in model.graph.initializer}  # nothing reads it any more
    assert name_dimensions(model) == ["x_dim0", "logits_dim0"]
    assert modernise_ir(model) is None and constants_to_initializers(model) == 0 and name_dimensions(model) == []
    onnx.checker.check_model(model, full_check=True)
    normalised = tmp_path / "normalised.onnx"
    onnx.save(model, str(normalised))
    x = foreign_onnx.calibration()[0][0]["x"]
    np.testing.assert_allclose(_run(normalised, x), _run(original, x), rtol=1e-5, atol=1e-6)


def test_a_dead_channel_widens_its_weight_scale_so_the_bias_fits_int32(tmp_path: Path) -> None:
    model = onnx.version_converter.convert_version(onnx.load(str(foreign_onnx.make_model(tmp_path / "f.onnx"))), 13)
    modernise_ir(model)
    constants_to_initializers(model)
    fold_weight_chains(model)
    path = tmp_path / "fp32.onnx"
    onnx.save(model, str(path))
    tensors = {
        "x": activation_scale("x", -1.0, 1.0, "asymmetric", "minmax"),
        "r1": activation_scale("r1", 0.0, 4.0, "asymmetric", "minmax"),
    }
    tensors |= weight_scales(model, ("Conv",), (), "absmax", 127)
    naive = tensors["conv1_w"].scale[3]
    widened = widen_weights_for_bias(model, tensors, ("Conv",))
    assert set(widened) == {"conv1_w"}  # only the dead channel's weight; conv2 is healthy
    scale = widened["conv1_w"].scale
    assert scale[3] > naive * 1e3 and scale[:3] == tensors["conv1_w"].scale[:3]
    bias_step = np.float64(tensors["x"].scale[0]) * np.float64(scale[3])
    assert 0.5 / bias_step <= np.iinfo(np.int32).max  # the bias 0.5 now fits in int32
    tensors |= widened
    tensors |= bias_scales(model, tensors, ("Conv",))
    scales = ScaleFile("asymmetric", tensors)
    out = write_ort_qdq(path, scales, tmp_path / "int8.onnx", op_types=("Conv",), quantize_outputs=False)
    carried = read_qdq_scales(out)
    assert compare_scales(scales.restricted_to(carried).tensors, carried).ok  # ORT widened nothing again
    x = foreign_onnx.calibration()[0][0]["x"]
    assert np.abs(_run(out, x) - _run(path, x)).max() < 0.2


def test_a_foreign_file_builds_with_every_weight_recognised(tmp_path: Path) -> None:
    from deploy_opt.config.profiles import load_build_config
    from deploy_opt.pipeline.build import run_build

    foreign_onnx.make_model(tmp_path / "foreign.onnx")
    data = HERE / "foreign_onnx.py"
    text = f"""
name: foreign
model: {{onnx: foreign.onnx}}
data: {{calibration: "{data}:calibration", evaluation: "{data}:evaluation", metric: cosine}}
benchmark: {{enabled: false}}
"""
    config, profile = load_build_config(write_config(tmp_path, text), "ci", ["quantization.mode=manual"])
    result = run_build(config, profile, tmp_path / "reports", progress=False)
    export = result.build.to_json()["export"]
    assert export["original"] == {"opset": 11, "ir_version": 3, "producer": "foreign2onnx"}
    assert export["opset_converted"].startswith("11 -> 13") and export["ir_changed"].startswith("IR 3 -> 7")
    assert export["constants_to_initializers"] == 3 and export["weights_folded"] == 1
    assert export["dimensions_named"] == ["x_dim0", "logits_dim0"]
    assert export["parity"]["max_abs"] <= export["parity"]["tolerance"]
    scales = json.loads((tmp_path / "reports" / "foreign" / "scales.json").read_text(encoding="utf-8"))
    roles = [t["role"] for t in scales["tensors"].values()]
    assert roles.count("weight") == 3  # conv1, conv2 and the folded MatMul weight
    assert result.build.alignment["verdict"].startswith("pass")
    create_session(tmp_path / "reports" / "foreign" / "model.int8.onnx", threads=1)
    assert result.build.metrics.scores["ort_int8"] > 0.99, result.build.metrics


def test_a_file_with_external_data_is_imported_from_its_own_folder(tmp_path: Path) -> None:
    from deploy_opt.config.build import ExportConfig
    from deploy_opt.stages.export import import_onnx

    model = onnx.load(str(foreign_onnx.make_model(tmp_path / "inline.onnx")))
    elsewhere = tmp_path / "vendor"
    elsewhere.mkdir()
    onnx.save(
        model,
        str(elsewhere / "foreign.onnx"),
        save_as_external_data=True,
        size_threshold=0,
        location="foreign.weights",
        convert_attribute=True,
    )
    assert (elsewhere / "foreign.weights").stat().st_size > 1000
    info = import_onnx(elsewhere / "foreign.onnx", tmp_path / "stage" / ".raw.onnx", ExportConfig())
    assert info.changes["constants_to_initializers"] == 3 and info.changes["weights_folded"] == 1
    x = foreign_onnx.calibration()[0][0]["x"]
    np.testing.assert_allclose(_run(tmp_path / "stage" / ".raw.onnx", x), _run(tmp_path / "inline.onnx", x), rtol=1e-5)
