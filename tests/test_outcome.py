"""build.json read back as typed fields: the CLI's summary and the gate's configured thresholds."""

from __future__ import annotations

import pytest

from deploy_opt.report.outcome import BuildOutcome, gate_settings
from deploy_opt.report.record import BUILD_FORMAT
from dopt_common.errors import ReportError


def _build(**changes: object) -> dict:
    metrics = {"name": "top1", "ort_fp32": 97.5, "ort_int8": 97.0, "drop": 0.5, "samples": 128}
    metrics.update(drop_ci95=[0.1, 0.9], split="data.evaluation split by seed 0")
    timing = {"ort_fp32": {"median_ms": 2.0}, "ort_int8": {"median_ms": 1.0}, "speedup": 2.0}
    build = {
        "format": BUILD_FORMAT,
        "name": "digits-mlp",
        "metrics": metrics,
        "quantization": {"quantized_nodes": 3},
        "auto": {"verdict": "inputs asym: drop 0.5 <= 1"},
        "qat": {"ran": False, "why": "QAT not needed"},
        "benchmark": {"batches": {"1": {**timing, "speedup_ci95": [1.8, 2.2]}, "8": timing}},
        "timings_s": {"export": 1.5, "auto_search": 20.0},
        "artifacts": {"model.onnx": {"bytes": 4 << 20}, "model.int8.onnx": {"bytes": 1 << 20}},
        "config": {"gate": {"max_drop": 1.0, "min_speedup": 1.1, "speedup_batch": 8, "allow_fp32": True}},
    }
    build.update(changes)
    return build


def test_a_build_json_reads_back_as_typed_fields() -> None:
    outcome = BuildOutcome.from_json(_build())
    assert (outcome.metric, outcome.fp32_score, outcome.shipped_score, outcome.drop) == ("top1", 97.5, 97.0, 0.5)
    assert outcome.drop_ci95 == (0.1, 0.9) and outcome.samples == 128 and not outcome.fp32_ships
    assert outcome.qat_line == "not run: QAT not needed" and outcome.auto_verdict.startswith("inputs asym")
    assert [(b.size, b.speedup, b.speedup_ci95) for b in outcome.batches] == [("1", 2.0, (1.8, 2.2)), ("8", 2.0, None)]
    assert outcome.timings_s == (("export", 1.5), ("auto_search", 20.0))
    assert outcome.gate.min_speedup == 1.1 and outcome.gate.speedup_batch == 8 and outcome.gate.allow_fp32
    assert "4.00 MiB" in outcome.size
    assert BuildOutcome.from_json(_build(quantization={"quantized_nodes": 0})).fp32_ships
    shipped = {"ran": True, "shipped": "qat", "why": "QAT met the gate"}
    assert BuildOutcome.from_json(_build(qat=shipped)).qat_line == "qat ships; QAT met the gate"


def test_a_hand_written_report_gets_the_default_gate_and_a_broken_one_names_its_field() -> None:
    assert gate_settings({"metrics": {}}).allow_fp32 is False and gate_settings({}).max_drop is None
    assert gate_settings({"config": {"gate": {"max_ppl_increase": "5%"}}}).max_ppl_increase == "5%"
    with pytest.raises(ReportError, match="build.json's 'metrics' has no 'drop'"):
        BuildOutcome.from_json(_build(metrics={"name": "top1", "ort_fp32": 1.0, "ort_int8": 1.0, "samples": 4}))
    with pytest.raises(ReportError, match="'benchmark.batches.1.ort_fp32' has no 'median_ms'"):
        BuildOutcome.from_json(_build(benchmark={"batches": {"1": {"ort_fp32": {}, "ort_int8": {}}}}))
    with pytest.raises(ReportError, match="has no 'metrics' section"):
        BuildOutcome.from_json({"format": BUILD_FORMAT})
    with pytest.raises(ReportError, match="format 'deploy_opt.build/0'"):
        BuildOutcome.from_json(_build(format="deploy_opt.build/0"))
