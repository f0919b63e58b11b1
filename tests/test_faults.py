"""Hostile inputs and faults (issue 32): names that would escape the output folder, a publish killed between any
two filesystem steps, a failing build beside the last passing one, user code that exits, unbounded settings,
resource faults and the messages of damaged inputs. Every case ends in its documented exit code."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import build_tiny

from deploy_opt.cli import main, resource_fault
from deploy_opt.config.data import DataConfig
from deploy_opt.config.loader import build_dataclass
from deploy_opt.data.sources import call_user, iter_batches, resolve_callable
from deploy_opt.llm.config import LLMConfig
from dopt_common.errors import ConfigError, ModelError, OutputError, ReportError, SourceError
from dopt_common.files import ensure_writable_dir
from dopt_common.names import check_run_name, run_dir, shown
from dopt_common.ownership import new_owner, write_marker
from dopt_common.runs import failed_dir, staged_dir, sweep_stale

ROOT = Path(__file__).resolve().parents[1]

# ------------------------------------------------------------------------------------------------------- names

DATA = DataConfig(calibration="c.py:f", evaluation="e.py:f")


@pytest.mark.parametrize(
    "name", ["../victim", "/abs/dir", "a/b", "a\\b", "..", ".", ".hidden", "x" * 129, "nul\x00byte", "", "tab\there"]
)
def test_a_run_name_is_one_plain_path_component(name: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="a run name is one folder name"):
        run_dir(tmp_path, name)
    with pytest.raises(ConfigError):
        LLMConfig(name=name)


def test_a_good_name_passes_and_stays_under_the_root(tmp_path: Path) -> None:
    assert run_dir(tmp_path, "smollm2-awq-g64") == tmp_path / "smollm2-awq-g64"
    assert check_run_name("x" * 128) == "x" * 128


def test_quantize_llm_refuses_a_name_outside_the_output_folder_before_any_work(tmp_path: Path, capsys) -> None:
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "notes.txt").write_text("keep me")
    out = tmp_path / "out"
    out.mkdir()
    code = main(["quantize-llm", "--path", "smollm2", "--name", "../victim", "--output-dir", str(out)])
    assert code == 2 and "a run name is one folder name" in capsys.readouterr().err
    assert (victim / "notes.txt").read_text() == "keep me"


def test_build_refuses_a_long_or_nul_name_with_exit_2(tmp_path: Path, capsys) -> None:
    for bad in ("x" * 300, "a\x00b"):
        code = main(["build", "--profile", "ci", "--set", f"name={json.dumps(bad)}", "--output-dir", str(tmp_path)])
        assert code == 2, capsys.readouterr().err
        assert "a run name is one folder name" in capsys.readouterr().err


# ----------------------------------------------------------------------------------------- publish under kills

_KILLED_PUBLISH = textwrap.dedent(
    """
    import os, signal, sys
    from pathlib import Path
    import dopt_common.files as files
    from dopt_common.runs import staged_dir

    out, step = Path(sys.argv[1]), sys.argv[2]
    files.STEP_HOOK = lambda name: os.kill(os.getpid(), signal.SIGKILL) if name == step else None
    with staged_dir(out) as stage:
        (stage / "build.json").write_text("new")
        (stage / "model.onnx").write_text("new model")
    """
)


@pytest.mark.parametrize(("step", "survivor"), [("renamed-old", "old"), ("renamed-new", "new"), ("removed-old", "new")])
def test_a_publish_killed_between_any_two_steps_leaves_a_complete_report(
    tmp_path: Path, step: str, survivor: str
) -> None:
    out = tmp_path / "reports" / "demo"
    out.mkdir(parents=True)
    (out / "build.json").write_text("old")
    (out / "model.onnx").write_text("old model")
    write_marker(out, new_owner("build"))
    run = subprocess.run([sys.executable, "-c", _KILLED_PUBLISH, str(out), step], cwd=ROOT, check=False)
    assert run.returncode == -signal.SIGKILL
    # The next run fails before publishing: the last complete report must still be there afterwards.
    with pytest.raises(RuntimeError), staged_dir(out):
        raise RuntimeError("the next build fails")
    assert (out / "build.json").read_text() == survivor
    assert (out / "model.onnx").read_text() == f"{survivor} model"
    assert [p.name for p in out.parent.iterdir() if p.name.startswith(".demo.")] == []


_SIGNALLED_PUBLISH = textwrap.dedent(
    """
    import os, signal, sys
    from pathlib import Path
    import dopt_common.files as files
    from dopt_common.errors import Interrupted
    from dopt_common.runs import staged_dir

    def interrupt(signum, frame):
        raise Interrupted(signum)

    signal.signal(signal.SIGTERM, interrupt)
    out, step = Path(sys.argv[1]), sys.argv[2]
    files.STEP_HOOK = lambda name: os.kill(os.getpid(), signal.SIGTERM) if name == step else None
    try:
        with staged_dir(out) as stage:
            (stage / "build.json").write_text("new")
    except Interrupted as exc:
        print(f"published={exc.published}")
        sys.exit(143)
    """
)


@pytest.mark.parametrize("step", ["renamed-old", "renamed-new", "removed-old"])
def test_a_signal_during_the_swap_lands_after_it_and_reports_the_new_build(tmp_path: Path, step: str) -> None:
    out = tmp_path / "demo"
    out.mkdir()
    (out / "build.json").write_text("old")
    write_marker(out, new_owner("build"))
    run = subprocess.run(
        [sys.executable, "-c", _SIGNALLED_PUBLISH, str(out), step],
        cwd=ROOT,
        check=False,
        capture_output=True,
        text=True,
    )
    assert run.returncode == 143, run.stderr
    assert run.stdout.strip() == f"published={out}"
    assert (out / "build.json").read_text() == "new"
    assert [p.name for p in tmp_path.iterdir()] == ["demo"]  # the old folder was removed whole, no leftover


def test_a_stale_old_symlink_is_left_and_never_followed(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("keep")
    reports = tmp_path / "reports"
    reports.mkdir()
    (reports / ".demo.old-999999999").symlink_to(outside)
    assert sweep_stale(reports) == []  # a link is not a folder deploy_opt wrote: not ours to remove
    assert (outside / "keep.txt").read_text() == "keep" and os.path.islink(reports / ".demo.old-999999999")


# --------------------------------------------------------------------------------- failing vs passing builds


@pytest.mark.slow
def test_a_failing_build_never_replaces_the_last_passing_one(tmp_path: Path) -> None:
    passing = build_tiny(tmp_path, "gate: {max_drop: 100}")
    assert passing.gate.passed and passing.kept is None
    before = (passing.out_dir / "build.json").read_bytes()
    failing = build_tiny(tmp_path, "gate: {max_drop: 100}", unmeetable=True)
    assert not failing.gate.passed
    assert failing.kept == passing.out_dir and failing.out_dir == failed_dir(passing.out_dir)
    assert (passing.out_dir / "build.json").read_bytes() == before
    assert json.loads((failing.out_dir / "build.json").read_text())["gate"]["passed"] is False
    again = build_tiny(tmp_path, "gate: {max_drop: 100}")  # a passing build replaces it and clears .failed
    assert again.out_dir == passing.out_dir and not failed_dir(passing.out_dir).exists()


@pytest.mark.parametrize("value", ["-1", "-0.5", ".nan"])
def test_a_negative_or_nan_max_drop_is_refused_at_load(tmp_path: Path, capsys, value: str) -> None:
    code = main(["build", "--profile", "ci", "--set", f"gate.max_drop={value}", "--output-dir", str(tmp_path)])
    assert code == 2 and "max_drop" in capsys.readouterr().err
    assert not (tmp_path / "digits-mlp").exists()


def test_gate_thresholds_on_the_cli_must_be_non_negative(tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["gate", str(tmp_path), "--max-drop", "-1"])
    assert exit_info.value.code == 2


# ---------------------------------------------------------------------------------------------- user code


def test_sys_exit_or_keyboard_interrupt_in_user_code_is_a_named_error() -> None:
    def exits() -> None:
        sys.exit(0)

    def interrupts() -> None:
        raise KeyboardInterrupt

    with pytest.raises(SourceError, match=r"data.calibration 'm:f' called sys.exit\(0\)"):
        call_user(exits, "data.calibration 'm:f'")
    with pytest.raises(SourceError, match="raised KeyboardInterrupt itself"):
        call_user(interrupts, "data.metric 'm:g'")


def test_a_data_iterator_that_exits_midway_is_a_named_error(tmp_path: Path) -> None:
    from deploy_opt.config.model import InputSpec

    (tmp_path / "midway.py").write_text(
        "import sys\nimport numpy as np\n\ndef data():\n    yield np.zeros((2, 4), np.float32), None\n    sys.exit(3)\n"
    )
    specs = (InputSpec("x", ("batch", 4), "float32"),)
    with pytest.raises(SourceError, match=r"at item 1 called sys.exit\(3\)"):
        list(iter_batches("midway.py:data", specs, DATA, tmp_path, "data.evaluation"))


def test_a_module_that_parses_argv_at_import_is_a_named_error(tmp_path: Path) -> None:
    (tmp_path / "cli_module.py").write_text("import argparse\nargparse.ArgumentParser().parse_args(['--nope'])\n")
    with pytest.raises(SourceError, match="called sys.exit"):
        resolve_callable("cli_module.py:f", tmp_path, "data.calibration")


@pytest.mark.slow
def test_a_build_whose_data_function_exits_0_ends_with_exit_2(tmp_path: Path, capsys) -> None:
    (tmp_path / "exiting.py").write_text(
        "import sys\n\ndef calibration():\n    sys.exit(0)\n\ndef evaluation():\n    sys.exit(0)\n"
    )
    config = tmp_path / "b.yaml"
    config.write_text(
        "name: exiting\nmodel: {factory: 'deploy_opt.demo.digits:build_model', inputs: [{name: pixels, shape: "
        "[batch, 64], dtype: float32}]}\ndata: {calibration: 'exiting.py:calibration', evaluation: "
        "'exiting.py:evaluation', metric: top1}\n"
    )
    code = main(["build", str(config), "--profile", "ci", "--output-dir", str(tmp_path / "r")])
    err = capsys.readouterr().err
    assert code == 2 and "called sys.exit(0)" in err, err


# ------------------------------------------------------------------------------------------------- bounds


@pytest.mark.parametrize(
    ("override", "bound"),
    [
        ("calibration.bins=1000000000", "from 16 to 65536"),
        ("seed=1180591620717411303424", "from 0 to 4294967295"),
        ("calibration.samples=0", "from 1 to"),
        ("benchmark.repeats=100000000", "from 1 to 100000"),
    ],
)
def test_settings_that_size_memory_or_time_are_bounded_at_load(tmp_path: Path, capsys, override, bound) -> None:
    code = main(["build", "--profile", "ci", "--set", override, "--output-dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2 and bound in err, err


def test_a_yaml_anchor_bomb_gives_a_short_message() -> None:
    from dataclasses import dataclass

    @dataclass(frozen=True)
    class Tiny:
        bins: int = 2048

    bomb: list = ["lol"] * 10
    for _ in range(8):
        bomb = [bomb] * 10  # 10^9 leaves, shared as YAML anchors share them
    with pytest.raises(ConfigError) as info:
        build_dataclass(Tiny, {"bins": bomb}, "calibration")
    assert len(str(info.value)) < 400


def test_shown_cuts_values_and_says_how_long_they_were() -> None:
    assert shown("x" * 500).endswith("... (500 characters)") and len(shown("x" * 500)) < 230
    assert shown("short") == "short"


def test_a_long_description_is_refused(tmp_path: Path, capsys) -> None:
    code = main(["build", "--profile", "ci", "--set", f"description={'d' * 5000}", "--output-dir", str(tmp_path)])
    assert code == 2 and "description is 5000 characters long" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------- resource faults


def test_disk_full_becomes_one_line_with_the_path_and_free_space(tmp_path: Path) -> None:
    exc = OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "model.onnx"))
    line = resource_fault(exc, tmp_path)
    assert line is not None and line.startswith("the disk is full writing under") and "MiB free" in line
    assert "ulimit" in (resource_fault(OSError(errno.EMFILE, "Too many open files"), tmp_path) or "")
    assert resource_fault(ValueError("a bug"), tmp_path) is None  # plenty of space: a real internal error


def test_a_disk_full_during_a_command_exits_2(tmp_path: Path, monkeypatch, capsys) -> None:
    import deploy_opt.cli as cli

    def full(_args):
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "x"))

    monkeypatch.setattr(cli, "_commands", lambda: {"build": full})
    assert main(["build", "--profile", "ci", "--output-dir", str(tmp_path)]) == 2
    assert "the disk is full" in capsys.readouterr().err


# -------------------------------------------------------------------------------------------------- messages


def test_a_text_file_named_onnx_and_a_folder_as_model_say_what_they_are(tmp_path: Path) -> None:
    from exporters.onnx.checks import check_onnx

    text = tmp_path / "model.onnx"
    text.write_text("not a model at all\n")
    with pytest.raises(ModelError, match="is not a readable ONNX model \\(it looks like text"):
        check_onnx(text)
    with pytest.raises(ModelError, match="is a folder"):
        check_onnx(tmp_path)


def test_a_file_as_output_dir_says_so(tmp_path: Path) -> None:
    target = tmp_path / "file"
    target.write_text("x")
    with pytest.raises(OutputError, match="is a file, not a folder"):
        ensure_writable_dir(target)


def test_report_on_a_truncated_build_json_exits_2(tmp_path: Path) -> None:
    from deploy_opt.report.folder_page import write_report_page

    (tmp_path / "build.json").write_text('{"metrics": {"name": "top1", "ort_fp32"')
    with pytest.raises(ReportError, match="truncated or malformed"):
        write_report_page(tmp_path)


@pytest.mark.parametrize("value", ["Infinity", "NaN"])
def test_a_non_finite_scale_says_so(tmp_path: Path, value: str) -> None:
    from calibrators.scales.format import ScaleFile, TensorScale, load_scale_file, save_scale_file

    path = tmp_path / "scales.json"
    save_scale_file(ScaleFile("symmetric", {"x": TensorScale("x", "activation", "int8", (0.5,), (0,))}), path)
    text = path.read_text().replace('"scale": [\n        0.5\n      ]', f'"scale": [{value}]')
    assert value in text
    path.write_text(text)
    with pytest.raises(Exception, match="not a finite") as info:
        load_scale_file(path)
    assert "disagree" not in str(info.value) and "less than" not in str(info.value)


@pytest.mark.slow
def test_sensitivity_on_a_build_that_ships_fp32_reports_instead_of_crashing(tmp_path: Path) -> None:
    from conftest import fragile_config, unmeetable_gate

    from deploy_opt.pipeline.build import run_build

    config, profile = fragile_config(tmp_path, 0.0, "sensitivity: {enabled: true}\nauto: {budget_s: 20}")
    result = run_build(unmeetable_gate(config), profile, tmp_path / "reports", progress=False)
    assert result.build.quantization.quantized_nodes == 0 and not result.gate.passed
    assert (result.out_dir / "build.json").is_file()


# ---------------------------------------------------------------------------------- FP32 ships: timed once


class _CountingSession:
    """What the benchmark needs of an ORT InferenceSession: ``run(None, feed)`` returning a list of arrays."""

    def __init__(self) -> None:
        self.calls = 0

    def run(self, _outputs, feed):
        self.calls += 1
        return [next(iter(feed.values())) * 2.0]


def test_a_model_that_is_the_fp32_graph_is_timed_once_with_speedup_exactly_1() -> None:
    import numpy as np

    from deploy_opt.data.sources import Batch
    from deploy_opt.stages.benchmark import compare

    fp32, int8 = _CountingSession(), _CountingSession()
    batch = Batch({"x": np.ones((1, 4), np.float32)}, None)
    rows = compare({"ort_fp32": fp32, "ort_int8": int8}, batch, (1, 2), 1, 5, 0.05, same={"ort_int8": "ort_fp32"})
    assert int8.calls == 0 and fp32.calls > 0
    for row in rows.values():
        assert row.timings["ort_int8"] == row.timings["ort_fp32"]
        assert row.speedups["speedup"] == 1.0 and row.intervals["speedup"] == (1.0, 1.0)


def test_align_verify_on_a_truncated_model_exits_2_not_3(tmp_path: Path, capsys) -> None:
    from calibrators.scales.format import ScaleFile, TensorScale, save_scale_file

    save_scale_file(
        ScaleFile("symmetric", {"x": TensorScale("x", "activation", "int8", (0.5,), (0,))}), tmp_path / "scales.json"
    )
    (tmp_path / "model.int8.onnx").write_bytes(b"\x08\x07\x12\x05torch\x3a\xff\xff")  # a model cut short
    code = main(["align", "verify", str(tmp_path)])
    err = capsys.readouterr().err
    assert code in (1, 2) and "internal error" not in err, err


def test_a_nan_score_is_bad_numbers_exit_2_not_a_gate_verdict() -> None:
    from types import SimpleNamespace

    from deploy_opt.evaluation.metrics import resolve_metric
    from deploy_opt.stages.summary import metric_record
    from dopt_common.errors import NumericsError

    scores = SimpleNamespace(values={"ort_fp32": 99.0, "ort_int8": float("nan")}, samples=8)
    with pytest.raises(NumericsError, match="nan on ort_int8"):
        metric_record(resolve_metric("top1"), SimpleNamespace(scores=scores), labelled=True)


def test_an_llm_gate_that_is_not_a_number_is_refused_at_load() -> None:
    from deploy_opt.llm.config import LLMGateConfig

    with pytest.raises(ConfigError, match="gate.max_ppl_increase: max perplexity increase 'five percent'"):
        LLMGateConfig(max_ppl_increase="five percent")
    assert LLMGateConfig(max_ppl_increase="5%").max_ppl_increase == "5%"
