"""The layering rules of the code base, checked on the source (AST) without importing anything.

- ``calibrators`` and ``exporters`` (and ``dopt_common``) never import ``deploy_opt``, not even inside a function;
- torch, transformers and tensorrt are imported at module top level only where ``HEAVY_ALLOWED`` says;
- the first-party modules have no import cycles (imports at module level and inside functions both count).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

PACKAGES = ("deploy_opt", "calibrators", "exporters", "dopt_common", "profiles")
INDEPENDENT = ("calibrators", "exporters", "dopt_common")
HEAVY = ("torch", "transformers", "tensorrt")
# Where a heavy import may sit at module top level: torch-only code and the analysis that needs autograd.
HEAVY_ALLOWED = (
    "calibrators.groupwise",
    "exporters.lmdeploy",
    "deploy_opt.llm",
    "deploy_opt.train",
    "deploy_opt.demo",
    "deploy_opt.analysis.onnx_torch",
    "deploy_opt.analysis.sensitivity.noise",
)


def module_files(root: Path) -> dict[str, Path]:
    """Every first-party module under ``root``, by dotted name."""
    found = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


def imports(path: Path) -> Iterator[tuple[str, bool, int]]:
    """(imported module, at module top level, line) for every import statement of a file."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    top = {id(node) for node in tree.body}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, id(node) in top, node.lineno
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module, id(node) in top, node.lineno
            for alias in node.names:  # ``from pkg import module`` imports the submodule
                yield f"{node.module}.{alias.name}", id(node) in top, node.lineno


def _within(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def violations(root: Path) -> list[str]:
    """Every broken rule, one line each naming the file, the line and the import."""
    modules = module_files(root)
    problems, graph = [], {name: set() for name in modules}
    for name, path in modules.items():
        where = path.relative_to(root)
        for target, at_top, line in imports(path):
            if _within(name, INDEPENDENT) and _within(target, ("deploy_opt",)):
                problems.append(
                    f"{where}:{line}: {name} imports {target}; calibrators/exporters never import deploy_opt"
                )
            if at_top and _within(target, HEAVY) and not _within(name, HEAVY_ALLOWED):
                problems.append(f"{where}:{line}: top-level import of {target}; import it inside the function")
            if target in modules and target != name:
                graph[name].add(target)
    problems += [f"import cycle: {' -> '.join(cycle)}" for cycle in cycles(graph)]
    return problems


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected group of modules (Tarjan), each closed on its first module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(sorted(group) + [sorted(group)[0]])

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found
