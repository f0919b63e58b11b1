"""A MiniLM fine-tuning slice for the training companion: all-MiniLM-L6-v2 on adjacent-sentence pairs of Python's
pydoc topics (the demo's own sentences), symmetric InfoNCE with in-batch negatives.

``train run`` / ``train search`` reach it through ``deploy_opt/demo/train_minilm.yaml``:
``model: deploy_opt.demo.minilm_pairs:build_model`` and ``data: deploy_opt.demo.minilm_pairs:pair_data``.
Every 7th pair is held out for evaluation, spread over all topics like the training pairs.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
import torch.nn.functional as F

from deploy_opt.train.data import Batch, TrainData

log = logging.getLogger(__name__)

MAX_TOKENS = 64
EVAL_EVERY = 7
TEMPERATURE = 0.05


class PairEncoder(torch.nn.Module):
    """The MiniLM sentence encoder applied to both sides of a pair: ``(ids_a, mask_a, ids_b, mask_b) → (a, b)``."""

    def __init__(self, encoder: torch.nn.Module) -> None:
        super().__init__()
        self.encoder = encoder

    def forward(
        self, ids_a: torch.Tensor, mask_a: torch.Tensor, ids_b: torch.Tensor, mask_b: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return self.encoder(ids_a, mask_a), self.encoder(ids_b, mask_b)


def build_model() -> torch.nn.Module:
    """all-MiniLM-L6-v2 (the packaged weights) as a pair encoder."""
    from deploy_opt.demo.minilm import build_model as build_encoder

    return PairEncoder(build_encoder())


def pair_logits(output: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """Each sentence's similarity to every candidate in the batch, over the temperature: [batch, batch]."""
    a, b = output
    return a @ b.T / TEMPERATURE


def contrastive_loss(output: tuple[torch.Tensor, torch.Tensor], target: Any) -> torch.Tensor:
    """Symmetric InfoNCE: each sentence's positive is its pair; the batch's other pairs are negatives."""
    logits = pair_logits(output)
    labels = torch.arange(len(logits))
    return (F.cross_entropy(logits, labels) + F.cross_entropy(logits.T, labels)) / 2


def _encode(sentences: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    from deploy_opt.demo.minilm import tokenize

    tokens = tokenize(sentences)
    return (
        torch.from_numpy(tokens["input_ids"][:, :MAX_TOKENS]),
        torch.from_numpy(tokens["attention_mask"][:, :MAX_TOKENS]),
    )


def _batch(pairs: list[tuple[str, str]]) -> Batch:
    ids_a, mask_a = _encode([a for a, _ in pairs])
    ids_b, mask_b = _encode([b for _, b in pairs])
    return (ids_a, mask_a, ids_b, mask_b), None


def pair_data(batch_size: int = 16, seed: int = 0) -> TrainData:
    """Shuffled pair batches per epoch (seeded by ``seed`` and the epoch) and held-out batches of the same size."""
    from deploy_opt.demo.minilm import load_sentences

    sentences = load_sentences()
    pairs = [(sentences[i], sentences[i + 1]) for i in range(0, len(sentences) - 1, 2)]
    held_out = pairs[::EVAL_EVERY]
    train_pairs = [p for i, p in enumerate(pairs) if i % EVAL_EVERY]
    cache: dict[int, list[Batch]] = {}

    def train(epoch: int) -> list[Batch]:
        if epoch not in cache:
            order = torch.randperm(len(train_pairs), generator=torch.Generator().manual_seed(seed * 100_003 + epoch))
            chosen = [train_pairs[int(i)] for i in order]
            # Whole batches only: the loss depends on the number of in-batch negatives.
            cache.clear()
            cache[epoch] = [
                _batch(chosen[i : i + batch_size]) for i in range(0, len(chosen) - batch_size + 1, batch_size)
            ]
        return cache[epoch]

    evaluation = [_batch(held_out[i : i + batch_size]) for i in range(0, len(held_out) - batch_size + 1, batch_size)]
    log.info(
        "MiniLM pairs: %d training pairs, %d held out (%d evaluation batches of %d)",
        len(train_pairs),
        len(held_out),
        len(evaluation),
        batch_size,
    )
    return TrainData(train=train, evaluation=evaluation, loss=contrastive_loss, logits=pair_logits)
