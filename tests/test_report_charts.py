"""The report's charts read at a glance, and every line of a build's story names the model that shipped (issue 31).

The SVG charts are parsed as XML; the calibration figure is inspected as a matplotlib Figure.
"""

from __future__ import annotations

import dataclasses
import json
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest
import tiny_onnx

from calibrators.activations.histogram import Histogram
from deploy_opt.analysis.compare import compare_backends, fixed_samples, output_metrics
from deploy_opt.analysis.comparison import ComparedModels
from deploy_opt.autotune.candidates import Candidate
from deploy_opt.autotune.trials import AutoSearch, Trial
from deploy_opt.config.build import CompareConfig
from deploy_opt.data.sources import Batch
from deploy_opt.pipeline.qat import auto_search_reason
from deploy_opt.report import build_page, charts
from deploy_opt.report.calibration_plot import display_bins, histogram_figure, plotted_tensors

SVG = "{http://www.w3.org/2000/svg}"


def _svg(text: str) -> ET.Element:
    start = text.index("<svg")
    return ET.fromstring(text[start : text.index("</svg>", start) + len("</svg>")])


def _texts(svg: ET.Element) -> list[str]:
    return ["".join(t.itertext()) for t in svg.iter(f"{SVG}text")]


def _trial(label_of: Candidate, drop: float, speedup: float, step: str = "placement") -> dict:
    return {
        "step": step,
        "label": label_of.label,
        "settings": label_of.to_json(),
        "drop": drop,
        "speedup": speedup,
        "quantized_nodes": 6,
        "seconds": 1.0,
    }


INPUTS = Candidate("inputs", "asymmetric", excluded=("a",))
OUTPUTS = Candidate("outputs", "symmetric", excluded=("a",))


def _auto_build() -> dict:
    """build.json of an auto search whose first accurate trial is not the one that shipped (the demo's story)."""
    trials = [_trial(INPUTS, 0.0, 7.1), _trial(OUTPUTS, 0.2, 7.8), _trial(OUTPUTS, 0.2, 7.6, "confirm")]
    return {
        "auto": {"chosen": OUTPUTS.to_json(), "verdict": "", "latency_batch": 32, "trials": trials},
        "config": {"gate": {"max_drop": 1.0}, "auto": {"min_gain": 1.02}},
        "qat": {"ran": False, "why": "x"},
        "metrics": {
            "name": "top1",
            "higher_is_better": True,
            "drop_vs": "ort_fp32",
            "samples": 300,
            "ort_fp32": 100.0,
            "ort_int8": 99.34,
            "torch_fp32": 100.0,
        },
    }


def test_accuracy_is_shown_as_the_drop_against_the_gate() -> None:
    svg = _svg(build_page._accuracy_latency(_auto_build()))
    bars = {
        rect.find(f"{SVG}title").text.split(":")[0]: rect
        for rect in svg.iter(f"{SVG}rect")
        if rect.get("class") == "drop"
    }
    limit = next(line for line in svg.iter(f"{SVG}line") if line.get("class") == "limit")
    zero = float(bars["torch FP32"].get("x"))
    # 100 and 99.34 no longer look the same: the INT8 bar spans 0.66 of the way to max_drop, FP32's is a sliver
    span = float(limit.get("x1")) - zero
    assert float(bars["ORT INT8 (shipped)"].get("width")) == pytest.approx(0.66 * span, rel=0.02)
    assert float(bars["torch FP32"].get("width")) <= 1.0
    assert "max_drop 1" in _texts(svg)


def test_the_trial_scatter_has_gridlines_the_max_drop_line_and_one_shipped_point() -> None:
    svg = _svg(build_page._auto_search(_auto_build()))
    lines = list(svg.iter(f"{SVG}line"))
    limits = [line for line in lines if line.get("class") == "limit"]
    horizontal = [line for line in limits if line.get("y1") == line.get("y2")]
    assert len(horizontal) == 1 and "max_drop 1" in _texts(svg)
    assert sum(line.get("stroke") == charts.GRID_COLOR for line in lines) >= 4
    marked = [c for c in svg.iter(f"{SVG}circle") if c.get("class") == "marked"]
    assert len(marked) == 1 and marked[0].find(f"{SVG}title").text.startswith(OUTPUTS.label)
    # the shipped label sits inside the frame: on the left of a point in the right half
    label = next(t for t in svg.iter(f"{SVG}text") if t.text == OUTPUTS.label)
    assert label.get("text-anchor") == "end" and float(label.get("x")) < float(svg.get("width"))


def test_the_max_drop_line_is_inside_the_plot_when_every_drop_is_zero() -> None:
    points = [charts.Point(2.0, 0.0, "a"), charts.Point(9.0, 0.0, "b", True)]
    svg = _svg(charts.scatter_chart("t", points, "x", "y", [charts.Limit("y", 1.0, "max_drop 1")]))
    limit = next(line for line in svg.iter(f"{SVG}line") if line.get("class") == "limit")
    assert 0 < float(limit.get("y1")) < float(svg.get("height"))


def test_the_sqnr_chart_says_how_many_tensors_it_shows() -> None:
    layers = [
        {
            "name": f"/encoder/layer.{i}/attention/self/query/MatMul_output_0",
            "node": f"n{i}",
            "quant_sqnr_db": 20.0 + i % 50,
        }
        for i in range(307)
    ]
    svg = _svg(build_page.sqnr_chart(layers, {}))
    assert sum(1 for _ in svg.iter(f"{SVG}rect")) == build_page.SQNR_SHOWN
    assert any("40 of 307 quantized tensors" in text for text in _texts(svg))
    small = _svg(build_page.sqnr_chart(layers[:12], {}))
    assert any("all 12 quantized tensors" in text for text in _texts(small))


def test_long_labels_are_shortened_to_fit_with_the_whole_name_in_the_tooltip() -> None:
    name = "model.encoder.layer.11.attention.output.dense: /encoder/layer.11/attention/output/dense/MatMul_0"
    svg = _svg(charts.bar_chart("SQNR", [name, "short"], {"SQNR": [30.0, 40.0]}, "dB"))
    label = next(t for t in svg.iter(f"{SVG}text") if t.find(f"{SVG}title") is not None)
    shown = label.text or ""
    assert label.find(f"{SVG}title").text == name
    assert shown.startswith("…") and name.endswith(shown[1:])
    assert len(shown) * charts.CHAR_PX <= float(label.get("x"))  # right-aligned at x: it starts inside the chart
    title = "a title longer than the default plot width, which must not be cut off at the right edge of it all"
    assert float(_svg(charts.bar_chart(title, ["a"], {"v": [1.0]}, "")).get("width")) >= len(title) * 7


def test_a_single_series_has_no_legend_that_just_says_value() -> None:
    svg = _svg(charts.bar_chart("latency", ["batch 1"], {"value": [1.0]}, "ms"))
    assert "value" not in _texts(svg)


def _hist(high: float) -> Histogram:
    return Histogram(np.ones(8), np.linspace(0.0, high, 9), 0.0, high)


def test_the_calibration_plot_leaves_out_tensors_that_are_not_quantized() -> None:
    import matplotlib.pyplot as plt

    hists = {"logits": _hist(27.0), "relu": _hist(9.0), "linear": _hist(12.0), "relu_1": _hist(4.0)}
    chosen = {name: (0.0, h.high) for name, h in hists.items()}
    quantized = {"relu", "relu_1"}
    assert plotted_tensors(hists, quantized) == ["relu", "relu_1"]
    fig = histogram_figure(hists, chosen, dict.fromkeys(hists, "minmax"), quantized)
    titles = [ax.get_title() for ax in fig.axes if ax.get_title()]
    plt.close(fig)
    assert titles == ["relu", "relu_1"]


@pytest.mark.parametrize("bins", [8, 256, 257, 2047, 2048, 8192])
def test_a_histogram_is_drawn_from_at_most_256_bins_that_keep_its_mass_and_span(bins: int) -> None:
    counts = np.random.default_rng(bins).integers(0, 1000, bins)
    hist = Histogram(counts, np.linspace(0.0, 5.0, bins + 1), 0.0, 5.0)
    shown, edges = display_bins(hist)
    assert shown.size <= 256 and edges.size == shown.size + 1 and shown.sum() == counts.sum()
    assert (edges[0], edges[-1]) == (0.0, 5.0) and np.all(np.diff(edges) > 0)
    if bins <= 256:
        assert shown is hist.counts and edges is hist.edges


def _search(chosen: Candidate | None) -> AutoSearch:
    def trial(candidate: Candidate, drop: float, speedup: float, step: str = "placement") -> Trial:
        return Trial(step, candidate, 99.0, drop, None, 1.0, speedup, 6, 1.0)

    trials = (trial(INPUTS, 0.0, 0.9), trial(OUTPUTS, 0.2, 7.8), trial(OUTPUTS, 0.2, 7.6, "confirm"))
    return AutoSearch(chosen, trials, "", 10.0, 32)


def test_the_qat_reason_names_the_candidate_that_shipped() -> None:
    why = auto_search_reason(_search(OUTPUTS), 1.0)
    assert why is not None and f"{OUTPUTS.label} ships" in why and INPUTS.label not in why
    fp32 = auto_search_reason(_search(None), 1.0)
    assert fp32 is not None and "FP32 ships" in fp32
    assert auto_search_reason(None, 1.0) is None


def test_the_report_names_what_shipped_from_build_json_settings() -> None:
    build = _auto_build()
    assert build_page.shipped_label(build["auto"]) == OUTPUTS.label
    assert build_page.shipped_model(build) == f"{OUTPUTS.label} (auto search)"
    build["auto"]["chosen"] = None
    assert build_page.shipped_model(build).startswith("FP32")


def test_a_cosine_build_reports_no_top1_agreement(tiny_model: Path, tmp_path: Path) -> None:
    batches = [Batch(inputs, label) for inputs, label in tiny_onnx.evaluation()]
    samples = fixed_samples(batches, 16, 0)
    record = compare_backends(ComparedModels(tiny_model, tiny_model), samples, tmp_path, config=CompareConfig(), seed=0)
    outputs = [o for b in record.backends.values() for o in (b.outputs or {}).values()]
    assert outputs and all("top1_agreement" not in o for o in outputs)
    scores = np.random.default_rng(0).normal(size=(8, 4))
    assert output_metrics(scores, scores)["top1_agreement"] == 1.0  # class scores keep it
    # a page rebuilt from an older compare.json of an embedding build leaves the column out
    old = json.loads((tmp_path / "compare.json").read_text())
    for backend in old["backends"].values():
        for numbers in (backend.get("outputs") or {}).values():
            numbers["top1_agreement"] = 1.0
    (tmp_path / "compare.json").write_text(json.dumps(old))
    assert "top-1 agreement" not in build_page._comparison(tmp_path, {}, "cosine")
    assert "top-1 agreement" in build_page._comparison(tmp_path, {}, "top1")


def test_auto_qat_does_not_start_when_ptq_is_far_from_the_gate() -> None:
    from deploy_opt.pipeline.qat import QAT_REACH

    def search(drop: float) -> AutoSearch:
        return AutoSearch(None, (Trial("placement", INPUTS, 80.0, drop, None, 1.0, 1.5, 6, 1.0),), "", 10.0, 32)

    far = auto_search_reason(search(QAT_REACH * 1.0 + 0.5), 1.0)
    assert far is not None and "does not close that much" in far and INPUTS.label in far
    assert auto_search_reason(search(2.0), 1.0) is None  # within reach: QAT trains


def test_auto_qat_trains_only_within_what_the_search_left_of_its_budget(tiny_model: Path, tmp_path: Path) -> None:
    from conftest import write_config

    from deploy_opt.config.profiles import load_build_config
    from deploy_opt.config.setup import SearchSettings
    from deploy_opt.pipeline.qat import AUTO_QAT_S, MIN_AUTO_QAT_S, _within_auto_budget, budget_reason

    def search(seconds: float) -> AutoSearch:
        trials = (Trial("placement", INPUTS, 80.0, 2.0, None, 1.0, 1.5, 6, 1.0),)
        return AutoSearch(None, trials, "", seconds, 32, work_s=seconds)  # the budget counts work seconds

    spent = budget_reason(search(240.0 - MIN_AUTO_QAT_S + 1.0), 240.0)
    assert spent is not None and "auto.budget_s 240" in spent and "enabled: true" in spent
    assert budget_reason(search(100.0), 240.0) is None and budget_reason(None, 240.0) is None
    data = 'data: {calibration: "@TINY@:calibration", evaluation: "@TINY@:evaluation", metric: cosine}\n'
    text = f"name: t\nmodel: {{onnx: {tiny_model}}}\n" + data
    config, _ = load_build_config(write_config(tmp_path, text), "cpu-server", [])
    assert config.quantization.qat.enabled == "auto" and config.auto.budget_s == 240.0
    settings = SearchSettings.of(config)
    assert _within_auto_budget(settings, search(200.0)).setup.quantization.qat.budget_s == 40.0
    assert _within_auto_budget(settings, None).setup.quantization.qat.budget_s == AUTO_QAT_S  # manual: no search
    qat = dataclasses.replace(config.quantization.qat, enabled=True)
    asked = dataclasses.replace(config, quantization=dataclasses.replace(config.quantization, qat=qat))
    within = _within_auto_budget(SearchSettings.of(asked), search(230.0))
    assert within.setup.quantization.qat.budget_s == 600.0  # asked for: its own budget
