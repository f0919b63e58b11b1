"""Bad build sources: factories, checkpoints, input batches and numerics each raise their own error class naming the
offending value."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from bad_inputs import write_data_module

from calibrators.activations.minmax import MinMaxObserver
from deploy_opt.config.data import DataConfig
from deploy_opt.config.model import InputSpec
from deploy_opt.data.sources import (
    Batch,
    check_inputs,
    load_checkpoint,
    load_torch_model,
    resolve_callable,
    to_batch,
)
from deploy_opt.evaluation.evaluate import Runner, evaluate
from deploy_opt.evaluation.metrics import resolve_metric
from dopt_common.errors import CalibrationError, CheckpointError, InputError, NumericsError, SourceError

PIXELS = (InputSpec("pixels", ("batch", 64), "float32"),)

DATA = DataConfig(calibration="c.py:f", evaluation="e.py:f")


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    """A folder holding mydata.py."""
    return write_data_module(tmp_path)


# ---------------------------------------------------------------------------------------------------- sources


@pytest.mark.parametrize(
    "ref,match",
    [
        ("no_such_module:build", r"model\.factory 'no_such_module:build': cannot import 'no_such_module'"),
        ("nowhere.py:build", r"'nowhere\.py:build': cannot import 'nowhere\.py'"),
        ("mydata.py:no_such_function", r"module 'mydata\.py' has no callable 'no_such_function'"),
        ("broken_syntax.py:build", r"broken_syntax\.py"),
        ("no_colon", r"model\.factory 'no_colon' must look like 'package\.module:function'"),
        ("a:b:c", r"model\.factory 'a:b:c' must look like 'package\.module:function'"),
    ],
)
def test_a_factory_that_cannot_be_resolved_raises_source_error(data_dir: Path, ref: str, match: str) -> None:
    (data_dir / "broken_syntax.py").write_text("def build(:\n", encoding="utf-8")
    with pytest.raises(SourceError, match=match):
        resolve_callable(ref, data_dir, "model.factory")


@pytest.mark.parametrize(
    "ref,match",
    [
        ("no_such_module:build", r"'no_such_module:build'.*cannot import 'no_such_module'"),
        ("mydata.py:not_a_model", r"'mydata\.py:not_a_model' returned list, not a torch\.nn\.Module"),
    ],
)
def test_a_factory_that_gives_no_model_raises_source_error(data_dir: Path, ref: str, match: str) -> None:
    with pytest.raises(SourceError, match=match):
        load_torch_model(ref, None, data_dir)


def test_file_factory_loads_and_is_in_eval_mode(data_dir: Path) -> None:
    model = load_torch_model("mydata.py:build", None, data_dir)
    assert isinstance(model, torch.nn.Module) and not model.training


def test_a_data_function_that_raises_is_a_source_error(tmp_path: Path) -> None:
    from deploy_opt.data.sources import iter_batches

    (tmp_path / "flaky.py").write_text(
        "def data():\n    yield ({'x': __import__('numpy').zeros((1, 2), 'float32')}, None)\n"
        "    raise RuntimeError('disk gone')\n",
        encoding="utf-8",
    )
    spec = InputSpec("x", ("batch", 2))
    with pytest.raises(SourceError, match=r"flaky\.py:data' raised RuntimeError at item 1: disk gone"):
        list(iter_batches("flaky.py:data", (spec,), DATA, tmp_path, "data.calibration"))


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
