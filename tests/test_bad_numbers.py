"""Non-finite numbers and bad arguments exit 2 with one line, before any work: scale files, gate thresholds,
config values, a user's metric, serve's arguments and a corrupt training checkpoint."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from calibrators.scales.format import ScaleFile, TensorScale, save_scale_file
from deploy_opt.evaluation.metrics import resolve_metric
from dopt_common.errors import InputError


def _cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "deploy_opt", *args], capture_output=True, text=True, cwd=cwd)


def _one_line_error(result: subprocess.CompletedProcess[str], *words: str) -> None:
    assert result.returncode == 2, (result.stdout, result.stderr)
    lines = [line for line in result.stderr.strip().splitlines() if "error" in line]
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert all(w in lines[0] for w in words), lines[0]


def _scale_file(tmp_path: Path) -> Path:
    entry = TensorScale("x", "activation", "int8", (0.05,), (0,), method="minmax")
    return save_scale_file(ScaleFile("symmetric", {"x": entry}), tmp_path / "scales.json")


def test_an_infinite_scale_is_refused_on_export_and_import(tmp_path: Path) -> None:
    path = _scale_file(tmp_path)
    data = json.loads(path.read_text())
    data["tensors"]["x"] |= {"scale": [1e39], "scale_hex": ["7f800000"]}  # what a hand edit or a bad tool writes
    path.write_text(json.dumps(data))
    for fmt in ("trt-cache", "aimet"):
        _one_line_error(_cli("scales", "export", str(path), "--format", fmt, "--out", str(tmp_path / fmt)), "inf")
        assert not (tmp_path / fmt).exists()
    aimet = tmp_path / "encodings.json"
    entry = '{"bitwidth": 8, "dtype": "int", "is_symmetric": "True", "max": Infinity, "min": -Infinity, '
    entry += '"offset": -128, "scale": Infinity}'
    aimet.write_text(f'{{"activation_encodings": {{"x": [{entry}]}}, "param_encodings": {{}}}}')
    _one_line_error(_cli("scales", "import", str(aimet), "--to", str(tmp_path / "back.json")), "inf")


@pytest.mark.parametrize("args", [["--max-drop", "nan"], ["--min-speedup=-inf"], ["--min-speedup", "-3"]])
def test_gate_thresholds_must_be_finite_and_in_range(tmp_path: Path, args: list[str]) -> None:
    build = {"metrics": {"name": "top1", "drop": 0.1}, "benchmark": {"batches": {"1": {"speedup": 1.5}}}}
    (tmp_path / "build.json").write_text(json.dumps(build))
    _one_line_error(_cli("gate", str(tmp_path / "build.json"), *args), "gate")


def test_a_nan_in_the_config_fails_before_the_build(tmp_path: Path) -> None:
    result = _cli("build", "--profile", "ci", "--set", "gate.max_drop=.nan", "--output-dir", str(tmp_path))
    _one_line_error(result, "gate.max_drop", "not a finite number")
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize(
    "body,words",
    [
        ("raise ValueError('labels missing')", ("raised ValueError: labels missing",)),
        ("return float('nan')", ("NaN or Inf",)),
        ("return 'good'", ("'good'", "not finite numbers")),
    ],
    ids=["raises", "nan", "string"],
)
def test_a_custom_metric_that_fails_is_bad_input_naming_it(tmp_path: Path, body: str, words: tuple[str, ...]) -> None:
    (tmp_path / "mine.py").write_text(f"def score(prediction, reference):\n    {body}\n")
    metric = resolve_metric("mine.py:score", tmp_path)
    with pytest.raises(InputError, match="data.metric 'mine.py:score'") as caught:
        metric.score(np.zeros((2, 3)), np.zeros(2))
    assert all(w in str(caught.value) for w in words)


@pytest.mark.parametrize(
    "args,words",
    [(["--port", "-1"], ("serve.port -1",)), (["--tp", "0"], ("serve.tp 0",)), ([], ("does not exist",))],
    ids=["port", "tp", "missing"],
)
def test_serve_checks_its_arguments_first(tmp_path: Path, args: list[str], words: tuple[str, ...]) -> None:
    checkpoint = tmp_path / ("checkpoint" if args else "nowhere")
    if args:
        checkpoint.mkdir()
        (checkpoint / "config.json").write_text("{}")
    _one_line_error(_cli("serve", str(checkpoint), "--dry-run", *args), *words)


def test_a_corrupt_training_checkpoint_is_one_line_without_unsafe_advice(tmp_path: Path) -> None:
    from deploy_opt.train.checkpoint import read_checkpoint
    from dopt_common.errors import CheckpointError

    path = tmp_path / "last.pt"
    path.write_bytes(b"\x80\x04not a checkpoint" * 10)
    with pytest.raises(CheckpointError) as caught:
        read_checkpoint(path)
    text = str(caught.value)
    assert "\n" not in text and "weights_only" not in text and str(path) in text


def test_scales_import_to_a_folder_fails_before_reading(tmp_path: Path) -> None:
    cache = tmp_path / "calibration.cache"
    cache.write_text("TRT-100001-EntropyCalibration2\nx: 3d4ccccd\n")
    _one_line_error(_cli("scales", "import", str(cache), "--to", str(tmp_path)), "is a folder")


def test_a_torchao_state_naming_foreign_globals_is_refused_unread(tmp_path: Path) -> None:
    import argparse

    import torch

    from deploy_opt.llm.torchao_path import _load_state
    from dopt_common.errors import CheckpointError

    path = tmp_path / "state.pt"
    torch.save({"w": torch.zeros(2), "odd": argparse.Namespace(a=1)}, path)  # any class could run code on load
    with pytest.raises(CheckpointError, match="argparse.Namespace to unpickle, which torchao does not define"):
        _load_state(path)


@pytest.mark.slow
def test_a_wrong_input_name_names_the_user_s_file_not_the_staging_copy(tmp_path: Path) -> None:
    import tiny_onnx
    from conftest import write_config

    tiny_onnx.make_model(tmp_path / "tiny.onnx")
    data = tmp_path / "renamed.py"
    data.write_text(
        "import tiny_onnx\n"
        "def calibration():\n    return [({'inp': x['x']}, y) for x, y in tiny_onnx.calibration()]\n"
        "def evaluation():\n    return [({'inp': x['x']}, y) for x, y in tiny_onnx.evaluation()]\n"
    )
    config = write_config(
        tmp_path,
        f"""
name: renamed
model: {{onnx: tiny.onnx, inputs: [{{name: inp, shape: [batch, 16], dtype: float32}}]}}
data: {{calibration: "{data}:calibration", evaluation: "{data}:evaluation", metric: top1}}
""",
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent)}  # the data module imports tiny_onnx
    command = ["build", str(config), "--profile", "ci", "--output-dir", str(tmp_path / "o")]
    result = subprocess.run([sys.executable, "-m", "deploy_opt", *command], capture_output=True, text=True, env=env)
    _one_line_error(result, "model.inputs ['inp'] do not match the inputs of 'tiny.onnx': ['x']")
    assert "partial" not in result.stderr
