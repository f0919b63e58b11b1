"""W4A16 checkpoints for lmdeploy: AutoGPTQ v1 (``gptq``) and AutoAWQ GEMM (``awq``).

lmdeploy 0.18 serves gptq on TurboMind only (group 128, symmetric, no act-order) and awq on TurboMind (group 128)
or its PyTorch engine (any group of 16 or more); ``lmdeploy_engines.py`` holds those rules with their sources.

Both are a Hugging Face folder (written by ``exporters/w4a16_writer.py``): config.json with a
``quantization_config``, ``model.safetensors`` (shards and their index for large models) where each quantized
Linear ``<name>`` is replaced by ``<name>.qweight/.qzeros/.scales`` (+ ``.g_idx`` for GPTQ), every other tensor
(embeddings, lm_head, norms) in float16, and the tokenizer and generation config beside.

Layouts, matched to the packers of AutoGPTQ (``QuantLinear.pack``) and AutoAWQ (``WQLinear_GEMM.from_linear``)
and to lmdeploy 0.18's readers (``turbomind/weight_format.py``: ``GPTQFormat.normalize``, ``AWQFormat.normalize``;
``pytorch/backends/default/awq_modules.py``: ``dequantize_gemm``), which ``tests/test_lmdeploy_readers.py`` runs on
our folders; codes are unsigned with a zero point, w = (q - zero) · scale:

- GPTQ v1: ``qweight`` int32 [in·bits/32, out], input row 8r+j in bits [4j, 4j+4) of row r; ``qzeros`` int32
  [groups, out·bits/32], packed the same way along ``out``, storing zero - 1 (the v1 quirk; readers add 1 back);
  ``scales`` fp16 [groups, out]; ``g_idx`` int32 [in], the group of each input column (act-order).
- AWQ GEMM: ``qweight`` int32 [in, out/8] packed along ``out`` with the interleave [0, 2, 4, 6, 1, 3, 5, 7]
  (nibble i of word c holds output column 8c + order[i]); ``qzeros`` int32 [groups, out/8] the same way,
  stored as is; ``scales`` fp16 [groups, out]; no g_idx, so act-order cannot be written as AWQ.

``load_quantized_checkpoint`` reads either back into a plain float32 transformers model (dequantizing), because
transformers' own GPTQ/AWQ loading needs optimum/gptqmodel/autoawq: it proves the folder reloads and generates.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from calibrators.groupwise.rtn import QuantizedWeight
from dopt_common.deps import require
from dopt_common.errors import CheckpointError, ConfigError
from dopt_common.hf_tokenizer import load_auto_tokenizer
from dopt_common.weights import load_safetensors

log = logging.getLogger(__name__)
FORMATS = ("gptq", "awq")
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
AWQ_REVERSE_ORDER = (0, 4, 1, 5, 2, 6, 3, 7)


def _pack_rows(values: torch.Tensor, bits: int) -> torch.Tensor:
    """Pack int codes [n, m] along dim 0 into int32 [n·bits/32, m]: row k·p+j goes to bits [bits·j, bits·(j+1))."""
    per_word = 32 // bits
    n, m = values.shape
    if n % per_word:
        raise ConfigError(f"{n} values cannot be packed {per_word} to an int32 word; the size must divide by it")
    v = (values.to(torch.int64) & (2**bits - 1)).reshape(n // per_word, per_word, m)
    shifts = (torch.arange(per_word, dtype=torch.int64) * bits)[None, :, None]
    words = (v << shifts).sum(dim=1)
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def _unpack_rows(words: torch.Tensor, bits: int) -> torch.Tensor:
    """Inverse of ``_pack_rows``: int32 [n·bits/32, m] → int64 codes [n, m]."""
    per_word = 32 // bits
    w = words.to(torch.int64) & 0xFFFFFFFF
    shifts = (torch.arange(per_word, dtype=torch.int64) * bits)[None, :, None]
    v = (w[:, None, :] >> shifts) & (2**bits - 1)
    return v.reshape(-1, words.shape[1])


def pack_gptq(qw: QuantizedWeight) -> dict[str, torch.Tensor]:
    """AutoGPTQ v1 tensors (qweight, qzeros, scales, g_idx) of one quantized Linear."""
    if bool((qw.zeros == 0).any()):
        raise ConfigError(
            "a GPTQ v1 checkpoint stores zero - 1 and cannot hold a zero point of 0 (asymmetric group with no "
            "negative weight); fix: quantize with sym: true (lmdeploy serves only symmetric GPTQ anyway)"
        )
    return {
        "qweight": _pack_rows(qw.qweight.t(), qw.bits),
        "qzeros": _pack_rows((qw.zeros - 1).t(), qw.bits).t().contiguous(),
        "scales": qw.scales.to(torch.float16).contiguous(),
        "g_idx": qw.g_idx.to(torch.int32).contiguous(),
    }


def unpack_gptq(tensors: Mapping[str, torch.Tensor], *, bits: int, group_size: int, sym: bool) -> QuantizedWeight:
    """QuantizedWeight from AutoGPTQ v1 tensors (scales come back fp16-rounded)."""
    codes = _unpack_rows(tensors["qweight"], bits).t()
    zeros = (_unpack_rows(tensors["qzeros"].t().contiguous(), bits).t() + 1) & (2**bits - 1)
    return QuantizedWeight(
        qweight=codes.to(torch.int32).contiguous(),
        scales=tensors["scales"].float().contiguous(),
        zeros=zeros.to(torch.int32).contiguous(),
        g_idx=tensors["g_idx"].to(torch.int32).contiguous(),
        bits=bits,
        group_size=group_size,
        sym=sym,
    )


def _pack_awq_columns(values: torch.Tensor) -> torch.Tensor:
    """Pack 4-bit codes [n, m] along dim 1 with AWQ's interleave into int32 [n, m/8]."""
    n, m = values.shape
    if m % 8:
        raise ConfigError(f"AWQ packs 8 output columns per int32; {m} columns do not divide by 8")
    ordered = values.reshape(n, m // 8, 8)[:, :, list(AWQ_ORDER)].reshape(n, m)
    return _pack_rows(ordered.t(), 4).t().contiguous()


def _unpack_awq_columns(words: torch.Tensor) -> torch.Tensor:
    """Inverse of ``_pack_awq_columns``: int32 [n, m/8] → int64 [n, m]."""
    ordered = _unpack_rows(words.t().contiguous(), 4).t()
    n, m = ordered.shape
    return ordered.reshape(n, m // 8, 8)[:, :, list(AWQ_REVERSE_ORDER)].reshape(n, m)


def pack_awq(qw: QuantizedWeight) -> dict[str, torch.Tensor]:
    """AutoAWQ GEMM tensors (qweight, qzeros, scales) of one quantized Linear."""
    if qw.bits != 4:
        raise ConfigError(f"the AWQ GEMM format holds 4-bit weights only, not {qw.bits}-bit; fix: use bits: 4")
    if qw.act_order:
        raise ConfigError("the AWQ format has no g_idx and cannot hold act-order weights; fix: desc_act: false")
    return {
        "qweight": _pack_awq_columns(qw.qweight.t()),
        "qzeros": _pack_awq_columns(qw.zeros),
        "scales": qw.scales.to(torch.float16).contiguous(),
    }


def unpack_awq(tensors: Mapping[str, torch.Tensor], *, group_size: int, sym: bool = False) -> QuantizedWeight:
    """QuantizedWeight from AutoAWQ GEMM tensors (scales come back fp16-rounded)."""
    codes = _unpack_awq_columns(tensors["qweight"]).t()
    in_features = codes.shape[1]
    size = in_features if group_size == -1 else group_size
    return QuantizedWeight(
        qweight=codes.to(torch.int32).contiguous(),
        scales=tensors["scales"].float().contiguous(),
        zeros=_unpack_awq_columns(tensors["qzeros"]).to(torch.int32).contiguous(),
        g_idx=(torch.arange(in_features) // size).to(torch.int32),
        bits=4,
        group_size=group_size,
        sym=sym,
    )


def quantization_config(fmt: str, weights: Mapping[str, QuantizedWeight]) -> dict[str, Any]:
    """The config.json ``quantization_config`` lmdeploy and transformers read for ``fmt``."""
    if fmt not in FORMATS:
        raise ConfigError(f"checkpoint format '{fmt}' is unknown; use one of {', '.join(FORMATS)}")
    if not weights:
        raise ConfigError("no quantized weights to write; fix: run the quantization engine first")
    first = next(iter(weights.values()))
    for name, qw in weights.items():
        if (qw.bits, qw.group_size, qw.sym) != (first.bits, first.group_size, first.sym):
            raise ConfigError(f"{name} was quantized with other settings than the rest; one checkpoint holds one")
    if fmt == "awq":
        return {
            "quant_method": "awq",
            "bits": 4,
            "group_size": first.group_size,
            "zero_point": True,
            "version": "gemm",
            "modules_to_not_convert": None,
        }
    return {
        "quant_method": "gptq",
        "bits": first.bits,
        "group_size": first.group_size,
        "desc_act": any(qw.act_order for qw in weights.values()),
        "sym": first.sym,
        "true_sequential": True,
        "checkpoint_format": "gptq",
    }


def _read_config(folder: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(config.json, its quantization_config), or CheckpointError."""
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"'{folder}' has no readable config.json ({exc}); fix: pass a checkpoint folder") from exc
    qconfig = config.get("quantization_config") or {}
    if qconfig.get("quant_method") not in FORMATS:
        raise CheckpointError(
            f"'{folder}' is not a gptq/awq checkpoint (quantization_config {qconfig or None}); "
            "fix: load it with transformers' from_pretrained"
        )
    return config, qconfig


def read_quantized_weights(
    folder: str | os.PathLike[str],
) -> tuple[dict[str, QuantizedWeight], dict[str, torch.Tensor]]:
    """(Linear name → codes, every other tensor) of a gptq/awq checkpoint folder."""
    folder = Path(folder)
    _, qconfig = _read_config(folder)
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"'{folder}' has no .safetensors file")
    tensors: dict[str, torch.Tensor] = {}
    for file in files:
        tensors.update(load_safetensors(file))
    names = sorted(key[: -len(".qweight")] for key in tensors if key.endswith(".qweight"))
    weights = {}
    for name in names:
        parts = {
            suffix: tensors.pop(f"{name}.{suffix}")
            for suffix in ("qweight", "qzeros", "scales", "g_idx")
            if f"{name}.{suffix}" in tensors
        }
        if qconfig["quant_method"] == "gptq":
            weights[name] = unpack_gptq(
                parts,
                bits=int(qconfig["bits"]),
                group_size=int(qconfig["group_size"]),
                sym=bool(qconfig.get("sym", True)),
            )
        else:
            weights[name] = unpack_awq(parts, group_size=int(qconfig["group_size"]))
    return weights, tensors


def load_quantized_checkpoint(folder: str | os.PathLike[str]) -> tuple[torch.nn.Module, Any]:
    """(float32 model with dequantized weights in eval mode, tokenizer or None) from a gptq/awq folder."""
    transformers = require("transformers", purpose="reloading a W4A16 checkpoint", extra="llm")
    folder = Path(folder)
    weights, tensors = read_quantized_weights(folder)
    config = transformers.AutoConfig.from_pretrained(folder, local_files_only=True)
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # a plain float model: transformers must not look for a GPTQ backend
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    state = {key: (t.float() if t.is_floating_point() else t) for key, t in tensors.items()}
    for name, qw in weights.items():
        state[f"{name}.weight"] = qw.dequantize()
    result = model.load_state_dict(state, strict=False)
    tied = {"lm_head.weight"} if getattr(config, "tie_word_embeddings", False) else set()
    missing = [key for key in result.missing_keys if key not in tied]
    if missing or result.unexpected_keys:
        raise CheckpointError(
            f"'{folder}' does not fill {type(model).__name__}: missing {missing[:5]}, "
            f"unexpected {list(result.unexpected_keys)[:5]}"
        )
    if tied:
        model.tie_weights()
    if (folder / "generation_config.json").is_file():
        model.generation_config = transformers.GenerationConfig.from_pretrained(folder)
    tokenizer = None
    if any((folder / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")):
        tokenizer = load_auto_tokenizer(folder, "the W4A16 checkpoint")
    return model.eval(), tokenizer
