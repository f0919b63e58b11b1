"""The CLI's supervisor (``python -m deploy_opt`` runs the command in a forked child): a run that user code ends
with ``os._exit`` exits 2 with a line, signals reach the run once and map to 130/143 with no leftovers, and the
run dies with a SIGKILLed parent."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from deploy_opt.cli.supervise import SI_KERNEL, run_supervised, should_forward

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the supervisor forks only on Linux")

USER_CODE = f"""
import os, sys, time
sys.path.insert(0, {str(HERE)!r})
import fragile_onnx

def exits():
    os._exit(0)

def stalls():
    open(os.path.join(os.path.dirname(__file__), "stalled"), "w").close()
    time.sleep(120)
    return fragile_onnx.calibration()
"""


def _config(tmp_path: Path, calibration: str) -> Path:
    import fragile_onnx

    fragile_onnx.make_model(tmp_path / "fragile.onnx")
    (tmp_path / "user.py").write_text(USER_CODE)
    config = tmp_path / "b.yaml"
    config.write_text(
        f"name: sup\nmodel: {{onnx: fragile.onnx}}\ndata: {{calibration: 'user.py:{calibration}', evaluation: "
        f"'{HERE / 'fragile_onnx.py'}:evaluation', metric: cosine}}\nbenchmark: {{enabled: false}}\n"
    )
    return config


def _start(tmp_path: Path, calibration: str, *flags: str, **popen) -> subprocess.Popen[str]:
    argv = [sys.executable, "-m", "deploy_opt", *flags, "build", str(_config(tmp_path, calibration))]
    argv += ["--profile", "ci", "--output-dir", str(tmp_path / "out")]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("DEPLOY_OPT_NO_SUPERVISOR", None)
    return subprocess.Popen(argv, stderr=subprocess.PIPE, text=True, cwd=REPO, env=env, **popen)


def _wait_stalled(tmp_path: Path, run: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 120
    while not (tmp_path / "stalled").exists():
        assert run.poll() is None and time.monotonic() < deadline, run.stderr.read() if run.stderr else ""
        time.sleep(0.1)


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if entry.name.isdigit() and int(fields[1]) == pid:
            found.append(int(entry.name))
    return found


@pytest.mark.slow
def test_a_factory_that_calls_os_exit_0_exits_2_with_a_line_and_no_report(tmp_path: Path) -> None:
    run = _start(tmp_path, "exits")
    _, err = run.communicate(timeout=120)
    assert run.returncode == 2, err
    line = err.strip().splitlines()[-1]
    assert line.startswith("deploy_opt build: error: the process ended without finishing (os._exit or a kill in")
    assert "exit status 0; fix: " in line
    assert not (tmp_path / "out" / "sup").exists()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("signum", "whole_group", "code"),
    [(signal.SIGTERM, False, 143), (signal.SIGINT, True, 130), (signal.SIGINT, False, 130)],
    ids=["SIGTERM-to-parent", "SIGINT-to-group", "SIGINT-to-parent"],
)
def test_a_signal_reaches_the_run_once_and_leaves_nothing(
    tmp_path: Path, signum: int, whole_group: bool, code: int
) -> None:
    run = _start(tmp_path, "stalls", start_new_session=True)  # its own group: killpg spares this test
    _wait_stalled(tmp_path, run)
    os.killpg(run.pid, signum) if whole_group else os.kill(run.pid, signum)
    _, err = run.communicate(timeout=120)
    assert run.returncode == code, err
    name = signal.Signals(signum).name
    assert err.count("interrupted") == 1 and f"interrupted ({name}); staging removed" in err, err
    out = tmp_path / "out"
    assert not out.exists() or list(out.iterdir()) == []  # no .sup.partial-*, no .sup.lock


@pytest.mark.slow
def test_ctrl_c_in_a_terminal_interrupts_the_run_once(tmp_path: Path) -> None:
    """The CLI on a pseudo-terminal of its own; ^C makes the terminal send SIGINT to its foreground group, the
    supervisor and the run together (si_code SI_KERNEL), and the supervisor does not forward a second copy."""
    import fcntl
    import pty
    import termios

    master, slave = pty.openpty()

    def take_terminal() -> None:  # runs in the new session: the pty becomes its controlling terminal
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    try:
        terminal = {"stdin": slave, "stdout": slave, "start_new_session": True, "preexec_fn": take_terminal}
        run = _start(tmp_path, "stalls", "-v", **terminal)  # -v: a second copy of the signal would be logged
        _wait_stalled(tmp_path, run)
        os.write(master, b"\x03")
        _, err = run.communicate(timeout=120)
    finally:
        os.close(slave)
        os.close(master)
    assert run.returncode == 130, err
    assert err.count("interrupted") == 1 and "interrupted (SIGINT); staging removed" in err, err
    assert "second interrupting signal" not in err
    assert list((tmp_path / "out").iterdir()) == []


@pytest.mark.slow
def test_the_run_dies_with_a_sigkilled_parent(tmp_path: Path) -> None:
    """The kernel sends the child SIGTERM when the parent dies: it cleans up as after any SIGTERM and ends."""
    run = _start(tmp_path, "stalls")
    _wait_stalled(tmp_path, run)
    children = _children(run.pid)
    assert len(children) == 1
    run.kill()
    run.wait(timeout=30)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(children[0], 0)
        except ProcessLookupError:
            assert list((tmp_path / "out").iterdir()) == []  # its staging and lock removed on the way out
            return
        time.sleep(0.1)
    pytest.fail(f"the child {children[0]} outlived its parent")


@pytest.mark.slow
def test_a_run_killed_by_sigkill_exits_137_with_a_line(tmp_path: Path) -> None:
    run = _start(tmp_path, "stalls")
    _wait_stalled(tmp_path, run)
    (child,) = _children(run.pid)
    os.kill(child, signal.SIGKILL)  # as the out-of-memory killer would
    _, err = run.communicate(timeout=60)
    assert run.returncode == 137, err
    line = err.strip().splitlines()[-1]
    assert line.startswith("deploy_opt build: error: the process ended without finishing (os._exit or a kill in user")
    assert "killed by SIGKILL; fix: " in line


def test_ctrl_c_from_the_terminal_is_not_forwarded_twice() -> None:
    assert not should_forward(signal.SIGINT, SI_KERNEL)
    assert should_forward(signal.SIGINT, 0) and should_forward(signal.SIGTERM, SI_KERNEL)


def test_without_the_supervisor_the_command_runs_in_this_process(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DEPLOY_OPT_NO_SUPERVISOR", "1")
    assert run_supervised(os.getpid) == os.getpid()
