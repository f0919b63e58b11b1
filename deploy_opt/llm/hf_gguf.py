"""A Hugging Face folder as an F32 GGUF, laid out as llama.cpp's ``convert_hf_to_gguf.py`` lays one out.

``quantize-llm --format gguf`` copies a GGUF source's metadata and tensors and packs the quantized ones in place;
a Hugging Face folder is first written as that source: the architecture's hyper-parameters, the tokenizer (a
byte-level BPE ``tokenizer.json``: ``tokenizer.ggml.model = gpt2``, its vocabulary, merges, special-token types
and ids, and the chat template), and every tensor under gguf's own HF → GGUF name map, with a Llama's q/k rows
in llama.cpp's rotary order. Families: Llama and Mistral (GGUF architecture ``llama``), Qwen2 (``qwen2``, whose
q/k/v biases map to ``attn_q.bias`` etc. and whose rows are not permuted) and Gemma 3 (``gemma3``: its norms are
stored as ``1 + w``, llama.cpp's convention; ``architectures.py``).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import numpy as np

from deploy_opt.llm.architectures import by_hf_architecture, norm_offset, qk_heads
from dopt_common.deps import require
from dopt_common.errors import ConfigError

log = logging.getLogger(__name__)
WRITTEN = (  # hparams known here
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "Qwen2ForCausalLM",
    "Gemma3ForCausalLM",
    "NemotronForCausalLM",
)
CONTROL, NORMAL = 3, 1  # gguf.TokenType


def gguf_architecture(model: Any) -> str:
    """The GGUF architecture of an HF causal LM, or a ConfigError naming the families written here."""
    names = list(getattr(model.config, "architectures", None) or [type(model).__name__])
    arch = by_hf_architecture([name for name in names if name in WRITTEN])
    if arch is None:
        raise ConfigError(
            f"--format gguf from a Hugging Face folder writes {', '.join(WRITTEN)}; this model is {names}; fix: "
            "start from a .gguf, or use the default lmdeploy format"
        )
    return arch.gguf_arch


def write_hf_gguf(model: Any, tokenizer: Any, path: Path, name: str = "model") -> Path:
    """``model`` (an HF causal LM in memory) and ``tokenizer`` as an F32 GGUF at ``path``."""
    gguf = require("gguf", purpose="--format gguf", extra="llm")
    from exporters.gguf import permute_qk

    arch = gguf_architecture(model)
    config = model.config
    writer = gguf.GGUFWriter(str(path), arch)
    _write_hparams(writer, config, name)
    if arch == "gemma3":
        _write_gemma3_hparams(writer, config)
    elif arch == "nemotron":
        _write_nemotron_hparams(writer, config)
    _write_tokenizer(writer, tokenizer)
    by_name = {v: k for k, v in gguf.MODEL_ARCH_NAMES.items()}
    table = gguf.get_tensor_name_map(by_name[arch], config.num_hidden_layers)
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    for hf_name, tensor in model.state_dict().items():
        if hf_name == "lm_head.weight" and getattr(config, "tie_word_embeddings", False):
            continue  # llama.cpp ties output to token_embd when the file has no output.weight
        gguf_name = table.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if gguf_name is None:
            raise ConfigError(f"--format gguf: no GGUF name for {hf_name} in a {arch} model")
        values = tensor.detach().float().cpu().numpy() + np.float32(norm_offset(arch, hf_name))
        n_head = qk_heads(arch, gguf_name, (heads, kv_heads))
        if n_head is not None:
            values = permute_qk(values, n_head)
        writer.add_tensor(gguf_name, np.ascontiguousarray(values, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    log.info("wrote %s: %s as an F32 GGUF (%s)", path.name, arch, name)
    return path


def _write_hparams(writer: Any, config: Any, name: str) -> None:
    writer.add_name(name)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(getattr(config, "num_key_value_heads", None) or config.num_attention_heads)
    rope = _rope(config)
    writer.add_rope_freq_base(float(rope.get("rope_theta", getattr(config, "rope_theta", 10000.0))))
    # transformers reads this key as Nemotron's ``norm_eps`` too (GGUF_CONFIG_MAPPING); llama.cpp reads its own
    writer.add_layer_norm_rms_eps(getattr(config, "rms_norm_eps", None) or config.norm_eps)
    writer.add_vocab_size(config.vocab_size)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    writer.add_rope_dimension_count(int(head_dim * rope.get("partial_rotary_factor", 1.0)))  # Nemotron: part
    writer.add_file_type(0)  # ALL_F32: the quantized tensors are packed in later


def _write_gemma3_hparams(writer: Any, config: Any) -> None:
    """What llama.cpp's Gemma3Model adds: head size and sliding window (transformers reads both back)."""
    if getattr(config, "attn_logit_softcapping", None) or getattr(config, "final_logit_softcapping", None):
        raise ConfigError("--format gguf writes Gemma 3 without logit soft-capping, as llama.cpp's converter does")
    writer.add_key_length(config.head_dim)
    writer.add_value_length(config.head_dim)
    writer.add_sliding_window(config.sliding_window)


def _rope(config: Any) -> dict[str, Any]:
    rope = getattr(config, "rope_parameters", None) or {}
    return rope.get("full_attention", rope)  # Gemma 3: one rotary per layer type; GGUF holds the global one


def _write_nemotron_hparams(writer: Any, config: Any) -> None:
    """What llama.cpp's NemotronModel adds: the LayerNorm epsilon it reads and the rotary scaling type."""
    gguf = require("gguf", purpose="--format gguf", extra="llm")
    writer.add_layer_norm_eps(config.norm_eps)
    rope = _rope(config)
    factor = rope.get("partial_rotary_factor", 0.5)
    if factor != 0.5:  # transformers' GGUF_CONFIG_MAPPING drops rope.dimension_count; llama.cpp reads it
        log.warning(
            "Nemotron's partial_rotary_factor is %s: llama.cpp reads it from the file, transformers' GGUF reader "
            "assumes 0.5, so the read-back check scores the file with another rotary than llama.cpp runs",
            factor,
        )
    kind = rope.get("rope_type", "default")
    if kind == "default":
        writer.add_rope_scaling_type(gguf.RopeScalingType.NONE)
    elif kind == "linear":
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(float(rope["factor"]))
    else:
        raise ConfigError(
            f"--format gguf writes Nemotron with no or linear rotary scaling, as llama.cpp's converter does; this "
            f"model's rope_type is {kind!r}; fix: convert it with llama.cpp's convert_hf_to_gguf.py and pass the .gguf"
        )


def _write_tokenizer(writer: Any, tokenizer: Any) -> None:
    backend = json.loads(tokenizer.backend_tokenizer.to_str())
    byte_level = "ByteLevel" in json.dumps(backend.get("pre_tokenizer")) + json.dumps(backend.get("decoder"))
    if backend.get("model", {}).get("type") != "BPE" or not byte_level:
        raise ConfigError(
            "--format gguf from a Hugging Face folder writes byte-level BPE tokenizers (tokenizer.json, as Llama 3, "
            "Qwen2 and SmolLM use); this one is not; fix: start from a .gguf"
        )
    from deploy_opt.llm.text_data import bos_token_id

    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    vocab = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    writer.add_token_list(vocab)
    special = set(tokenizer.all_special_ids)
    writer.add_token_types([CONTROL if i in special else NORMAL for i in range(len(vocab))])
    merges = backend["model"]["merges"]
    writer.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in merges])
    for setter, token_id in (
        (writer.add_bos_token_id, tokenizer.bos_token_id),
        (writer.add_eos_token_id, tokenizer.eos_token_id),
        (writer.add_unk_token_id, tokenizer.unk_token_id),
        (writer.add_pad_token_id, tokenizer.pad_token_id),
    ):
        if token_id is not None:
            setter(int(token_id))
    # llama.cpp places BOS (prompts, perplexity, imatrix) only where this says so; a gpt2 vocabulary defaults to no
    writer.add_add_bos_token(bos_token_id(tokenizer) is not None)
    if getattr(tokenizer, "chat_template", None):
        writer.add_chat_template(tokenizer.chat_template)
