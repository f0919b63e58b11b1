"""A tiny torch CNN and seeded image-like data, for exporter and checkpoint tests."""

from __future__ import annotations

import numpy as np
import torch


def build_model() -> torch.nn.Module:
    """Conv → ReLU → pool → Linear, with fixed random weights."""
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(1, 8, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(2),
        torch.nn.Flatten(),
        torch.nn.Linear(32, 5),
    ).eval()


def _split(seed: int, n: int) -> list[tuple[dict[str, np.ndarray], np.ndarray]]:
    x = np.random.default_rng(seed).normal(0, 1, (n, 1, 8, 8)).astype(np.float32)
    with torch.no_grad():
        y = build_model()(torch.from_numpy(x)).argmax(1).numpy()
    return [({"image": x[i : i + 8]}, y[i : i + 8]) for i in range(0, n, 8)]


def calibration() -> list[tuple[dict[str, np.ndarray], np.ndarray]]:
    """64 calibration samples."""
    return _split(10, 64)


def evaluation() -> list[tuple[dict[str, np.ndarray], np.ndarray]]:
    """64 evaluation samples from another seed."""
    return _split(11, 64)
