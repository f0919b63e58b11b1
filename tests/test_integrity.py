"""Integrity: a build folder whose artifacts were changed after the build fails ``gate`` and ``align verify``
(exit 1, naming the artifact and the tensor); an untouched build passes; the build's gate judges align verify.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import QDQ, passing_tiny_build
from onnx import numpy_helper

from deploy_opt.cli import main
from deploy_opt.report.gate import GateResult, load_build
from deploy_opt.report.integrity import check_integrity
from deploy_opt.report.trust import alignment_criterion, check_build_folder, with_criterion
from dopt_common.errors import ReportError


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One real tiny build whose gate passes (max_drop 100, speed not gated); tests tamper with copies."""
    return passing_tiny_build(tmp_path_factory.mktemp("integrity"), "gate: {max_drop: 100, min_speedup: null}")


def _rewrite(folder: Path, change: Callable[[dict[str, np.ndarray]], str]) -> str:
    """Apply ``change`` to the Q/DQ model's initializers (by name) and save it; returns the changed tensor."""
    model = onnx.load(str(folder / QDQ))
    arrays = {t.name: numpy_helper.to_array(t).copy() for t in model.graph.initializer}
    name = change(arrays)
    for tensor in model.graph.initializer:
        if tensor.name == name:
            tensor.CopyFrom(numpy_helper.from_array(arrays[name], name))
    onnx.save(model, str(folder / QDQ))
    return name


def _zero_weights(folder: Path) -> str:
    model = onnx.load(str(folder / QDQ))
    codes = [t for t in model.graph.initializer if t.data_type == onnx.TensorProto.INT8 and t.dims]
    codes = [t for t in codes if numpy_helper.to_array(t).any()]  # the weight codes (zero points are zero)
    assert codes, "the tiny build has int8 weight codes"
    for tensor in codes:
        tensor.CopyFrom(numpy_helper.from_array(np.zeros_like(numpy_helper.to_array(tensor)), tensor.name))
    onnx.save(model, str(folder / QDQ))
    return codes[0].name


def _swap_fp32(folder: Path) -> str:
    shutil.copyfile(folder / "model.onnx", folder / QDQ)
    return "model.onnx"  # the problem line says whose bytes the artifact now has


def _truncate(folder: Path) -> str:
    data = (folder / QDQ).read_bytes()
    (folder / QDQ).write_bytes(data[: len(data) // 2])
    return "truncated"


def _change_scale(folder: Path) -> str:
    def bump(arrays: dict[str, np.ndarray]) -> str:
        name = next(n for n in arrays if n.endswith("_scale") and arrays[n].size > 1)  # a per-channel weight scale
        arrays[name].flat[0] = np.nextafter(arrays[name].flat[0], np.float32(np.inf))
        return name

    return _rewrite(folder, bump)


def _change_code(folder: Path) -> str:
    def flip(arrays: dict[str, np.ndarray]) -> str:
        name = next(n for n in arrays if n.endswith("_quantized"))
        arrays[name].flat[0] = np.int8(1) if arrays[name].flat[0] != 1 else np.int8(2)
        return name

    return _rewrite(folder, flip)


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out + out.err


def test_an_untouched_build_passes_integrity(built: Path, capsys: pytest.CaptureFixture[str]) -> None:
    build = json.loads((built / "build.json").read_text())
    tensors = build["integrity"][QDQ]["tensors"]
    # The weight codes, the scales and the zero points are all recorded, each with dtype and dims.
    assert {t["dtype"] for t in tensors.values()} >= {"int8", "float"}
    assert any(n.endswith("_quantized") for n in tensors) and any(n.endswith("_zero_point") for n in tensors)
    report = check_integrity(built, build)
    assert report.ok and set(report.checked) == set(build["artifacts"])
    assert main(["gate", str(built)]) == 0
    assert "PASS  integrity:" in capsys.readouterr().out
    assert main(["align", "verify", str(built)]) == 0
    assert "PASS  integrity:" in capsys.readouterr().out


@pytest.mark.parametrize(
    "tamper",
    [_zero_weights, _swap_fp32, _truncate, _change_scale, _change_code],
    ids=["int8-weights-zeroed", "fp32-swapped-in", "truncated", "one-scale-changed", "one-weight-code-changed"],
)
@pytest.mark.parametrize("command", [["gate"], ["align", "verify"]], ids=["gate", "align-verify"])
def test_a_tampered_artifact_fails_and_is_named(
    copy: Path, tamper: Callable[[Path], str], command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    named = tamper(copy)
    code, out = _run(capsys, *command, str(copy))
    assert code == 1, out
    failing = [line for line in out.splitlines() if line.startswith("FAIL  integrity:")]
    assert failing and QDQ in failing[0], out
    if named in {"model.onnx", "truncated"}:
        assert named in failing[0], out
    else:
        assert f"tensor '{named}'" in failing[0], out
    if command == ["gate"]:
        assert out.rstrip().endswith("gate: FAILED"), out


@pytest.mark.parametrize("artifact", ["scales.json", "encodings.json"])
def test_a_missing_artifact_is_named(copy: Path, artifact: str) -> None:
    (copy / artifact).unlink()
    report = check_build_folder(copy)
    assert report is not None and not report.ok
    assert report.problems == (
        f"{artifact} is missing (the build wrote {load_build(copy)['artifacts'][artifact]['bytes']} bytes)",
    )


def test_a_changed_json_artifact_is_named_by_hash_and_size(copy: Path) -> None:
    scales = copy / "scales.json"
    scales.write_text(scales.read_text() + " ")
    (problem,) = check_build_folder(copy).problems
    assert problem.startswith("scales.json sha256 ") and "bytes, the build wrote" in problem


def test_the_builds_gate_fails_when_align_verify_fails() -> None:
    passed = GateResult(True, ())
    failed = with_criterion(passed, alignment_criterion(False, "FAIL: model.int8.onnx disagree with scales.json"))
    assert not failed.passed and failed.criteria[-1].name == "alignment"
    assert failed.lines()[0] == "FAIL  align verify: FAIL: model.int8.onnx disagree with scales.json"
    assert with_criterion(passed, alignment_criterion(True, "pass: model.int8.onnx")).passed


def test_the_build_records_its_align_verdict_as_a_criterion(built: Path) -> None:
    gate = load_build(built)["gate"]
    alignment = next(c for c in gate["criteria"] if c["name"] == "alignment")
    assert alignment["passed"] and alignment["text"].startswith("align verify: pass")


def test_gate_fails_on_a_recorded_failed_alignment(copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    build = json.loads((copy / "build.json").read_text())
    build["alignment"]["verdict"] = "FAIL: model.int8.onnx disagree with scales.json"
    (copy / "build.json").write_text(json.dumps(build))
    code, out = _run(capsys, "gate", str(copy))
    assert code == 1 and "FAIL  align verify, as the build recorded it: FAIL: model.int8.onnx" in out


@pytest.mark.parametrize("fmt", ["deploy_opt.build/2", "something-else"])
def test_an_unknown_build_format_is_refused(tmp_path: Path, fmt: str, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "build.json"
    path.write_text(json.dumps({"format": fmt, "metrics": {"drop": 0.0}}))
    with pytest.raises(ReportError, match="does not read"):
        load_build(path)
    code, out = _run(capsys, "gate", str(path), "--max-drop", "1")
    assert code == 2 and f"format '{fmt}'" in out and "fix:" in out
