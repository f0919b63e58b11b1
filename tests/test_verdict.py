"""The verdict's evidence: paired intervals for the drop and the speedup, the resolution, "not judged" on too
few samples or noisy timing, and the evaluation data split into what decides and what is judged."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import build_tiny, write_config

from deploy_opt.data.sources import Batch
from deploy_opt.evaluation.uncertainty import drop_interval, resolution, speedup_interval, split_indices
from deploy_opt.report.build_record import BuildRecord
from deploy_opt.report.gate import GateResult, apply_gate
from deploy_opt.report.outcome import GateSettings
from deploy_opt.stages.splits import split_evaluation


def _judge(
    build: dict, max_drop: float | None, min_speedup: float | None, speedup_batch: int | None = None, **kw: bool
) -> GateResult:
    """``apply_gate`` on a build.json document, with the thresholds the gate command would pass."""
    thresholds = GateSettings(max_drop, min_speedup, speedup_batch, kw.get("allow_fp32", False))
    return apply_gate(BuildRecord.from_json(build), thresholds)


def test_the_drop_interval_is_paired_and_covers_the_drop() -> None:
    rng = np.random.default_rng(0)
    fp32 = rng.normal(80, 15, 400)
    same = drop_interval(fp32, fp32, higher_is_better=True)
    assert same.value == same.low == same.high == 0.0  # what the samples share cancels
    worse = drop_interval(fp32, fp32 - 2 + rng.normal(0, 1, 400), higher_is_better=True)
    assert worse.low < 2 < worse.high and worse.high - worse.low < 0.5
    lower_is_better = drop_interval(fp32, fp32 + 2, higher_is_better=False)
    assert lower_is_better.value == pytest.approx(2.0)


def test_the_speedup_interval_is_narrow_when_quiet_and_wide_when_busy() -> None:
    rng = np.random.default_rng(1)
    quiet = speedup_interval(rng.normal(10, 0.1, 200), rng.normal(5, 0.05, 200))
    assert quiet.low < 2.0 < quiet.high and quiet.relative_width < 0.05
    # a loaded machine: a third of the rounds stalled, FP32 and INT8 alike, at random
    stalls = rng.random((2, 40)) < 0.35
    fp32 = np.where(stalls[0], 25.0, 3.0) * rng.uniform(0.9, 1.1, 40)
    int8 = np.where(stalls[1], 25.0, 1.5) * rng.uniform(0.9, 1.1, 40)
    busy = speedup_interval(fp32, int8)
    assert busy.relative_width > 0.25


def test_resolution_is_one_samples_step_for_a_two_valued_score() -> None:
    assert resolution([np.array([0.0, 100.0, 100.0, 0.0] * 10)]) == pytest.approx(2.5)
    assert resolution([np.full(40, 100.0)]) is None  # one value seen: no step known (an F1 where all agree)
    assert resolution([np.full(40, 100.0)], right_or_wrong=True) == pytest.approx(2.5)  # top1: 100/n always
    assert resolution([np.linspace(90, 100, 40)]) is None  # continuous: no single step


def _build_json(samples: int, ci: list[float] | None = None, speed: dict | None = None) -> dict:
    metrics = {
        "name": "top1",
        "drop": 0.0,
        "ort_fp32": 90.0,
        "ort_int8": 90.0,
        "samples": samples,
        "drop_ci95": ci or [0.0, 0.0],
        "resolution": 100.0 / samples,
    }
    return {"metrics": metrics, "benchmark": {"batches": {"32": speed}} if speed else None, "quantization": {}}


def test_one_evaluation_sample_is_not_judged_and_does_not_pass() -> None:
    result = _judge(_build_json(1), max_drop=1.0, min_speedup=None)
    assert not result.passed and result.verdict == "NOT JUDGED"
    assert result.lines()[0].startswith("SKIP  accuracy not judged: 1 evaluation sample(s)")
    judged = _judge(_build_json(200, [-0.5, 1.5]), max_drop=1.0, min_speedup=None)
    assert (
        judged.passed
        and "95% CI -0.500 to 1.500" in judged.lines()[0]
        and "on 200 judged samples" in (judged.lines()[0])
    )


def _speed(low: float, high: float, value: float) -> dict:
    timing = {"median_ms": 1.0, "p10_ms": 0.9, "p90_ms": 1.2, "repeats": 50}
    return {"ort_fp32": timing, "ort_int8": timing, "speedup": value, "speedup_ci95": [low, high]}


@pytest.mark.parametrize(
    ("ci", "status"),
    [((1.6, 1.9, 1.75), "PASS"), ((0.5, 0.8, 0.6), "FAIL"), ((0.6, 4.0, 2.0), "SKIP"), ((0.95, 1.08, 1.02), "FAIL")],
)
def test_speed_passes_only_when_the_interval_clears_the_limit(ci: tuple[float, float, float], status: str) -> None:
    result = _judge(_build_json(200, speed=_speed(*ci)), max_drop=None, min_speedup=1.0)
    (criterion,) = result.criteria
    assert criterion.status == status, criterion.text
    if status == "SKIP":
        assert criterion.text.startswith("speed not judged: timing too noisy") and result.passed


def _batches(n: int, size: int = 4) -> list[Batch]:
    x = np.arange(n, dtype=np.float32)[:, None]
    ids = [f"s{j}" for j in range(n)]
    return [Batch({"x": x[i : i + size]}, None, tuple(ids[i : i + size])) for i in range(0, n, size)]


def test_the_evaluation_data_is_split_into_disjoint_halves_by_seed() -> None:
    from deploy_opt.config.build import DataConfig

    data = DataConfig(calibration="c:f", evaluation="e:f")
    calibration = type("C", (), {"batches": ()})()
    split = split_evaluation(data, (), ".", _batches(41), calibration, seed=3)
    decided = {i for b in split.decide for i in b.ids}
    judged = {i for b in split.judge for i in b.ids}
    assert not decided & judged and len(decided | judged) == 41 and len(decided) == 20
    assert split_indices(41, 3) == split_indices(41, 3) and split_indices(41, 3) != split_indices(41, 4)
    one = split_evaluation(data, (), ".", _batches(1), calibration, seed=3)
    assert one.shared and one.separate_decision == ()


def test_a_build_reports_the_drop_on_the_decision_and_the_judged_samples(tmp_path: Path) -> None:
    result = build_tiny(tmp_path, "", ["quantization.fallback=auto"])
    metrics = json.loads((result.out_dir / "build.json").read_text())["metrics"]
    assert metrics["samples"] == 128 and metrics["decision"]["samples"] == 128
    assert "split by seed" in metrics["split"]
    for record in (metrics, metrics["decision"]):
        low, high = record["drop_ci95"]
        assert low <= record["drop"] <= high
    assert metrics["resolution"] == pytest.approx(100 / 128)


def test_data_validation_decides_and_may_not_share_samples_with_evaluation(tmp_path: Path) -> None:
    from deploy_opt.config.profiles import load_build_config
    from dopt_common.errors import ConfigError

    text = """
name: v
model: {onnx: tiny.onnx}
data: {calibration: "@TINY@:calibration", evaluation: "@TINY@:evaluation", validation: "@TINY@:evaluation"}
"""
    with pytest.raises(ConfigError, match="data.validation .* is also data.evaluation"):
        load_build_config(write_config(tmp_path, text), "ci", [])


def test_a_build_on_one_evaluation_sample_is_not_judged(tmp_path: Path) -> None:
    result = build_tiny(tmp_path, "", ["data.eval_samples=1"])
    assert not result.gate.passed and result.gate.verdict == "NOT JUDGED"
    assert result.build.gate.verdict == "NOT JUDGED" and result.build.metrics.samples == 1
