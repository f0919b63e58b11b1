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
    rotary order) by quantize-llm's own HF → GGUF writer: a GGUF source for ``--format gguf``. That writer is
    checked on its own against transformers' GGUF reader (tests/test_llm_gguf.py)."""
    import torch
    from transformers import AutoTokenizer, LlamaForCausalLM

    from deploy_opt.llm.hf_gguf import write_hf_gguf

    folder = make_tiny_llama(Path(path).with_suffix(".hf"), **kwargs)
    model = LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32)
    return write_hf_gguf(model, AutoTokenizer.from_pretrained(folder), Path(path), name="tiny-llama")
