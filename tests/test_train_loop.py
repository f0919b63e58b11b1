"""The training loop: config errors, the JSON-lines log, checkpoints, resume equality, anomaly skip and clipping.

Runs train the digits CNN (real sklearn data) for a few dozen steps; each takes well under a second.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from deploy_opt.config.profiles import example_config
from deploy_opt.train.checkpoint import CHECKPOINT_NAME, read_checkpoint
from deploy_opt.train.config import TrainConfig, build_train_config, load_train_config
from deploy_opt.train.loop import MODEL_NAME, train
from deploy_opt.train.run_log import read_train_log
from dopt_common.errors import CheckpointError, ConfigError, OutputError

REPO = Path(__file__).resolve().parents[1]
STEP_FIELDS = {
    "event",
    "step",
    "epoch",
    "lr",
    "loss",
    "grad_norm",
    "update_norm",
    "optimizer_state_bytes",
    "step_time_s",
    "skipped",
    "batch_size",
}
BASE: dict[str, Any] = {
    "model": "deploy_opt.demo.digits_cnn:build_model",
    "data": "deploy_opt.demo.digits_cnn:digits_data",
    "optimizer": {"type": "adamw", "lr": 3e-3, "state": "int8", "min_numel": 1024, "block_size": 256},
    "scheduler": {"type": "warmup_cosine", "warmup_ratio": 0.1},
    "steps": 20,
    "batch_size": 128,  # 11 batches per epoch: a 20-step run crosses an epoch boundary
    "seed": 3,
}
# A data module with one poisoned batch: its loss is scaled by FACTOR (1e4: a gradient spike; nan: a NaN loss).
SPIKY = """
import torch.nn.functional as F
from deploy_opt.demo.digits_cnn import accuracy, digits_data
from deploy_opt.train.data import TrainData

SPIKE_STEP = 15
FACTOR = float("@FACTOR@")

def spiky_data(batch_size, seed):
    base = digits_data(batch_size, seed)
    per_epoch = len(base.train(0))

    def train(epoch):
        return [
            (x, (y, FACTOR if epoch * per_epoch + i + 1 == SPIKE_STEP else 1.0))
            for i, (x, y) in enumerate(base.train(epoch))
        ]

    def loss(output, target):
        y, factor = target
        return F.cross_entropy(output, y) * factor

    evaluation = [(x, (y, 1.0)) for x, y in base.evaluation]
    return TrainData(train=train, evaluation=evaluation, loss=loss, metric=lambda o, t: accuracy(o, t[0]))
"""

# A data module that crashes once, while producing the batch of step CRASH_STEP (a marker file arms it).
CRASHY = """
from pathlib import Path
from deploy_opt.demo.digits_cnn import digits_data

CRASH_STEP = 13
MARKER = Path(__file__).with_name("crash-armed")

def crashy_data(batch_size, seed):
    base = digits_data(batch_size, seed)
    per_epoch = len(base.train(0))

    def train(epoch):
        for i, batch in enumerate(base.train(epoch)):
            if epoch * per_epoch + i + 1 == CRASH_STEP and MARKER.exists():
                MARKER.unlink()
                raise RuntimeError("simulated crash")
            yield batch

    return base.__class__(train=train, evaluation=base.evaluation, loss=base.loss)
"""


def make_config(tmp_path: Path, **changes: Any) -> TrainConfig:
    """BASE with top-level ``changes`` (mappings merge into their section), loaded from tmp_path."""
    data = json.loads(json.dumps(BASE))
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(data.get(key), dict):
            data[key].update(value)
        else:
            data[key] = value
    return build_train_config(data, base_dir=tmp_path)


def parameters_of(path: Path) -> dict[str, torch.Tensor]:
    """The trainable parameters (not batch-norm buffers) in a checkpoint or model file."""
    payload = torch.load(path, map_location="cpu", weights_only=True)
    state = payload["model"] if "model" in payload else payload
    return {k: v for k, v in state.items() if not k.split(".")[-1].startswith(("running_", "num_batches"))}


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        ({"colour": "blue"}, r"unknown key 'colour'; allowed keys: .*\bbatch_size\b.*\boptimizer\b.*\bsteps\b"),
        ({"optimizer": {"kind": "adamw"}}, r"unknown key 'optimizer\.kind'; allowed keys in optimizer: .*\btype\b"),
        ({"optimizer": {"type": "adam"}}, r"optimizer\.type: 'adam' is not allowed; use one of adamw, lion, sgd"),
        ({"optimizer": {"state": "int4"}}, r"optimizer\.state: 'int4' is not allowed; use one of int8, fp32"),
        ({"optimizer": {"block_size": 16}}, r"block_size must be in 64\.\.8192, got 16"),
        ({"optimizer": {"type": "sgd", "betas": [0.9, 0.99]}}, r"betas applies to adamw, lion and sophia"),
        ({"scheduler": {"type": "exp"}}, r"scheduler.*'exp' is not one of warmup_cosine"),
        ({"scheduler": {"warm": 0.1}}, r"unknown key 'scheduler\.warm'"),
        ({"epochs": 2}, r"exactly one of 'steps'.*or 'epochs'"),
        ({"steps": 0}, r"steps must be a positive integer, got 0"),
        ({"anomaly_factor": 0.5}, r"anomaly_factor must be > 1 or null"),
        ({"clip_norm": -1.0}, r"clip_norm must be positive or null"),
    ],
)
def test_config_errors_name_the_key(tmp_path: Path, edit: dict[str, Any], message: str) -> None:
    data = json.loads(json.dumps(BASE))
    for key, value in edit.items():
        if isinstance(value, dict):
            data.setdefault(key, {}).update(value)
        else:
            data[key] = value
    path = tmp_path / "train.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    with pytest.raises(ConfigError, match=message):
        load_train_config(path)


def test_yaml_overrides_and_relative_output_dir(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "train.yaml"
    path.parent.mkdir()
    path.write_text(yaml.safe_dump({**BASE, "output_dir": "runs/a"}), encoding="utf-8")
    config = load_train_config(path, ["optimizer.lr=0.01", "steps=7"])
    assert config.optimizer.lr == 0.01 and config.steps == 7 and config.optimizer.type == "adamw"
    assert config.resolve_output_dir() == path.parent / "runs" / "a"
    assert config.scheduler.warmup_ratio == 0.1


def test_shipped_demo_config_loads() -> None:
    config = load_train_config(example_config("train_digits"))
    assert config.optimizer.type == "sgd" and config.model_type == "cnn"


def test_short_run_writes_log_checkpoint_and_model(tmp_path: Path) -> None:
    config = make_config(tmp_path, checkpoint_every=8, model_type="cnn", memory_gb=8.0)
    result = train(config, tmp_path / "run", progress=False)
    assert result.completed and result.steps == 20 and result.skipped_steps == 0
    steps = read_train_log(tmp_path / "run" / "train_log.jsonl")
    assert [r["step"] for r in steps] == list(range(1, 21))
    for record in steps:
        assert STEP_FIELDS <= set(record)
        assert math.isfinite(record["loss"]) and record["grad_norm"] > 0 and record["update_norm"] > 0
        assert record["optimizer_state_bytes"] > 0 and record["step_time_s"] > 0 and not record["skipped"]
    assert [r["epoch"] for r in steps][10:12] == [0, 1]
    start = read_train_log(tmp_path / "run" / "train_log.jsonl", "start")[0]
    assert start["recommendation"]["optimizer"] == "sgd" and start["recommendation"]["reasons"]
    assert read_train_log(tmp_path / "run" / "train_log.jsonl", "eval")[0]["eval_accuracy"] == pytest.approx(
        result.metrics["eval_accuracy"]
    )
    # The LR follows the warmup: 2 warmup steps (10% of 20), then cosine decay towards the 10% floor.
    lrs = [r["lr"] for r in steps]
    assert lrs[0] == pytest.approx(1.5e-3) and lrs[1] == pytest.approx(3e-3) and lrs[-1] < lrs[2]
    payload = read_checkpoint(tmp_path / "run" / CHECKPOINT_NAME)
    assert payload["progress"]["step"] == 20 and payload["optimizer_type"] == "Int8AdamW"
    assert payload["config"]["optimizer"]["state"] == "int8"
    assert torch.equal(parameters_of(tmp_path / "run" / MODEL_NAME)["conv2.weight"], payload["model"]["conv2.weight"])
    saved = json.loads((tmp_path / "run" / "train_result.json").read_text())
    assert saved["steps"] == 20 and saved["optimizer_state_bytes"] == result.optimizer_state_bytes


@pytest.fixture(scope="module")
def whole_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    """(folder, result) of BASE's 20 steps without a pause: what both pauses of the next test must reproduce."""
    folder = tmp_path_factory.mktemp("whole") / "whole"
    return folder, train(make_config(folder.parent), folder, progress=False)


@pytest.mark.parametrize("pause_at", [10, 11])  # mid-epoch, and exactly at the end of epoch 0
def test_resume_equals_uninterrupted_run(tmp_path: Path, pause_at: int, whole_run: tuple[Path, Any]) -> None:
    config = make_config(tmp_path)
    whole_folder, whole = whole_run
    first = train(config, tmp_path / "split", progress=False, stop_at=pause_at)
    assert not first.completed and first.steps == pause_at and first.model is None
    resumed = train(config, tmp_path / "split", resume=True, progress=False)
    assert resumed.completed and resumed.steps == 20
    a, b = parameters_of(whole_folder / MODEL_NAME), parameters_of(tmp_path / "split" / MODEL_NAME)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    log_a = read_train_log(whole_folder / "train_log.jsonl")
    log_b = read_train_log(tmp_path / "split" / "train_log.jsonl")
    assert [(r["step"], r["lr"], r["loss"]) for r in log_a] == [(r["step"], r["lr"], r["loss"]) for r in log_b]
    assert resumed.metrics == whole.metrics


def test_resume_after_a_crash_continues_from_the_last_checkpoint(tmp_path: Path) -> None:
    (tmp_path / "crashy.py").write_text(CRASHY, encoding="utf-8")
    config = make_config(tmp_path, data="crashy.py:crashy_data", checkpoint_every=5)
    whole = train(config, tmp_path / "whole", progress=False)
    (tmp_path / "crash-armed").touch()
    with pytest.raises(RuntimeError, match="simulated crash"):
        train(config, tmp_path / "crashed", progress=False)
    assert read_checkpoint(tmp_path / "crashed" / CHECKPOINT_NAME)["progress"]["step"] == 10
    assert len(read_train_log(tmp_path / "crashed" / "train_log.jsonl")) == 12  # steps 11, 12 come again
    resumed = train(config, tmp_path / "crashed", resume=True, progress=False)
    a, b = parameters_of(tmp_path / "whole" / MODEL_NAME), parameters_of(tmp_path / "crashed" / MODEL_NAME)
    assert all(torch.equal(a[k], b[k]) for k in a) and resumed.metrics == whole.metrics
    steps = read_train_log(tmp_path / "crashed" / "train_log.jsonl")
    assert [r["step"] for r in steps] == list(range(1, 21))


def test_resume_refuses_a_changed_config_and_a_new_run_refuses_an_old_folder(tmp_path: Path) -> None:
    train(make_config(tmp_path), tmp_path / "run", progress=False, stop_at=3)
    with pytest.raises(CheckpointError, match=r"config changed \(optimizer\.lr: 0\.003 in the checkpoint, 0\.01 now"):
        train(make_config(tmp_path, optimizer={"lr": 0.01}), tmp_path / "run", resume=True, progress=False)
    with pytest.raises(OutputError, match="already holds a training run"):
        train(make_config(tmp_path), tmp_path / "run", progress=False)
    with pytest.raises(CheckpointError, match="no checkpoint to resume from"):
        train(make_config(tmp_path), tmp_path / "empty", resume=True, progress=False)


@pytest.mark.parametrize(
    ("factor", "anomaly_factor", "reason"),
    [("1e4", 10.0, "exceeds 10 x the median"), ("nan", None, "grad norm is nan")],
)
def test_anomalous_step_is_skipped_and_logged(
    tmp_path: Path, factor: str, anomaly_factor: float | None, reason: str
) -> None:
    (tmp_path / "spiky.py").write_text(SPIKY.replace("@FACTOR@", factor), encoding="utf-8")
    config = make_config(tmp_path, data="spiky.py:spiky_data", anomaly_factor=anomaly_factor, anomaly_min_history=5)
    train(config, tmp_path / "run", progress=False, stop_at=14)
    before = read_checkpoint(tmp_path / "run" / CHECKPOINT_NAME)
    train(config, tmp_path / "run", resume=True, progress=False, stop_at=15)
    after = read_checkpoint(tmp_path / "run" / CHECKPOINT_NAME)
    for name, value in parameters_of(tmp_path / "run" / CHECKPOINT_NAME).items():
        assert torch.equal(value, before["model"][name]), name
    for index, param_state in before["optimizer"]["state"].items():  # the optimizer state did not move either
        for key, value in param_state.items():
            assert torch.equal(after["optimizer"]["state"][index][key], value), (index, key)
    assert after["progress"]["skipped_at"] == [15] and after["progress"]["step"] == 15
    result = train(config, tmp_path / "run", resume=True, progress=False)
    steps = read_train_log(tmp_path / "run" / "train_log.jsonl")
    spike = steps[14]
    assert spike["step"] == 15 and spike["skipped"] and spike["update_norm"] == 0.0
    assert reason in spike["skip_reason"]
    assert not spike["grad_norm"] <= 1000 * steps[13]["grad_norm"]  # huge, or NaN
    assert [r["step"] for r in steps if r["skipped"]] == [15] and result.skipped_at == (15,)
    assert steps[15]["update_norm"] > 0 and math.isfinite(result.metrics["eval_loss"])


@pytest.mark.parametrize("clip_norm", [0.05, None])
def test_clipping_bounds_the_update(tmp_path: Path, clip_norm: float | None) -> None:
    # Plain SGD (no momentum, no decay, constant LR, fp32 state): the update is exactly lr x the clipped gradient.
    lr = 0.1
    config = make_config(
        tmp_path,
        optimizer={"type": "sgd", "lr": lr, "momentum": 0.0, "weight_decay": 0.0, "state": "fp32"},
        scheduler={"type": "constant", "warmup_ratio": 0.0},
        clip_norm=clip_norm,
        steps=6,
    )
    train(config, tmp_path / "run", progress=False)
    steps = read_train_log(tmp_path / "run" / "train_log.jsonl")
    assert all(r["grad_norm"] > 0.05 for r in steps)  # clipping really bites
    for record in steps:
        expected = lr * (min(record["grad_norm"], clip_norm) if clip_norm else record["grad_norm"])
        assert record["update_norm"] == pytest.approx(expected, rel=1e-4)


@pytest.mark.slow
def test_demo_config_trains_digits_cnn_above_95_percent(tmp_path: Path) -> None:
    config = load_train_config(example_config("train_digits"))
    result = train(config, tmp_path / "demo", progress=False)
    assert result.completed and result.metrics["eval_accuracy"] > 0.95
