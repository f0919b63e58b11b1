"""The package layers drawn in docs/layout.md are the layers of the tree: every import points at a row below.

The drawing is a fenced block under "## Layers": one row a line, top to bottom, packages before ``│``. A package
is a top-level package (``calibrators``) or a package of ``deploy_opt`` (``stages`` for ``deploy_opt.stages``);
``deploy_opt/__main__.py`` belongs to ``cli``, and the package root (the version and the lazy public API) to no
row. Imports inside functions count, as in tests/layering.py.
"""

from __future__ import annotations

import re
from pathlib import Path

from layering import imports, module_files

REPO = Path(__file__).resolve().parents[1]
ROOT_MODULE = "deploy_opt"  # the version and the lazy public API: imported for __version__ from any row


def drawn_rows(page: Path) -> list[list[str]]:
    """The rows of the drawing, top first."""
    section = page.read_text(encoding="utf-8").split("## Layers", 1)[1]
    block = re.search(r"```\n(.*?)```", section, re.S)
    if block is None:
        raise AssertionError(f"{page}: no fenced drawing under '## Layers'")
    return [line.split("│")[0].split() for line in block.group(1).splitlines() if line.strip()]


def layer_of(module: str) -> str | None:
    """The drawn package of a module: ``deploy_opt.stages.calibrate`` -> ``stages``; None for the root."""
    parts = module.split(".")
    if parts[0] != "deploy_opt":
        return parts[0]
    if len(parts) == 1:
        return None
    return "cli" if parts[1] == "__main__" else parts[1]


def upward_imports(root: Path, rows: list[list[str]]) -> list[str]:
    """Every import that points at its own row or above, and every package the drawing leaves out."""
    height = {name: len(rows) - i for i, row in enumerate(rows) for name in row}
    modules = module_files(root)
    missing = sorted({f"{layer} is not drawn" for m in modules if (layer := layer_of(m)) and layer not in height})
    problems: set[str] = set()
    for name, path in modules.items():
        source = layer_of(name)
        for target, _, line in imports(path):
            drawn = layer_of(target) if target in modules else None
            if source is None or drawn is None or drawn == source or source not in height or drawn not in height:
                continue
            if height[drawn] >= height[source]:
                problems.add(f"{path.relative_to(root)}:{line}: {source} imports {drawn}, drawn on or above it")
    return missing + sorted(problems)


def test_the_drawing_is_the_tree() -> None:
    rows = drawn_rows(REPO / "docs/layout.md")
    names = [name for row in rows for name in row]
    assert len(names) == len(set(names)), "a package is drawn twice"
    assert upward_imports(REPO, rows) == []


def test_an_import_running_back_up_fails(tree: Path) -> None:
    rows = drawn_rows(REPO / "docs/layout.md")
    (tree / "deploy_opt/report/upward.py").write_text("def f():\n    from deploy_opt.pipeline import build\n")
    upward = "deploy_opt/report/upward.py:2: report imports pipeline, drawn on or above it"
    assert upward_imports(tree, rows) == [upward]


def test_a_package_left_out_of_the_drawing_fails(tree: Path) -> None:
    rows = [[name for name in row if name != "distill"] for row in drawn_rows(REPO / "docs/layout.md")]
    assert "distill is not drawn" in upward_imports(tree, rows)
