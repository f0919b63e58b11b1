"""The two training tasks of ``benchmarks/train/optimizers.py``: the digits CNN and MiniLM contrastive fine-tuning.

A :class:`Task` holds a model factory, the batches of every step, the loss and the evaluation; the benchmark trains
one copy of the model per optimizer on the same batches.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

MINILM_MAX_TOKENS = 64
MINILM_EVAL_EVERY = 7
TEMPERATURE = 0.05


@dataclass
class Task:
    """A model factory, the batches of every step, the loss and the evaluation."""

    name: str
    build_model: Callable[[], torch.nn.Module]
    batches: list[Any]
    loss: Callable[[torch.nn.Module, Any], torch.Tensor]
    evaluate: Callable[[torch.nn.Module], dict[str, float]]
    lr: float
    warmup_ratio: float


def digits_task(epochs: int, seed: int) -> Task:
    """The digits CNN to convergence: batches of 32, reshuffled every epoch."""
    from deploy_opt.demo.digits_cnn import accuracy, build_model, digits_data

    data = digits_data(batch_size=32, seed=seed)
    batches = [b for epoch in range(epochs) for b in data.train(epoch)]

    def evaluate(model: torch.nn.Module) -> dict[str, float]:
        x = torch.cat([b[0] for b in data.evaluation])
        y = torch.cat([b[1] for b in data.evaluation])
        logits = model(x)
        return {"eval_loss": float(F.cross_entropy(logits, y)), "eval_accuracy": accuracy(logits, y)}

    return Task("digits", build_model, batches, lambda m, b: F.cross_entropy(m(b[0]), b[1]), evaluate, 3e-3, 0.05)


def _encode(sentences: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    from deploy_opt.demo.minilm import tokenize

    tokens = tokenize(sentences)
    ids = torch.from_numpy(tokens["input_ids"][:, :MINILM_MAX_TOKENS])
    mask = torch.from_numpy(tokens["attention_mask"][:, :MINILM_MAX_TOKENS])
    return ids, mask


def _pair_batch(pairs: list[tuple[str, str]]) -> tuple[tuple[torch.Tensor, torch.Tensor], ...]:
    return _encode([a for a, _ in pairs]), _encode([b for _, b in pairs])


def contrastive_loss(model: torch.nn.Module, batch: Any) -> torch.Tensor:
    """Symmetric InfoNCE: each sentence's positive is its neighbour; the batch's other pairs are negatives."""
    (ids_a, mask_a), (ids_b, mask_b) = batch
    a, b = model(ids_a, mask_a), model(ids_b, mask_b)
    logits = a @ b.T / TEMPERATURE
    labels = torch.arange(len(logits))
    return (F.cross_entropy(logits, labels) + F.cross_entropy(logits.T, labels)) / 2


def minilm_task(steps: int, batch_size: int, seed: int) -> Task:
    """all-MiniLM-L6-v2 fine-tuned on adjacent-sentence pairs of Python's pydoc topics."""
    from deploy_opt.demo.minilm import build_model, load_sentences

    sentences = load_sentences()
    pairs = [(sentences[i], sentences[i + 1]) for i in range(0, len(sentences) - 1, 2)]
    # Every 7th pair is held out (97 pairs): spread over all topics, like the training pairs.
    held_out = pairs[::MINILM_EVAL_EVERY]
    train_pairs = [p for i, p in enumerate(pairs) if i % MINILM_EVAL_EVERY]
    rng = random.Random(seed)
    batches = []
    while len(batches) < steps:
        order = list(train_pairs)
        rng.shuffle(order)
        for i in range(0, len(order) - batch_size + 1, batch_size):
            batches.append(_pair_batch(order[i : i + batch_size]))
            if len(batches) == steps:
                break
    # Held-out batches of the training batch size: the loss depends on the number of in-batch negatives.
    eval_batches = [_pair_batch(held_out[i : i + batch_size]) for i in range(0, len(held_out), batch_size)]

    def evaluate(model: torch.nn.Module) -> dict[str, float]:
        return {"eval_loss": statistics.fmean(float(contrastive_loss(model, b)) for b in eval_batches)}

    def fresh_model() -> torch.nn.Module:
        return build_model().train()

    return Task("minilm", fresh_model, batches, contrastive_loss, evaluate, 5e-5, 0.1)
