"""One home for SQNR, noise dB and cosine, with one convention: no noise is +inf in memory and null in JSON."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest

from deploy_opt.analysis.compare import output_metrics
from deploy_opt.analysis.compare_layers import PairStats
from deploy_opt.analysis.sensitivity.analyze import _cosine, _sqnr
from deploy_opt.evaluation.numerics import cosine_similarity, json_db, noise_db, power_db, sqnr_db

REPO = Path(__file__).resolve().parents[1]


def test_the_definition_and_its_edges() -> None:
    reference = np.array([3.0, 4.0])
    assert sqnr_db(reference, reference + [0.5, 0.0]) == pytest.approx(10 * math.log10(25 / 0.25))
    assert sqnr_db(reference, reference) == math.inf
    assert noise_db(0.01) == pytest.approx(20.0) and noise_db(0.0) == math.inf
    assert power_db(0.0, 1.0) < -200  # noise against a silent reference: very low, finite
    assert cosine_similarity(np.zeros(3), np.zeros(3)) == 1.0 and cosine_similarity(np.zeros(3), np.ones(3)) == 0.0
    assert json_db(math.inf) is None and json_db(float("nan")) is None and json_db(12.345678) == 12.3457
    json.dumps([json_db(x) for x in (math.inf, 1.0)], allow_nan=False)


def test_every_report_agrees_on_identical_and_on_noisy_tensors() -> None:
    rng = np.random.default_rng(0)
    a = rng.normal(size=(4, 16)).astype(np.float32)
    b = a + rng.normal(scale=0.05, size=a.shape).astype(np.float32)
    layers = PairStats()
    layers.add(a, b)
    expected = sqnr_db(a, b)
    assert _sqnr(a, b) == pytest.approx(expected)  # sensitivity's proxy
    assert layers.sqnr_db == pytest.approx(expected)  # per-layer compare
    assert output_metrics(a, b, class_scores=False)["sqnr_db"] == pytest.approx(expected, abs=1e-4)  # compare.json
    assert _cosine(a, b) == pytest.approx(cosine_similarity(a, b))
    same = PairStats()
    same.add(a, a)
    assert _sqnr(a, a) == same.sqnr_db == math.inf
    assert output_metrics(a, a, class_scores=False)["sqnr_db"] is None


def test_no_other_module_computes_decibels() -> None:
    found = [
        f"{path.relative_to(REPO)}:{number}"
        for package in ("deploy_opt", "calibrators", "exporters", "dopt_common")
        for path in (REPO / package).rglob("*.py")
        if path.name != "numerics.py"
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if re.search(r"\blog10\(", line) and "floor(" not in line  # charts.py's tick spacing is not a dB figure
    ]
    assert found == []
