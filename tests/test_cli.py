"""The CLI's surface: --version, exit codes under every --help, the program name as invoked, log line format."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from deploy_opt.cli.parser import EXIT_CODES, GATE_EXIT_CODES, make_parser, program_name, version

REPO = Path(__file__).resolve().parents[1]


def _commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """(argv path, parser) for every command and action, depth first."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield (*path, name), child
                yield from _commands(child, (*path, name))


def test_every_command_and_action_lists_its_exit_codes() -> None:
    found = dict(_commands(make_parser("deploy-opt")))
    assert {("build",), ("gate",), ("train", "search"), ("scales", "import"), ("align", "verify")} <= set(found)
    for path, parser in found.items():
        text = parser.format_help()
        expected = GATE_EXIT_CODES if path == ("gate",) else EXIT_CODES
        assert text.rstrip().endswith(expected.rstrip()), path
        assert f"usage: deploy-opt {' '.join(path)}" in text.replace("\n", " "), path


def test_version_is_the_installed_distributions(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        make_parser("deploy-opt").parse_args(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.strip() == f"deploy-opt {version()}"
    from importlib import metadata

    assert version() == metadata.version("deploy_opt")  # pyproject.toml reads deploy_opt.__version__


@pytest.mark.parametrize(
    ("argv0", "shown"),
    [
        ("/usr/local/bin/deploy-opt", "deploy-opt"),
        ("/repo/deploy_opt/__main__.py", "python -m deploy_opt"),
        ("", "python -m deploy_opt"),
    ],
)
def test_the_program_name_is_what_the_user_typed(argv0: str, shown: str) -> None:
    assert program_name(argv0) == shown


def test_usage_errors_name_the_module_form_when_run_as_a_module() -> None:
    result = subprocess.run([sys.executable, "-m", "deploy_opt", "gate"], capture_output=True, text=True, cwd=REPO)
    assert result.returncode == 2 and result.stderr.startswith("usage: python -m deploy_opt gate")


@pytest.mark.parametrize(("flags", "line"), [([], "INFO hello"), (["-v"], "INFO deploy_opt.stages.stage: hello")])
def test_log_lines_show_module_paths_only_with_verbose(flags: list[str], line: str) -> None:
    code = (
        "import logging\nfrom deploy_opt.cli import main\n"
        f"main({[*flags, 'profiles']!r})\nlogging.getLogger('deploy_opt.stages.stage').info('hello')\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert result.returncode == 0, result.stderr
    assert line in result.stderr.splitlines()


def test_verbose_shows_our_debug_lines_and_not_other_libraries() -> None:
    code = (
        "import logging\nfrom deploy_opt.cli import main\nmain(['-v', 'profiles'])\n"
        "logging.getLogger('deploy_opt.stages.stage').debug('ours')\n"
        "logging.getLogger('matplotlib.font_manager').debug('theirs')\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert result.returncode == 0, result.stderr
    assert "DEBUG deploy_opt.stages.stage: ours" in result.stderr and "theirs" not in result.stderr
