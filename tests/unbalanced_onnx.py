"""A 4-conv ONNX CNN whose middle pair is unbalanced by construction: conv2's output channel 0 is 50x the others
and conv3 reads it 50x smaller, so the function is ordinary but one per-tensor int8 range for conv2's output
leaves the other channels a few codes. Cross-layer equalization rescales the pair and removes exactly that."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def _weights() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    w = {
        "w1": rng.normal(0, 0.4, (8, 3, 3, 3)),
        "w2": rng.normal(0, 0.3, (8, 8, 3, 3)),
        "w3": rng.normal(0, 0.3, (8, 8, 1, 1)),
        "w4": rng.normal(0, 0.3, (4, 8, 1, 1)),
    }
    w["w2"][0] *= 50.0
    w["w3"][:, 0] /= 50.0
    b = {f"b{i}": rng.normal(0, 0.1, (w[f"w{i}"].shape[0],)) for i in range(1, 5)}
    b["b2"][0] *= 50.0
    return {k: v.astype(np.float32) for k, v in {**w, **b}.items()}


def make_model(path: Path) -> Path:
    """x → conv1 → relu → conv2 → relu → conv3 → relu → conv4 → y, dynamic batch."""
    nodes, last = [], "x"
    for i in range(1, 5):
        pads = [1, 1, 1, 1] if i <= 2 else [0, 0, 0, 0]
        nodes.append(helper.make_node("Conv", [last, f"w{i}", f"b{i}"], [f"c{i}"], name=f"conv{i}", pads=pads))
        if i < 4:
            nodes.append(helper.make_node("Relu", [f"c{i}"], [f"r{i}"], name=f"relu{i}"))
        last = f"r{i}" if i < 4 else f"c{i}"
    graph = helper.make_graph(
        nodes,
        "unbalanced",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, 8, 8])],
        [helper.make_tensor_value_info("c4", TensorProto.FLOAT, ["batch", 4, 8, 8])],
        [numpy_helper.from_array(v, k) for k, v in _weights().items()],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def _split(seed: int, n: int) -> list[tuple[dict[str, np.ndarray], None]]:
    x = np.random.default_rng(seed).normal(0, 1, (n, 3, 8, 8)).astype(np.float32)
    return [({"x": x[i : i + 16]}, None) for i in range(0, n, 16)]


def calibration() -> list[tuple[dict[str, np.ndarray], None]]:
    """64 calibration samples."""
    return _split(41, 64)


def evaluation() -> list[tuple[dict[str, np.ndarray], None]]:
    """192 evaluation samples."""
    return _split(42, 192)
