"""Bad ONNX files, output folders and whole builds: each raises its own error class; the CLI prints one line, exit 2."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from bad_inputs import write_data_module
from onnx import TensorProto, helper

from deploy_opt.config.profiles import load_build_config
from deploy_opt.pipeline.build import run_build
from dopt_common.errors import (
    CalibrationError,
    CheckpointError,
    DeployOptError,
    InputError,
    ModelError,
    NumericsError,
    OutputError,
    SourceError,
)
from dopt_common.files import ensure_writable_dir
from exporters.onnx.checks import check_onnx


@pytest.fixture(autouse=True)
def _shipped_profiles(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DEPLOY_OPT_PROFILES", raising=False)


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    """A folder holding mydata.py."""
    return write_data_module(tmp_path)


def write_build_config(folder: Path, factory: str, name: str = "t") -> Path:
    path = folder / "build.yaml"
    path.write_text(
        textwrap.dedent(
            f"""
            name: {name}
            model:
              factory: "{factory}"
              inputs: [{{name: x, shape: [batch, 4], dtype: float32}}]
            data: {{calibration: "mydata.py:calib", evaluation: "mydata.py:evaluation"}}
            benchmark: {{enabled: false}}
            """
        ),
        encoding="utf-8",
    )
    return path


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "deploy_opt", *args], capture_output=True, text=True, cwd=cwd, timeout=120
    )


def assert_nothing_left(output: Path, name: str) -> None:
    """No reports/<name>/ and no hidden staging folder (.<name>.partial-*) after a failed build."""
    assert not (output / name).exists()
    leftovers = sorted(p.name for p in output.iterdir()) if output.is_dir() else []
    assert leftovers == [], leftovers


# ---------------------------------------------------------------------------------------------------- ONNX


def _undefined_input_model() -> onnx.ModelProto:
    """An Add node reading a tensor nothing produces: onnx.checker rejects it (onnx.save does not check)."""
    node = helper.make_node("Add", ["x", "undefined_tensor"], ["y"], name="add0")
    graph = helper.make_graph(
        [node],
        "broken",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_onnx_failing_the_checker_raises_model_error(tmp_path: Path) -> None:
    path = tmp_path / "broken.onnx"
    onnx.save(_undefined_input_model(), str(path))
    with pytest.raises(ModelError, match=r"broken\.onnx' fails onnx\.checker: .*'undefined_tensor'"):
        check_onnx(path)


def test_checker_error_names_the_node(tmp_path: Path) -> None:
    path = tmp_path / "broken.onnx"
    onnx.save(_undefined_input_model(), str(path))
    with pytest.raises(ModelError, match=r"add0.*is not output of any previous nodes"):
        check_onnx(path)


def test_file_that_is_not_onnx_raises_model_error(tmp_path: Path) -> None:
    path = tmp_path / "model.onnx"
    path.write_bytes(b"\x00\xffdefinitely not a protobuf\x00" * 8)
    with pytest.raises(ModelError, match=r"model\.onnx'") as info:
        check_onnx(path)
    assert "\n" not in str(info.value)


def test_missing_onnx_file_raises_model_error(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match=r"absent\.onnx' does not exist"):
        check_onnx(tmp_path / "absent.onnx")


def test_parity_failure_names_the_error_and_tolerance(tmp_path: Path) -> None:
    from deploy_opt.evaluation.evaluate import torch_runner
    from exporters.onnx.checks import check_parity
    from exporters.onnx.export import export_onnx

    model = torch.nn.Sequential(torch.nn.Linear(4, 3)).eval()
    example = torch.zeros(2, 4)
    path = export_onnx(
        model,
        [example],
        tmp_path / "m.onnx",
        input_names=["x"],
        output_names=["y"],
        dynamic_axes={"x": {0: "batch"}},
        exporter="torchscript",
        opset=17,
    )
    feeds = [{"x": np.random.default_rng(0).normal(0, 1, (5, 4)).astype(np.float32)}]
    ok = check_parity(torch_runner(model, ["x"]), path, feeds, atol=1e-5, rtol=0)
    assert ok.ok and ok.max_abs < 1e-5 and ok.samples == 5
    with torch.no_grad():
        model[0].bias.add_(0.5)  # torch now disagrees with the exported file
    with pytest.raises(ModelError, match=r"parity: ONNX Runtime differs from torch by max-abs 0\.5 > tolerance"):
        check_parity(torch_runner(model, ["x"]), path, feeds, atol=1e-5, rtol=0)


# ---------------------------------------------------------------------------------------------------- outputs


def test_output_folder_under_a_file_raises_output_error(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("x", encoding="utf-8")
    with pytest.raises(OutputError, match=r"output folder '.*afile/sub' is not writable"):
        ensure_writable_dir(tmp_path / "afile" / "sub")


def test_output_folder_that_is_a_file_raises_output_error(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("x", encoding="utf-8")
    with pytest.raises(OutputError, match=r"output folder '.*afile' is a file, not a folder"):
        ensure_writable_dir(tmp_path / "afile")


def test_writable_output_folder_is_created_and_left_clean(tmp_path: Path) -> None:
    folder = ensure_writable_dir(tmp_path / "a" / "b")
    assert folder.is_dir() and list(folder.iterdir()) == []


# ---------------------------------------------------------------------------------------------------- whole build


@pytest.mark.slow
@pytest.mark.parametrize(
    "factory,error,match",
    [
        pytest.param(
            "mydata.py:build",
            CalibrationError,
            r"data\.calibration 'mydata\.py:calib' yielded no samples",
            id="empty_calibration_raises_calibration_error",
        ),
        pytest.param(
            "no_such_module:build", SourceError, r"no_such_module", id="unimportable_factory_raises_source_error"
        ),
    ],
)
def test_a_failing_build_raises_its_error_and_leaves_nothing(
    data_dir: Path, factory: str, error: type[Exception], match: str
) -> None:
    config, profile = load_build_config(write_build_config(data_dir, factory), "ci")
    output = data_dir / "reports"
    with pytest.raises(error, match=match):
        run_build(config, profile, output, progress=False)
    assert_nothing_left(output, "t")


@pytest.mark.slow
def test_build_into_output_under_a_file_raises_output_error(data_dir: Path) -> None:
    config, profile = load_build_config(write_build_config(data_dir, "mydata.py:build"), "ci")
    (data_dir / "afile").write_text("x", encoding="utf-8")
    with pytest.raises(OutputError, match=r"afile/reports"):
        run_build(config, profile, data_dir / "afile" / "reports", progress=False)


def test_every_error_is_a_deploy_opt_error() -> None:
    for cls in (SourceError, CheckpointError, InputError, NumericsError, ModelError, OutputError, CalibrationError):
        assert issubclass(cls, DeployOptError)


# ---------------------------------------------------------------------------------------------------- CLI


@pytest.mark.slow
def test_cli_unimportable_factory_exits_2_with_one_line(data_dir: Path) -> None:
    config = write_build_config(data_dir, "no_such_module:build", name="demo")
    output = data_dir / "out"
    proc = run_cli("build", str(config), "--output-dir", str(output), cwd=data_dir)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert lines[-1].startswith("deploy_opt build: error:")
    assert "no_such_module" in lines[-1]
    assert_nothing_left(output, "demo")


@pytest.mark.slow
def test_cli_empty_calibration_exits_2(data_dir: Path) -> None:
    config = write_build_config(data_dir, "mydata.py:build", name="demo")
    output = data_dir / "out"
    proc = run_cli("-q", "build", str(config), "--output-dir", str(output), cwd=data_dir)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    last = [line for line in proc.stderr.splitlines() if line.strip()][-1]
    assert last.startswith("deploy_opt build: error: calibration data is empty: data.calibration 'mydata.py:calib'")
    assert_nothing_left(output, "demo")


@pytest.mark.slow
def test_cli_config_error_exits_2_with_one_line(data_dir: Path) -> None:
    config = write_build_config(data_dir, "mydata.py:build", name="demo")
    output = data_dir / "out"
    proc = run_cli("build", str(config), "--set", "benchmark.threads=two", "--output-dir", str(output), cwd=data_dir)
    assert proc.returncode == 2
    assert proc.stderr.strip() == "deploy_opt build: error: benchmark.threads: expected int, got 'two'"
    assert not output.exists()
