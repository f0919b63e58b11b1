"""The LLM gate judges the perplexity increase by its paired bootstrap interval over evaluation windows, so a
point value that one calibration seed moves across the limit cannot flip the verdict."""

from __future__ import annotations

import math

import numpy as np
import pytest

from deploy_opt.evaluation.uncertainty import perplexity_increase_interval
from deploy_opt.report.gate import apply_ppl_gate
from deploy_opt.report.llm_report import LLMReport
from dopt_common.errors import ReportError


def _windows(nll_per_token: np.ndarray, tokens: int = 256) -> list[list[float]]:
    return [[float(value * tokens), float(tokens)] for value in nll_per_token]


def _record(windows: list[list[float]]) -> dict:
    nll = sum(w[0] for w in windows) / sum(w[1] for w in windows)
    return {"ppl": math.exp(nll), "nll": nll, "tokens": int(sum(w[1] for w in windows)), "window_nll": windows}


def _report(original: list[list[float]], quantized: list[list[float]]) -> LLMReport:
    return LLMReport.from_json(
        {"name": "t", "perplexity": {"original": _record(original), "quantized": _record(quantized)}}
    )


def _pair(increase: float, spread: float, count: int = 16, seed: int = 0) -> tuple[list, list]:
    rng = np.random.default_rng(seed)
    base = rng.uniform(2.0, 3.5, count)  # windows of very different difficulty: shared by both models
    shift = math.log1p(increase) + rng.normal(0.0, spread, count)
    shift -= shift.mean() - math.log1p(increase)  # the point increase is exactly ``increase``
    return _windows(base), _windows(base + shift)


def test_interval_is_paired_and_centred_on_the_point_increase() -> None:
    original, quantized = _pair(0.10, 0.002)
    interval = perplexity_increase_interval(original, quantized)
    assert interval.value == pytest.approx(0.10, abs=1e-9)
    assert interval.low < 0.10 < interval.high and interval.high - interval.low < 0.005  # shared difficulty cancels
    with pytest.raises(ValueError, match="different windows"):
        perplexity_increase_interval(original, [[w[0], w[1] + 1] for w in quantized])


def test_gate_passes_only_when_the_interval_is_within_the_limit() -> None:
    tight = apply_ppl_gate(_report(*_pair(0.10, 0.002)), "11%")
    assert tight.passed and "95% CI" in tight.criteria[0].text and "16 windows" in tight.criteria[0].text
    noisy = apply_ppl_gate(_report(*_pair(0.10, 0.08)), "11%")  # the same point value, windows disagree
    assert not noisy.passed and "not shown within +11%" in noisy.criteria[0].text
    above = apply_ppl_gate(_report(*_pair(0.15, 0.002)), "11%")
    assert not above.passed and "above +11%" in above.criteria[0].text


def test_a_seed_that_moves_the_point_across_the_limit_does_not_flip_the_verdict() -> None:
    """Two quantized models 0.6 points apart around an 11% limit: a point-value gate passes one and fails the
    other; judged by the interval, both fail (neither is shown within the limit)."""
    verdicts = []
    for increase in (0.107, 0.113):
        original, quantized = _pair(increase, 0.05, seed=3)
        verdicts.append(apply_ppl_gate(_report(original, quantized), "11%").passed)
        assert (increase <= 0.11) == (increase == 0.107)  # the point value alone would flip
    assert verdicts == [False, False]


def test_reports_without_windows_are_judged_on_the_point_value_and_say_so() -> None:
    data = {"name": "t", "perplexity": {"original": {"ppl": 10.0}, "quantized": {"ppl": 10.5}}}
    result = apply_ppl_gate(LLMReport.from_json(data), "10%")
    assert result.passed and "point value: no per-window scores" in result.criteria[0].text
    original, quantized = _pair(0.05, 0.01)
    broken = _report(original, [[w[0], w[1] * 2] for w in quantized])
    with pytest.raises(ReportError, match="do not pair"):
        apply_ppl_gate(broken, "10%")
