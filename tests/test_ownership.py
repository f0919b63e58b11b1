"""deploy_opt deletes or replaces only what it provably wrote (issue 54): the leftover sweep, a target folder that is
not a run of the same kind, an output folder holding the model or inside the data, a planted lock link, and the
last passing build kept across format versions. Each repro checks a sentinel tree, hashed before and after."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import build_tiny

from deploy_opt.cli import main
from deploy_opt.pipeline.build import passed_before
from dopt_common.errors import OutputError
from dopt_common.ownership import check_separate, check_target, new_owner, run_kind, write_marker
from dopt_common.runs import failed_dir, report_lock, staged_dir


def _hashes(root: Path) -> dict[str, str]:
    """Every entry under ``root`` (links as their target text, never followed) with a digest of its content."""
    found = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        if path.is_symlink():
            found[rel] = "link:" + os.readlink(path)
        elif path.is_file():
            found[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
        else:
            found[rel] = "dir"
    return found


def _sentinel(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "thesis.tex").write_text("x")
    (folder / "NOTES.txt").write_text("mine")
    return folder


def _dead_pid() -> int:
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(done.stdout)


def test_the_sweep_keeps_a_look_alike_folder_through_a_real_build(tmp_path: Path) -> None:
    look_alike = _sentinel(tmp_path / "reports" / ".thesis.old-2023")
    other_node = tmp_path / "reports" / f".x.partial-{_dead_pid()}"
    other_node.mkdir()
    write_marker(other_node, dataclasses.replace(new_owner("stage:build"), host="node-2", pid=_dead_pid()))
    before = {p: _hashes(p) for p in (look_alike, other_node)}
    result = build_tiny(tmp_path, "gate: {max_drop: 100}")
    assert result.gate.passed and run_kind(result.out_dir) == "build"
    assert {p: _hashes(p) for p in (look_alike, other_node)} == before


def test_a_folder_that_is_not_a_run_is_never_replaced(tmp_path: Path) -> None:
    mine = _sentinel(tmp_path / "reports" / "tiny")
    before = _hashes(tmp_path / "reports")
    with pytest.raises(OutputError, match="is not a folder deploy_opt wrote"):
        build_tiny(tmp_path, "gate: {max_drop: 100}")
    assert _hashes(tmp_path / "reports") == before and mine.is_dir()


def test_an_empty_folder_may_be_the_target(tmp_path: Path) -> None:
    (tmp_path / "reports" / "tiny").mkdir(parents=True)
    assert build_tiny(tmp_path, "gate: {max_drop: 100}").gate.passed


def test_a_run_of_another_kind_is_never_replaced(tmp_path: Path) -> None:
    llm = tmp_path / "llm-run"
    llm.mkdir()
    (llm / "quantize_report.json").write_text(json.dumps({"format": "deploy_opt.llm_quantize/1"}))
    build = tmp_path / "build-run"
    build.mkdir()
    write_marker(build, new_owner("build"))
    assert check_target(build, "build") == build and check_target(llm, "llm") == llm
    with pytest.raises(OutputError, match="is a deploy_opt llm run, not a build run"):
        check_target(llm, "build")
    with pytest.raises(OutputError, match="is a deploy_opt build run, not a llm run"):
        with staged_dir(build, kind="llm"):
            pass


def test_a_target_link_is_refused(tmp_path: Path) -> None:
    elsewhere = _sentinel(tmp_path / "elsewhere")
    before = _hashes(elsewhere)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "run").symlink_to(elsewhere)
    with pytest.raises(OutputError, match="is a symbolic link"):
        with staged_dir(tmp_path / "out" / "run"):
            pass
    assert _hashes(elsewhere) == before


def test_an_output_folder_holding_the_model_is_refused(tmp_path: Path) -> None:
    model = tmp_path / "out" / "tiny"
    model.mkdir(parents=True)
    (model / "model.onnx").write_bytes(b"onnx")
    with pytest.raises(OutputError, match="holds the input"):
        check_separate(model, [model / "model.onnx"], [])


def test_an_output_folder_inside_the_data_is_refused(tmp_path: Path) -> None:
    images = tmp_path / "images"
    (images / "cat").mkdir(parents=True)
    with pytest.raises(OutputError, match="inside the data folder"):
        check_separate(images / "reports" / "run", [], [images])
    check_separate(tmp_path / "reports" / "run", [tmp_path], [images])  # the config's folder may hold the output


def test_quantize_llm_refuses_to_replace_the_folder_it_quantizes(tmp_path: Path, capsys) -> None:
    source = tmp_path / "out" / "tiny"
    source.mkdir(parents=True)
    (source / "config.json").write_text("{}")
    (source / "model.safetensors").write_bytes(b"weights")
    before = _hashes(tmp_path)
    code = main(["quantize-llm", "--path", str(source), "--output-dir", str(tmp_path / "out"), "--name", "tiny"])
    assert code == 2
    assert "is not a folder deploy_opt wrote" in capsys.readouterr().err
    assert _hashes(tmp_path) == before


def test_a_planted_lock_link_writes_nothing_outside(tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere.txt"
    outside.write_text("precious")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / ".run.lock").symlink_to(outside)
    with pytest.raises(OutputError, match="symbolic link"):
        with report_lock(tmp_path / "out" / "run"):
            pass
    assert outside.read_text() == "precious"


@pytest.mark.parametrize(
    ("record", "kept"),
    [
        ({"format": "deploy_opt.build/1", "gate": {"passed": True}}, True),
        ({"format": "deploy_opt.build/1", "gate": {"passed": False}}, False),
        ({"format": "deploy_opt.build/7", "gate": {"passed": True}}, True),  # another release's, readable
        ({"format": "deploy_opt.build/7", "verdict": "?"}, True),  # unreadable verdict: kept, never destroyed
    ],
)
def test_passed_is_read_from_any_build_version(tmp_path: Path, record: dict, kept: bool) -> None:
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "build.json").write_text(json.dumps(record))
    assert passed_before(tmp_path / "run") is kept


@pytest.mark.slow
def test_a_failing_build_keeps_a_passing_build_of_another_version(tmp_path: Path) -> None:
    passing = build_tiny(tmp_path, "gate: {max_drop: 100}")
    record = json.loads((passing.out_dir / "build.json").read_text())
    record["format"] = "deploy_opt.build/9"  # as a build from a later release would write it
    (passing.out_dir / "build.json").write_text(json.dumps(record))
    before = _hashes(passing.out_dir)
    failing = build_tiny(tmp_path, "gate: {max_drop: 100}", unmeetable=True)
    assert failing.kept == passing.out_dir and failing.out_dir == failed_dir(passing.out_dir)
    assert _hashes(passing.out_dir) == before
    again = build_tiny(tmp_path, "gate: {max_drop: 100}", unmeetable=True)  # a second failure replaces .failed/
    assert again.out_dir == failed_dir(passing.out_dir) and _hashes(passing.out_dir) == before
