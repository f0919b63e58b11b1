"""The ``sensitivity`` command's own folder, its resolution statement, and ``gate`` on a build without benchmark."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import tiny_onnx
from conftest import write_config

from deploy_opt.analysis.sensitivity.resolution import Resolution
from deploy_opt.cli import main
from deploy_opt.pipeline.sensitivity import build_figures
from dopt_common.ownership import MARKER

FILES = {"sensitivity.json", "sensitivity.png", "sensitivity.html", MARKER}


@pytest.mark.parametrize(
    "metric,samples,drawn_from,max_drop,step,coarser,fix",
    [
        ("top1", 45, 450, 1.0, 100 / 45, True, "--set sensitivity.subset=0.23 (at least 100 samples)"),
        ("top1", 200, 450, 1.0, 0.5, False, None),
        ("top1", 10, 50, 1.0, 10.0, True, "even all 50 samples step by 2.00 points"),
        ("top1", 26, 256, 0.0, 100 / 26, True, "read the drops as counts"),
        ("cosine", 45, 450, 1.0, None, False, None),
    ],
)
def test_the_resolution_is_the_step_of_one_sample_against_the_gate(
    metric: str, samples: int, drawn_from: int, max_drop: float, step: float | None, coarser: bool, fix: str | None
) -> None:
    resolution = Resolution(metric=metric, samples=samples, drawn_from=drawn_from, subset=0.1, max_drop=max_drop)
    assert resolution.step == (None if step is None else pytest.approx(step))
    assert resolution.coarser_than_gate is coarser
    assert (resolution.fix() is None) if fix is None else fix in resolution.fix()
    assert f"{samples} of the {drawn_from} evaluation samples" in resolution.text()
    record = resolution.to_json()
    assert record["samples"] == samples and record["coarser_than_gate"] is coarser
    assert json.loads(json.dumps(record, allow_nan=False)) == record


def _tiny_config(tmp_path: Path) -> Path:
    model = tiny_onnx.make_model(tmp_path / "tiny.onnx")
    return write_config(
        tmp_path,
        f"""
name: tiny
model: {{onnx: {model.name}}}
data: {{calibration: "@TINY@:calibration", evaluation: "@TINY@:evaluation", metric: top1}}
quantization: {{mode: manual}}
benchmark: {{enabled: false}}
gate: {{max_drop: 1.0}}
""",
    )


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


def test_sensitivity_after_build_leaves_the_build_alone(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config, reports = _tiny_config(tmp_path), tmp_path / "reports"
    common = [str(config), "--profile", "ci", "--output-dir", str(reports), "-q"]
    assert main(["build", *common]) in (0, 1)  # 1: the gate failed; the folder is written either way
    before = _snapshot(reports / "tiny")
    assert {"build.json", "model.int8.onnx"} <= set(before)
    capsys.readouterr()

    assert main(["sensitivity", *common, "--mode", "exhaustive"]) == 0
    out = capsys.readouterr().out

    assert _snapshot(reports / "tiny") == before  # build.json, model.int8.onnx and the rest, byte for byte
    folder = reports / "tiny-sensitivity"
    assert {p.name for p in folder.iterdir()} == FILES
    assert sorted(p.name for p in reports.iterdir()) == ["tiny", "tiny-sensitivity"]  # no staging, no lock left
    build = json.loads((reports / "tiny" / "build.json").read_text())
    record = json.loads((folder / "sensitivity.json").read_text())

    # The same FP32 (and INT8) figure as the build, on the build's samples; the subset's beside it.
    assert record["build"]["source"] == str(reports / "tiny" / "build.json")
    assert record["build"]["ort_fp32"] == build["metrics"]["ort_fp32"]
    assert record["build"]["ort_int8"] == build["metrics"]["ort_int8"]
    assert record["build"]["samples"] == build["metrics"]["samples"]
    samples = record["metric"]["subset_samples"]
    resolution = record["resolution"]
    assert resolution["samples"] == samples and 0 < samples < resolution["drawn_from"]
    assert resolution["points_per_sample"] == pytest.approx(100 / samples)
    assert resolution["gate_max_drop"] == 1.0 and resolution["coarser_than_gate"] is (100 / samples > 1.0)

    page = (folder / "sensitivity.html").read_text()
    assert f"FP32 <b>{build['metrics']['ort_fp32']:.3f}</b>" in page
    assert f"subset of {samples} samples" in page
    assert f"steps of {100 / samples:.2f} points" in page and "coarser than the gate&#x27;s max_drop 1" in page
    assert f"FP32 {build['metrics']['ort_fp32']:.3f}" in out and f"steps of {100 / samples:.2f} points" in out
    assert f"report: {folder}/sensitivity.html" in out


def _build(fp32: float, int8_sha: str = "b", gate: float = 1.0, threads: int = 1) -> dict:
    return {
        "metrics": {"ort_fp32": fp32, "ort_int8": fp32 - 1, "samples": 256},
        "artifacts": {"model.onnx": {"sha256": "a"}, "model.int8.onnx": {"sha256": int8_sha}},
        "config": {"gate": {"max_drop": gate}, "benchmark": {"threads": threads}, "runtime": {"threads": None}},
    }


@pytest.mark.parametrize(
    "published,why",
    [
        (_build(97.56, threads=4), None),  # benchmark settings are the command's own: still the same build
        ({**_build(97.56), "config": {"gate": {"max_drop": 1.0}}}, None),  # build.json from before runtime/benchmark
        (None, "no build.json"),
        (_build(97.56, gate=2.0), "another config"),
        (_build(97.56, int8_sha="other"), "model.int8.onnx is not the model analyzed"),
    ],
)
def test_the_page_quotes_the_published_build_only_when_it_built_these_models(
    tmp_path: Path, published: dict | None, why: str | None
) -> None:
    built = _build(95.0)  # the build the command ran (another sample split may score it otherwise)
    figures = build_figures(published, built, tmp_path / "build.json")
    if why is None:
        assert figures["ort_fp32"] == 97.56 and figures["source"] == str(tmp_path / "build.json")
    else:
        assert figures["ort_fp32"] == 95.0 and why in figures["why"] and "this command ran" in figures["source"]


def test_gate_on_a_build_without_benchmark_says_speed_not_measured(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "tiny"
    folder.mkdir()
    build = {
        "name": "tiny",
        "metrics": {"name": "top1", "ort_fp32": 97.5, "ort_int8": 97.2, "drop": 0.3},
        "benchmark": None,
        "config": {"gate": {"max_drop": 1.0, "min_speedup": 1.0}},
    }
    (folder / "build.json").write_text(json.dumps(build))

    assert main(["gate", str(folder)]) == 0  # the config's min_speedup: not measured, as the build's own gate
    assert "SKIP  speed not measured" in capsys.readouterr().out

    assert main(["gate", str(folder), "--min-speedup", "1"]) == 0  # the flag too: said, not judged
    assert "SKIP  speed not measured" in capsys.readouterr().out
