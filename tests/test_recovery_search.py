"""The auto search's newer candidates end to end: dynamic INT8 for ORT CPU, and the recovery methods."""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest
from conftest import HERE, write_config

from deploy_opt.stages.dynamic import dynamic_allowed


def _config(tmp_path: Path, name: str, quantization: str, max_drop: float, auto: str):
    """A build config (profile ci, benchmark off, metric cosine) of the test module ``<name>_onnx.py``'s model."""
    import importlib

    from deploy_opt.config.profiles import load_build_config

    model = importlib.import_module(f"{name}_onnx").make_model(tmp_path / f"{name}.onnx")
    source = HERE / f"{name}_onnx.py"
    text = f"""
name: {name}
model: {{onnx: {model.name}}}
data: {{calibration: "{source}:calibration", evaluation: "{source}:evaluation", metric: cosine}}
quantization: {{{quantization}}}
benchmark: {{enabled: false}}
gate: {{max_drop: {max_drop}}}
auto: {auto}
"""
    return load_build_config(write_config(tmp_path, text), "ci", [])


def _scaled_config(tmp_path: Path, auto: str):
    return _config(tmp_path, "scaled", "op_types: [MatMul]", 1, auto)


def test_dynamic_int8_ships_where_no_static_range_fits_every_batch(tmp_path: Path) -> None:
    """Batches of 1e-2 and 10 magnitude: every static candidate loses the small ones; ORT's dynamic INT8 keeps
    them, ships as model.int8.onnx, and scales.json lists its run-time quantized activations."""
    from deploy_opt.pipeline.build import run_build

    config, profile = _scaled_config(tmp_path, "{recovery: []}")
    result = run_build(config, profile, tmp_path / "reports", progress=False)
    auto = result.build.auto
    steps = {t["step"]: t for t in auto["trials"]}
    assert min(t["drop"] for t in auto["trials"] if t["step"] == "placement") > 1.0, auto["trials"]
    assert auto["chosen"]["placement"] == "dynamic" and steps["dynamic"]["drop"] <= 1.0, auto["verdict"]
    folder = tmp_path / "reports" / "scaled"
    shipped = onnx.load(str(folder / "model.int8.onnx"))
    assert {"DynamicQuantizeLinear", "MatMulInteger"} <= {n.op_type for n in shipped.graph.node}
    scales = json.loads((folder / "scales.json").read_text())
    assert scales["dynamic"] and all(t["role"] == "weight" for t in scales["tensors"].values())
    assert result.build.gate.verdict == "PASSED", result.build.gate


def test_dynamic_int8_is_never_offered_with_tensorrt_among_the_targets() -> None:
    assert dynamic_allowed(("ort-cpu",))
    assert not dynamic_allowed(("ort-cpu", "tensorrt")) and not dynamic_allowed(("tensorrt",))
    assert not dynamic_allowed(("ort-cuda",))  # ORT's CUDA provider has no dynamic INT8 kernels


@pytest.mark.parametrize("bad", ["[cle, gptq]", "[rounding]"])
def test_an_unknown_recovery_method_is_a_config_error(tmp_path: Path, bad: str) -> None:
    from dopt_common.errors import ConfigError

    with pytest.raises(ConfigError, match="auto.recovery: unknown method"):
        _scaled_config(tmp_path, f"{{recovery: {bad}}}")


def _unbalanced_config(tmp_path: Path, recovery: str):
    return _config(tmp_path, "unbalanced", "op_types: [Conv], keep_head: false", 0.2, f"{{recovery: {recovery}}}")


def test_cross_layer_equalization_is_a_candidate_that_recovers_an_unbalanced_pair(tmp_path: Path) -> None:
    """conv2's channel 0 is 50x the others: no placement meets max_drop, the head in float does not help (the
    damage is in the middle), and CLE's candidate does; scales.json and build.json say what it changed."""
    from deploy_opt.pipeline.build import run_build

    config, profile = _unbalanced_config(tmp_path, "[cle]")
    result = run_build(config, profile, tmp_path / "reports", progress=False)
    trials = result.build.auto["trials"]
    placed = min(t["drop"] for t in trials if t["step"] == "placement")
    recovered = [t for t in trials if t["step"] == "recovery"]
    assert placed > 0.4 and recovered and recovered[0]["settings"]["recovery"] == ["cle"], trials
    assert recovered[0]["drop"] < placed / 3, trials
    chosen = result.build.auto["chosen"]
    assert chosen["recovery"] == ["cle"], result.build.auto["verdict"]
    scales = json.loads((tmp_path / "reports" / "unbalanced" / "scales.json").read_text())
    pairs = scales["provenance"]["recovery"]["cle"]["pairs"]
    assert {(p["producer"], p["consumer"]) for p in pairs} >= {("conv2", "conv3")}
    assert result.build.gate.verdict == "PASSED", result.build.gate


def test_each_recovery_method_is_tried_in_order_and_stacks_on_what_helped(tmp_path: Path) -> None:
    """With a gate nothing meets, CLE, bias correction and learned rounding are each tried once; a method stacks
    on the last one that lowered the drop (or, at the same drop, raised the output SQNR)."""
    from conftest import unmeetable_gate

    from deploy_opt.pipeline.build import run_build

    config, profile = _unbalanced_config(tmp_path, "[cle, bias, adaround]")
    result = run_build(unmeetable_gate(config), profile, tmp_path / "reports", progress=False)
    recovered = [t for t in result.build.auto["trials"] if t["step"] == "recovery"]
    methods = [t["settings"]["recovery"] for t in recovered]
    assert [m[-1] for m in methods] == ["cle", "bias", "adaround"], methods
    assert methods[1][:-1] == ["cle"]  # CLE lowered the drop (the test above), so bias correction stacks on it
    cle, bias = recovered[0], recovered[1]
    bias_helped = (bias["drop"], -(bias["fidelity_db"] or -1e9)) < (cle["drop"], -(cle["fidelity_db"] or -1e9))
    assert methods[2][:-1] == (["cle", "bias"] if bias_helped else ["cle"]), recovered


def test_equalization_recovers_the_fragile_outlier_channel_with_no_fp32_node(tmp_path: Path) -> None:
    """fc1's column 0 is 300x the others and fc2 ignores it: CLE scales that channel down in fc1 and up in fc2
    (whose row 0 is zero), which the fallback could only answer by keeping fc2 in FP32."""
    from conftest import fragile_config

    from deploy_opt.pipeline.build import run_build

    config, profile = fragile_config(tmp_path, 0.5, "auto: {smoothquant_alpha: null, dynamic: false}")
    result = run_build(config, profile, tmp_path / "reports", progress=False)
    auto = result.build.auto
    # fc3, the head, stays float by quantization.keep_head in every candidate; fc2 is quantized
    assert "cle" in auto["chosen"]["recovery"] and auto["chosen"]["excluded"] == ["fc3"], auto["verdict"]
    assert "fallback" not in {t["step"] for t in auto["trials"]}
    assert result.gate.passed, result.gate.lines()
