"""Hostile inputs to ``gate``, ``align verify``, ``compat`` and ``scales`` (issue 54): integrity that deleting
build.json's entries cannot bypass, artifact names that never leave the run folder, a gate that judges a build
without a benchmark as the build did, and output options that never write through a link or onto a device.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import QDQ, passing_tiny_build
from onnx import numpy_helper

import deploy_opt.report.integrity as integrity
from deploy_opt.cli import main
from deploy_opt.report.manifest import plain_name_problem, required_artifacts
from dopt_common.files import sha256_file


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One real tiny build, benchmark disabled, gate min_speedup 1.0: its own gate passes."""
    return passing_tiny_build(tmp_path_factory.mktemp("hostile"), "gate: {max_drop: 100, min_speedup: 1.0}")


def _run(capsys: pytest.CaptureFixture[str], *argv: object) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def _edit_build(folder: Path, change) -> None:
    build = json.loads((folder / "build.json").read_text())
    change(build)
    (folder / "build.json").write_text(json.dumps(build))


def _zero_int8_weights(folder: Path) -> None:
    model = onnx.load(str(folder / QDQ))
    for tensor in model.graph.initializer:
        if tensor.data_type == onnx.TensorProto.INT8 and tensor.dims:
            tensor.CopyFrom(numpy_helper.from_array(np.zeros_like(numpy_helper.to_array(tensor)), tensor.name))
    onnx.save(model, str(folder / QDQ))


def _drop_int8_entries(build: dict) -> None:
    del build["integrity"][QDQ], build["artifacts"][QDQ]


def _drop_every_record(build: dict) -> None:
    for key in ("format", "artifacts", "integrity", "alignment", "backends"):
        build.pop(key, None)


@pytest.mark.parametrize("edit", [_drop_int8_entries, _drop_every_record], ids=["int8-entries", "whole-sections"])
@pytest.mark.parametrize("command", [["gate"], ["align", "verify"]], ids=["gate", "align-verify"])
def test_deleting_build_json_entries_does_not_hide_zeroed_weights(
    copy: Path, edit, command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    _zero_int8_weights(copy)
    _edit_build(copy, edit)
    code, out, err = _run(capsys, *command, copy)
    assert code == 1, out + err
    failing = [line for line in out.splitlines() if line.startswith("FAIL  integrity:")]
    assert any(QDQ in line for line in failing), out


def test_the_required_artifacts_come_from_the_format_and_the_other_sections(built: Path) -> None:
    build = json.loads((built / "build.json").read_text())
    needed = required_artifacts(build)
    assert {"model.onnx", QDQ, "scales.json", "encodings.json", "compat.json", "compare.json"} <= set(needed)
    assert set(needed) <= set(build["artifacts"])  # an untouched build lists every one
    tensorrt = build | {"backends": {"tensorrt_qdq": "model.trt.onnx: ...", "tensorrt": {"status": "built: e.plan"}}}
    assert {"model.trt.onnx", "e.plan"} <= set(required_artifacts(tensorrt))
    qat = build | {"qat": {"ran": True, "shipped": "qat"}}
    assert "model.qat.onnx" in required_artifacts(qat)


def test_a_missing_integrity_entry_alone_fails(copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _edit_build(copy, lambda b: b["integrity"].pop(QDQ))
    code, out, _ = _run(capsys, "gate", copy)
    assert code == 1 and f"FAIL  integrity: {QDQ}: build.json's integrity section has no tensor digests" in out


def test_an_unlisted_external_data_file_is_required(copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = onnx.load(str(copy / QDQ))
    onnx.save(model, str(copy / QDQ), save_as_external_data=True, location="w.data", size_threshold=0)
    entry = {"sha256": sha256_file(copy / QDQ), "bytes": (copy / QDQ).stat().st_size}
    _edit_build(copy, lambda b: b["artifacts"].update({QDQ: entry}))  # the model re-recorded, its data not
    problems = integrity.check_integrity(copy, json.loads((copy / "build.json").read_text())).problems
    assert any(p.startswith("w.data is not listed") and "external data" in p for p in problems), problems
    data = copy / "w.data"  # the weights live there now: zeroing them leaves model.int8.onnx's bytes as listed
    data.write_bytes(bytes(data.stat().st_size))
    code, out, _ = _run(capsys, "gate", copy)
    assert code == 1 and "FAIL  integrity: " in out and "w.data" in out


@pytest.mark.parametrize("name", ["../../../etc/hostname", "/etc/passwd", "sub/scales.json", "..", ""])
def test_an_artifact_name_outside_the_folder_is_never_opened(
    copy: Path, name: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    opened: list[Path] = []

    def recording(path: os.PathLike[str]) -> str:
        opened.append(Path(path))
        return sha256_file(path)

    monkeypatch.setattr(integrity, "sha256_file", recording)
    _edit_build(copy, lambda b: b["artifacts"].update({name: {"sha256": "0" * 64, "bytes": 1}}))
    code, out, _ = _run(capsys, "gate", copy)
    assert code == 1, out
    assert f"artifact name {name!r} in build.json" in out and "was not opened" in out
    assert opened and all(p.parent == copy for p in opened), opened
    if Path("/etc/passwd").is_file():
        assert sha256_file("/etc/passwd")[:16] not in out


@pytest.mark.parametrize("name", ["a/b", "/abs", "..", ".", "", "x\x00y", "a\\b", None])
def test_plain_name_problem_refuses_every_path_form(name: object) -> None:
    assert plain_name_problem(name) is not None
    assert plain_name_problem("model.int8.onnx") is None


def test_an_artifact_replaced_by_a_link_outside_is_not_read(copy: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside.json"
    shutil.copyfile(copy / "scales.json", outside)  # same bytes: only the link itself can give it away
    (copy / "scales.json").unlink()
    (copy / "scales.json").symlink_to(outside)
    code = main(["gate", str(copy)])
    assert code == 1


def test_gate_judges_a_build_without_a_benchmark_as_the_build_did(
    built: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    own = json.loads((built / "build.json").read_text())["gate"]
    code, out, err = _run(capsys, "gate", built)
    assert code == 0 and own["verdict"] == "PASSED", out + err
    assert "SKIP  speed not measured: the build ran without a benchmark" in out
    assert out.rstrip().endswith("gate: PASSED")
    code, out, _ = _run(capsys, "gate", built, "--min-speedup", "1.5")
    assert code == 0 and "SKIP  speed not measured" in out


def test_min_speedup_zero_is_accepted(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    build = {
        "name": "toy",
        "metrics": {"name": "top1", "ort_fp32": 97.0, "ort_int8": 96.9, "drop": 0.1},
        "benchmark": {"batches": {"8": {"speedup": 0.7}}},
    }
    (tmp_path / "build.json").write_text(json.dumps(build))
    code, out, _ = _run(capsys, "gate", tmp_path / "build.json", "--min-speedup", "0")
    assert code == 0 and "PASS  INT8 speedup 0.70x at batch 8" in out
    with pytest.raises(SystemExit) as refused:
        main(["gate", str(tmp_path / "build.json"), "--min-speedup", "-1"])
    assert refused.value.code == 2


def test_compat_refuses_an_empty_onnx_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    empty = tmp_path / "empty.onnx"
    empty.write_bytes(b"")
    code, _, err = _run(capsys, "compat", empty, "--output-dir", tmp_path / "out")
    assert code == 2 and "empty.onnx" in err and "not an ONNX model" in err
    assert not (tmp_path / "out").exists()


def test_compat_refuses_a_fifo(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fifo = tmp_path / "model.onnx"
    os.mkfifo(fifo)
    code, _, err = _run(capsys, "compat", fifo, "--output-dir", tmp_path)
    assert code == 2 and "named pipe" in err


@pytest.mark.parametrize("spelling", ["same", "dotted", "link"])
def test_scales_import_refuses_to_overwrite_its_input(
    copy: Path, spelling: str, capsys: pytest.CaptureFixture[str]
) -> None:
    source = copy / "encodings.json"
    before = source.read_bytes()
    target = {"same": source, "dotted": copy / ".." / copy.name / "encodings.json", "link": copy / "alias.json"}[
        spelling
    ]
    if spelling == "link":
        target.symlink_to(source)
    code, _, err = _run(capsys, "scales", "import", source, "--to", target)
    assert code == 2 and "is the input file itself" in err, err
    assert source.read_bytes() == before


def _export(capsys: pytest.CaptureFixture[str], folder: Path, out: object) -> tuple[int, str, str]:
    return _run(capsys, "scales", "export", folder / "scales.json", "--format", "aimet", "--out", out)


def test_scales_export_refuses_a_device(copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _export(capsys, copy, "/dev/full")
    assert code == 2 and "character device" in err
    assert stat.S_ISCHR(os.stat("/dev/full").st_mode)


def test_scales_export_and_gate_junit_refuse_a_symlink(
    copy: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    link = tmp_path / "link.json"
    link.symlink_to(victim)
    code, _, err = _export(capsys, copy, link)
    assert code == 2 and "symbolic link" in err
    code, _, err = _run(capsys, "gate", copy, "--junit", link)
    assert code == 2 and "symbolic link" in err
    assert link.is_symlink() and victim.read_text() == "keep me"


@pytest.mark.parametrize("writer", ["export", "junit", "align-json"])
def test_output_options_refuse_a_fifo(
    copy: Path, tmp_path: Path, writer: str, capsys: pytest.CaptureFixture[str]
) -> None:
    fifo = tmp_path / "out.fifo"
    os.mkfifo(fifo)
    if writer == "export":
        code, _, err = _export(capsys, copy, fifo)
    elif writer == "junit":
        code, _, err = _run(capsys, "gate", copy, "--junit", fifo)
    else:
        code, _, err = _run(capsys, "align", "verify", copy, "--json", fifo)
    assert code == 2 and "named pipe" in err, err
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_compat_refuses_a_linked_report(copy: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    out = tmp_path / "out"
    out.mkdir()
    (out / "compat.json").symlink_to(victim)
    code, _, err = _run(capsys, "compat", copy / "model.onnx", "--targets", "ort-cpu", "--output-dir", out)
    assert code == 2 and "symbolic link" in err
    assert victim.read_text() == "keep me"


def test_dash_writes_to_standard_output(copy: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _export(capsys, copy, "-")
    assert code == 0
    assert _export(capsys, copy, tmp_path / "enc.json")[0] == 0
    assert out == (tmp_path / "enc.json").read_text()
    code, out, err = _run(capsys, "gate", copy, "--junit", "-")
    assert code == 0 and "gate: PASSED" in err
    suite = ET.fromstring(out)
    assert suite.tag == "testsuite" and suite.get("failures") == "0"
    assert not (Path.cwd() / "-").exists()
