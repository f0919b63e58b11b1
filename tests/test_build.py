"""End to end: the demo, a transformer with dynamic batch and sequence axes, and an ONNX file brought as is."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from conftest import assert_qat_no_worse_than_its_start, tiny_cnn_config, write_config

from calibrators.scales.format import load_scale_file
from deploy_opt.analysis.align import verify_alignment
from deploy_opt.config.profiles import example_config, load_build_config
from deploy_opt.pipeline.build import run_build
from dopt_common.errors import CalibrationError
from dopt_common.files import sha256_file
from dopt_common.ort import usable_threads
from exporters.ort.qdq import compare_scales, read_qdq_scales

OUTPUTS = {
    "model.onnx",
    "model.int8.onnx",
    "scales.json",
    "build.json",
    "summary.md",
    "calibration.png",
    "encodings.json",
    "compat.json",
    "compat.md",
    "compare.json",
    "compare_samples.npz",
}


def _cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "deploy_opt", *args], capture_output=True, text=True, cwd=cwd)


def _assert_consistent(out: Path) -> dict:
    """Every output exists, hashes match build.json, and the Q/DQ model carries scales.json bit for bit."""
    assert OUTPUTS <= {p.name for p in out.iterdir()}
    assert not list(out.parent.glob(".*partial*")), "a staging folder was left behind"
    build = json.loads((out / "build.json").read_text())
    for name, entry in build["artifacts"].items():
        assert sha256_file(out / name) == entry["sha256"], name
    scales = load_scale_file(out / "scales.json")
    if scales.dynamic:  # ORT's dynamic INT8 shipped: its weights and run-time quantized tensors, read back
        from exporters.ort.dynamic_read import compare_dynamic, read_dynamic_model

        diff = compare_dynamic(scales, read_dynamic_model(out / "model.int8.onnx"))
    else:
        diff = compare_scales(scales.tensors, read_qdq_scales(out / "model.int8.onnx"))
    assert diff.ok, diff.summary()
    # The scales were computed on model.onnx, or on its SmoothQuant-ed graph, which names model.onnx as its source.
    smoothing = scales.provenance.get("smoothing")
    if smoothing:
        assert smoothing["smoothed_sha256"] == scales.provenance["model_sha256"]
    source = smoothing["source_sha256"] if smoothing else scales.provenance["model_sha256"]
    if not scales.provenance.get("qat"):  # QAT's scales were computed on its trained graph, not on model.onnx
        assert source == build["artifacts"]["model.onnx"]["sha256"]
    onnx.checker.check_model(str(out / "model.int8.onnx"))
    # align verify passes on the published folder, as build.json says, and compare.json names no divergence.
    assert build["alignment"]["verdict"].startswith("pass"), build["alignment"]
    assert verify_alignment(out).ok
    assert build["comparison"]["first_divergence"] is None
    compat = json.loads((out / "compat.json").read_text())
    graph = onnx.load(str(out / "model.onnx"), load_external_data=False).graph
    assert [n["name"] for n in compat["nodes"]] == [n.name for n in graph.node]
    assert all({"ort_cpu", "ort_cuda", "tensorrt", "min_opset", "min_tensorrt"} <= set(n) for n in compat["nodes"])
    return build


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess[str], Path]:
    root = tmp_path_factory.mktemp("reports")
    return _cli("build", "--profile", "ci", "--output-dir", str(root), "-q"), root / "digits-mlp"


@pytest.mark.slow
def test_demo_build_writes_every_output_and_keeps_accuracy(demo: tuple) -> None:
    result, out = demo
    assert result.returncode == 0, result.stderr
    build = _assert_consistent(out)
    metrics = build["metrics"]
    # 450 evaluation digits: the auto search decides on a seeded 225, the gate judges the other 225
    assert metrics["name"] == "top1" and metrics["samples"] == 225 and metrics["decision"]["samples"] == 225
    assert metrics["drop_ci95"][0] <= metrics["drop"] <= metrics["drop_ci95"][1]
    assert build["calibration"]["stratify"] == "label" and len(build["calibration"]["per_stratum"]) == 10
    assert metrics["ort_fp32"] > 90.0
    assert metrics["drop"] <= 1.0
    assert abs(metrics["torch_fp32"] - metrics["ort_fp32"]) < 0.5
    for size in ("1", "32"):
        row = build["benchmark"]["batches"][size]
        assert row["speedup"] == pytest.approx(row["ort_fp32"]["median_ms"] / row["ort_int8"]["median_ms"])
        assert row["speedup_ci95"][0] <= row["speedup_ci95"][1]
    # the ci profile's 2 threads, as many as this worker's cores allow (conftest pins each xdist worker)
    assert build["benchmark"]["threads"] == usable_threads(2)
    assert set(build["timings_s"]) >= {"export", "auto_search", "evaluate", "benchmark"}
    assert build["versions"]["onnxruntime"] == ort.__version__
    assert build["gate"]["passed"] is True
    assert build["quantization"]["activations"] == "asymmetric"
    assert build["config"]["profile"] == "ci" and build["seed"] == 0
    assert "speedup" in (out / "summary.md").read_text()
    assert "gate: PASSED" in result.stdout


@pytest.mark.slow
def test_gate_on_the_demo_build(demo: tuple, tmp_path: Path) -> None:
    _, out = demo
    assert _cli("gate", str(out / "build.json"), "--max-drop", "1.0", "--min-speedup", "0.01").returncode == 0
    assert _cli("gate", str(out / "build.json"), "--min-speedup", "1000").returncode == 1
    assert _cli("gate", str(out / "missing.json")).returncode == 2


@pytest.mark.slow
def test_failed_gate_still_writes_every_artifact_and_exits_1(tmp_path: Path) -> None:
    result = _cli(
        "build",
        "--profile",
        "ci",
        "--set",
        "gate.max_drop=0",
        "--set",
        "gate.min_speedup=1000",
        "--set",
        "quantization.mode=manual",  # the gate's failure is under test, not a search for max_drop 0
        "--output-dir",
        str(tmp_path),
        "-q",
    )
    assert result.returncode == 1, result.stderr
    build = _assert_consistent(tmp_path / "digits-mlp")
    assert build["gate"]["passed"] is False


@pytest.mark.slow
def test_minilm_builds_with_dynamic_batch_and_sequence_and_qat_ends_no_worse_than_its_start(tmp_path: Path) -> None:
    """One MiniLM build (the slowest build of the suite, so one does for both): dynamic batch and sequence through
    the export, the stratified calibration and the Q/DQ model; and QAT, whose model scores no worse on the
    decision samples than its PTQ start (the digits half of that check is tests/test_qat.py's)."""
    qat = ["quantization.qat.steps=12", "quantization.qat.batch_size=8", "quantization.qat.eval_every=6"]
    config, profile = load_build_config(
        example_config("minilm"),
        "ci",
        ["calibration.samples=48", "data.eval_samples=32", "benchmark.enabled=false"]
        + ["quantization.mode=manual", "quantization.qat.enabled=true", *qat],
    )
    result = run_build(config, profile, tmp_path, progress=False)
    build = _assert_consistent(result.out_dir)
    assert_qat_no_worse_than_its_start(build)
    assert build["metrics"]["name"] == "cosine" and build["metrics"]["samples"] == 16  # the other 16 decide
    assert build["metrics"]["decision"]["samples"] == 16 and build["metrics"]["resolution"] is None
    assert build["calibration"]["stratify"] == "deploy_opt.demo.minilm:length_stratum"
    assert build["calibration"]["chosen"] == 48 and len(build["calibration"]["per_stratum"]) >= 3
    assert build["metrics"]["ort_fp32"] == pytest.approx(100.0, abs=1e-3)
    assert 80.0 < build["metrics"]["ort_int8"] <= 100.0
    model = onnx.load(str(result.out_dir / "model.onnx"), load_external_data=False)
    dims = {i.name: [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim] for i in model.graph.input}
    assert dims == {"input_ids": ["batch", "seq"], "attention_mask": ["batch", "seq"]}
    int8 = ort.InferenceSession(str(result.out_dir / "model.int8.onnx"), providers=["CPUExecutionProvider"])
    for batch, seq in ((1, 5), (3, 40)):
        ids = np.random.default_rng(0).integers(1000, 2000, (batch, seq), dtype=np.int64)
        (emb,) = int8.run(None, {"input_ids": ids, "attention_mask": np.ones_like(ids)})
        assert emb.shape == (batch, 384) and np.all(np.isfinite(emb))


@pytest.mark.slow
@pytest.mark.parametrize("scheme", ["asymmetric", "symmetric"])
def test_onnx_file_not_made_by_the_exporter_builds(tmp_path: Path, tiny_model: Path, scheme: str) -> None:
    path = write_config(
        tmp_path,
        f"""
name: tiny
model:
  onnx: {tiny_model.name}
data:
  calibration: "@TINY@:calibration"
  evaluation: "@TINY@:evaluation"
  metric: top1
quantization:
  mode: manual
  activations: {scheme}
  op_types: [MatMul]
benchmark:
  batch_sizes: [1, 8]
  repeats: 5
  warmup: 1
gate:
  max_drop: 5.0
  min_speedup: null
""",
    )
    config, profile = load_build_config(path, "cpu-server", [])
    result = run_build(config, profile, tmp_path / "reports", progress=False)
    build = _assert_consistent(result.out_dir)
    assert build["export"]["exporter"] == "none (model.onnx)"
    parity = build["export"]["parity"]  # the imported model against the user's file, both on ORT
    assert parity["reference"].startswith("the original model.onnx") and parity["max_abs"] <= parity["tolerance"]
    assert "torch_fp32" not in build["metrics"] and build["metrics"]["drop"] <= 5.0
    scales = load_scale_file(result.out_dir / "scales.json")
    activations = [t for t in scales.tensors.values() if t.role == "activation"]
    assert activations and all(t.symmetric == (scheme == "symmetric") for t in activations)
    assert all(t.dtype == ("int8" if scheme == "symmetric" else "uint8") for t in activations)
    assert result.gate.passed


@pytest.mark.slow
@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_factory_and_checkpoint_build_with_either_exporter(tmp_path: Path, exporter: str) -> None:
    import tiny_torch
    import torch

    model = tiny_torch.build_model()
    with torch.no_grad():
        model[0].weight.mul_(1.5)  # the checkpoint differs from the factory's weights, so loading it matters
    torch.save(model.state_dict(), tmp_path / "weights.pt")
    source = Path(tiny_torch.__file__)
    path = write_config(
        tmp_path,
        f"""
name: tiny-cnn
model:
  factory: "{source}:build_model"
  checkpoint: weights.pt
  inputs: [{{name: image, shape: [batch, 1, 8, 8], dtype: float32}}]
  outputs: [scores]
data:
  calibration: "{source}:calibration"
  evaluation: "{source}:evaluation"
export:
  exporter: {exporter}
benchmark:
  enabled: false
gate:
  max_drop: 100
""",
    )
    config, profile = load_build_config(path, "ci", [])
    result = run_build(config, profile, tmp_path / "reports", progress=False)
    build = _assert_consistent(result.out_dir)
    assert build["export"]["exporter"] == exporter
    assert build["export"]["opset"] == (18 if exporter == "dynamo" else 17)
    assert build["export"]["parity"]["max_abs"] < 1e-4
    fp32 = ort.InferenceSession(str(result.out_dir / "model.onnx"), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(5).normal(0, 1, (3, 1, 8, 8)).astype(np.float32)
    with torch.no_grad():
        np.testing.assert_allclose(fp32.run(None, {"image": x})[0], model(torch.from_numpy(x)).numpy(), atol=1e-4)
    assert [o.name for o in fp32.get_outputs()] == ["scores"]


@pytest.mark.slow
def test_large_models_use_external_data(tmp_path: Path, tiny_model: Path) -> None:
    path = write_config(
        tmp_path,
        f"""
name: tiny
model: {{onnx: {tiny_model.name}}}
data: {{calibration: "@TINY@:calibration", evaluation: "@TINY@:evaluation"}}
export: {{external_data_mb: 0}}
benchmark: {{enabled: false}}
""",
    )
    config, profile = load_build_config(path, "ci", [])
    result = run_build(config, profile, tmp_path / "reports", progress=False)
    names = {p.name for p in result.out_dir.iterdir()}
    assert {"model.onnx.data", "model.int8.onnx.data"} <= names
    build = _assert_consistent(result.out_dir)
    assert "model.int8.onnx.data" in build["artifacts"]
    session = ort.InferenceSession(str(result.out_dir / "model.int8.onnx"), providers=["CPUExecutionProvider"])
    assert session.run(None, {"x": np.zeros((2, 16), np.float32)})[0].shape == (2, 4)


@pytest.mark.slow
def test_overlapping_calibration_and_evaluation_is_refused(tmp_path: Path) -> None:
    (tmp_path / "overlap.py").write_text(
        "import tiny_torch\n"
        "def calibration():\n    return tiny_torch.calibration()\n"
        "def evaluation():\n    return tiny_torch.calibration()[:2] + tiny_torch.evaluation()\n",
        encoding="utf-8",
    )
    path = tiny_cnn_config(tmp_path, "overlap.py:calibration", "overlap.py:evaluation")
    config, profile = load_build_config(path, "ci", [])
    with pytest.raises(CalibrationError, match="16 calibration samples also appear in the evaluation data"):
        run_build(config, profile, tmp_path / "reports", progress=False)
    assert not (tmp_path / "reports" / "tiny-cnn").exists()
    assert list((tmp_path / "reports").iterdir()) == []
