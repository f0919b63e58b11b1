"""Publishing is whole or not at all: a failed swap, a kill or a second run never leaves half a report."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

import dopt_common.files as files
from dopt_common.errors import OutputError
from dopt_common.ownership import MOVING, new_owner, write_marker
from dopt_common.runs import report_lock, staged_dir, sweep_stale


def _tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _old_report(root: Path, name: str = "model") -> Path:
    old = root / name
    (old / "sub").mkdir(parents=True)
    (old / "build.json").write_text('{"old": true}\n')
    (old / "sub" / "model.onnx").write_bytes(os.urandom(256))
    write_marker(old, new_owner("build"))  # a run deploy_opt wrote
    return old


def test_a_failed_swap_puts_the_previous_report_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    old = _old_report(tmp_path)
    before = _tree(old)
    rename = os.rename

    def failing(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        if ".partial-" in str(src):  # the new report's rename in: the publish step fails there
            raise OSError(18, "Invalid cross-device link")
        rename(src, dst)

    monkeypatch.setattr(files.os, "rename", failing)
    with pytest.raises(OutputError, match="the previous 'model' is unchanged"):
        with staged_dir(old) as stage:
            (stage / "build.json").write_text('{"new": true}\n')
    assert _tree(old) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]  # no staging, no .old- left


def test_a_staging_folder_on_another_filesystem_is_copied_then_swapped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    old, staging = _old_report(tmp_path / "out"), tmp_path / "elsewhere"
    staging.mkdir()
    (staging / "build.json").write_text('{"new": true}\n')
    monkeypatch.setattr(files, "_device", lambda path: 1 if "elsewhere" in str(path) else 2)
    files.replace_dir(staging, old)
    assert _tree(old) == {"build.json": b'{"new": true}\n'}
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["model"]  # the copy was renamed in, the old removed


def test_leftovers_of_dead_runs_are_swept_and_live_ones_kept(tmp_path: Path) -> None:
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)
    marked = {f".a.partial-{dead_pid}": dead_pid, f".b.partial-{os.getpid()}": os.getpid()}
    for name, pid in marked.items():
        (tmp_path / name).mkdir()
        write_marker(tmp_path / name, dataclasses.replace(new_owner("stage:build"), pid=pid))
    (tmp_path / f".a.old-{dead_pid}").mkdir()  # a previous report its dead mover claimed, while "a" exists
    (tmp_path / "a").mkdir()
    write_marker(tmp_path / f".a.old-{dead_pid}", new_owner("build"))
    write_marker(tmp_path / f".a.old-{dead_pid}", dataclasses.replace(new_owner("build"), pid=dead_pid), MOVING)
    other_host = dataclasses.replace(new_owner("stage:build"), host="another-node", pid=dead_pid)
    (tmp_path / f".c.partial-{dead_pid}").mkdir()  # another node's live stage on shared storage
    write_marker(tmp_path / f".c.partial-{dead_pid}", other_host)
    (tmp_path / ".thesis.old-2023").mkdir()  # a look-alike deploy_opt never wrote
    (tmp_path / ".thesis.old-2023" / "thesis.tex").write_text("x")
    removed = sweep_stale(tmp_path)
    assert sorted(p.name for p in removed) == [f".a.old-{dead_pid}", f".a.partial-{dead_pid}"]
    kept = [".thesis.old-2023", "a", f".b.partial-{os.getpid()}", f".c.partial-{dead_pid}"]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(kept)
    assert (tmp_path / ".thesis.old-2023" / "thesis.tex").read_text() == "x"


def _hold_lock(out_dir: Path, seconds: int) -> subprocess.Popen[str]:
    """Another process holding ``out_dir``'s report lock for ``seconds``; returns once it holds it."""
    code = (
        "import time; from pathlib import Path; from dopt_common.runs import report_lock\n"
        f"with report_lock(Path({str(out_dir)!r})):\n    print('held', flush=True); time.sleep({seconds})"
    )
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    return holder


def test_a_second_run_of_the_same_name_fails_at_once(tmp_path: Path) -> None:
    holder = _hold_lock(tmp_path / "model", seconds=60)
    try:
        with pytest.raises(OutputError, match=f"is being written by pid {holder.pid}"):
            with report_lock(tmp_path / "model"):
                pass
    finally:
        holder.kill()
        holder.wait()
    with report_lock(tmp_path / "model"):  # released with its process
        pass


# A log line of each kind of work in the demo build; the signal lands in the stage that follows it: torch's
# export (in dynamo), ORT sessions on their own threads (the search; calibration and evaluation run the same
# way), the comparison's per-layer runs, and the publish itself. Each kill costs a demo build up to that stage.
STAGES = {
    "export": "calibration: 512 of",  # the dynamo export starts right after the calibration set is chosen
    "search": "auto placement",
    "compare": "evaluation on",
    "publish": "align verify",  # the gate, the records and the swap follow; the kill may land after it
}
KILLS = [(stage, signal.SIGTERM, 143) for stage in STAGES] + [("export", signal.SIGINT, 130)]  # Ctrl-C in dynamo


@pytest.mark.slow
@pytest.mark.parametrize("stage,signum,code", KILLS, ids=[f"{s}-{signal.Signals(n).name}" for s, n, _ in KILLS])
def test_a_killed_build_leaves_no_staging_and_the_old_report_intact(
    tmp_path: Path, stage: str, signum: int, code: int
) -> None:
    old = _old_report(tmp_path, "digits-mlp")
    before = _tree(old)
    # The build's own temp folder: another test worker's exports come and go in the shared one meanwhile.
    temp = Path(tempfile.mkdtemp(prefix="killed-build."))
    build = subprocess.Popen(
        [sys.executable, "-m", "deploy_opt", "build", "--profile", "ci", "--output-dir", str(tmp_path)],
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "TMPDIR": str(temp)},
    )
    assert build.stderr is not None
    deadline, seen = time.monotonic() + 180, []
    for line in build.stderr:
        seen.append(line)
        if STAGES[stage] in line or time.monotonic() > deadline:
            break
    assert STAGES[stage] in seen[-1], "".join(seen)
    build.send_signal(signum)
    rest = build.stderr.read()
    returncode = build.wait(timeout=120)
    assert "Traceback" not in rest
    assert sorted(p.name for p in tmp_path.iterdir()) == ["digits-mlp"]  # no staging left
    assert not list(temp.glob("deploy_opt.*"))  # nor the exporter's temp folders
    shutil.rmtree(temp)
    if stage == "publish" and returncode in (0, 1):  # it finished first: then the new report is there, whole
        assert json.loads((old / "build.json").read_text())["name"] == "digits-mlp"
        return
    assert returncode == code, rest
    assert rest.strip().splitlines()[-1] == (
        f"deploy_opt build: interrupted ({signal.Signals(signum).name}); staging removed, no partial report left"
    )
    after = _tree(old)
    if stage == "publish" and after != before:  # killed after the swap: the complete new report
        assert json.loads((old / "build.json").read_text())["name"] == "digits-mlp"
    else:
        assert after == before


class _Stop(Exception):
    pass


def _raise_stop(_signum: int, _frame: object) -> None:
    raise _Stop


@pytest.mark.parametrize("when", ["made", "inside"])
def test_a_scratch_folder_is_removed_whenever_the_signal_lands(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, when: str
) -> None:
    """The exporter's temp folder, killed as it is made (the race a TemporaryDirectory loses) or while in use."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    mkdtemp = tempfile.mkdtemp

    def made_then_signalled(**kwargs: str) -> str:
        folder = mkdtemp(**kwargs)
        os.kill(os.getpid(), signal.SIGTERM)  # held until the folder is named
        return folder

    if when == "made":
        monkeypatch.setattr(files.tempfile, "mkdtemp", made_then_signalled)
    previous = signal.signal(signal.SIGTERM, _raise_stop)
    try:
        with pytest.raises(_Stop):
            with files.scratch_dir("deploy_opt.test.") as folder:
                (folder / "raw.onnx").write_bytes(b"x")
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(5)  # the handler raises first
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert list(tmp_path.iterdir()) == []


def test_a_report_path_that_cannot_be_replaced_is_refused_before_any_work(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "file").write_text("not a report")
    with pytest.raises(OutputError, match="exists and is not a folder"):
        with staged_dir(tmp_path / "file"):
            pytest.fail("the run must not start")
    locked = _old_report(tmp_path, "locked")
    access = os.access  # root passes every permission check, so the read-only answer is injected
    monkeypatch.setattr(files.os, "access", lambda p, mode: False if Path(p) == locked else access(p, mode))
    with pytest.raises(OutputError, match="the existing report .* is read-only"):
        with staged_dir(locked):
            pytest.fail("the run must not start")
    assert not any(p.name.startswith(".locked.partial") for p in tmp_path.iterdir())


def test_a_writer_refuses_a_folder_as_its_output_file(tmp_path: Path) -> None:
    with pytest.raises(OutputError, match="is a folder; fix: give a file path"):
        files.write_text(tmp_path, "x")


def test_with_wait_a_second_run_waits_for_the_first(tmp_path: Path) -> None:
    holder = _hold_lock(tmp_path / "model", seconds=2)
    try:
        started = time.monotonic()
        with report_lock(tmp_path / "model", wait=True):
            assert time.monotonic() - started > 1.0  # the lock came only when the first run let it go (2 s)
    finally:
        holder.kill()
        holder.wait()


def test_nan_in_the_evaluation_data_is_blamed_on_the_data(tmp_path: Path) -> None:
    import numpy as np

    from deploy_opt.data.sources import InputSpec, to_batch
    from dopt_common.errors import InputError

    x = np.zeros((4, 16), np.float32)
    x[1, 3] = np.nan
    with pytest.raises(InputError, match="data.evaluation batch 0: input 'x' holds NaN or Inf \\(1 of 64 values\\)"):
        to_batch(({"x": x}, np.zeros(4)), (InputSpec("x", ("batch", 16), "float32"),), "data.evaluation batch 0")
