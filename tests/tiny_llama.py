"""A tiny random Llama and a byte-level BPE tokenizer trained on Python's own docs, built in code (no hub).

``make_tiny_llama(folder)`` writes a normal Hugging Face folder (config, safetensors, tokenizer) that every
LLM test loads like a real checkpoint. Hidden size 64 and intermediate 128, so group sizes 32 and 64 divide
every Linear and 128 divides none of the attention projections' inputs (the group-size error's test case).
"""

from __future__ import annotations

from pathlib import Path


def bpe_tokenizer(texts: list[str], vocab_size: int):  # -> PreTrainedTokenizerFast
    """A byte-level BPE fitted to ``texts``, with <unk>, <s> (BOS) and </s> (EOS); benchmarks/device/lm.py's
    tokenizer too."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<unk>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")


def train_tokenizer(vocab_size: int = 512):  # -> PreTrainedTokenizerFast
    """A byte-level BPE trained on the first pydoc_data topics (every Python ships them)."""
    import pydoc_data.topics

    return bpe_tokenizer([pydoc_data.topics.topics[k] for k in sorted(pydoc_data.topics.topics)[:60]], vocab_size)


def decoder_config(config_class, vocab_size: int, *, hidden: int = 64, layers: int = 2, kv_heads: int = 2, **extra):
    """``config_class`` (a transformers decoder config) with the tiny shape every LLM test uses: ``hidden`` wide,
    an MLP twice that, ``layers`` layers, 4 attention heads over ``kv_heads`` key/value heads; ``extra`` adds or
    overrides fields."""
    shape = {
        "vocab_size": vocab_size,
        "hidden_size": hidden,
        "intermediate_size": 2 * hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": 4,
        "num_key_value_heads": kv_heads,
    }
    return config_class(**(shape | extra))


def special_ids(tokenizer) -> dict[str, int]:
    """``tokenizer``'s BOS and EOS ids as config fields."""
    return {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id}


def rtn_kv_flags(folder: Path, session_len: int) -> dict:
    """quantize-llm's flags for a short RTN run (group 32) of ``folder`` that also checks an int8 KV cache."""
    return {
        "model": {"path": str(folder)},
        "quantization": {"method": "rtn", "group_size": 32},
        "calibration": {"samples": 16, "max_seq_len": 64},
        "checks": {
            "eval_tokens": 256,
            "eval_seq_len": 64,
            "generations": 2,
            "max_new_tokens": 16,
            "kv_cache": "int8",
            "session_len": session_len,
        },
        "gate": {"max_ppl_increase": "50%"},
    }


def make_tiny_llama(folder: Path, *, hidden: int = 64, layers: int = 2, seed: int = 0) -> Path:
    """Save a random LlamaForCausalLM (2 layers, hidden 64, 4 heads) and its tokenizer into ``folder``."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    tokenizer = train_tokenizer()
    config = decoder_config(
        LlamaConfig,
        len(tokenizer),
        hidden=hidden,
        layers=layers,
        max_position_embeddings=512,
        **special_ids(tokenizer),
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config).eval()
    folder = Path(folder)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def make_tiny_llama_gguf(path: Path, **kwargs) -> Path:
    """The same tiny Llama written as an F32 GGUF (llama metadata, gpt2 BPE tokenizer, q/k rows in llama.cpp's
    rotary order) by quantize-llm's own HF → GGUF writer: a GGUF source for ``--format gguf``. That writer is
    checked on its own against transformers' GGUF reader (tests/test_llm_gguf.py)."""
    import torch
    from transformers import AutoTokenizer, LlamaForCausalLM

    from deploy_opt.llm.hf_gguf import write_hf_gguf

    folder = make_tiny_llama(Path(path).with_suffix(".hf"), **kwargs)
    model = LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32)
    return write_hf_gguf(model, AutoTokenizer.from_pretrained(folder), Path(path), name="tiny-llama")


def make_synthetic_llama(
    folder: Path, *, hidden: int = 2048, intermediate: int = 5632, layers: int = 22, vocab: int = 32000, seed: int = 0
) -> Path:
    """A random Llama of any size written straight to bfloat16 safetensors shards, one shard per decoder layer.

    Never materialises the model: each tensor is drawn (normal, std 0.02; norms 1) and written shard by shard, so a
    2 GB model is made in seconds in little memory. The shapes are those of ``LlamaForCausalLM`` built on the meta
    device from the same config; the tokenizer is ``train_tokenizer``'s (its ids are a subset of ``vocab``)."""
    import json

    import torch
    from safetensors.torch import save_file
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = train_tokenizer()
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=hidden // 64,
        num_key_value_heads=hidden // 64,
        max_position_embeddings=2048,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=False,
        torch_dtype="bfloat16",
    )
    with torch.device("meta"):
        shapes = {k: tuple(v.shape) for k, v in LlamaForCausalLM(config).state_dict().items()}
    groups: dict[str, list[str]] = {}
    for name in shapes:
        key = name.split(".")[2] if name.startswith("model.layers.") else "rest"
        groups.setdefault(key, []).append(name)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(seed)
    weight_map, total = {}, 0
    for number, names in enumerate(groups.values()):
        file = f"model-{number + 1:05d}-of-{len(groups):05d}.safetensors"
        tensors = {
            n: torch.ones(shapes[n]) if n.endswith("norm.weight") else torch.randn(shapes[n], generator=gen) * 0.02
            for n in names
        }
        tensors = {n: t.to(torch.bfloat16) for n, t in tensors.items()}
        save_file(tensors, str(folder / file), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(names, file))
        total += sum(t.numel() * 2 for t in tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    config.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
