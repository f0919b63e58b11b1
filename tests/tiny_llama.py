"""A tiny random Llama and a byte-level BPE tokenizer trained on Python's own docs, built in code (no hub).

``make_tiny_llama(folder)`` writes a normal Hugging Face folder (config, safetensors, tokenizer) that every
LLM test loads like a real checkpoint. Hidden size 64 and intermediate 128, so group sizes 32 and 64 divide
every Linear and 128 divides none of the attention projections' inputs (the group-size error's test case).
"""

from __future__ import annotations

from pathlib import Path


def train_tokenizer(vocab_size: int = 512):  # -> PreTrainedTokenizerFast
    """A byte-level BPE trained on the first pydoc_data topics (every Python ships them)."""
    import pydoc_data.topics

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    texts = [pydoc_data.topics.topics[k] for k in sorted(pydoc_data.topics.topics)[:60]]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<unk>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(texts, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")


def make_tiny_llama(folder: Path, *, hidden: int = 64, layers: int = 2, seed: int = 0) -> Path:
    """Save a random LlamaForCausalLM (2 layers, hidden 64, 4 heads) and its tokenizer into ``folder``."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    tokenizer = train_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config).eval()
    folder = Path(folder)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def make_tiny_llama_gguf(path: Path, **kwargs) -> Path:
    """The same tiny Llama written as an F32 GGUF (llama metadata, gpt2 BPE tokenizer, q/k rows in llama.cpp's
    rotary order), the way llama.cpp's convert_hf_to_gguf.py lays one out: a GGUF source for ``--format gguf``."""
    import json

    import gguf
    import numpy as np
    import torch
    from transformers import AutoTokenizer, LlamaForCausalLM

    from exporters.gguf import permute_qk

    folder = make_tiny_llama(Path(path).with_suffix(".hf"), **kwargs)
    model = LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    config = model.config
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("tiny-llama")
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_rope_freq_base(
        config.rope_parameters["rope_theta"] if getattr(config, "rope_parameters", None) else 10000.0
    )
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_vocab_size(config.vocab_size)
    writer.add_rope_dimension_count(config.hidden_size // config.num_attention_heads)
    writer.add_file_type(0)  # ALL_F32
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    vocab = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    writer.add_token_list(vocab)
    special = {tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.unk_token_id}
    writer.add_token_types([3 if i in special else 1 for i in range(len(vocab))])  # CONTROL / NORMAL
    merges = json.loads(tokenizer.backend_tokenizer.to_str())["model"]["merges"]
    writer.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in merges])
    writer.add_bos_token_id(tokenizer.bos_token_id)
    writer.add_eos_token_id(tokenizer.eos_token_id)
    table = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, config.num_hidden_layers)
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    for name, tensor in model.state_dict().items():
        values = tensor.float().numpy()
        gguf_name = table.get_name(name, try_suffixes=(".weight", ".bias"))
        if gguf_name.endswith("attn_q.weight"):
            values = permute_qk(values, heads)
        elif gguf_name.endswith("attn_k.weight"):
            values = permute_qk(values, kv_heads)
        writer.add_tensor(gguf_name, np.ascontiguousarray(values))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return Path(path)
