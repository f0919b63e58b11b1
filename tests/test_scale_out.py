"""Scale out: exhaustive sensitivity as Ray tasks gives the serial run's numbers, and several configs build as
tasks into one table with the worst exit code."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from conftest import fragile_config, write_config

from deploy_opt.pipeline.fleet import FleetSettings, build_fleet, fleet_exit, fleet_table
from dopt_common.errors import ConfigError, InputError
from dopt_common.executor import InProcessExecutor, scatter


def _square_or_fail(offset: int, item: int) -> int:
    if item < 0:
        raise InputError(f"item {item} is negative")
    return offset + item * item


def test_scatter_keeps_the_items_order_and_raises_the_first_error() -> None:
    assert scatter(InProcessExecutor(), _square_or_fail, 1, [3, 1, 2]) == [10, 2, 5]
    with pytest.raises(InputError, match="item -1"):
        scatter(InProcessExecutor(), _square_or_fail, 0, [2, -1, -2])


def test_sensitivity_parallel_must_be_positive(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="sensitivity.parallel"):
        fragile_config(tmp_path, 100.0, "sensitivity: {parallel: 0}")


@pytest.mark.slow
def test_several_configs_build_into_one_table_with_the_worst_exit(tmp_path: Path) -> None:
    import tiny_onnx

    tiny_onnx.make_model(tmp_path / "tiny.onnx")
    body = """
model: {onnx: tiny.onnx}
data: {calibration: "@TINY@:calibration", evaluation: "@TINY@:evaluation", metric: top1}
quantization: {mode: manual}
benchmark: {enabled: false}
"""
    passing = write_config(tmp_path, f"name: tiny-a\n{body}gate: {{max_drop: 100}}\n", "a.yaml")
    failing = write_config(tmp_path, f"name: tiny-b\n{body}gate: {{max_drop: 0, min_speedup: 1000}}\n", "b.yaml")
    broken = write_config(tmp_path, f"name: tiny-c\n{body.replace('tiny.onnx', 'missing.onnx')}", "c.yaml")
    settings = FleetSettings("ci", (), tmp_path / "reports")
    rows = build_fleet([str(passing), str(failing), str(broken)], settings, parallel=1, address=None)
    assert [r.exit_code for r in rows] == [0, 1, 2] and fleet_exit(rows) == 2
    assert rows[0].verdict == "PASSED" and Path(rows[0].path, "build.json").is_file()
    assert json.loads(Path(rows[0].path, "build.json").read_text())["name"] == "tiny-a"
    assert rows[2].error.startswith("c.yaml: ") and "missing.onnx" in rows[2].error
    table = fleet_table(rows).splitlines()
    assert table[0].startswith("| build | metric | drop | speedup | verdict | path |") and len(table) == 5
    assert "tiny-b" in table[3] and "FAILED" in table[3]
    with pytest.raises(InputError, match="twice"):
        build_fleet([str(passing), str(passing)], settings, parallel=1, address=None)


@pytest.mark.slow
def test_two_ray_workers_give_the_serial_search_and_sensitivity(tmp_path: Path) -> None:
    """One build with the auto search's fallback and an exhaustive sensitivity pass, serially and on two Ray
    workers: the fallback scores its next doublings as tasks and walks them in the serial order, and the
    sensitivity pass scores each node as a task; every trial, the choice and every node's numbers agree."""
    pytest.importorskip("ray")
    from deploy_opt.pipeline.build import run_build

    extra = "auto: {smoothquant_alpha: null}\nsensitivity: {enabled: true, mode: exhaustive}"
    config, profile = fragile_config(tmp_path, 0.5, extra)
    serial = run_build(config, profile, tmp_path / "serial", progress=False)
    on_ray = dataclasses.replace(config, sensitivity=dataclasses.replace(config.sensitivity, parallel=2))
    parallel = run_build(on_ray, profile, tmp_path / "ray", progress=False)
    trials = lambda result: [(t["step"], t["settings"], t["drop"]) for t in result.build["auto"]["trials"]]  # noqa: E731
    assert "fallback" in [step for step, _, _ in trials(serial)]
    assert trials(parallel) == trials(serial) and parallel.build["auto"]["chosen"] == serial.build["auto"]["chosen"]
    nodes = lambda result: json.loads((result.out_dir / "sensitivity.json").read_text())["nodes"]  # noqa: E731
    assert nodes(parallel) == nodes(serial) and all(n["exact"] for n in nodes(serial))
    assert max(nodes(serial), key=lambda n: n["drop_both"])["name"] == "fc2"
