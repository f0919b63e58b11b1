"""Scale out: exhaustive sensitivity as Ray tasks gives the serial run's numbers, and several configs build as
tasks into one table with the worst exit code."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import fragile_config, write_config

from deploy_opt.pipeline.fleet import FleetSettings, build_fleet, fleet_exit, fleet_table
from dopt_common.errors import ConfigError, InputError
from dopt_common.executor import InProcessExecutor, scatter

HERE = Path(__file__).resolve().parent
# A calibration function that marks that it started, then works in short steps (a cancelled Ray task's
# KeyboardInterrupt lands between two of them, as it would in a real loop).
STALL = f"""
import os, sys, time
sys.path.insert(0, {str(HERE)!r})
import tiny_onnx

def calibration():
    open(os.path.join(os.path.dirname(__file__), f"stalled-{{os.getpid()}}"), "w").close()
    for _ in range(1200):
        time.sleep(0.1)
    return tiny_onnx.calibration()
"""


def tiny_config_file(tmp_path: Path, name: str, calibration: str = "@TINY@:calibration") -> Path:
    """A build config of the tiny MLP named ``par<name>``, in ``<name>.yaml``."""
    import tiny_onnx

    model = tmp_path / "tiny.onnx"
    if not model.exists():
        tiny_onnx.make_model(model)
    text = (
        f"name: par{name}\nmodel: {{onnx: tiny.onnx}}\ndata: {{calibration: '{calibration}', evaluation: "
        "'@TINY@:evaluation', metric: top1}\nquantization: {mode: manual}\nbenchmark: {enabled: false}\n"
    )
    return write_config(tmp_path, text, f"{name}.yaml")


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

    extra = "auto: {smoothquant_alpha: null, recovery: []}\nsensitivity: {enabled: true, mode: exhaustive}"
    config, profile = fragile_config(tmp_path, 0.5, extra)
    serial = run_build(config, profile, tmp_path / "serial", progress=False)
    on_ray = dataclasses.replace(config, sensitivity=dataclasses.replace(config.sensitivity, parallel=2))
    parallel = run_build(on_ray, profile, tmp_path / "ray", progress=False)
    trials = lambda result: [(t["step"], t["settings"], t["drop"]) for t in result.build.auto["trials"]]  # noqa: E731
    assert "fallback" in [step for step, _, _ in trials(serial)]
    assert trials(parallel) == trials(serial) and parallel.build.auto["chosen"] == serial.build.auto["chosen"]
    nodes = lambda result: json.loads((result.out_dir / "sensitivity.json").read_text())["nodes"]  # noqa: E731
    assert nodes(parallel) == nodes(serial) and all(n["exact"] for n in nodes(serial))
    assert max(nodes(serial), key=lambda n: n["drop_both"])["name"] == "fc2"


@pytest.mark.parametrize("address", ["::::", "host:notaport", "ray://", "host:70000"])
@pytest.mark.parametrize("configs", [1, 2], ids=["one-build", "fleet"])
def test_a_malformed_ray_address_exits_2_before_ray_starts(tmp_path: Path, capsys, address: str, configs: int) -> None:
    from deploy_opt.cli import main

    paths = [str(tiny_config_file(tmp_path, name)) for name in "ab"[:configs]]
    code = main(["build", *paths, "--profile", "ci", "--address", address, "--output-dir", str(tmp_path / "r")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert f"'{address}' is not a Ray address; fix: " in err[0]
    assert not (tmp_path / "r").exists()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("signum", "whole_group", "code"), [(signal.SIGINT, True, 130), (signal.SIGTERM, False, 143)], ids=["INT", "TERM"]
)
def test_a_signal_during_parallel_builds_exits_128_plus_it_and_leaves_nothing(
    tmp_path: Path, signum: int, whole_group: bool, code: int
) -> None:
    """Ctrl-C (SIGINT to the whole group) or SIGTERM to the CLI while two builds run as Ray tasks: the tasks are
    cancelled, their staging folders and locks removed, and the CLI exits 130 or 143 (not 3 or 1). ~30 s each."""
    pytest.importorskip("ray")
    (tmp_path / "stall.py").write_text(STALL)
    configs = [str(tiny_config_file(tmp_path, n, f"{tmp_path / 'stall.py'}:calibration")) for n in "ab"]
    out = tmp_path / "out"
    argv = [sys.executable, "-m", "deploy_opt", "build", *configs, "--parallel", "2", "--profile", "ci"]
    env = {**os.environ, "PYTHONPATH": str(HERE.parent)}
    run = subprocess.Popen(
        [*argv, "--output-dir", str(out)], stderr=subprocess.PIPE, text=True, env=env, start_new_session=True
    )
    deadline = time.monotonic() + 90
    while len(list(tmp_path.glob("stalled-*"))) < 2:
        assert run.poll() is None and time.monotonic() < deadline, run.stderr.read() if run.stderr else ""
        time.sleep(0.2)
    assert len(list(out.glob(".par?.partial-*"))) == 2 and len(list(out.glob(".par?.lock"))) == 2
    os.killpg(run.pid, signum) if whole_group else os.kill(run.pid, signum)
    _, err = run.communicate(timeout=60)
    assert run.returncode == code, err
    assert err.strip().splitlines()[-1] == (
        f"deploy_opt build: interrupted ({signal.Signals(signum).name}); staging removed, no partial report left"
    )
    assert list(out.iterdir()) == []


def test_a_sigterm_while_ray_starts_is_raised_after_it_not_ray_s_exit_15() -> None:
    """ray.init installs a handler that calls sys.exit(15) before it starts its processes: a SIGTERM then would
    exit 15 halfway through the start and orphan Ray's agents. Held, it is noted and raised once init returns."""
    import ray

    from dopt_common.signals import signals_held

    class Stopped(Exception):
        pass

    def stop(_signum: int, _frame: object) -> None:
        raise Stopped

    before = signal.signal(signal.SIGTERM, stop)
    try:
        with pytest.raises(Stopped):
            with signals_held(ray):
                ray._private.utils.set_sigterm_handler(lambda signum, _frame: sys.exit(signum))  # what init does
                signal.raise_signal(signal.SIGTERM)  # lands "inside init": noted, no SystemExit
                noted_inside = signal.getsignal(signal.SIGTERM) is not stop
        assert noted_inside
        assert ray._private.utils.set_sigterm_handler.__name__ == "set_sigterm_handler"  # restored
    finally:
        signal.signal(signal.SIGTERM, before)
