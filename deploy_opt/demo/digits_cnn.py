"""The training demo: a small CNN on scikit-learn's real handwritten digits (8x8 grey images, 10 classes).

``build_model`` and ``digits_data`` are the ``model:`` and ``data:`` of ``configs/train_digits.yaml``. The split
is fixed and seeded: 80% train, 20% evaluation, disjoint. Training order is reshuffled every epoch from
``(seed, epoch)``, so a resumed run sees the same batches as an uninterrupted one.
"""

from __future__ import annotations

import logging
from functools import lru_cache

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from deploy_opt.demo.digits import digits_arrays
from deploy_opt.train.data import Batch, TrainData

log = logging.getLogger(__name__)
SPLIT_SEED = 0
EVAL_SHARE = 0.2


class DigitsCNN(nn.Module):
    """Three 3x3 conv layers with batch norm, two max-pools and a linear classifier (about 26k parameters)."""

    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, width, 3, padding=1, bias=False)
        self.norm1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, 2 * width, 3, padding=1, bias=False)
        self.norm2 = nn.BatchNorm2d(2 * width)
        self.conv3 = nn.Conv2d(2 * width, 4 * width, 3, padding=1, bias=False)
        self.norm3 = nn.BatchNorm2d(4 * width)
        self.head = nn.Linear(4 * width * 2 * 2, 10)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        """Map images [batch, 1, 8, 8] in 0..1 to 10 logits."""
        x = F.relu(self.norm1(self.conv1(pixels)))
        x = F.max_pool2d(F.relu(self.norm2(self.conv2(x))), 2)
        x = F.max_pool2d(F.relu(self.norm3(self.conv3(x))), 2)
        return self.head(x.flatten(1))


def build_model() -> nn.Module:
    """A freshly initialised DigitsCNN (the loop seeds torch before calling this)."""
    return DigitsCNN()


@lru_cache(maxsize=1)
def _splits() -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    data, target = digits_arrays()
    x = torch.from_numpy((data.reshape(-1, 8, 8) / 16.0).astype(np.float32)).unsqueeze(1)
    y = torch.from_numpy(target.astype(np.int64))
    order = torch.from_numpy(np.random.default_rng(SPLIT_SEED).permutation(len(x)))
    n_eval = int(len(x) * EVAL_SHARE)
    return {"train": (x[order[n_eval:]], y[order[n_eval:]]), "evaluation": (x[order[:n_eval]], y[order[:n_eval]])}


def accuracy(logits: torch.Tensor, target: torch.Tensor) -> float:
    """Top-1 accuracy of one batch."""
    return float((logits.argmax(dim=1) == target).float().mean())


def digits_data(batch_size: int = 32, seed: int = 0) -> TrainData:
    """Shuffled training batches per epoch (seeded by ``seed`` and the epoch), fixed evaluation batches."""
    x, y = _splits()["train"]
    ex, ey = _splits()["evaluation"]

    def train(epoch: int) -> list[Batch]:
        generator = torch.Generator().manual_seed(seed * 100_003 + epoch)
        order = torch.randperm(len(x), generator=generator)
        # Drop the last short batch: every step sees batch_size samples (batch norm dislikes tiny batches).
        return [(x[idx], y[idx]) for idx in order.split(batch_size) if len(idx) == batch_size]

    evaluation = [(ex[i : i + 256], ey[i : i + 256]) for i in range(0, len(ex), 256)]
    return TrainData(
        train=train,
        evaluation=evaluation,
        loss=F.cross_entropy,
        metric=accuracy,
        metric_name="accuracy",
        logits=_identity,
    )


def _identity(output: torch.Tensor) -> torch.Tensor:
    """The CNN's output is its logits (for Sophia's Gauss-Newton-Bartlett estimator)."""
    return output
