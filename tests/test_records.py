"""The typed records (compare.json, compat.json, sensitivity.json, quantize_report.json): each refuses another
format and a missing field with one ReportError naming it, and reads back what it writes."""

from __future__ import annotations

import pytest

from deploy_opt.analysis.comparison import BackendVerdict, Comparison
from deploy_opt.analysis.compat_report import CompatReport
from deploy_opt.analysis.sensitivity.record import NodeSensitivity, SensitivityRecord, SubsetMetric
from deploy_opt.report.llm_report import LLMReport, PerplexityChange
from dopt_common.errors import ReportError


def _comparison(failures: tuple[str, ...] = ()) -> Comparison:
    backends = {
        "ort_fp32_cpu": BackendVerdict("ran", "fp32", True, reference=True),
        "ort_int8_cpu": BackendVerdict("ran", "int8", not failures, outputs={"y": {"cosine": 0.99}}, failures=failures),
        "tensorrt_int8": BackendVerdict("not available: no engine", "int8", None),
    }
    return Comparison(0, "ort_fp32_cpu", ("y",), backends, "compared", "c", None, (), {}, failures, 1.0)


def test_a_comparison_reads_back_and_its_verdict_follows_its_failures() -> None:
    record = _comparison(("ort_int8_cpu: y: cosine 0.5 < 0.9",))
    assert record.verdict == "fail" and _comparison().verdict == "pass"
    assert Comparison.from_json(record.to_json()) == record
    assert record.summary()["backends"] == {b: v.status for b, v in record.backends.items()}
    with pytest.raises(ReportError, match="format 'other/1'"):
        Comparison.from_json(record.to_json() | {"format": "other/1"})
    with pytest.raises(ReportError, match="no 'backends'"):
        Comparison.from_json({k: v for k, v in record.to_json().items() if k != "backends"})


def test_a_compat_report_refuses_another_format_and_a_missing_section() -> None:
    report = CompatReport({"name": "m", "nodes": 0, "opsets": {}}, ("ort-cpu",), {}, (), {}, {}, (), ())
    assert CompatReport.from_json(report.to_json()) == report
    with pytest.raises(ReportError, match="format"):
        CompatReport.from_json(report.to_json() | {"format": "deploy_opt.analysis.compat/0"})
    with pytest.raises(ReportError, match="nodes"):
        CompatReport.from_json({k: v for k, v in report.to_json().items() if k != "nodes"})


def test_a_sensitivity_record_ranks_its_nodes_and_reads_back() -> None:
    def node(name: str, rank: int) -> NodeSensitivity:
        return NodeSensitivity(name, "Conv", rank, [4, 4], 10, 0.5, {"sqnr_db": 20.0}, 1.0, None, 0.5, 0.1, rank, True)

    record = SensitivityRecord(
        SubsetMetric("top1", True, 90.0, 89.0, 64), "proxy", 0, "local", (node("b", 2), node("a", 1)), {}
    )
    assert [n.name for n in record.ranked()] == ["a", "b"]
    assert SensitivityRecord.from_json(record.to_json()) == record
    with pytest.raises(ReportError, match="does not hold a sensitivity record"):
        SensitivityRecord.from_json({k: v for k, v in record.to_json().items() if k != "metric"})


def test_an_llm_report_computes_its_increase_and_refuses_a_report_without_perplexities() -> None:
    report = LLMReport("x", PerplexityChange({"ppl": 10.0}, {"ppl": 10.5}), stability={"ok": True, "flagged": 0})
    assert report.perplexity.increase == pytest.approx(0.05) and report.stable is True
    assert LLMReport.from_json(report.to_json()) == report
    with pytest.raises(ReportError, match="perplexity.original/quantized.ppl missing"):
        LLMReport.from_json({"perplexity": {"original": {}}})
    with pytest.raises(ReportError, match="format 'deploy_opt.llm_quantize/0'"):
        LLMReport.from_json(report.to_json() | {"format": "deploy_opt.llm_quantize/0"})
