"""Writing a gptq/awq checkpoint folder one decoder layer at a time (formats: ``exporters/lmdeploy.py``).

``CheckpointWriter`` packs each layer's codes as soon as the layer is quantized and spools them to disk
(``exporters/shards.py``), so a model larger than memory is written with one layer's tensors resident. The
in-memory path (``write_quantized_checkpoint``) feeds the same writer the same layers in the same order, so both
write the same bytes: layer 0's float tensors (fp16) and packed codes, layer 1's, ..., then every other tensor
(embeddings, final norm, lm_head; tied copies once). The folder is staged beside its target and published whole.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from calibrators.groupwise.rtn import QuantizedWeight
from dopt_common.errors import ConfigError, OutputError
from dopt_common.files import replace_dir
from exporters.lmdeploy import FORMATS, pack_awq, pack_gptq, quantization_config
from exporters.lmdeploy_engines import architecture_of, engine_problems, requantize_advice, serving_engine
from exporters.shards import DEFAULT_SHARD_BYTES, ShardWriter

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CodeSettings:
    """What ``quantization_config`` reads of one Linear's codes, kept once the codes themselves are written."""

    bits: int
    group_size: int
    sym: bool
    act_order: bool


def _fp16(tensor: torch.Tensor) -> torch.Tensor:
    return (tensor.to(torch.float16) if tensor.is_floating_point() else tensor).detach().contiguous()


def find_decoder_layers(model: torch.nn.Module) -> torch.nn.ModuleList | None:
    """``model.model.layers`` of a Hugging Face decoder, or ``model.model.language_model.layers`` of one with a
    vision tower beside it (Gemma3ForConditionalGeneration); None when neither holds layers."""
    inner = getattr(model, "model", None)
    for holder in (inner, getattr(inner, "language_model", None)):
        layers = getattr(holder, "layers", None)
        if isinstance(layers, torch.nn.ModuleList) and len(layers) > 0:
            return layers
    return None


def _layer_prefix(model: torch.nn.Module) -> str | None:
    layers = find_decoder_layers(model)
    if layers is None:
        return None
    return next(name for name, module in model.named_modules() if module is layers)


class CheckpointWriter:
    """A ``fmt`` ('gptq'|'awq') folder for ``folder``, filled layer by layer and published by ``finish``."""

    def __init__(self, folder: str | os.PathLike[str], fmt: str, max_shard_bytes: int = DEFAULT_SHARD_BYTES) -> None:
        if fmt not in FORMATS:
            raise ConfigError(f"checkpoint format '{fmt}' is unknown; use one of {', '.join(FORMATS)}")
        folder = Path(folder)
        if folder.exists() and (
            not folder.is_dir() or (any(folder.iterdir()) and not (folder / "config.json").exists())
        ):
            raise OutputError(f"'{folder}' exists and is not a model folder; fix: choose a new or empty output folder")
        try:
            folder.parent.mkdir(parents=True, exist_ok=True)
            self.staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", suffix=".tmp", dir=folder.parent))
        except OSError as exc:
            raise OutputError(f"cannot write beside '{folder}': {exc.strerror}; fix: choose a writable folder") from exc
        self.folder, self.fmt = folder, fmt
        self._pack = pack_gptq if fmt == "gptq" else pack_awq
        self._shards = ShardWriter(self.staging, max_shard_bytes)
        self._settings: dict[str, CodeSettings] = {}
        self._written_prefixes: list[str] = []

    def add_layer(self, prefix: str, layer: torch.nn.Module, weights: Mapping[str, QuantizedWeight]) -> None:
        """Spool one decoder layer: its float tensors as fp16 and the packed codes of its quantized Linears."""
        replaced = {f"{name}.weight" for name in weights}
        tensors = {
            f"{prefix}.{key}": _fp16(tensor)
            for key, tensor in layer.state_dict().items()
            if f"{prefix}.{key}" not in replaced
        }
        for name, qw in weights.items():
            if not name.startswith(f"{prefix}."):
                raise ConfigError(f"{name} is not inside the layer {prefix}")
            for suffix, tensor in self._pack(qw).items():
                tensors[f"{name}.{suffix}"] = tensor
            self._settings[name] = CodeSettings(qw.bits, qw.group_size, qw.sym, qw.act_order)
        try:
            self._shards.add(tensors)
        except OSError as exc:
            self.abort()
            raise OutputError(f"cannot write the checkpoint '{self.folder}': {exc}") from exc
        self._written_prefixes.append(f"{prefix}.")

    def _rest(self, model: torch.nn.Module) -> dict[str, torch.Tensor]:
        """Every state_dict tensor outside the written layers (fp16); tied/shared copies once."""
        out: dict[str, torch.Tensor] = {}
        seen: set[int] = set()
        layers = _layer_prefix(model)
        for key, tensor in model.state_dict().items():
            if key.startswith(tuple(self._written_prefixes)) or (layers and key.startswith(f"{layers}.")):
                continue
            pointer = tensor.data_ptr()
            if pointer in seen:  # tied lm_head/embeddings: safetensors stores one copy, from_pretrained re-ties
                continue
            seen.add(pointer)
            out[key] = _fp16(tensor)
        return out

    def finish(self, model: torch.nn.Module, tokenizer: Any = None) -> Path:
        """Write the remaining tensors, config.json (with ``quantization_config``) and tokenizer, and publish."""
        try:
            qconfig = quantization_config(self.fmt, self._settings)  # type: ignore[arg-type]
            config = json.loads(model.config.to_json_string(use_diff=False))
            config["quantization_config"] = qconfig
            config["torch_dtype"] = "float16"
            if "dtype" in config:
                config["dtype"] = "float16"
            self._shards.add(self._rest(model))
            self._shards.finish()
            (self.staging / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
            if self.fmt == "gptq":  # AutoGPTQ/GPTQModel read this file as well
                text = json.dumps(qconfig, indent=2) + "\n"
                (self.staging / "quantize_config.json").write_text(text, encoding="utf-8")
            generation = getattr(model, "generation_config", None)
            if generation is not None:
                generation.save_pretrained(self.staging)
            if tokenizer is not None:
                tokenizer.save_pretrained(self.staging)
            replace_dir(self.staging, self.folder)
        except OSError as exc:
            raise OutputError(f"cannot write the checkpoint '{self.folder}': {exc}") from exc
        finally:
            self.abort()
        _warn_unservable(self.folder, qconfig, architecture_of(config))
        log.info("wrote %s checkpoint %s (%d quantized Linears)", self.fmt, self.folder, len(self._settings))
        return self.folder

    def abort(self) -> None:
        """Remove the staging folder (after ``finish`` it is gone already)."""
        shutil.rmtree(self.staging, ignore_errors=True)


def _warn_unservable(folder: Path, qconfig: dict[str, Any], architecture: str | None) -> None:
    if serving_engine(qconfig, architecture) is None:
        problems = engine_problems(qconfig, architecture)
        log.warning(
            "lmdeploy 0.18 serves %s on neither engine (TurboMind: %s; PyTorch engine: %s); %s",
            folder,
            "; ".join(problems["turbomind"]),
            "; ".join(problems["pytorch"]),
            requantize_advice(qconfig, architecture),
        )


def write_quantized_checkpoint(
    model: torch.nn.Module,
    weights: Mapping[str, QuantizedWeight],
    folder: str | os.PathLike[str],
    *,
    fmt: str,
    tokenizer: Any = None,
    max_shard_bytes: int = DEFAULT_SHARD_BYTES,
) -> Path:
    """Write ``model`` with ``weights`` (Linear name → codes) as a ``fmt`` ('gptq'|'awq') folder, atomically."""
    quantization_config(fmt, weights)  # refuse bad settings before any file is written
    writer = CheckpointWriter(folder, fmt, max_shard_bytes)
    try:
        prefix = _layer_prefix(model)
        layers = find_decoder_layers(model) or []
        for index, layer in enumerate(layers):
            name = f"{prefix}.{index}"
            writer.add_layer(name, layer, {k: v for k, v in weights.items() if k.startswith(f"{name}.")})
        unplaced = [k for k in weights if not (prefix and k.startswith(f"{prefix}."))]
        if unplaced:
            raise ConfigError(f"{unplaced[0]} is not inside a decoder layer; the engine quantizes decoder Linears only")
        return writer.finish(model, tokenizer)
    finally:
        writer.abort()
