"""A package's public names, imported on first use: ``import deploy_opt`` stays light (no torch, no onnx)."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Mapping
from typing import Any


def lazy_exports(
    package: str, public: Mapping[str, str], listed: Iterable[str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The module ``__getattr__`` and ``__dir__`` of ``package``: ``public`` maps each name to the module that
    defines it (imported when the name is first read); ``__dir__`` lists ``listed`` (its ``__all__``), sorted."""
    names = sorted(listed)

    def __getattr__(name: str) -> Any:
        if name in public:
            return getattr(importlib.import_module(public[name]), name)
        raise AttributeError(f"module '{package}' has no attribute '{name}'")

    def __dir__() -> list[str]:
        return list(names)

    return __getattr__, __dir__
