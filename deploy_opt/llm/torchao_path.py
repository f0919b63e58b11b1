"""torchao weight-only quantization (``quantize_``) as a second, library-made LLM path, and its checkpoint.

- ``torchao-int8-wo``: ``Int8WeightOnlyConfig`` (int8 per output row); runs on a CPU.
- ``torchao-int4-wo``: ``Int4WeightOnlyConfig``. In torchao 0.18 no int4 layout runs on a CPU (``plain`` and
  ``preshuffled`` need the ``mslk`` kernels, ``plain_int32`` has no CPU support, ``tile_packed_to_4d`` needs
  CUDA and bfloat16), so on a CPU it raises a ConfigError that says so.

The weights become torchao tensor subclasses, which ``save_pretrained`` cannot serialise (it fails reading their
storage), so ``save_torchao_checkpoint`` writes ``torch.save(state_dict)`` beside the config and tokenizer.
Reload with ``load_torchao_checkpoint(folder)``: it rebuilds the float model from config.json, applies the same
``quantize_`` config so every Linear has the right tensor subclass, then ``load_state_dict(..., assign=True)``.
The file is a pickle: load only checkpoints you wrote yourself.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from deploy_opt.llm.quantize_engine import is_kept
from dopt_common.deps import require
from dopt_common.errors import CheckpointError, ConfigError, OutputError
from dopt_common.files import replace_dir
from dopt_common.hf_tokenizer import load_auto_tokenizer

log = logging.getLogger(__name__)
TORCHAO_METHODS = ("torchao-int8-wo", "torchao-int4-wo")
STATE_FILE = "torchao_state_dict.pt"
MARKER = "deploy_opt_torchao.json"


def _config(method: str, group_size: int):
    """The torchao config object for ``method``."""
    quantization = require("torchao.quantization", purpose=f"the {method} method", extra="llm")
    if method == "torchao-int8-wo":
        return quantization.Int8WeightOnlyConfig()
    if method == "torchao-int4-wo":
        return quantization.Int4WeightOnlyConfig(group_size=group_size, int4_packing_format="tile_packed_to_4d")
    raise ConfigError(f"method '{method}' is not a torchao method; use one of {', '.join(TORCHAO_METHODS)}")


def _filter(keep: Sequence[str]):
    def accept(module: torch.nn.Module, name: str) -> bool:
        return isinstance(module, torch.nn.Linear) and not is_kept(name, keep)

    return accept


def _apply(model: torch.nn.Module, method: str, group_size: int, keep: Sequence[str]) -> list[str]:
    """Run ``quantize_`` on the Linears not kept; the names of those it quantized."""
    quantization = require("torchao.quantization", purpose=f"the {method} method", extra="llm")
    if method == "torchao-int4-wo":
        device = next(model.parameters()).device
        if device.type != "cuda":
            raise ConfigError(
                f"torchao-int4-wo needs a CUDA GPU: torchao {_version()} has no int4 weight-only layout that runs "
                f"on {device.type} (tile_packed_to_4d is CUDA-only, plain needs the mslk kernels); fix: use "
                "torchao-int8-wo, or gptq/awq/rtn, on a CPU"
            )
        model.to(torch.bfloat16)
    accept = _filter(keep)
    names = [name for name, module in model.named_modules() if accept(module, name)]
    quantization.quantize_(model, _config(method, group_size), filter_fn=accept)
    return names


def _version() -> str:
    try:
        import torchao

        return torchao.__version__
    except ImportError:
        return "(not installed)"


@torch.no_grad()
def quantize_torchao(
    model: torch.nn.Module,
    method: str,
    *,
    group_size: int = 128,
    keep: Sequence[str] = ("embed_tokens", "lm_head"),
) -> dict[str, Any]:
    """Quantize ``model``'s Linears in place with torchao; a summary {method, linears, seconds, ...}."""
    if method not in TORCHAO_METHODS:
        raise ConfigError(f"method '{method}' is not a torchao method; use one of {', '.join(TORCHAO_METHODS)}")
    started = time.perf_counter()
    names = _apply(model.eval(), method, group_size, keep)
    seconds = time.perf_counter() - started
    log.info("%s: %d Linears quantized in %.1f s", method, len(names), seconds)
    return {
        "method": method,
        "group_size": group_size if method == "torchao-int4-wo" else None,
        "keep": list(keep),
        "linears": names,
        "seconds": round(seconds, 3),
        "torchao": _version(),
    }


def save_torchao_checkpoint(
    model: torch.nn.Module, folder: str | os.PathLike[str], summary: dict[str, Any], *, tokenizer: Any = None
) -> Path:
    """Write config.json, the torchao state_dict, the summary and the tokenizer into ``folder``, atomically."""
    folder = Path(folder)
    if folder.exists() and any(folder.iterdir()) and not (folder / MARKER).is_file():
        raise OutputError(f"'{folder}' exists and holds other files; fix: choose a new or empty output folder")
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", suffix=".tmp", dir=folder.parent))
    except OSError as exc:
        raise OutputError(f"cannot write beside '{folder}': {exc.strerror}; fix: choose a writable folder") from exc
    try:
        model.config.save_pretrained(staging)
        if getattr(model, "generation_config", None) is not None:
            model.generation_config.save_pretrained(staging)
        torch.save(model.state_dict(), staging / STATE_FILE)
        (staging / MARKER).write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
        if tokenizer is not None:
            tokenizer.save_pretrained(staging)
        replace_dir(staging, folder)
    except OSError as exc:
        raise OutputError(f"cannot write the torchao checkpoint '{folder}': {exc}") from exc
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return folder


def _load_state(path: Path) -> dict[str, Any]:
    """``torch.load(weights_only=True)``, allow-listing exactly the torchao tensor subclasses the file names.

    Any other global in the pickle (a foreign or tampered file) is refused, never unpickled.
    """
    import importlib

    try:
        names = torch.serialization.get_unsafe_globals_in_checkpoint(path)
    except Exception as exc:
        raise CheckpointError(f"cannot read '{path}' ({type(exc).__name__}): truncated or not a checkpoint") from exc
    foreign = [n for n in names if not n.startswith(("torchao.", "torch."))]
    if foreign:
        raise CheckpointError(
            f"'{path}' names {', '.join(foreign[:3])} to unpickle, which torchao does not define; refusing to load "
            "it; fix: re-run quantize-llm"
        )
    allowed = [getattr(importlib.import_module(n.rpartition(".")[0]), n.rpartition(".")[2]) for n in names]
    try:
        with torch.serialization.safe_globals(allowed):
            return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise CheckpointError(f"cannot read '{path}' ({type(exc).__name__}); fix: re-run quantize-llm") from exc


def load_torchao_checkpoint(folder: str | os.PathLike[str]) -> tuple[torch.nn.Module, Any]:
    """(model with torchao weights in eval mode, tokenizer or None) from ``save_torchao_checkpoint``'s folder."""
    transformers = require("transformers", purpose="reloading a torchao checkpoint", extra="llm")
    folder = Path(folder)
    try:
        summary = json.loads((folder / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"'{folder}' is not a torchao checkpoint (no readable {MARKER}): {exc}") from exc
    config = transformers.AutoConfig.from_pretrained(folder, local_files_only=True)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    _apply(model, summary["method"], summary.get("group_size") or 128, summary.get("keep", ()))
    state = _load_state(folder / STATE_FILE)
    result = model.load_state_dict(state, strict=False, assign=True)
    tied = {"lm_head.weight"} if getattr(config, "tie_word_embeddings", False) else set()
    missing = [key for key in result.missing_keys if key not in tied]
    if missing or result.unexpected_keys:
        raise CheckpointError(f"'{folder}': missing {missing[:5]}, unexpected {list(result.unexpected_keys)[:5]}")
    if tied:
        model.tie_weights()
    tokenizer = None
    if (folder / "tokenizer_config.json").is_file():
        tokenizer = load_auto_tokenizer(folder)
    return model, tokenizer
