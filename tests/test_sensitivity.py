"""Sensitivity ranking, exact variants, and mixed-precision fallback (auto, patterns, head)."""

from __future__ import annotations

import json
from pathlib import Path

import fragile_onnx
import numpy as np
import onnx
import pytest
from conftest import fragile_config, unmeetable_gate

from deploy_opt.analysis.sensitivity.fallback import head_nodes
from deploy_opt.analysis.sensitivity.record import SensitivityRecord
from deploy_opt.analysis.sensitivity.variants import all_roles, make_variant, quantized_nodes
from deploy_opt.pipeline.build import run_build
from dopt_common.errors import ConfigError
from dopt_common.ort import create_session


def _config(tmp_path: Path, quantization: str, extra: str = "", max_drop: float = 100.0):
    """The fragile chain in manual mode, weighted nodes' inputs only, plus ``quantization`` settings."""
    return fragile_config(
        tmp_path, max_drop, extra, f"mode: manual, op_types: [MatMul], quantize_outputs: false, {quantization}"
    )


@pytest.mark.slow
def test_the_fragile_layer_ranks_first(tmp_path: Path) -> None:
    config, profile = _config(tmp_path, "keep_head: false", "sensitivity: {enabled: true, mode: exhaustive}")
    result = run_build(config, profile, tmp_path / "reports", progress=False)
    record = json.loads((result.out_dir / "sensitivity.json").read_text())
    assert SensitivityRecord.from_json(record).to_json() == record  # the typed record reads back as written
    nodes = {n["name"]: n for n in record["nodes"]}
    assert set(nodes) == {"fc1", "fc2", "fc3"} and all(n["exact"] for n in nodes.values())
    assert nodes["fc2"]["rank"] == 1
    fc2 = nodes["fc2"]
    assert fc2["drop_both"] > 5 * max(nodes["fc1"]["drop_both"], nodes["fc3"]["drop_both"])
    # The damage is in fc2's input activation (the crushed channels), not in its weights.
    assert fc2["drop_activation_only"] > 10 * fc2["drop_weight_only"]
    assert fc2["recovered_all_but"] > 0
    assert fc2["proxy"]["local_sqnr_db"] < min(
        nodes["fc1"]["proxy"]["local_sqnr_db"], nodes["fc3"]["proxy"]["local_sqnr_db"]
    )
    assert {"sensitivity.png", "sensitivity.html"} <= {p.name for p in result.out_dir.iterdir()}
    assert result.build.sensitivity["top"][0]["name"] == "fc2"


@pytest.mark.slow
def test_variants_reproduce_the_full_and_the_float_model(tmp_path: Path) -> None:
    config, profile = _config(tmp_path, "keep_head: false")
    result = run_build(config, profile, tmp_path / "reports", progress=False)
    fp32, qdq = onnx.load(str(result.out_dir / "model.onnx")), onnx.load(str(result.out_dir / "model.int8.onnx"))
    feed = fragile_onnx.evaluation()[0][0]
    run = lambda m: create_session(m.SerializeToString()).run(None, feed)[0]  # noqa: E731
    nodes = quantized_nodes(qdq)
    np.testing.assert_array_equal(run(make_variant(qdq, fp32, all_roles(nodes))), run(qdq))
    np.testing.assert_array_equal(run(make_variant(qdq, fp32, {})), run(fp32))


@pytest.mark.slow
def test_auto_fallback_stops_once_the_gate_holds(tmp_path: Path) -> None:
    config, profile = _config(tmp_path, "fallback: auto, keep_head: false", max_drop=1.0)
    result = run_build(config, profile, tmp_path / "reports", progress=False)
    auto = result.build.fallback["auto"]
    assert auto["met"] and auto["nodes"] == ["fc2"], auto
    assert [s["fallback"] for s in auto["steps"]] == [[], ["fc2"]]
    assert auto["steps"][0]["drop"] > 1.0 >= auto["steps"][-1]["drop"]
    assert result.build.metrics.drop <= 1.0 < result.build.metrics.drop_no_fallback
    assert result.gate.passed
    scales = json.loads((result.out_dir / "scales.json").read_text())
    assert scales["excluded"] == ["fc2"]
    qdq = onnx.load(str(result.out_dir / "model.int8.onnx"))
    assert "fc2" not in {n.name for n in quantized_nodes(qdq)}


@pytest.mark.slow
def test_auto_fallback_reports_when_it_cannot_meet_the_gate(tmp_path: Path) -> None:
    config, profile = _config(tmp_path, "fallback: auto, keep_head: false", max_drop=0.0)
    config = unmeetable_gate(config)
    result = run_build(config, profile, tmp_path / "reports", progress=False)
    auto = result.build.fallback["auto"]
    assert not auto["met"] and "cannot meet max_drop -1" in auto["verdict"]
    assert len(auto["steps"]) == 4 and sorted(auto["steps"][-1]["fallback"]) == ["fc1", "fc2", "fc3"]
    assert auto["steps"][1]["fallback"] == ["fc2"]  # most sensitive first
    assert not result.gate.passed
    assert "cannot meet" in (result.out_dir / "summary.md").read_text()


@pytest.mark.slow
def test_fallback_patterns(tmp_path: Path) -> None:
    config, profile = _config(tmp_path, "fallback: ['fc[23]'], keep_head: false")
    result = run_build(config, profile, tmp_path / "reports", progress=False)
    assert result.build.fallback["nodes"] == ["fc2", "fc3"]
    qdq = onnx.load(str(result.out_dir / "model.int8.onnx"))
    assert {n.name for n in quantized_nodes(qdq)} == {"fc1"}


@pytest.mark.slow
def test_a_pattern_that_matches_nothing_is_an_error(tmp_path: Path) -> None:
    config, profile = _config(tmp_path, "fallback: ['attention*']")
    with pytest.raises(ConfigError, match="quantization.fallback pattern 'attention\\*' matches no quantizable node"):
        run_build(config, profile, tmp_path / "reports", progress=False)
    assert list((tmp_path / "reports").iterdir()) == []


@pytest.mark.slow
def test_the_head_stays_in_high_precision_by_default(tmp_path: Path) -> None:
    model = onnx.load(str(fragile_onnx.make_model(tmp_path / "m.onnx")))
    assert head_nodes(model, ["MatMul"]) == ["fc3"]
    config, profile = _config(tmp_path, "fallback: none")
    result = run_build(config, profile, tmp_path / "reports", progress=False)
    assert result.build.fallback["nodes"] == ["fc3"]


@pytest.mark.slow
def test_smoothquant_in_the_build_is_recorded_and_keeps_the_model(tmp_path: Path) -> None:
    config, profile = _config(tmp_path, "smoothing: smoothquant, smoothing_alpha: 0.8, keep_head: false")
    result = run_build(config, profile, tmp_path / "reports", progress=False)
    scales = json.loads((result.out_dir / "scales.json").read_text())
    smoothing = scales["provenance"]["smoothing"]
    assert smoothing["method"] == "smoothquant" and smoothing["alpha"] == 0.8 and smoothing["targets"]
    # model.onnx stays the original graph; the smoothed twin is what was quantized.
    assert smoothing["source_sha256"] == result.build.artifacts["model.onnx"]["sha256"]
    assert smoothing["smoothed_sha256"] == scales["provenance"]["model_sha256"]
    assert result.build.metrics.drop < result.build.metrics.scores["ort_fp32"]


@pytest.mark.slow
def test_the_sensitivity_command_prints_the_ranking(tmp_path: Path) -> None:
    import subprocess
    import sys

    _config(tmp_path, "keep_head: false")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "deploy_opt",
            "sensitivity",
            "--config",
            str(tmp_path / "build.yaml"),
            "--profile",
            "ci",
            "--mode",
            "exhaustive",
            "--output-dir",
            str(tmp_path / "reports"),
            "-q",
        ],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    assert "1. fc2 (MatMul)" in result.stdout
    assert (tmp_path / "reports" / "fragile-sensitivity" / "sensitivity.html").is_file()
    assert not (tmp_path / "reports" / "fragile").exists()  # the build's folder is not the sensitivity command's
