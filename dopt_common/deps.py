"""The one place optional dependencies are imported: ``require()``.

Which pip extra installs which import is read from the installed package's own metadata (the extras declared
once in pyproject.toml), so the hint can never disagree with what ``pip install 'deploy_opt[extra]'`` brings.
"""

from __future__ import annotations

import functools
import importlib
import re
from importlib import metadata
from types import ModuleType

from dopt_common.errors import MissingDependency

DISTRIBUTION = "deploy_opt"
# Imports whose distribution has another name (the metadata lists distributions, code imports modules).
_DISTRIBUTION_OF = {"cuda": "cuda-python", "sklearn": "scikit-learn", "yaml": "pyyaml"}
_EXTRA_MARKER = re.compile(r"""extra\s*==\s*["']([\w-]+)["']""")


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


@functools.cache
def declared_extras() -> dict[str, tuple[str, ...]]:
    """Each distribution named by an extra (normalized) → the extras that install it, dev last."""
    try:
        requirements = metadata.requires(DISTRIBUTION) or []
    except metadata.PackageNotFoundError:  # running from a checkout that was never installed
        return {}
    found: dict[str, list[str]] = {}
    for line in requirements:
        marker = _EXTRA_MARKER.search(line)
        name = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", line)
        if marker and name and _normalize(name.group(0)) != _normalize(DISTRIBUTION):
            found.setdefault(_normalize(name.group(0)), []).append(marker.group(1))
    return {dist: tuple(sorted(extras, key=lambda e: e == "dev")) for dist, extras in found.items()}


def extra_for(module: str) -> str | None:
    """The pip extra of deploy_opt that installs ``module``, or None when no extra does."""
    top = module.split(".")[0]
    extras = declared_extras().get(_normalize(_DISTRIBUTION_OF.get(top, top)))
    return extras[0] if extras else None


def require(module: str, *, purpose: str, extra: str | None = None) -> ModuleType:
    """Import ``module`` or raise ``MissingDependency`` naming the pip extra that installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        top = module.split(".")[0]
        extra = extra or extra_for(module)
        hint = f"pip install 'deploy_opt[{extra}]'" if extra else f"pip install {_DISTRIBUTION_OF.get(top, top)}"
        raise MissingDependency(
            f"{purpose} needs the Python package '{top}', which is not installed ({exc}); fix: {hint}"
        ) from exc
