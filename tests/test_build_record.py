"""build.json as one typed record: a real build.json of 2026-12-06 (written before the record was typed) reads
back and writes the same text, renders the same summary.md, and older records read too."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from deploy_opt.report.build_record import BuildRecord
from deploy_opt.report.gate import apply_gate
from deploy_opt.report.outcome import GateSettings, outcome
from deploy_opt.report.record import render_summary
from dopt_common.errors import ReportError

DATA = Path(__file__).parent / "data"
REAL = DATA / "build_2026-12-06.json"  # `python -m deploy_opt build digits` on main at b7297ea (the last landed main)
REAL_SUMMARY = DATA / "build_2026-12-06.summary.md"  # the summary.md written beside it


def _text(data: dict[str, Any]) -> str:
    return json.dumps(data, indent=2, sort_keys=False, allow_nan=False) + "\n"  # dopt_common.files.write_json


def test_a_real_build_json_reads_back_to_the_same_text() -> None:
    text = REAL.read_text(encoding="utf-8")
    record = BuildRecord.from_json(json.loads(text))
    assert _text(record.to_json()) == text
    assert record.metrics is not None and record.metrics.scores["ort_int8"] > 90
    assert record.benchmark is not None and set(record.benchmark.batches) == {"1", "32"}
    assert record.benchmark.batches["32"].timings["ort_fp32"].repeats == 232
    assert record.quantization is not None and record.quantization.quantized_nodes == 6
    assert record.export is not None and record.export.parity is not None and record.export.opset == 18
    assert record.backends is not None and record.backends.artifacts.aimet == "encodings.json"
    assert record.gate is not None and record.gate.verdict == "PASSED"


def test_the_summary_of_a_real_build_json_is_its_summary_md() -> None:
    record = BuildRecord.from_json(json.loads(REAL.read_text(encoding="utf-8")))
    assert render_summary(record) == REAL_SUMMARY.read_text(encoding="utf-8")


def test_the_gate_judges_the_real_record_as_the_build_did() -> None:
    record = BuildRecord.from_json(json.loads(REAL.read_text(encoding="utf-8")))
    result = apply_gate(record, GateSettings(max_drop=1.0, min_speedup=1.0))
    assert [c.text for c in result.criteria] == [c.text for c in record.gate.criteria[:2]]
    shown = outcome(record)
    assert (shown.metric, shown.samples, shown.fp32_ships) == ("top1", 225, False)


def _older(real: dict[str, Any]) -> dict[str, Any]:
    """The real record as a build before 2026-12-02 wrote it: no split, no intervals or
    deciles, no node counts, no integrity digests, no stage times, and no verdict word in the gate section."""
    old = copy.deepcopy(real)
    old["format"] = "deploy_opt.build/1"
    for key in ("integrity", "timings_s", "sensitivity", "comparison"):
        old.pop(key)
    for key in ("higher_is_better", "reference", "drop_vs", "drop_ci95", "resolution", "split", "decision"):
        old["metrics"].pop(key)
    for key in ("quantized_nodes", "quantizable_nodes"):
        old["quantization"].pop(key)
    for row in old["benchmark"]["batches"].values():
        row.pop("speedup_ci95")
        for timing in (row["ort_fp32"], row["ort_int8"]):
            del timing["p10_ms"], timing["p90_ms"], timing["repeats"]
    old["gate"].pop("verdict")
    for criterion in old["gate"]["criteria"]:
        criterion.pop("judged")
    return old


def test_an_older_record_reads_with_its_missing_sections_none() -> None:
    record = BuildRecord.from_json(_older(json.loads(REAL.read_text(encoding="utf-8"))))
    assert record.format == "deploy_opt.build/1" and record.integrity is None and record.sensitivity is None
    assert record.metrics.uncertainty is None and record.metrics.split is None and record.metrics.drop_vs is None
    assert record.quantization.quantized_nodes is None
    assert record.gate.verdict == "PASSED" and all(c.judged for c in record.gate.criteria)
    shown = outcome(record)
    assert shown.drop_ci95 is None and shown.batches[0].speedup_ci95 is None and shown.timings_s == ()
    speed = apply_gate(record, GateSettings(max_drop=1.0, min_speedup=1.0)).criteria[1]
    assert speed.passed and "(median, no interval)" in speed.text


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"format": "deploy_opt.build/0"}, "format 'deploy_opt.build/0'"),
        ({"metrics": [1, 2]}, "'metrics' is not an object"),
        ({"benchmark": {"batches": {"1": 3}}}, "'benchmark.batches.1' is not an object"),
    ],
)
def test_a_record_it_cannot_read_is_one_report_error(change: dict[str, Any], message: str) -> None:
    data = json.loads(REAL.read_text(encoding="utf-8")) | change
    with pytest.raises(ReportError, match=message):
        BuildRecord.from_json(data)
