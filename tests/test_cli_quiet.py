"""Quiet by default: warnings a CPU user cannot act on (torchao's CUDA libraries that do not load, torch's pytree
deprecations that torchao triggers) stay out of a default run; ``-v`` shows them."""

from __future__ import annotations

import subprocess
import sys

import pytest

SCRIPT = """
import sys
from deploy_opt.cli import main
main(sys.argv[1:])
import torchao  # what transformers imports during quantize-llm
"""


def _stderr(*argv: str) -> str:
    done = subprocess.run([sys.executable, "-c", SCRIPT, *argv], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stderr


def test_torchao_and_pytree_warnings_show_only_with_verbose() -> None:
    pytest.importorskip("torchao")
    loud = _stderr("-v", "profiles")
    if "Failed to load" not in loud and "_pytree" not in loud:
        pytest.skip("this torchao warns about nothing here (all its libraries load)")
    quiet = _stderr("profiles")
    assert "Failed to load" not in quiet and "_pytree" not in quiet
