"""The gate: exit 0 on pass, 1 on fail, 2 on an unusable report; JUnit output."""

from __future__ import annotations

import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from deploy_opt.report.build_record import BuildRecord
from deploy_opt.report.gate import GateResult, apply_gate
from deploy_opt.report.outcome import GateSettings
from dopt_common.errors import ReportError


def _judge(
    build: dict, max_drop: float | None, min_speedup: float | None, speedup_batch: int | None = None, **kw: bool
) -> GateResult:
    """``apply_gate`` on a build.json document, with the thresholds the gate command would pass."""
    thresholds = GateSettings(max_drop, min_speedup, speedup_batch, kw.get("allow_fp32", False))
    return apply_gate(BuildRecord.from_json(build), thresholds)


def _build_json(tmp_path: Path, drop: float = 0.4, speedup: float = 1.8, **extra: object) -> Path:
    build = {
        "name": "toy",
        "metrics": {"name": "top1", "ort_fp32": 97.0, "ort_int8": 97.0 - drop, "drop": drop},
        "benchmark": {"batches": {"1": {"speedup": 1.1}, "32": {"speedup": speedup}}},
        "config": {"gate": {"max_drop": 1.0, "min_speedup": 1.0, "speedup_batch": None}},
        **extra,
    }
    path = tmp_path / "build.json"
    path.write_text(json.dumps(build))
    return path


def _gate(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "deploy_opt", "gate", *args], capture_output=True, text=True)


def test_gate_passes_with_exit_0(tmp_path: Path) -> None:
    result = _gate(str(_build_json(tmp_path)), "--max-drop", "1.0", "--min-speedup", "1.0")
    assert result.returncode == 0, result.stderr
    assert "PASS  top1 drop 0.400 points" in result.stdout
    assert "PASS  INT8 speedup 1.80x at batch 32" in result.stdout


@pytest.mark.parametrize(
    "args,failing",
    [
        (["--max-drop", "0.1"], "FAIL  top1 drop 0.400"),
        (["--min-speedup", "2.5"], "FAIL  INT8 speedup 1.80x"),
        (["--min-speedup", "1.5", "--speedup-batch", "1"], "FAIL  INT8 speedup 1.10x at batch 1"),
    ],
)
def test_gate_fails_with_exit_1(tmp_path: Path, args: list[str], failing: str) -> None:
    result = _gate(str(_build_json(tmp_path)), *args)
    assert result.returncode == 1
    assert failing in result.stdout
    assert "gate: FAILED" in result.stdout


def test_gate_defaults_to_the_builds_own_thresholds(tmp_path: Path) -> None:
    assert _gate(str(_build_json(tmp_path, drop=0.5))).returncode == 0
    assert _gate(str(_build_json(tmp_path, drop=1.5))).returncode == 1
    assert _gate(str(_build_json(tmp_path, speedup=0.9))).returncode == 1


@pytest.mark.parametrize(
    "content,message",
    [
        (None, "does not exist"),
        ("{not json", "not readable JSON"),
        ('{"name": "x"}', "no 'metrics' section"),
    ],
)
def test_gate_unusable_report_exits_2(tmp_path: Path, content: str | None, message: str) -> None:
    path = tmp_path / "build.json"
    if content is not None:
        path.write_text(content)
    result = _gate(str(path), "--max-drop", "1")
    assert result.returncode == 2
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_gate_without_benchmark_does_not_judge_speed(tmp_path: Path) -> None:
    path = _build_json(tmp_path, benchmark=None)
    result = _gate(str(path), "--min-speedup", "1")
    assert result.returncode == 0, result.stderr  # as the build's own gate: speed left out, said so
    assert "SKIP  speed not measured" in result.stdout
    with pytest.raises(ReportError, match="no speedup at batch 8"):
        _judge(json.loads(_build_json(tmp_path).read_text()), None, 1.0, 8)


def test_gate_writes_junit(tmp_path: Path) -> None:
    junit = tmp_path / "out" / "gate.xml"
    result = _gate(str(_build_json(tmp_path)), "--max-drop", "0.1", "--min-speedup", "1", "--junit", str(junit))
    assert result.returncode == 1
    suite = ET.parse(junit).getroot()
    assert suite.tag == "testsuite" and suite.get("tests") == "2" and suite.get("failures") == "1"
    cases = {c.get("name"): c for c in suite.iter("testcase")}
    assert cases["max_drop"].find("failure") is not None
    assert cases["min_speedup"].find("failure") is None


def test_a_build_with_no_quantized_node_fails_unless_fp32_is_allowed() -> None:
    """A model.int8.onnx that quantizes nothing is the FP32 model: never reported as an INT8 pass."""
    build = {"metrics": {"name": "top1", "drop": 0.0}, "quantization": {"quantized_nodes": 0}}
    refused = _judge(build, 1.0, None)
    assert not refused.passed
    assert any(c.name == "int8_nodes" and "0 nodes" in c.text and "allow_fp32" in c.text for c in refused.criteria)
    allowed = _judge(build, 1.0, None, allow_fp32=True)
    assert allowed.passed and any("FP32 ships" in c.text for c in allowed.criteria)
    quantized = {**build, "quantization": {"quantized_nodes": 3}}
    assert _judge(quantized, 1.0, None).passed
    assert [c.name for c in _judge(quantized, 1.0, None).criteria] == ["max_drop"]


def test_the_speed_of_an_fp32_model_against_itself_is_not_judged() -> None:
    bench = {"benchmark": {"batches": {"32": {"speedup": 0.97}}}}
    fp32 = {"metrics": {"name": "top1", "drop": 0.0}, "quantization": {"quantized_nodes": 0}, **bench}
    speed = next(c for c in _judge(fp32, 1.0, 1.0, allow_fp32=True).criteria if c.name == "min_speedup")
    assert speed.passed and "not judged" in speed.text
    int8 = {**fp32, "quantization": {"quantized_nodes": 2}}
    assert not next(c for c in _judge(int8, 1.0, 1.0).criteria if c.name == "min_speedup").passed


def test_the_summary_counts_int8_nodes_and_flags_unrecognised_weights() -> None:
    from deploy_opt.report.model_sections import QuantizationInfo
    from deploy_opt.report.record import _coverage_lines

    healthy = {"quantized_nodes": 6, "quantizable_nodes": 7, "quantized_tensors": {"activation": 6, "weight": 6}}
    expected = ["- INT8 nodes: 6 of 7 quantizable; tensors: 6 activations, 6 weights, 0 biases"]
    assert _coverage_lines(QuantizationInfo.from_json(healthy)) == expected
    foreign = {"quantized_nodes": 38, "quantizable_nodes": 38, "quantized_tensors": {"activation": 40, "weight": 6}}
    assert "only 6 weights recognised for 38 INT8 nodes" in _coverage_lines(QuantizationInfo.from_json(foreign))[1]


def test_a_gpu_profile_is_never_judged_on_a_cpu_timing(tmp_path: Path) -> None:
    gpu = {"tensorrt": "tensorrt: not available", "ort-cuda": "ships model.onnx (FP32)"}
    backends = {"tensorrt": {"status": "tensorrt: not available: tensorrt is not installed"}}
    slow = _gate(str(_build_json(tmp_path, speedup=0.4, targets=gpu, backends=backends)), "--min-speedup", "1.2")
    assert slow.returncode == 0, slow.stdout
    assert "SKIP  speed not measured: no GPU timing here (tensorrt: not available: tensorrt is not installed)" in (
        slow.stdout
    )
    assert "0.40x" not in slow.stdout  # the ORT CPU figure is not shown under the GPU targets
    cpu = _gate(str(_build_json(tmp_path, speedup=0.4, targets={"ort-cpu": "built"})), "--min-speedup", "1.2")
    assert cpu.returncode == 1 and "FAIL  INT8 speedup 0.40x" in cpu.stdout


def test_a_gpu_profile_is_judged_on_the_engine_against_ort_cuda_fp32(tmp_path: Path) -> None:
    gpu = {"tensorrt": "built: model.engine", "ort-cuda": "ships model.onnx (FP32)"}
    timing = {"method": "...", "ort_cuda": "ran on ['CUDAExecutionProvider']"}
    timing |= {"1": {"tensorrt": 0.2, "ort_cuda_fp32": 0.3, "speedup_vs_ort_cuda_fp32": 1.5}}
    timing |= {"32": {"tensorrt": 1.0, "ort_cuda_fp32": 1.1, "speedup_vs_ort_cuda_fp32": 1.1}}
    built = _build_json(
        tmp_path, speedup=3.0, targets=gpu, backends={"tensorrt": {"status": "built", "timing_ms": timing}}
    )
    slow = _gate(str(built), "--min-speedup", "1.2")
    assert slow.returncode == 1 and "FAIL  TensorRT INT8 over ORT CUDA FP32: 1.10x at batch 32" in slow.stdout
    fast = _gate(str(built), "--min-speedup", "1.2", "--speedup-batch", "1")
    assert fast.returncode == 0 and "PASS  TensorRT INT8 over ORT CUDA FP32: 1.50x at batch 1" in fast.stdout
