"""A foreign ONNX file builds end to end: onnx's backend-test SqueezeNet (opset 9, fixed batch 1, shared biases)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from conftest import write_config
from zoo_data import zoo_path

from deploy_opt.build.pipeline import run_build
from deploy_opt.config.profiles import load_build_config

HERE = Path(__file__).resolve().parent


@pytest.mark.slow
def test_an_opset_9_zoo_graph_builds_and_aligns(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOPT_ZOO_MODEL", "light_squeezenet")
    shutil.copy(zoo_path("light_squeezenet"), tmp_path / "squeezenet.onnx")
    data = HERE / "zoo_data.py"
    text = f"""
name: squeezenet
model: {{onnx: squeezenet.onnx}}
data: {{calibration: "{data}:calibration", evaluation: "{data}:evaluation", metric: cosine}}
benchmark: {{enabled: false}}
"""
    config, profile = load_build_config(write_config(tmp_path, text), "ci", [])
    result = run_build(config, profile, tmp_path / "reports", progress=False)
    build = result.build
    assert build["export"]["opset_converted"].startswith("9 -> 13") and build["export"]["biases_unshared"] > 0
    assert build["quantization"]["quantized_nodes"] > 0 and result.gate.passed, result.gate.lines()
    assert build["alignment"]["verdict"].startswith("pass")
    # The zoo's weights are all 0.02, so compare.json's per-layer weight SQNR is degenerate there; the backends
    # themselves must run.
    assert set((build["comparison"] or {})["backends"]) >= {"ort_fp32_cpu", "ort_int8_cpu"}
    assert all(v == "ran" for k, v in build["comparison"]["backends"].items() if k.endswith("_cpu"))
