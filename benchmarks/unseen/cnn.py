"""Unseen model (a): a small residual depthwise-separable CNN on scikit-learn's handwritten digits.

Architecture: stem Conv2d 3x3 + BatchNorm + GELU, two residual blocks (depthwise 3x3 conv + BN + GELU +
pointwise 1x1 conv, added to the block's input), global average pool, Linear to 10 classes. Input ``pixels``
is [batch, 1, 8, 8]: ``load_digits`` pixel values 0..16 divided by 16, so it takes only 17 distinct values.

Data: one seeded split of the 1,797 digits. The training split (75%) trains the model and is also the
calibration data; the held-out test split (25%) is the evaluation data, so the two never share a sample.
Each sample's id is its row in ``load_digits`` (identical images in both splits stay distinct samples).

Train (seeded, 30 epochs of Adam, ~15 s on 2 idle cores)::

    python benchmarks/unseen/cnn.py --train benchmarks/unseen/.cache/cnn.pt
"""

from __future__ import annotations

import argparse
import functools
import logging
import time
from pathlib import Path
from typing import Any

import numpy as np

from deploy_opt.demo.digits import fit

log = logging.getLogger(__name__)
SEED = 0
CHANNELS, EPOCHS, LR, BATCH = 32, 30, 3e-3, 128
TEST_FRACTION = 0.25
Item = tuple[dict[str, np.ndarray], np.ndarray, list[str]]


@functools.lru_cache(maxsize=1)
def _splits() -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = (digits.images / 16.0).astype(np.float32)[:, None, :, :]
    y = digits.target.astype(np.int64)
    order = np.random.default_rng(SEED).permutation(len(x))
    n_test = int(len(x) * TEST_FRACTION)
    parts = {"test": np.sort(order[:n_test]), "train": np.sort(order[n_test:])}
    return {name: (x[idx], y[idx], idx) for name, idx in parts.items()}


def _batches(split: str, batch_size: int) -> list[Item]:
    x, y, rows = _splits()[split]
    return [
        ({"pixels": x[i : i + batch_size]}, y[i : i + batch_size], [f"digit-{r}" for r in rows[i : i + batch_size]])
        for i in range(0, len(x), batch_size)
    ]


def calibration_data(batch_size: int = 32) -> list[Item]:
    """The training split (1,348 digits) as ``(inputs, labels, ids)`` batches."""
    return _batches("train", batch_size)


def evaluation_data(batch_size: int = 32) -> list[Item]:
    """The held-out test split (449 digits), disjoint from training and calibration."""
    return _batches("test", batch_size)


def train_data(batch_size: int = 32, seed: int = 0) -> Any:
    """The training split reshuffled each epoch (seeded) and the test split, for ``train run|search``
    (``benchmarks/unseen/train_cnn.yaml``): cross-entropy, top-1 accuracy, no ``logits`` (Sophia: Hutchinson)."""
    import torch
    import torch.nn.functional as F

    from deploy_opt.train.data import TrainData

    x, y, _ = (torch.from_numpy(a) for a in _splits()["train"])
    tx, ty, _ = (torch.from_numpy(a) for a in _splits()["test"])

    def epoch_batches(epoch: int) -> list[tuple[Any, Any]]:
        order = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed * 7919 + epoch))
        return [(x[idx], y[idx]) for idx in order.split(batch_size) if len(idx) == batch_size]

    def accuracy(logits: Any, target: Any) -> float:
        return float((logits.argmax(dim=1) == target).float().mean())

    evaluation = [(tx[i : i + 256], ty[i : i + 256]) for i in range(0, len(tx), 256)]
    return TrainData(epoch_batches, evaluation, F.cross_entropy, accuracy, "accuracy")


def _block(channels: int) -> Any:
    from torch import nn

    return nn.Sequential(
        nn.Conv2d(channels, channels, 3, padding=1, groups=channels),
        nn.BatchNorm2d(channels),
        nn.GELU(),
        nn.Conv2d(channels, channels, 1),
    )


def _residual_cnn() -> Any:
    import torch
    from torch import nn

    class ResidualCNN(nn.Module):
        """Stem, two residual depthwise-separable blocks, global average pool, linear head."""

        def __init__(self) -> None:
            super().__init__()
            self.stem = nn.Sequential(nn.Conv2d(1, CHANNELS, 3, padding=1), nn.BatchNorm2d(CHANNELS), nn.GELU())
            self.blocks = nn.ModuleList([_block(CHANNELS), _block(CHANNELS)])
            self.head = nn.Linear(CHANNELS, 10)

        def forward(self, pixels: torch.Tensor) -> torch.Tensor:
            x = self.stem(pixels)
            for block in self.blocks:
                x = x + block(x)
            return self.head(x.mean(dim=(2, 3)))

    return ResidualCNN()


def build_model() -> Any:
    """The untrained architecture in eval mode; the build loads ``.cache/cnn.pt`` into it."""
    return _residual_cnn().eval()


def _fit(model: Any) -> None:
    import torch

    x, y = (torch.from_numpy(a) for a in _splits()["train"][:2])

    def one_cycle(optimizer: Any, steps: int) -> Any:
        return torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=LR, total_steps=steps)

    fit(model, x, y, epochs=EPOCHS, batch=BATCH, lr=LR, seed=SEED, schedule=one_cycle)  # the digits demo's loop


def test_top1(model: Any) -> float:
    """Top-1 accuracy (percent) of a torch model on the held-out test split."""
    import torch

    x, y, _ = _splits()["test"]
    with torch.no_grad():
        predicted = model(torch.from_numpy(x)).argmax(dim=1).numpy()
    return float((predicted == y).mean() * 100.0)


def train(out_path: str | Path) -> float:
    """Train the CNN with a fixed seed on 2 threads, save its state dict, and return FP32 test top-1."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(min(threads, 2))
    try:
        torch.manual_seed(SEED)
        model = _residual_cnn()
        _fit(model)
    finally:
        torch.set_num_threads(threads)
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    torch.save(model.state_dict(), tmp)
    tmp.replace(out)
    return test_top1(model)


def main() -> None:
    """CLI: ``--train OUT`` trains and saves the weights, then prints the FP32 test top-1."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train", metavar="OUT", required=True, help="where to save the state dict (.pt)")
    args = parser.parse_args()
    start = time.perf_counter()
    top1 = train(args.train)
    print(f"saved {args.train}: FP32 test top-1 {top1:.2f}% ({time.perf_counter() - start:.1f} s)")


if __name__ == "__main__":
    main()
