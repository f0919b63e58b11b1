"""The layering rules of the code base, checked on the source (AST) without importing anything.

- ``calibrators`` and ``exporters`` (and ``dopt_common``) never import ``deploy_opt``, not even inside a function;
- torch, transformers and tensorrt are imported at module top level only where ``HEAVY_ALLOWED`` says;
- the first-party modules have no import cycles (imports at module level and inside functions both count);
- nor have the packages of ``deploy_opt`` (``deploy_opt.stages``, ``deploy_opt.evaluation``, ...): one package may
  use another, never both ways, even through modules that form no module cycle;
- every stage function the build pipeline composes returns a typed result, not a loose ``dict`` or a tuple;
- no public function of ``deploy_opt/stages/`` returns a dict (bare, or holding plain values), except ORT feeds
  (``dict[str, np.ndarray]``) and mappings by name to a typed result (``dict[str, Latency]``); JSON serialisers
  (``to_json``) are methods, not stage functions;
- only the modules that compose stages (``WHOLE_CONFIG_MODULES``) take a whole ``BuildConfig``; every other
  function takes the sections it reads (``WHOLE_CONFIG_FUNCTIONS`` names the few that transform a whole one);
- no function is longer than ``MAX_FUNCTION_LINES``, and no line hands its formatting to a ``# fmt: skip``
  (``ruff format`` lays out every call; a call too wide to read is a signature to narrow).
"""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Iterator
from pathlib import Path

PACKAGES = ("deploy_opt", "calibrators", "exporters", "dopt_common", "profiles")
INDEPENDENT = ("calibrators", "exporters", "dopt_common")
HEAVY = ("torch", "transformers", "tensorrt")
# Where a heavy import may sit at module top level: torch-only code and the analysis that needs autograd. Every
# other module imports without torch (tests/test_imports.py imports each with torch blocked).
HEAVY_ALLOWED = (
    "calibrators.groupwise",
    "exporters.lmdeploy",
    "exporters.w4a16_writer",
    "exporters.shards",
    "deploy_opt.llm.quantize_engine",
    "deploy_opt.llm.awq_layer",
    "deploy_opt.llm.onload",
    "deploy_opt.llm.torchao_path",
    "deploy_opt.llm.gguf_export",
    "deploy_opt.train",
    "deploy_opt.demo",
    "deploy_opt.onnx_torch",
    "deploy_opt.analysis.sensitivity.noise",
)


MAX_FUNCTION_LINES = 80
PIPELINE = Path("deploy_opt/pipeline/build.py")  # the composition whose stages must return typed results
STAGE_PACKAGES = ("deploy_opt.stages", "deploy_opt.pipeline")
# Where a function may take the whole ``BuildConfig``: the modules that compose stages, the CLI and the config
# itself. Everywhere else a function takes the sections it reads (``quantization: QuantizationConfig``, ...).
WHOLE_CONFIG_MODULES = (
    "deploy_opt.config",
    "deploy_opt.cli",
    "deploy_opt.pipeline.build",
    "deploy_opt.pipeline.fleet",
    "deploy_opt.pipeline.sensitivity",
)
# Functions elsewhere that take a whole BuildConfig, as module:function: those that transform one (a candidate's
# settings, a fixed batch) and those still to narrow to their sections.
WHOLE_CONFIG_FUNCTIONS = frozenset({"deploy_opt.stages.benchmark:respect_fixed_batch"})
FMT_SKIP = "# fmt: " + "skip"  # split, so this file does not carry the marker it forbids


def module_files(root: Path) -> dict[str, Path]:
    """Every first-party module under ``root``, by dotted name."""
    found = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


def _source(path: Path) -> str:
    """The text of a file that parses; a SyntaxError names the file."""
    text = path.read_text(encoding="utf-8")
    try:
        _parsed(text)
    except SyntaxError:
        ast.parse(text, str(path))
        raise
    return text


@functools.cache
def _parsed(text: str) -> ast.Module:
    """One parse per distinct text: the negative tests check copies of the tree that differ in one file."""
    return ast.parse(text)


@functools.cache
def _import_facts(text: str) -> tuple[tuple[str, bool, int], ...]:
    tree = _parsed(text)
    top = {id(node) for node in tree.body}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, id(node) in top, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.module, id(node) in top, node.lineno))
            # ``from pkg import module`` imports the submodule
            found += [(f"{node.module}.{alias.name}", id(node) in top, node.lineno) for alias in node.names]
    return tuple(found)


def imports(path: Path) -> Iterator[tuple[str, bool, int]]:
    """(imported module, at module top level, line) for every import statement of a file."""
    yield from _import_facts(_source(path))


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
    problems += [f"package cycle: {' -> '.join(cycle)}" for cycle in cycles(package_graph(graph))]
    problems += stage_return_violations(root, modules)
    problems += stage_dict_violations(root, modules)
    problems += whole_config_violations(root, modules)
    return problems + [line for path in modules.values() for line in shape_violations(path, root)]


def stage_return_violations(root: Path, modules: dict[str, Path]) -> list[str]:
    """Stage functions the pipeline imports from ``build/`` and ``pipeline/`` whose result is a loose dict, Any or
    a tuple (a record the next stage would read by key or by position) rather than a frozen dataclass."""
    problems = []
    for node in _parsed(_source(root / PIPELINE)).body:
        if not (isinstance(node, ast.ImportFrom) and node.module in modules and _within(node.module, STAGE_PACKAGES)):
            continue
        path = modules[node.module]
        functions = {f.name: f for f in _parsed(_source(path)).body if isinstance(f, ast.FunctionDef)}
        for alias in node.names:
            function = functions.get(alias.name)
            if function is not None and _loose(function.returns):
                problems.append(_bad_return(root, path, function, "stage", "return a frozen dataclass with to_json()"))
    return problems


def stage_dict_violations(root: Path, modules: dict[str, Path]) -> list[str]:
    """Public functions of ``deploy_opt/stages/`` whose result is a dict: a record read by key, with no type."""
    problems = []
    for name, path in modules.items():
        if not _within(name, ("deploy_opt.stages",)):
            continue
        problems += [
            _bad_return(root, path, f, "stage function", "return a frozen dataclass (with to_json() for build.json)")
            for f in _parsed(_source(path)).body
            if isinstance(f, ast.FunctionDef) and not f.name.startswith("_") and _returns_dict(f.returns)
        ]
    return problems


def _bad_return(root: Path, path: Path, function: ast.FunctionDef, label: str, fix: str) -> str:
    """One problem line: where ``function`` is, what it returns, and the fix."""
    shown = "nothing" if function.returns is None else ast.unparse(function.returns)
    return f"{path.relative_to(root)}:{function.lineno}: {label} {function.name} returns {shown}; {fix}"


def whole_config_violations(root: Path, modules: dict[str, Path]) -> list[str]:
    """Functions outside the composing modules (``WHOLE_CONFIG_MODULES``) with a parameter annotated BuildConfig."""
    problems = []
    for name, path in modules.items():
        if _within(name, WHOLE_CONFIG_MODULES):
            continue
        for node in ast.walk(_parsed(_source(path))):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            if f"{name}:{node.name}" in WHOLE_CONFIG_FUNCTIONS:
                continue
            args = node.args
            for arg in [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]:
                if arg is not None and arg.annotation is not None and _names_build_config(arg.annotation):
                    problems.append(
                        f"{path.relative_to(root)}:{node.lineno}: {node.name} takes {arg.arg}: BuildConfig; take the "
                        "sections it reads (only the pipeline composes the whole config)"
                    )
    return problems


def _returns_dict(annotation: ast.expr | None) -> bool:
    """An unannotated result, or one that is or holds a dict, other than an ORT feed or a dict of typed results."""
    if annotation is None:
        return True
    text = ast.unparse(annotation).replace(" ", "")
    for allowed in ("dict[str,np.ndarray]", *_TYPED_VALUES.findall(text)):
        text = text.replace(allowed, "")
    return "dict" in text or "Mapping" in text


_TYPED_VALUES = re.compile(r"dict\[str,(?!Any\])[A-Z]\w*\]")  # by name, a project's typed result: dict[str, Latency]


def _names_build_config(annotation: ast.expr) -> bool:
    """Whether an annotation names BuildConfig (bare, quoted, dotted or inside ``X | None``)."""
    text = annotation.value if isinstance(annotation, ast.Constant) else ast.unparse(annotation)
    return re.search(r"\bBuildConfig\b", str(text)) is not None


def _loose(annotation: ast.expr | None) -> bool:
    """An unannotated result, Any, a bare dict, a dict holding Any, object or dicts, or a tuple."""
    if annotation is None:
        return True
    for part in (p.strip() for p in ast.unparse(annotation).split("|")):
        inner = part[5:] if part.startswith("dict[") else ""
        if part in ("dict", "Any") or part.startswith("tuple[") or any(w in inner for w in ("Any", "object", "dict")):
            return True
    return False


def package_of(module: str) -> str:
    """``deploy_opt.stages.quantize`` -> ``deploy_opt.stages``; modules directly under a package stand alone."""
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "deploy_opt" and len(parts) > 2 else module


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The module graph folded onto the packages of ``deploy_opt``; edges inside one package are dropped."""
    folded: dict[str, set[str]] = {package_of(name): set() for name in graph}
    for name, targets in graph.items():
        folded[package_of(name)] |= {package_of(t) for t in targets} - {package_of(name)}
    return folded


def shape_violations(path: Path, root: Path) -> list[str]:
    """Functions over ``MAX_FUNCTION_LINES`` lines, and ``# fmt: skip`` markers, in one file."""
    where = path.relative_to(root)
    long, skips = _shape_facts(_source(path))
    found = [
        f"{where}:{line}: {name} is {length} lines (at most {MAX_FUNCTION_LINES}); split it"
        for name, line, length in long
    ]
    return found + [f"{where}:{number}: {FMT_SKIP}; let ruff format lay it out" for number in skips]


@functools.cache
def _shape_facts(text: str) -> tuple[tuple[tuple[str, int, int], ...], tuple[int, ...]]:
    """(name, line, length) of each function over the limit, and the lines holding the marker."""
    long = tuple(
        (node.name, node.lineno, node.end_lineno - node.lineno + 1)
        for node in ast.walk(_parsed(text))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    )
    return long, tuple(number for number, line in enumerate(text.splitlines(), 1) if FMT_SKIP in line)


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
