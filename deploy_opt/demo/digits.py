"""The demo: an MLP trained on scikit-learn's real handwritten digits, calibrated and evaluated on
disjoint splits.

The model is 6 hidden layers of 1024 units. That size is deliberate: on a 2-core AVX2 CPU a tiny digits
CNN runs 2-4x *slower* in INT8 (quantize/dequantize overhead dominates), while this MLP at batch 32 runs
about 2x faster. Training is deterministic (fixed seed, fixed split) and takes seconds; the weights are
cached under ``$DEPLOY_OPT_CACHE`` (default ``~/.cache/deploy_opt``).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import logging
import os
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from dopt_common.deps import require
from dopt_common.files import atomic_path

log = logging.getLogger(__name__)
SEED = 0
WIDTH, DEPTH, EPOCHS, LR, BATCH = 1024, 6, 10, 2e-3, 128
SPLITS = {"train": 0.45, "calibration": 0.30, "evaluation": 0.25}


def cache_dir() -> Path:
    """Where trained demo weights are cached."""
    return Path(os.environ.get("DEPLOY_OPT_CACHE", Path.home() / ".cache" / "deploy_opt"))


@lru_cache(maxsize=1)
def digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's digits: 1,797 flattened 8x8 images (values 0..16, float64) and their labels, as
    ``sklearn.datasets.load_digits`` returns them (``data``, ``target``).

    Read from the CSV scikit-learn ships, the way ``load_digits`` reads it, without importing scikit-learn and
    SciPy (2 s of every demo build's process); scikit-learn's own loader where that file is not found.
    """
    import importlib.util

    spec = importlib.util.find_spec("sklearn")
    origin = Path(spec.origin) if spec is not None and spec.origin else None
    csv = origin.parent / "datasets" / "data" / "digits.csv.gz" if origin is not None else None
    if csv is None or not csv.is_file():
        digits = require("sklearn.datasets", purpose="the digits demo").load_digits()
        return digits.data, digits.target
    with gzip.open(csv, mode="rt", encoding="utf-8") as compressed:
        table = np.loadtxt(compressed, delimiter=",")
    table.flags.writeable = False  # shared by every caller (the cache)
    target = table[:, -1].astype(int)
    target.flags.writeable = False
    return table[:, :-1], target


@lru_cache(maxsize=1)
def _splits() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    data, target = digits_arrays()
    x = (data / 16.0).astype(np.float32)
    y = target.astype(np.int64)
    order = np.random.default_rng(SEED).permutation(len(x))
    n_train = int(len(x) * SPLITS["train"])
    n_cal = int(len(x) * SPLITS["calibration"])
    parts = {
        "train": order[:n_train],
        "calibration": order[n_train : n_train + n_cal],
        "evaluation": order[n_train + n_cal :],
    }
    return {name: (x[idx], y[idx]) for name, idx in parts.items()}


def _batches(split: str, batch_size: int) -> list[tuple[dict[str, np.ndarray], np.ndarray]]:
    x, y = _splits()[split]
    return [({"pixels": x[i : i + batch_size]}, y[i : i + batch_size]) for i in range(0, len(x), batch_size)]


def calibration_data(batch_size: int = 32) -> list[tuple[dict[str, np.ndarray], np.ndarray]]:
    """The calibration split (30% of the digits, 539 samples), as (inputs, labels) batches."""
    return _batches("calibration", batch_size)


def evaluation_data(batch_size: int = 32) -> list[tuple[dict[str, np.ndarray], np.ndarray]]:
    """The evaluation split (25%, disjoint from training and calibration)."""
    return _batches("evaluation", batch_size)


def _architecture() -> Any:
    import torch

    layers: list[torch.nn.Module] = []
    width_in = 64
    for _ in range(DEPTH):
        layers += [torch.nn.Linear(width_in, WIDTH), torch.nn.ReLU()]
        width_in = WIDTH
    layers.append(torch.nn.Linear(width_in, 10))
    return torch.nn.Sequential(*layers)


def _recipe_hash() -> str:
    recipe = {
        "seed": SEED,
        "width": WIDTH,
        "depth": DEPTH,
        "epochs": EPOCHS,
        "lr": LR,
        "batch": BATCH,
        "splits": SPLITS,
    }
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:12]


def train(model: Any) -> None:
    """Train deterministically on the training split (Adam, cosine schedule)."""
    import torch

    torch.manual_seed(SEED)
    for param in model.parameters():
        param.data.copy_(_init_like(param, torch))
    x, y = (torch.from_numpy(a) for a in _splits()["train"])
    cosine = torch.optim.lr_scheduler.CosineAnnealingLR
    fit(model, x, y, epochs=EPOCHS, batch=BATCH, lr=LR, seed=SEED, schedule=cosine)


def fit(
    model: Any, x: Any, y: Any, *, epochs: int, batch: int, lr: float, seed: int, schedule: Callable[[Any, int], Any]
) -> None:
    """Adam on cross-entropy over mini-batches of ``batch`` in a seeded random order per epoch, ``schedule(optimizer,
    total_steps)`` stepped after every batch; the model is left in eval mode. The demo's loop, and the unseen CNN's
    (``benchmarks/unseen/cnn.py``, with a one-cycle schedule)."""
    import torch

    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    scheduler = schedule(optimizer, epochs * ((len(x) + batch - 1) // batch))
    generator = torch.Generator().manual_seed(seed)
    model.train()
    for _ in range(epochs):
        order = torch.randperm(len(x), generator=generator)
        for start in range(0, len(x), batch):
            idx = order[start : start + batch]
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x[idx]), y[idx])
            loss.backward()
            optimizer.step()
            scheduler.step()
    model.eval()


def _init_like(param: Any, torch: Any) -> Any:
    # Kaiming-uniform as nn.Linear does, but drawn from our seeded generator so the run is reproducible.
    fan_in = param.shape[-1] if param.ndim > 1 else WIDTH
    bound = (6.0 / fan_in) ** 0.5 if param.ndim > 1 else 1.0 / fan_in**0.5
    return torch.empty_like(param).uniform_(-bound, bound)


def build_model() -> Any:
    """The trained demo MLP (input ``pixels`` [batch, 64] in 0..1, output 10 logits)."""
    import torch

    model = _architecture()
    path = cache_dir() / f"digits-mlp-{_recipe_hash()}.pt"
    if path.is_file():
        model.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
        return model.eval()
    log.info("training the digits demo MLP (first use; cached at %s)", path)
    threads = torch.get_num_threads()
    torch.set_num_threads(min(threads, 2))
    try:
        train(model)
    finally:
        torch.set_num_threads(threads)
    with atomic_path(path) as tmp:
        torch.save(model.state_dict(), tmp)
    return model.eval()
