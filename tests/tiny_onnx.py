"""A tiny ONNX classifier made with onnx.helper, and seeded data for it (calibration and evaluation disjoint)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

FEATURES, HIDDEN, CLASSES = 16, 64, 4


def seeded_weights(seed: int, **shapes: int | tuple[int, ...]) -> dict[str, np.ndarray]:
    """float32 arrays by name, drawn in order from one seed: a bias (a name starting with "b") at std 0.1, the
    rest at std 0.3."""
    rng = np.random.default_rng(seed)
    return {k: rng.normal(0, 0.1 if k.startswith("b") else 0.3, s).astype(np.float32) for k, s in shapes.items()}


def weights() -> dict[str, np.ndarray]:
    """Fixed random weights."""
    return seeded_weights(7, w1=(FEATURES, HIDDEN), b1=HIDDEN, w2=(HIDDEN, CLASSES), b2=CLASSES)


def make_model(path: Path) -> Path:
    """MatMul+Add → Relu → MatMul+Add with a dynamic batch axis, opset 17."""
    w = weights()
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h0"], name="fc1"),
        helper.make_node("Add", ["h0", "b1"], ["h1"], name="fc1_bias"),
        helper.make_node("Relu", ["h1"], ["h2"], name="relu"),
        helper.make_node("MatMul", ["h2", "w2"], ["h3"], name="fc2"),
        helper.make_node("Add", ["h3", "b2"], ["logits"], name="fc2_bias"),
    ]
    graph = helper.make_graph(
        nodes,
        "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", FEATURES])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", CLASSES])],
        [numpy_helper.from_array(v, k) for k, v in w.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def xy_model(
    nodes: list[onnx.NodeProto],
    name: str,
    x_shape: list[int | str],
    y_shape: list[int | str],
    inits: dict[str, np.ndarray] | list[onnx.TensorProto],
    opset: int = 17,
) -> onnx.ModelProto:
    """A graph of ``nodes`` from one float input ``x`` to one float output ``y``; ``inits`` as arrays by name or
    as initializers."""
    if isinstance(inits, dict):
        inits = [numpy_helper.from_array(v, k) for k, v in inits.items()]
    graph = helper.make_graph(
        nodes,
        name,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, y_shape)],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def save_xy_model(path: Path, *args, **kwargs) -> Path:
    """``xy_model(*args, **kwargs)`` saved at ``path``."""
    onnx.save(xy_model(*args, **kwargs), str(path))
    return path


def reference(x: np.ndarray) -> np.ndarray:
    """The same network in numpy."""
    w = weights()
    return np.maximum(x @ w["w1"] + w["b1"], 0) @ w["w2"] + w["b2"]


def _split(seed: int, n: int, batch: int = 16) -> list[tuple[dict[str, np.ndarray], np.ndarray]]:
    x = np.random.default_rng(seed).normal(0, 1, (n, FEATURES)).astype(np.float32)
    y = reference(x).argmax(axis=1)
    return [({"x": x[i : i + batch]}, y[i : i + batch]) for i in range(0, n, batch)]


def calibration() -> list[tuple[dict[str, np.ndarray], np.ndarray]]:
    """128 calibration samples."""
    return _split(1, 128)


def evaluation() -> list[tuple[dict[str, np.ndarray], np.ndarray]]:
    """256 evaluation samples, drawn with another seed."""
    return _split(2, 256)
