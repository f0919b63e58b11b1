"""A small CNN written the way other frameworks' exporters write ONNX, and seeded data for it.

What it has that a fresh torch export has not: opset 11 with IR version 3 (every initializer also listed as a
graph input), Conv weights held by ``Constant`` nodes, a MatMul weight computed as ``Transpose`` of a constant,
an input dimension named ``?``, and a dead output channel (weights ~1e-15 with a bias of 0.5), whose int32 bias
would overflow at the naive weight scale.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

CHANNELS, CLASSES, SIDE = 8, 4, 8


def weights() -> dict[str, np.ndarray]:
    """Fixed random weights; conv1's channel 3 is dead."""
    rng = np.random.default_rng(11)
    conv1 = rng.normal(0, 0.4, (CHANNELS, 3, 3, 3)).astype(np.float32)
    conv1[3] = 1e-15
    bias1 = rng.normal(0, 0.1, CHANNELS).astype(np.float32)
    bias1[3] = 0.5
    return {
        "conv1_w": conv1,
        "conv1_b": bias1,
        "conv2_w": rng.normal(0, 0.3, (CHANNELS, CHANNELS, 3, 3)).astype(np.float32),
        "conv2_b": rng.normal(0, 0.1, CHANNELS).astype(np.float32),
        "fc_w_t": rng.normal(0, 0.3, (CLASSES, CHANNELS)).astype(np.float32),  # stored [out, in]: transposed
        "fc_b": rng.normal(0, 0.1, CLASSES).astype(np.float32),
    }


def _constant(name: str, value: np.ndarray) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], name=f"{name}_const", value=numpy_helper.from_array(value))


def make_model(path: Path) -> Path:
    """Conv → Relu → Conv → Relu → GlobalAveragePool → Flatten → MatMul(x, Transpose(W)) → Add, at opset 11."""
    w = weights()
    nodes = [
        _constant("conv1_w", w["conv1_w"]),
        _constant("conv2_w", w["conv2_w"]),
        _constant("fc_w_t", w["fc_w_t"]),
        helper.make_node("Conv", ["x", "conv1_w", "conv1_b"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "conv2_w", "conv2_b"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
        helper.make_node("GlobalAveragePool", ["r2"], ["pooled"], name="pool"),
        helper.make_node("Flatten", ["pooled"], ["flat"], name="flatten"),
        helper.make_node("Transpose", ["fc_w_t"], ["fc_w"], name="fc_transpose", perm=[1, 0]),
        helper.make_node("MatMul", ["flat", "fc_w"], ["fc"], name="fc"),
        helper.make_node("Add", ["fc", "fc_b"], ["logits"], name="fc_bias"),
    ]
    inits = [numpy_helper.from_array(w[k], k) for k in ("conv1_b", "conv2_b", "fc_b")]
    graph = helper.make_graph(
        nodes,
        "foreign",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["?", 3, SIDE, SIDE])]
        + [helper.make_tensor_value_info(i.name, TensorProto.FLOAT, list(i.dims)) for i in inits],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["?", CLASSES])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)], producer_name="foreign2onnx")
    model.ir_version = 3
    onnx.save(model, str(path))
    return path


def _split(seed: int, n: int, batch: int = 16) -> list[tuple[dict[str, np.ndarray], None]]:
    x = np.random.default_rng(seed).uniform(-1, 1, (n, 3, SIDE, SIDE)).astype(np.float32)
    return [({"x": x[i : i + batch]}, None) for i in range(0, n, batch)]


def calibration() -> list[tuple[dict[str, np.ndarray], None]]:
    """64 calibration images."""
    return _split(1, 64)


def evaluation() -> list[tuple[dict[str, np.ndarray], None]]:
    """64 evaluation images, drawn with another seed."""
    return _split(2, 64)
