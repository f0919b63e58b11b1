"""The checks ``quantize-llm`` makes in its first seconds, from the model's header alone, before any weight loads.

The header is a folder's ``config.json`` or a GGUF's metadata (read through a memory map: no tensor data is
touched). From it:

- the **architecture** must be a family of the architecture table (``architectures.py``) that deploy_opt
  quantizes, and an AWQ method needs the family's AWQ groups;
- the **group size** is resolved (``scheme.py``) against the in_features of the family's Linears, known from the
  hidden, intermediate and head sizes, so a group that divides none is refused now, not after loading;
- the **engine routing** follows lmdeploy 0.18 (``exporters/lmdeploy_engines.py``): an architecture neither engine
  runs is refused for the lmdeploy format (the GGUF format serves it through llama.cpp), and an explicitly
  configured scheme no engine serves is said once, as a warning with the fix, before the long work.

Anything refused is one ``ConfigError`` (exit 2) naming what is supported.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deploy_opt.llm.architectures import ARCHITECTURES, Architecture, by_gguf_arch, by_hf_architecture
from deploy_opt.llm.config import LLMQuantConfig
from deploy_opt.llm.scheme import QuantScheme, resolve_scheme, serving_config
from dopt_common.errors import ConfigError, ModelError

log = logging.getLogger(__name__)

AWQ_METHODS = ("awq", "awq-gptq")
# HF config keys → the sizes a decoder layer's Linears read (GGUF: "<arch>.<key>")
CONFIG_KEYS = {
    "hidden": "hidden_size",
    "intermediate": "intermediate_size",
    "heads": "num_attention_heads",
    "head_dim": "head_dim",
}
GGUF_KEYS = {
    "hidden": "embedding_length",
    "intermediate": "feed_forward_length",
    "heads": "attention.head_count",
    "head_dim": "attention.key_length",
}


@dataclass(frozen=True)
class Header:
    """What the model's header says: its architecture name, the table's entry, the Hugging Face class lmdeploy
    routes by, and the sizes of a decoder layer (any of hidden, intermediate, heads, head_dim; may be empty)."""

    named: str
    architecture: Architecture | None
    model_class: str | None
    sizes: dict[str, int]


@dataclass(frozen=True)
class Preflight:
    """The checks' outcome: the family, the scheme resolved from the header (None: torchao, or sizes unknown) and
    the lmdeploy engine that will serve it (None: GGUF, torchao, or none)."""

    architecture: Architecture
    model_class: str | None
    scheme: QuantScheme | None
    engine: str | None


def read_header(source: Path) -> Header:
    """The header of the model at ``source`` (a Hugging Face folder or a .gguf file)."""
    if source.is_dir():
        config = source / "config.json"
        try:
            data = json.loads(config.read_text(encoding="utf-8"))
            names = [str(name) for name in data.get("architectures") or []]
        except (OSError, ValueError, AttributeError) as exc:
            raise ModelError(
                f"'{config}' cannot be read as a model config ({exc}); fix: point at the model folder"
            ) from None
        text = data.get("text_config") if isinstance(data.get("text_config"), dict) else data
        sizes = {key: _int(text.get(name)) for key, name in CONFIG_KEYS.items()}
        arch = by_hf_architecture(names)
        return Header(", ".join(names) or "(none)", arch, names[0] if names else None, _known(sizes))
    return _gguf_header(source)


def _gguf_header(source: Path) -> Header:
    from deploy_opt.llm.gguf_header import read_gguf_metadata

    named = str(read_gguf_metadata(source, ("general.architecture",)).get("general.architecture") or "")
    wanted = {key: f"{named}.{suffix}" for key, suffix in GGUF_KEYS.items()}
    values = read_gguf_metadata(source, tuple(wanted.values())) if named else {}
    sizes = {key: _int(values.get(name)) for key, name in wanted.items()}
    arch = by_gguf_arch(named)
    return Header(named or "(none)", arch, arch.hf_architectures[0] if arch else None, _known(sizes))


def _int(value: Any) -> int | None:
    try:
        number = int(value)
    except (TypeError, ValueError):
        return None
    return number if number > 0 else None


def _known(sizes: dict[str, int | None]) -> dict[str, int]:
    known = {key: size for key, size in sizes.items() if size is not None}
    if "head_dim" not in known and {"hidden", "heads"} <= known.keys():
        known["head_dim"] = known["hidden"] // known["heads"]
    return known


def layer_inputs(arch: Architecture, sizes: dict[str, int], keep: tuple[str, ...]) -> dict[str, int]:
    """in_features of a decoder layer's quantized Linears ({} when the header lacks a size)."""
    if not {"hidden", "intermediate", "heads", "head_dim"} <= sizes.keys():
        return {}
    from deploy_opt.llm.quantize_engine import is_kept

    hidden, attention = sizes["hidden"], sizes["heads"] * sizes["head_dim"]
    if arch.family == "Phi3":
        linears = {"self_attn.qkv_proj": hidden, "mlp.gate_up_proj": hidden}
    else:
        gate = {} if arch.family == "Nemotron" else {"mlp.gate_proj": hidden}
        linears = {"self_attn.q_proj": hidden, "self_attn.k_proj": hidden, "self_attn.v_proj": hidden, **gate}
        linears["mlp.up_proj"] = hidden
    linears |= {"self_attn.o_proj": attention, "mlp.down_proj": sizes["intermediate"]}
    named = {f"model.layers.0.{name}": n for name, n in linears.items()}
    return {name: n for name, n in named.items() if not is_kept(name, keep)}


def supported() -> str:
    """The families the table holds and quantize-llm quantizes, as a user reads them."""
    return ", ".join(
        f"{arch.family} ({arch.hf_architectures[0]}, GGUF '{arch.gguf_arch}')"
        for arch in ARCHITECTURES
        if not arch.not_quantized
    )


def check_family(header: Header, source: Path, method: str) -> Architecture:
    """The table's entry; ConfigError for a family the table lacks or refuses, or AWQ without AWQ groups."""
    arch = header.architecture
    if arch is None:
        raise ConfigError(
            f"model architecture '{header.named}' of '{source.name}' is not one deploy_opt quantizes; supported: "
            f"{supported()}; fix: convert the model to one of these, or ask for the family to be added"
        )
    if arch.not_quantized:
        raise ConfigError(
            f"model architecture '{header.named}' ({arch.family}) is not quantized by deploy_opt: "
            f"{arch.not_quantized}; supported: {supported()}"
        )
    if method in AWQ_METHODS and not arch.awq_groups:
        families = ", ".join(a.family for a in ARCHITECTURES if a.awq_groups)
        raise ConfigError(
            f"method {method} needs AWQ scale groups, which {arch.family} has none of in the architecture table; "
            f"fix: use method auto or gptq (AWQ covers {families})"
        )
    return arch


def preflight(source: Path, quant: LLMQuantConfig) -> Preflight:
    """The family, scheme and serving engine of the model at ``source``, from its header alone; ConfigError
    (exit 2) for what cannot be quantized or served as configured."""
    header = read_header(source)
    arch = check_family(header, source, quant.method)
    if quant.method.startswith("torchao"):
        log.info("preflight: %s is %s (%s), method %s", source.name, arch.family, header.named, quant.method)
        return Preflight(arch, header.model_class, None, None)
    inputs = layer_inputs(arch, header.sizes, quant.keep)
    if not inputs:
        log.info("preflight: %s's header gives no layer sizes; the scheme is resolved after loading", source.name)
        return Preflight(arch, header.model_class, None, None)
    scheme = resolve_scheme(quant, inputs, header.model_class, bool(arch.awq_groups))
    engine = None if quant.format == "gguf" else _route(scheme, header, quant)
    log.info(
        "preflight: %s is %s (%s); %s %s at group %d%s",
        source.name,
        arch.family,
        header.named,
        scheme.method,
        scheme.layout,
        scheme.group_size,
        f", served by lmdeploy's {engine} engine" if engine else "",
    )
    return Preflight(arch, header.model_class, scheme, engine)


def _route(scheme: QuantScheme, header: Header, quant: LLMQuantConfig) -> str | None:
    """The lmdeploy engine that serves the scheme; ConfigError where lmdeploy runs the architecture on no engine,
    a warning (said before the long work) where only the explicitly configured scheme keeps it from serving."""
    from exporters.lmdeploy_engines import engine_problems, requantize_advice, served_architecture, serving_engine

    qconfig = serving_config(scheme, quant.bits)
    engine = serving_engine(qconfig, header.model_class)
    if engine is not None:
        return engine
    if not served_architecture(header.model_class):
        raise ConfigError(
            f"lmdeploy 0.18 runs {header.model_class} on neither engine (TurboMind nor PyTorch), so the lmdeploy "
            "format cannot serve it; fix: --format gguf (from a .gguf, or from a Hugging Face folder of a family "
            "it writes, Nemotron among them), served by llama.cpp or Ollama"
        )
    problems = engine_problems(qconfig, header.model_class)
    log.warning(
        "no lmdeploy engine will serve %s %s at group %d (TurboMind: %s; PyTorch engine: %s): the checkpoint is "
        "written, but serve will refuse it; %s",
        scheme.method,
        scheme.layout,
        scheme.group_size,
        "; ".join(problems["turbomind"]),
        "; ".join(problems["pytorch"]),
        requantize_advice(qconfig, header.model_class),
    )
    return None
