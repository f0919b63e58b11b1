"""The core imports and the CLI help work without tensorrt, LLM libraries or even torch."""

from __future__ import annotations

import importlib
import pkgutil
import subprocess
import sys
import textwrap
from pathlib import Path

from layering import HEAVY_ALLOWED

REPO = Path(__file__).resolve().parents[1]
BLOCKED = [
    "tensorrt",
    "lmdeploy",
    "gptqmodel",
    "llmcompressor",
    "auto_gptq",
    "awq",
    "torchao",
    "bitsandbytes",
    "transformers",
    "torch",
    "matplotlib",
    "ray",
    "optuna",
]
BLOCKER = textwrap.dedent(f"""
    import importlib.abc, sys
    class Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in {BLOCKED!r}:
                raise ImportError(f"blocked for the test: {{name}}")
    sys.meta_path.insert(0, Block())
""")


def all_modules() -> list[str]:
    """Every first-party module, found with pkgutil.walk_packages (never listed by hand)."""
    found = []
    for package in ("deploy_opt", "calibrators", "exporters", "dopt_common", "profiles"):
        module = importlib.import_module(package)
        found.append(package)
        found += [
            m.name for m in pkgutil.walk_packages(module.__path__, f"{package}.") if not m.name.endswith("__main__")
        ]
    return found


# Every module light enough for the core: all but those where layering.py allows torch at top level.
CORE = [m for m in all_modules() if not any(m == p or m.startswith(p + ".") for p in HEAVY_ALLOWED)]


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", BLOCKER + code], capture_output=True, text=True, cwd=REPO)


def test_core_imports_without_heavy_optional_packages() -> None:
    result = _run(f"import importlib\nfor m in {CORE!r}: importlib.import_module(m)\nprint('ok')")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_help_runs_without_heavy_optional_packages() -> None:
    for argv in (["--help"], ["build", "--help"], ["gate", "--help"], ["profiles"], ["train", "search", "--help"]):
        result = _run(
            f"import sys; sys.argv = ['deploy_opt', *{argv!r}]\nimport runpy\n"
            "runpy.run_module('deploy_opt', run_name='__main__')"
        )
        assert result.returncode == 0, (argv, result.stderr)
        assert "usage" in result.stdout or "cpu-server" in result.stdout


def test_require_names_the_extra() -> None:
    result = _run(
        "from dopt_common.deps import require\n"
        "try:\n    require('tensorrt', purpose='building an engine')\n"
        "except Exception as e:\n    print(type(e).__name__, e)"
    )
    assert "MissingDependency" in result.stdout
    assert "pip install 'deploy_opt[tensorrt]'" in result.stdout
