"""Load a module that sits beside another file, by path, once per process.

Build configs name data functions as ``path/to/file.py:function`` and load that file by path, not through
``sys.path`` (``deploy_opt/data/sources.py``). Such a file reaches its neighbours (``images.py`` beside
``saliency.py`` in ``benchmarks/corpus/``) the same way: ``sibling(__file__, "images")``. Each neighbour is
executed once and kept in ``sys.modules`` as ``<folder>_<name>`` (``corpus_images``), so every file that asks for
it shares one module and its caches.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType


def sibling(anchor: str | Path, name: str) -> ModuleType:
    """The module ``<name>.py`` in the folder of ``anchor`` (a file path, usually ``__file__``), loaded once."""
    path = Path(anchor).resolve().with_name(f"{name}.py")
    key = f"{path.parent.name}_{name}"
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(key, path)
        if spec is None or spec.loader is None or not path.is_file():
            raise ImportError(f"no module file {path} beside {anchor}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[key] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[key]
            raise
    return sys.modules[key]
