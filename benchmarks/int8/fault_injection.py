"""Fault injection: random SIGKILL, SIGINT and SIGTERM over real runs of the CLI, and what each leaves behind.

Three scenarios on the fast models of the test suite (tests/tiny_onnx.py's MLP, tests/tiny_llama.py's 2-layer
Llama): a ``build``, an LLM ``quantize-llm`` and a ``build a.yaml b.yaml --parallel 2``. Each trial starts the CLI as
a user would (its own session; SIGINT goes to the whole process group as Ctrl-C sends it, SIGTERM and SIGKILL to
the pid), waits a random time drawn over the run's measured duration, sends a random signal and checks:

- the exit code is one the README's table lists (0, 1, 130, 143; -9 for SIGKILL);
- every run folder is either the previous complete report, byte for byte, or a new complete one (its marker names
  its kind, its record parses, and a build's artifacts pass ``check_integrity``);
- nothing else is left: after SIGINT or SIGTERM no staging folder, lock or process at all; after SIGKILL only
  leftovers that the next run's start removes (checked by running that start: ``recover_published`` and
  ``sweep_stale``), and no process of the killed session;
- a sentinel tree (a look-alike ``.thesis.old-2023`` in the output folder, and a folder beside it) is unchanged.

    python benchmarks/int8/fault_injection.py --scenario build --trials 50 --seed 0
    python benchmarks/int8/fault_injection.py --scenario all --trials 50

Prints one line a trial and a summary; exits 1 if any trial broke a promise.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"
ALLOWED = {0, 1, 130, 143, -signal.SIGKILL}
SIGNALS = (signal.SIGKILL, signal.SIGINT, signal.SIGTERM)


@dataclass(frozen=True)
class Scenario:
    """A command to run in ``work`` and the run folders (with their kind) it publishes under ``work/out``."""

    name: str
    command: list[str]
    runs: dict[str, str]


@dataclass(frozen=True)
class Trial:
    """One trial's signal, delay, exit code and the broken promises (empty: it held)."""

    number: int
    signum: int
    delay: float
    code: int
    problems: tuple[str, ...]
    elapsed: float = 0.0  # seconds from start to exit


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "deploy_opt", "-q", *args]


def build_body(name: str) -> str:
    return (
        f"name: {name}\nmodel: {{onnx: tiny.onnx}}\n"
        f'data: {{calibration: "{TESTS / "tiny_onnx.py"}:calibration", '
        f'evaluation: "{TESTS / "tiny_onnx.py"}:evaluation", metric: top1}}\n'
        "quantization: {mode: manual}\nbenchmark: {enabled: false}\ngate: {max_drop: 100}\n"
    )


def make_scenario(name: str, work: Path) -> Scenario:
    """Write the models and configs of scenario ``name`` into ``work``."""
    sys.path.insert(0, str(TESTS))
    out = str(work / "out")
    if name in ("build", "parallel"):
        import tiny_onnx

        tiny_onnx.make_model(work / "tiny.onnx")
        (work / "a.yaml").write_text(build_body("tiny-a"))
        (work / "b.yaml").write_text(build_body("tiny-b"))
        if name == "build":
            return Scenario(name, _cli("build", "a.yaml", "--profile", "ci", "--output-dir", out), {"tiny-a": "build"})
        command = _cli("build", "a.yaml", "b.yaml", "--parallel", "2", "--profile", "ci", "--output-dir", out)
        return Scenario(name, command, {"tiny-a": "build", "tiny-b": "build"})
    import tiny_llama

    tiny_llama.make_tiny_llama(work / "model")
    flags = ["--method", "rtn", "--group-size", "32", "--samples", "16", "--max-seq-len", "64"]
    flags += ["--eval-tokens", "256", "--eval-seq-len", "64", "--generations", "1", "--max-new-tokens", "8"]
    command = _cli("quantize-llm", "--path", "model", "--output-dir", out, "--name", "tiny", *flags)
    return Scenario(name, command, {"tiny": "llm"})


def tree_hashes(root: Path) -> dict[str, str]:
    """Every entry under ``root`` with a digest (links as their text, never followed)."""
    entries = sorted(root.rglob("*")) if root.is_dir() else []
    return {str(path.relative_to(root)): _digest(path) for path in entries}


def _digest(path: Path) -> str:
    """A link's text, a file's sha256 (``dopt_common.files.sha256_file``), or ``dir``."""
    from dopt_common.files import sha256_file

    if path.is_symlink():
        return "link:" + os.readlink(path)
    return sha256_file(path) if path.is_file() else "dir"


def complete(folder: Path, kind: str) -> str | None:
    """None when ``folder`` is a complete run of ``kind``; else what is wrong."""
    from deploy_opt.report.integrity import check_integrity
    from dopt_common.ownership import read_marker

    owner = read_marker(folder)
    if owner is None or owner.kind != kind:
        return f"{folder.name}: no {kind} marker"
    record = folder / ("build.json" if kind == "build" else "quantize_report.json")
    try:
        data = json.loads(record.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        return f"{folder.name}: {record.name} unreadable ({exc})"
    if kind == "build":
        report = check_integrity(folder, data)
        return None if report.ok else f"{folder.name}: integrity {report.problems[:2]}"
    return None if (folder / "checkpoint").is_dir() else f"{folder.name}: no checkpoint/"


def _signal_name(signum: int) -> str:
    return signal.Signals(signum).name if signum else "none"


def session_processes(sid: int) -> list[int]:
    """Pids still running in session ``sid`` (the killed CLI's, its supervisor child, Ray's workers)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[3]) == sid and fields[0] != "Z":
                found.append(int(entry.name))
    return found


def leftovers(out: Path, scenario: Scenario) -> list[str]:
    """Entries of the output folder that are neither a run folder, its ``.failed``, nor the sentinel."""
    keep = {*scenario.runs, *(f"{n}.failed" for n in scenario.runs), ".thesis.old-2023"}
    return sorted(p.name for p in out.iterdir() if p.name not in keep) if out.is_dir() else []


def next_start(out: Path, scenario: Scenario) -> None:
    """What the next run's start does before any work: restore a killed publish, sweep dead runs' leftovers."""
    from dopt_common.ownership import recover_published
    from dopt_common.runs import _moved_by_gone, sweep_stale

    for name in scenario.runs:
        recover_published(out, name, _moved_by_gone)
    sweep_stale(out)


def check_trial(scenario: Scenario, work: Path, before: dict[str, dict[str, str]], signum: int) -> list[str]:
    """The promises a finished trial must keep (see the module docstring)."""
    out, problems = work / "out", []
    if signum != signal.SIGKILL and leftovers(out, scenario):
        problems.append(f"left after {_signal_name(signum)}: {leftovers(out, scenario)}")
    deadline = time.monotonic() + 30
    while session_processes(work_sid(work)) and time.monotonic() < deadline:
        time.sleep(0.2)
    if session_processes(work_sid(work)):
        problems.append(f"processes still running: {session_processes(work_sid(work))}")
    next_start(out, scenario)
    if leftovers(out, scenario):
        problems.append(f"left after the next start: {leftovers(out, scenario)}")
    for name, kind in scenario.runs.items():
        folder = out / name
        if before.get(name) is not None and tree_hashes(folder) == before[name]:
            continue  # the previous complete report, byte for byte
        wrong = complete(folder, kind)
        if wrong is not None:
            problems.append(wrong)
    return problems


_SIDS: dict[Path, int] = {}


def work_sid(work: Path) -> int:
    return _SIDS.get(work, -1)


def run_trial(scenario: Scenario, work: Path, number: int, rng: random.Random, span: float) -> Trial:
    """Start the CLI, signal it after a random delay within ``span`` seconds, and check what it left."""
    out = work / "out"
    before = {name: (tree_hashes(out / name) or None) for name in scenario.runs}
    signum, delay = rng.choice(SIGNALS), rng.uniform(0.0, span)
    proc = subprocess.Popen(
        scenario.command, cwd=work, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    _SIDS[work] = proc.pid
    started = time.monotonic()
    try:
        proc.wait(timeout=delay)
        signum = 0  # it finished first: no signal sent
    except subprocess.TimeoutExpired:
        if signum == signal.SIGINT:
            os.killpg(proc.pid, signum)  # Ctrl-C: the terminal signals the whole foreground group
        else:
            os.kill(proc.pid, signum)
    try:
        proc.wait(timeout=300)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return Trial(number, signum, delay, proc.returncode, ("did not end within 300 s of the signal",), 300.0)
    elapsed = time.monotonic() - started
    stderr = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    problems = check_trial(scenario, work, before, signum)
    if proc.returncode not in ALLOWED:
        problems.insert(0, f"exit {proc.returncode} not in the README's table: {stderr.strip()[-300:]}")
    if problems:  # the whole stderr of a broken trial, for the diagnosis
        kept = Path(tempfile.gettempdir()) / f"fault-{scenario.name}-{number}.stderr"
        kept.write_text(stderr)
        problems.append(f"stderr in {kept}")
    return Trial(number, signum, delay, proc.returncode, tuple(problems), elapsed)


def measure_span(scenario: Scenario, work: Path) -> float:
    """Seconds one uninterrupted run takes (it also leaves the first complete report)."""
    start = time.perf_counter()
    done = subprocess.run(scenario.command, cwd=work, capture_output=True, text=True, check=False)
    if done.returncode not in (0, 1):
        raise SystemExit(f"{scenario.name}: the uninterrupted run failed ({done.returncode}): {done.stderr[-500:]}")
    return time.perf_counter() - start


def run_scenario(name: str, trials: int, seed: int) -> list[Trial]:
    """``trials`` random signals over scenario ``name`` in a fresh folder, with a sentinel tree around it."""
    with tempfile.TemporaryDirectory(prefix=f"faults-{name}-") as tmp:
        work = Path(tmp)
        scenario = make_scenario(name, work)
        sentinel = work / "out" / ".thesis.old-2023"
        sentinel.mkdir(parents=True)
        (sentinel / "thesis.tex").write_text("x")
        (work / "beside").mkdir()
        (work / "beside" / "notes.txt").write_text("mine")
        guarded = {p: tree_hashes(p) for p in (sentinel, work / "beside")}
        # The signal lands at a random point of the run: the span is the latest whole run's duration (a machine
        # that gets busier or quieter moves it), so few trials end before their signal.
        span = measure_span(scenario, work)
        rng = random.Random(seed)
        results = []
        for number in range(trials):
            trial = run_trial(scenario, work, number, rng, span)
            if trial.signum == 0:
                span = trial.elapsed
            if {p: tree_hashes(p) for p in guarded} != guarded:
                trial = dataclasses.replace(trial, problems=(*trial.problems, "the sentinel tree changed"))
            results.append(trial)
            verdict = "ok" if not trial.problems else "BROKEN: " + "; ".join(trial.problems)
            print(
                f"{name} {number:3d} {_signal_name(trial.signum):7s} after {trial.delay:5.1f} s "
                f"exit {trial.code:4d}  {verdict}",
                flush=True,
            )
        return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", choices=["build", "llm", "parallel", "all"], default="all")
    parser.add_argument("--trials", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    names = ["build", "llm", "parallel"] if args.scenario == "all" else [args.scenario]
    broken = 0
    for name in names:
        results = run_scenario(name, args.trials, args.seed)
        codes = Counter(t.code for t in results)
        bad = [t for t in results if t.problems]
        broken += len(bad)
        print(f"{name}: {len(results)} trials, {len(bad)} broken; exit codes {dict(sorted(codes.items()))}")
    return 1 if broken else 0


if __name__ == "__main__":
    raise SystemExit(main())
