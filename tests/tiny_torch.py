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


def labelled_images(
    model: torch.nn.Module, seed: int, n: int, batch: int = 8
) -> list[tuple[dict[str, np.ndarray], np.ndarray]]:
    """``n`` seeded 1x8x8 images labelled by ``model``'s argmax, ``batch`` a batch."""
    x = np.random.default_rng(seed).normal(0, 1, (n, 1, 8, 8)).astype(np.float32)
    with torch.no_grad():
        y = model(torch.from_numpy(x)).argmax(1).numpy()
    return [({"image": x[i : i + batch]}, y[i : i + batch]) for i in range(0, n, batch)]


def calibration() -> list[tuple[dict[str, np.ndarray], np.ndarray]]:
    """64 calibration samples."""
    return labelled_images(build_model(), 10, 64)


def evaluation() -> list[tuple[dict[str, np.ndarray], np.ndarray]]:
    """64 evaluation samples from another seed."""
    return labelled_images(build_model(), 11, 64)
