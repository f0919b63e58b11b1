"""A 2-layer ONNX MLP whose inputs change magnitude from batch to batch (1e-2 to 10): one static int8 range per
tensor, set by the largest batches, leaves the smallest ones a few codes, while ORT's dynamic INT8 takes each
batch's own range. The case for dynamic INT8 as an auto-search candidate."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from onnx import helper

SCALES = (0.01, 0.1, 1.0, 10.0)


def make_model(path: Path) -> Path:
    """x → MatMul → Relu → MatMul → y, dynamic batch."""
    import tiny_onnx  # here, not at the top: configs load this file by path, where tests/ is not importable

    rng = np.random.default_rng(5)
    inits = {
        "w1": rng.normal(0, 0.3, (16, 32)).astype(np.float32),
        "w2": rng.normal(0, 0.3, (32, 8)).astype(np.float32),
    }
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"], name="fc1"),
        helper.make_node("Relu", ["h"], ["r"], name="relu"),
        helper.make_node("MatMul", ["r", "w2"], ["y"], name="fc2"),
    ]
    return tiny_onnx.save_xy_model(path, nodes, "scaled", ["batch", 16], ["batch", 8], inits)


def _split(seed: int, n: int) -> list[tuple[dict[str, np.ndarray], None]]:
    x = np.random.default_rng(seed).normal(0, 1, (n, 16)).astype(np.float32)
    return [({"x": x[i : i + 16] * SCALES[(i // 16) % len(SCALES)]}, None) for i in range(0, n, 16)]


def calibration() -> list[tuple[dict[str, np.ndarray], None]]:
    """128 calibration samples, in batches of 16 of one magnitude each."""
    return _split(31, 128)


def evaluation() -> list[tuple[dict[str, np.ndarray], None]]:
    """256 evaluation samples, likewise."""
    return _split(32, 256)
