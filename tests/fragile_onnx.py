"""A 3-layer ONNX MLP with one deliberately fragile layer: fc2 reads an activation with one huge channel.

fc1's column 0 is scaled ×300, so its output h1 carries an outlier channel; fc2 ignores that channel (its row 0
is zero), so in FP32 it is harmless, but a per-tensor int8 scale for h1 crushes every other channel.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from onnx import helper


def weights() -> dict[str, np.ndarray]:
    """Fixed weights with the outlier channel."""
    rng = np.random.default_rng(11)
    w1 = rng.normal(0, 0.3, (16, 32)).astype(np.float32)
    w1[:, 0] *= 300.0
    w2 = rng.normal(0, 0.3, (32, 32)).astype(np.float32)
    w2[0, :] = 0.0
    w3 = rng.normal(0, 0.3, (32, 8)).astype(np.float32)
    return {"w1": w1, "w2": w2, "w3": w3}


def make_model(path: Path) -> Path:
    """x → fc1 → relu → fc2 → relu → fc3 → y, dynamic batch."""
    import tiny_onnx  # here, not at the top: configs load this file by path, where tests/ is not importable

    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h1"], name="fc1"),
        helper.make_node("MatMul", ["h1", "w2"], ["h2"], name="fc2"),
        helper.make_node("Relu", ["h2"], ["r2"], name="relu2"),
        helper.make_node("MatMul", ["r2", "w3"], ["y"], name="fc3"),
    ]
    return tiny_onnx.save_xy_model(path, nodes, "fragile", ["batch", 16], ["batch", 8], weights())


def _split(seed: int, n: int) -> list[tuple[dict[str, np.ndarray], None]]:
    x = np.random.default_rng(seed).normal(0, 1, (n, 16)).astype(np.float32)
    return [({"x": x[i : i + 16]}, None) for i in range(0, n, 16)]


def calibration() -> list[tuple[dict[str, np.ndarray], None]]:
    """128 calibration samples."""
    return _split(21, 128)


def evaluation() -> list[tuple[dict[str, np.ndarray], None]]:
    """160 evaluation samples."""
    return _split(22, 160)
