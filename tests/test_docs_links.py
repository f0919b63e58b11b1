"""README.md and docs/*.md point only at what exists.

On every page:
- **Markdown links** ``[text](target)`` outside fenced code: a relative target must be an existing file or folder,
  relative to the page. ``http(s)://`` and ``mailto:`` links are skipped. A ``#anchor`` (alone, or after a ``.md``
  target) must be the GitHub slug of a heading of that page.
- **Repository paths in code** (inline code spans and fenced blocks, split on whitespace; ``--opt=PATH`` and
  ``PATH:function`` count as PATH): a word is a repository path when its first ``/``-separated part is an entry
  at the repository's top level (``deploy_opt``, ``tests``, ``.ci``, ``pyproject.toml``, ...) and it contains a
  ``/`` or ends in .py, .yaml, .yml, .sh, .json, .toml or .md. It must exist. Skipped: words with a glob or
  placeholder character (``* ? [ ] { } < > |``, ``...``, ``…``), and anything under ``reports/``, where runs
  write their outputs (its README is reached by a Markdown link).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PATH_SUFFIXES = (".py", ".yaml", ".yml", ".sh", ".json", ".toml", ".md")
PLACEHOLDER = re.compile(r"[*?\[\]{}<>|…]|\.\.\.")
OUTPUT_FOLDERS = ("reports",)
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
INLINE_CODE = re.compile(r"`([^`]+)`")
HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$")


def split_fences(text: str) -> tuple[str, str]:
    """The page's prose (fenced blocks blanked, lines kept) and the text of its fenced blocks."""
    prose, code, inside = [], [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            inside = not inside
            prose.append("")
        elif inside:
            code.append(line)
            prose.append("")
        else:
            prose.append(line)
    return "\n".join(prose), "\n".join(code)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: link text kept, lowercased, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every heading anchor of a Markdown page, duplicates numbered as GitHub numbers them."""
    prose, _ = split_fences(page.read_text(encoding="utf-8"))
    counts: dict[str, int] = {}
    found = set()
    for line in prose.splitlines():
        match = HEADING.match(line)
        if match:
            base = slug(match.group(2))
            found.add(f"{base}-{counts[base]}" if base in counts else base)
            counts[base] = counts.get(base, 0) + 1
    return found


def link_problems(page: Path) -> list[str]:
    """Relative links of page whose file, folder or heading anchor does not exist."""
    prose, _ = split_fences(page.read_text(encoding="utf-8"))
    problems = []
    for target in LINK.findall(prose):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        path_part, _, anchor = target.partition("#")
        linked = (page.parent / path_part) if path_part else page
        if not linked.exists():
            problems.append(f"{page.name}: link to a missing file or folder: {target}")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            problems.append(f"{page.name}: link to a missing heading: {target}")
    return problems


def repository_path(word: str, top_level: set[str]) -> str | None:
    """word as a repository path by the docstring's rule, or None when it is not one."""
    word = word.rsplit("=", 1)[-1].split(":", 1)[0].lstrip("('\"").rstrip(")'\",;.")
    first = word.split("/", 1)[0]
    if first not in top_level or first in OUTPUT_FOLDERS or PLACEHOLDER.search(word):
        return None
    return word if "/" in word or word.endswith(PATH_SUFFIXES) else None


def path_problems(page: Path, root: Path) -> list[str]:
    """Repository paths named in page's code that do not exist under root."""
    top_level = {entry.name for entry in root.iterdir() if entry.name != ".git"}
    prose, code = split_fences(page.read_text(encoding="utf-8"))
    words = [word for span in INLINE_CODE.findall(prose) for word in span.split()] + code.split()
    problems = []
    for word in words:
        path = repository_path(word, top_level)
        if path is not None and not (root / path).exists():
            problems.append(f"{page.name}: names a path that does not exist: {path}")
    return problems


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.relative_to(ROOT).as_posix())
def test_links_resolve(page: Path) -> None:
    assert link_problems(page) == []


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.relative_to(ROOT).as_posix())
def test_code_paths_exist(page: Path) -> None:
    assert path_problems(page, ROOT) == []


def test_index_lists_every_page() -> None:
    index = (ROOT / "docs" / "index.md").read_text(encoding="utf-8")
    linked = {Path(target.partition("#")[0]).name for target in LINK.findall(index)}
    assert {page.name for page in PAGES[1:]} - {"index.md"} <= linked
    assert "docs/index.md" in (ROOT / "README.md").read_text(encoding="utf-8")


def test_readme_fits_on_a_screen_and_keeps_two_setup_commands() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 200
    setup = readme.split("## Set-up on a fresh machine", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    commands = setup.splitlines()
    assert len(commands) == 2
    assert "python -m pytest -n 2" in commands[1]  # the command .ci/run runs


def test_checks_catch_a_broken_link_anchor_and_path(tmp_path: Path) -> None:
    (tmp_path / "deploy_opt").mkdir()
    (tmp_path / "deploy_opt" / "real.py").write_text("")
    (tmp_path / "other.md").write_text("# Other page\n\n## A `code` heading: here\n")
    page = tmp_path / "page.md"
    page.write_text(
        "# Page\n\n"
        "[ok](other.md#a-code-heading-here) [web](https://example.com/x) [self](#page)\n"
        "[gone](missing.md) [bad anchor](other.md#nowhere) [bad self](#nothing)\n"
        "`deploy_opt/real.py` `deploy_opt/gone.py` `deploy_opt/*.py` `reports/<name>/x.json` `model.onnx`\n"
        "```bash\npython deploy_opt/real.py --config=deploy_opt/absent.yaml\n```\n"
    )
    assert link_problems(page) == [
        "page.md: link to a missing file or folder: missing.md",
        "page.md: link to a missing heading: other.md#nowhere",
        "page.md: link to a missing heading: #nothing",
    ]
    assert path_problems(page, tmp_path) == [
        "page.md: names a path that does not exist: deploy_opt/gone.py",
        "page.md: names a path that does not exist: deploy_opt/absent.yaml",
    ]
