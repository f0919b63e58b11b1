"""Bad build inputs: each raises its own error class naming the offending value; the CLI prints one line, exit 2."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper

from calibrators.activations.minmax import MinMaxObserver
from deploy_opt.build.evaluate import Runner, evaluate
from deploy_opt.build.metrics import resolve_metric
from deploy_opt.build.pipeline import run_build
from deploy_opt.build.sources import Batch, check_inputs, load_checkpoint, load_torch_model, resolve_callable, to_batch
from deploy_opt.config.build import InputSpec
from deploy_opt.config.profiles import load_build_config
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

PIXELS = (InputSpec("pixels", ("batch", 64), "float32"),)
# A tiny model and its data functions, written beside each test's config as mydata.py.
DATA_MODULE = textwrap.dedent(
    """
    import numpy as np
    import torch


    def build():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(4, 3))


    def calib():
        return []


    def evaluation():
        return [({"x": np.ones((2, 4), np.float32)}, np.array([0, 1]))]


    def not_a_model():
        return [1, 2, 3]
    """
)


@pytest.fixture(autouse=True)
def _shipped_profiles(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DEPLOY_OPT_PROFILES", raising=False)


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    """A folder holding mydata.py."""
    (tmp_path / "mydata.py").write_text(DATA_MODULE, encoding="utf-8")
    return tmp_path


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


# ---------------------------------------------------------------------------------------------------- sources


def test_unimportable_factory_raises_source_error(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match=r"model\.factory 'no_such_module:build': cannot import 'no_such_module'"):
        resolve_callable("no_such_module:build", tmp_path, "model.factory")


def test_load_torch_model_with_unimportable_factory(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match=r"'no_such_module:build'.*cannot import 'no_such_module'"):
        load_torch_model("no_such_module:build", None, tmp_path)


def test_missing_factory_file_raises_source_error(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match=r"'nowhere\.py:build': cannot import 'nowhere\.py'"):
        resolve_callable("nowhere.py:build", tmp_path, "model.factory")


def test_missing_function_raises_source_error(data_dir: Path) -> None:
    with pytest.raises(SourceError, match=r"module 'mydata\.py' has no callable 'no_such_function'"):
        resolve_callable("mydata.py:no_such_function", data_dir, "model.factory")


@pytest.mark.parametrize("ref", ["no_colon", "a:b:c"])
def test_malformed_reference_raises_source_error(tmp_path: Path, ref: str) -> None:
    with pytest.raises(SourceError, match=rf"model\.factory '{ref}' must look like 'package\.module:function'"):
        resolve_callable(ref, tmp_path, "model.factory")


def test_module_with_syntax_error_raises_source_error(tmp_path: Path) -> None:
    (tmp_path / "broken_syntax.py").write_text("def build(:\n", encoding="utf-8")
    with pytest.raises(SourceError, match=r"broken_syntax\.py"):
        resolve_callable("broken_syntax.py:build", tmp_path, "model.factory")


def test_factory_returning_a_non_module_raises_source_error(data_dir: Path) -> None:
    with pytest.raises(SourceError, match=r"'mydata\.py:not_a_model' returned list, not a torch\.nn\.Module"):
        load_torch_model("mydata.py:not_a_model", None, data_dir)


def test_file_factory_loads_and_is_in_eval_mode(data_dir: Path) -> None:
    model = load_torch_model("mydata.py:build", None, data_dir)
    assert isinstance(model, torch.nn.Module) and not model.training


# ---------------------------------------------------------------------------------------------------- checkpoints


def _small() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(4, 3))


def test_checkpoint_with_wrong_shapes_raises_checkpoint_error(tmp_path: Path) -> None:
    path = tmp_path / "wide.pt"
    torch.save(torch.nn.Sequential(torch.nn.Linear(4, 5)).state_dict(), path)
    with pytest.raises(CheckpointError, match=r"wide\.pt' does not match.*shape mismatch.*0\.weight \(5, 4\)"):
        load_checkpoint(_small(), path)


def test_checkpoint_with_other_keys_raises_checkpoint_error(tmp_path: Path) -> None:
    path = tmp_path / "other.pt"
    torch.save(torch.nn.Sequential(torch.nn.Conv1d(4, 3, 1), torch.nn.ReLU(), torch.nn.Linear(3, 2)).state_dict(), path)
    with pytest.raises(CheckpointError, match=r"unexpected keys \['2\.bias', '2\.weight'\]"):
        load_checkpoint(_small(), path)


def test_checkpoint_with_missing_keys_raises_checkpoint_error(tmp_path: Path) -> None:
    path = tmp_path / "renamed.pt"
    torch.save({"encoder.weight": torch.zeros(3, 4)}, path)
    with pytest.raises(CheckpointError, match=r"missing keys \['0\.bias', '0\.weight'\].*unexpected keys"):
        load_checkpoint(_small(), path)


def test_missing_checkpoint_file_raises_checkpoint_error(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match=r"'.*absent\.pt' does not exist"):
        load_checkpoint(_small(), tmp_path / "absent.pt")


def test_missing_checkpoint_through_load_torch_model(data_dir: Path) -> None:
    with pytest.raises(CheckpointError, match=r"absent\.pt' does not exist"):
        load_torch_model("mydata.py:build", "absent.pt", data_dir)


def test_corrupt_checkpoint_raises_checkpoint_error(tmp_path: Path) -> None:
    path = tmp_path / "garbage.pt"
    path.write_bytes(b"this is not a torch checkpoint")
    with pytest.raises(CheckpointError, match=r"garbage\.pt' cannot be loaded with weights_only=True"):
        load_checkpoint(_small(), path)


def test_matching_checkpoint_loads(data_dir: Path) -> None:
    source = _small()
    torch.nn.init.constant_(source[0].weight, 0.5)
    torch.save(source.state_dict(), data_dir / "ok.pt")
    model = load_torch_model("mydata.py:build", "ok.pt", data_dir)
    assert torch.equal(model[0].weight, source[0].weight)


# ---------------------------------------------------------------------------------------------------- inputs


def test_input_shape_mismatch_raises_input_error() -> None:
    item = (np.zeros((2, 32), np.float32), np.array([0, 1]))
    with pytest.raises(InputError, match=r"input 'pixels' has shape \[2, 32\], declared \['batch', 64\]"):
        to_batch(item, PIXELS, "data.evaluation batch 0")


def test_input_rank_mismatch_raises_input_error() -> None:
    with pytest.raises(InputError, match=r"input 'pixels' has shape \[2, 8, 8\]"):
        to_batch((np.zeros((2, 8, 8), np.float32), None), PIXELS, "data.calibration batch 3")


def test_input_dtype_mismatch_raises_input_error() -> None:
    item = (np.zeros((2, 64), np.float64), np.array([0, 1]))
    with pytest.raises(InputError, match=r"batch 0: input 'pixels' has dtype float64, declared float32"):
        to_batch(item, PIXELS, "data.evaluation batch 0")


def test_wrong_input_name_raises_input_error() -> None:
    item = ({"image": np.zeros((2, 64), np.float32)}, None)
    with pytest.raises(InputError, match=r"input names \['image'\] do not match model\.inputs \['pixels'\]"):
        to_batch(item, PIXELS, "data.calibration batch 0")


def test_check_inputs_batch_sizes_must_agree() -> None:
    specs = (InputSpec("ids", ("batch", 8), "int64"), InputSpec("mask", ("batch", 8), "int64"))
    arrays = {"ids": np.zeros((2, 8), np.int64), "mask": np.zeros((3, 8), np.int64)}
    with pytest.raises(InputError, match=r"inputs disagree on the batch size: \[2, 3\]"):
        check_inputs(arrays, specs, "data.evaluation batch 0")


def test_check_inputs_dtype_names_the_input() -> None:
    specs = (InputSpec("ids", ("batch", 8), "int64"),)
    with pytest.raises(InputError, match=r"input 'ids' has dtype int32, declared int64"):
        check_inputs({"ids": np.zeros((2, 8), np.int32)}, specs, "here")


def test_label_without_batch_axis_raises_input_error() -> None:
    with pytest.raises(InputError, match=r"label has shape \(3,\), expected a leading batch axis of 2"):
        to_batch((np.zeros((2, 64), np.float32), np.array([0, 1, 2])), PIXELS, "data.evaluation batch 0")


def test_item_that_is_not_a_pair_raises_input_error() -> None:
    with pytest.raises(InputError, match=r"expected an \(inputs, label\) pair, got ndarray"):
        to_batch(np.zeros((2, 64), np.float32), PIXELS, "data.evaluation batch 0")


# ---------------------------------------------------------------------------------------------------- numerics


def _batch(n: int = 2) -> Batch:
    return Batch({"pixels": np.zeros((n, 64), np.float32)}, np.zeros(n, np.int64))


def _fine(feed: dict[str, np.ndarray]) -> list[np.ndarray]:
    return [np.eye(10, dtype=np.float32)[: feed["pixels"].shape[0]]]


def _fails_on_second_call(broken: Runner) -> Runner:
    """``_fine`` on the first call, ``broken`` after: the bad output shows up on evaluation batch 1."""
    calls = {"n": 0}

    def run(feed: dict[str, np.ndarray]) -> list[np.ndarray]:
        calls["n"] += 1
        return list(broken(feed)) if calls["n"] > 1 else _fine(feed)

    return run


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_output_raises_numerics_error(bad: float) -> None:
    def broken(feed: dict[str, np.ndarray]) -> list[np.ndarray]:
        out = _fine(feed)[0].copy()
        out[0, 3] = bad
        return [out]

    metric = resolve_metric("top1")
    with pytest.raises(NumericsError, match=r"ort_int8 output has NaN or Inf on evaluation batch 1"):
        evaluate(
            {"ort_fp32": _fine, "ort_int8": _fails_on_second_call(broken)},
            [_batch(), _batch()],
            metric,
            "ort_fp32",
            progress=False,
        )


def test_evaluate_on_finite_outputs_scores() -> None:
    result = evaluate({"ort_fp32": _fine}, [_batch(3)], resolve_metric("top1"), "ort_fp32", progress=False)
    assert result.samples == 3 and result.values["ort_fp32"] == pytest.approx(100 / 3)


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_non_finite_calibration_tensor_raises_numerics_error(bad: float) -> None:
    observer = MinMaxObserver()
    observer.update("conv1_out", np.array([0.0, 1.0], np.float32), "in batch 0")
    with pytest.raises(NumericsError, match=r"tensor 'conv1_out' has NaN or Inf in batch 1"):
        observer.update("conv1_out", np.array([0.0, bad], np.float32), "in batch 1")
    assert observer.ranges() == {"conv1_out": (0.0, 1.0)}  # the bad batch left no trace


def test_observer_without_data_raises_calibration_error() -> None:
    with pytest.raises(CalibrationError, match=r"calibration saw no data"):
        MinMaxObserver().ranges()


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


# ---------------------------------------------------------------------------------------------------- outputs


def test_output_folder_under_a_file_raises_output_error(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("x", encoding="utf-8")
    with pytest.raises(OutputError, match=r"output folder '.*afile/sub' is not writable"):
        ensure_writable_dir(tmp_path / "afile" / "sub")


def test_output_folder_that_is_a_file_raises_output_error(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("x", encoding="utf-8")
    with pytest.raises(OutputError, match=r"output folder '.*afile' is not writable"):
        ensure_writable_dir(tmp_path / "afile")


def test_writable_output_folder_is_created_and_left_clean(tmp_path: Path) -> None:
    folder = ensure_writable_dir(tmp_path / "a" / "b")
    assert folder.is_dir() and list(folder.iterdir()) == []


# ---------------------------------------------------------------------------------------------------- whole build


def test_build_with_empty_calibration_raises_calibration_error(data_dir: Path) -> None:
    config, profile = load_build_config(write_build_config(data_dir, "mydata.py:build"), "ci")
    output = data_dir / "reports"
    with pytest.raises(CalibrationError, match=r"data\.calibration 'mydata\.py:calib' yielded no samples"):
        run_build(config, profile, output, progress=False)
    assert_nothing_left(output, "t")


def test_build_with_unimportable_factory_raises_source_error(data_dir: Path) -> None:
    config, profile = load_build_config(write_build_config(data_dir, "no_such_module:build"), "ci")
    output = data_dir / "reports"
    with pytest.raises(SourceError, match=r"no_such_module"):
        run_build(config, profile, output, progress=False)
    assert_nothing_left(output, "t")


def test_build_into_output_under_a_file_raises_output_error(data_dir: Path) -> None:
    config, profile = load_build_config(write_build_config(data_dir, "mydata.py:build"), "ci")
    (data_dir / "afile").write_text("x", encoding="utf-8")
    with pytest.raises(OutputError, match=r"afile/reports"):
        run_build(config, profile, data_dir / "afile" / "reports", progress=False)


def test_every_error_is_a_deploy_opt_error() -> None:
    for cls in (SourceError, CheckpointError, InputError, NumericsError, ModelError, OutputError, CalibrationError):
        assert issubclass(cls, DeployOptError)


# ---------------------------------------------------------------------------------------------------- CLI


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


def test_cli_empty_calibration_exits_2(data_dir: Path) -> None:
    config = write_build_config(data_dir, "mydata.py:build", name="demo")
    output = data_dir / "out"
    proc = run_cli("-q", "build", str(config), "--output-dir", str(output), cwd=data_dir)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    last = [line for line in proc.stderr.splitlines() if line.strip()][-1]
    assert last.startswith("deploy_opt build: error: calibration data is empty: data.calibration 'mydata.py:calib'")
    assert_nothing_left(output, "demo")


def test_cli_config_error_exits_2_with_one_line(data_dir: Path) -> None:
    config = write_build_config(data_dir, "mydata.py:build", name="demo")
    output = data_dir / "out"
    proc = run_cli("build", str(config), "--set", "benchmark.threads=two", "--output-dir", str(output), cwd=data_dir)
    assert proc.returncode == 2
    assert proc.stderr.strip() == "deploy_opt build: error: benchmark.threads: expected int, got 'two'"
    assert not output.exists()


def test_a_data_function_that_raises_is_a_source_error(tmp_path: Path) -> None:
    from deploy_opt.build.sources import iter_batches

    (tmp_path / "flaky.py").write_text(
        "def data():\n    yield ({'x': __import__('numpy').zeros((1, 2), 'float32')}, None)\n"
        "    raise RuntimeError('disk gone')\n",
        encoding="utf-8",
    )
    spec = InputSpec("x", ("batch", 2))
    with pytest.raises(SourceError, match=r"flaky\.py:data' raised RuntimeError at item 1: disk gone"):
        list(iter_batches("flaky.py:data", (spec,), tmp_path, "data.calibration"))


def test_parity_failure_names_the_error_and_tolerance(tmp_path: Path) -> None:
    from deploy_opt.build.evaluate import torch_runner
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
