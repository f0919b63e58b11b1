"""The code base keeps its layers: checked on the real tree, and shown to fail on a tree that breaks them."""

from __future__ import annotations

from pathlib import Path

import pytest
from layering import violations

REPO = Path(__file__).resolve().parents[1]


def test_the_tree_keeps_its_layers() -> None:
    assert violations(REPO) == []


@pytest.mark.parametrize(
    "path,code,expected",
    [
        ("calibrators/bad.py", "def f():\n    from deploy_opt.stages import sources\n", "never import deploy_opt"),
        ("exporters/bad.py", "import deploy_opt\n", "never import deploy_opt"),
        ("deploy_opt/stages/bad.py", "import torch\n", "top-level import of torch"),
        ("deploy_opt/analysis/compat_extra.py", "from tensorrt import Builder\n", "top-level import of tensorrt"),
        ("deploy_opt/config/bad.py", "import deploy_opt.report.gate\n", "import cycle"),
        ("deploy_opt/stages/long.py", "def f():\n" + "    x = 1\n" * 80, "f is 81 lines (at most 80)"),
        ("calibrators/wide.py", "x = [1,  2]  " + "# fmt: " + "skip\n", "let ruff format lay it out"),
    ],
)
def test_a_forbidden_import_fails(tree: Path, path: str, code: str, expected: str) -> None:
    if "cycle" in expected:  # close a cycle: gate -> config.bad -> gate
        gate = tree / "deploy_opt/report/gate.py"
        gate.write_text(gate.read_text() + "\n\ndef _cycle():\n    from deploy_opt.config import bad  # noqa\n")
    (tree / path).write_text(code)
    found = violations(tree)
    assert any(expected in line and ("cycle" in expected or path in line) for line in found), found


def test_a_package_cycle_fails_without_a_module_cycle(tree: Path) -> None:
    """evaluation -> report.trust and report.gate -> evaluation.uncertainty: no module imports itself back, but
    the packages depend on each other both ways."""
    (tree / "deploy_opt/evaluation/bad.py").write_text("from deploy_opt.report import trust  # noqa\n")
    found = violations(tree)
    assert not any("import cycle" in line for line in found), found
    assert any(
        line.startswith("package cycle:") and "deploy_opt.evaluation" in line and "deploy_opt.report" in line
        for line in found
    ), found


@pytest.mark.parametrize(
    "loose", ["dict", "dict[str, Any]", "tuple[Path, int]", "dict[str, dict[str, float]] | None", "Any"]
)
def test_a_stage_returning_a_loose_record_fails(tree: Path, loose: str) -> None:
    summary = tree / "deploy_opt/stages/summary.py"
    text = summary.read_text()
    typed = "def target_status(deploy: DeployConfig, backends: Backends) -> Targets:"
    assert typed in text
    summary.write_text(text.replace(typed, typed.replace("Targets", loose)))
    found = violations(tree)
    assert any("summary.py" in line and "stage target_status returns" in line for line in found), found


@pytest.mark.parametrize(
    ("returns", "flagged"),
    [
        ("dict[str, int]", True),
        ("dict", True),
        ("tuple[Path, dict[str, Any]]", True),
        ("Mapping[str, float] | None", True),
        ("", True),  # unannotated
        ("dict[str, np.ndarray]", False),  # an ORT feed
        ("dict[str, Latency]", False),  # typed results by name
        ("Latency", False),
    ],
)
def test_any_public_stage_function_returning_a_dict_fails(tree: Path, returns: str, flagged: bool) -> None:
    """Not only the stages the pipeline composes: every public function of deploy_opt/stages/."""
    arrow = f" -> {returns}" if returns else ""
    (tree / "deploy_opt/stages/extra.py").write_text(
        f"def table(){arrow}:\n    ...\n\n\ndef _private() -> dict:\n    ...\n"
    )
    found = [line for line in violations(tree) if "extra.py" in line]
    assert bool(found) is flagged and all("stage function table returns" in line for line in found), found


def test_heavy_imports_inside_functions_are_allowed(tree: Path) -> None:
    (tree / "deploy_opt/stages/lazy.py").write_text("def f() -> object:\n    import torch\n    return torch\n")
    assert violations(tree) == []


def test_the_import_test_covers_every_module() -> None:
    from test_imports import all_modules

    import deploy_opt

    assert "deploy_opt.pipeline.build" in all_modules() and len(all_modules()) > 80
    assert deploy_opt.__name__ == "deploy_opt"


@pytest.mark.parametrize(
    "annotation", ["BuildConfig", "BuildConfig | None", "'BuildConfig'", "build.BuildConfig", "list[BuildConfig]"]
)
def test_a_stage_taking_the_whole_config_fails(tree: Path, annotation: str) -> None:
    """Outside the composing modules a function takes the sections it reads, never the whole BuildConfig."""
    (tree / "deploy_opt/stages/greedy.py").write_text(
        f"def calibrate(x: int, *, config: {annotation}) -> None:\n    pass\n"
    )
    found = violations(tree)
    assert any("stages/greedy.py:1: calibrate takes config: BuildConfig" in line for line in found), found


def test_the_composing_modules_and_listed_transformations_may_take_the_whole_config(tree: Path) -> None:
    (tree / "deploy_opt/pipeline/build.py").write_text(
        (tree / "deploy_opt/pipeline/build.py").read_text() + "\n\ndef _more(config: BuildConfig) -> None:\n    pass\n"
    )
    assert violations(tree) == []
