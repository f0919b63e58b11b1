"""``align verify``: every artifact of a build carries scales.json; one corrupted scale is found and named."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import write_config
from onnx import numpy_helper

from calibrators.scales.format import float32_hex, hex_float32, load_scale_file
from deploy_opt.analysis.align import verify_alignment
from deploy_opt.analysis.scale_interop import export_scales
from deploy_opt.config.profiles import load_build_config
from deploy_opt.pipeline.build import run_build
from exporters.ort.qdq import OUTPUT_SUFFIX

CONFIG = """
name: tiny
model:
  onnx: {model}
data:
  calibration: "@TINY@:calibration"
  evaluation: "@TINY@:evaluation"
  metric: top1
deploy:
  targets: {targets}
quantization:
  mode: manual  # the scheme under test, not the auto search's choice (which differs by CPU)
  activations: {scheme}
  op_types: [MatMul]
benchmark:
  enabled: false
gate:
  max_drop: 5.0
  min_speedup: null
"""


def _build(tmp: Path, tiny_model: Path, scheme: str) -> Path:
    targets = "[ort-cpu, tensorrt]" if scheme == "symmetric" else "[ort-cpu]"
    path = write_config(tmp, CONFIG.format(model=tiny_model.name, scheme=scheme, targets=targets))
    config, profile = load_build_config(path, "cpu-server", [])
    return run_build(config, profile, tmp / "reports", progress=False).out_dir


@pytest.fixture
def symmetric_build(tmp_path: Path, tiny_model: Path) -> Path:
    out = _build(tmp_path, tiny_model, "symmetric")
    export_scales(out / "scales.json", "ort-overrides", out / "overrides.json")
    return out


def _bump(value: float) -> float:
    """The next float32 up: the smallest possible drift."""
    return float(np.nextafter(np.float32(value), np.float32(np.inf)))


def _corrupt_onnx(out: Path) -> str:
    model = onnx.load(str(out / "model.int8.onnx"))
    inits = {i.name: i for i in model.graph.initializer}
    node = next(n for n in model.graph.node if n.op_type == "QuantizeLinear")
    scale = inits[node.input[1]]
    scale.CopyFrom(numpy_helper.from_array(np.float32(_bump(numpy_helper.to_array(scale))), scale.name))
    onnx.save(model, str(out / "model.int8.onnx"))
    return node.input[0].removesuffix(OUTPUT_SUFFIX)


def _corrupt_cache(out: Path) -> str:
    lines = (out / "calibration.cache").read_text().splitlines()
    name, bits = lines[1].rsplit(": ", 1)
    lines[1] = f"{name}: {float32_hex(_bump(float(hex_float32(bits))))}"
    (out / "calibration.cache").write_text("\n".join(lines) + "\n")
    return name


def _corrupt_aimet(out: Path) -> str:
    data = json.loads((out / "encodings.json").read_text())
    entry = data["param_encodings"][0]
    entry["scale"][-1] = _bump(entry["scale"][-1])
    (out / "encodings.json").write_text(json.dumps(data))
    return entry["name"]


def _corrupt_overrides(out: Path) -> str:
    data = json.loads((out / "overrides.json").read_text())
    name = next(iter(data))
    data[name][0]["scale"] = _bump(data[name][0]["scale"])
    (out / "overrides.json").write_text(json.dumps(data))
    return name


@pytest.mark.slow
def test_every_artifact_of_a_symmetric_build_carries_scales_json(symmetric_build: Path) -> None:
    report = verify_alignment(symmetric_build)
    status = {c.artifact: c.status for c in report.checks}
    assert status == {
        "model.int8.onnx": "pass",
        "calibration.cache": "pass",
        "encodings.json": "pass",
        "overrides.json": "pass",
        "model.trt.onnx": "skipped",  # written only for a build that targets ORT CPU and TensorRT
        "tensorrt engine": "skipped",
    }
    scales = load_scale_file(symmetric_build / "scales.json")
    cache = next(c for c in report.checks if c.artifact == "calibration.cache")
    assert cache.checked == sum(t.role == "activation" for t in scales.tensors.values()) > 0
    assert next(c for c in report.checks if c.artifact == "encodings.json").checked == len(scales.tensors)
    build = json.loads((symmetric_build / "build.json").read_text())
    assert build["alignment"]["verdict"].startswith("pass")
    assert "calibration.cache" in build["alignment"]["verdict"]
    assert "pass" in (symmetric_build / "summary.md").read_text().split("## Scale alignment")[1]


@pytest.mark.slow
def test_without_tensorrt_the_build_records_why_and_carries_on(symmetric_build: Path) -> None:
    from exporters.tensorrt.engine import tensorrt_status

    if tensorrt_status().startswith("available"):
        pytest.skip("tensorrt runs here: the engine is built instead")
    build = json.loads((symmetric_build / "build.json").read_text())
    assert build["targets"]["tensorrt"].startswith("tensorrt: not available")
    assert build["comparison"]["backends"]["tensorrt_int8"].startswith("not available")
    # Every step up to the builder call ran: the cache, the compat report with its TensorRT column.
    assert (symmetric_build / "calibration.cache").read_text().startswith("TRT-")
    compat = json.loads((symmetric_build / "compat.int8.json").read_text())
    assert "tensorrt" in compat["summary"]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("artifact", "corrupt"),
    [
        ("model.int8.onnx", _corrupt_onnx),
        ("calibration.cache", _corrupt_cache),
        ("encodings.json", _corrupt_aimet),
        ("overrides.json", _corrupt_overrides),
    ],
)
def test_one_drifted_scale_fails_and_is_named(symmetric_build: Path, tmp_path: Path, artifact: str, corrupt) -> None:
    out = tmp_path / "copy"
    shutil.copytree(symmetric_build, out)
    name = corrupt(out)
    report = verify_alignment(out)
    assert not report.ok
    failed = {c.artifact: c for c in report.checks if c.status == "fail"}
    assert list(failed) == [artifact]
    assert failed[artifact].drifted == (name,)
    result = subprocess.run(
        [sys.executable, "-m", "deploy_opt", "align", "verify", str(out)], capture_output=True, text=True
    )
    assert result.returncode == 1, result.stderr
    assert name in result.stdout and "FAIL" in result.stdout


@pytest.mark.slow
def test_a_tensor_missing_from_an_artifact_is_listed(symmetric_build: Path, tmp_path: Path) -> None:
    out = tmp_path / "copy"
    shutil.copytree(symmetric_build, out)
    lines = (out / "calibration.cache").read_text().splitlines()
    dropped = lines.pop(1).rsplit(": ", 1)[0]
    (out / "calibration.cache").write_text("\n".join(lines) + "\n")
    check = next(c for c in verify_alignment(out).checks if c.artifact == "calibration.cache")
    assert check.status == "fail" and check.missing == (dropped,)


@pytest.mark.slow
def test_asymmetric_build_writes_no_cache_and_verifies_the_rest(tmp_path: Path, tiny_model: Path) -> None:
    out = _build(tmp_path, tiny_model, "asymmetric")
    assert not (out / "calibration.cache").exists()
    build = json.loads((out / "build.json").read_text())
    assert build["backends"]["trt_cache"].startswith("not written: activations are asymmetric")
    report = verify_alignment(out)
    assert report.ok
    assert {c.artifact: c.status for c in report.checks}["encodings.json"] == "pass"
    # A cache carried over from elsewhere cannot hold the uint8 activations: listed as asymmetric, and fails.
    (out / "calibration.cache").write_text("TRT-100001-EntropyCalibration2\n")
    check = next(c for c in verify_alignment(out).checks if c.artifact == "calibration.cache")
    assert check.status == "fail" and check.asymmetric


def test_a_folder_without_scales_json_is_a_clear_error(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "deploy_opt", "align", "verify", str(tmp_path)], capture_output=True, text=True
    )
    assert result.returncode == 2
    assert "has no scales.json" in result.stderr and len(result.stderr.strip().splitlines()) == 1


@pytest.mark.slow
@pytest.mark.tensorrt
def test_engine_scales_equal_scales_json(symmetric_build: Path) -> None:
    pytest.importorskip("tensorrt")
    from exporters.tensorrt.engine import tensorrt_status

    if not tensorrt_status().startswith("available"):
        pytest.skip(tensorrt_status())
    from exporters.tensorrt.engine import engine_scales

    scales = load_scale_file(symmetric_build / "scales.json")
    found = engine_scales(symmetric_build / "model.int8.onnx")
    assert {n: tuple(float32_hex(v) for v in found[n]) for n in scales.tensors} == {
        n: t.scale_bits for n, t in scales.tensors.items()
    }
