"""A one-block transformer encoder as ONNX, built in code: where a node sits decides how much its noise matters.

x → LayerNorm → q, k, v projections → softmax(q kᵀ / √d) v → output projection → + x → LayerNorm → FFN
(MatMul, Gelu, MatMul) → + → mean over the sequence. Noise on q or k is squashed by the softmax, noise on v
passes through, so a ranking by local quantization noise alone gets the order wrong and one that follows the
noise to the output gets it right.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

D, SEQ, HIDDEN = 16, 8, 48


def weights() -> dict[str, np.ndarray]:
    """Fixed weights; a few input channels of the FFN carry larger values so its ranges differ."""
    rng = np.random.default_rng(5)
    w = {name: rng.normal(0, 1 / np.sqrt(D), (D, D)).astype(np.float32) for name in ("wq", "wk", "wv", "wo")}
    w["w1"] = rng.normal(0, 1 / np.sqrt(D), (D, HIDDEN)).astype(np.float32)
    w["w2"] = rng.normal(0, 1 / np.sqrt(HIDDEN), (HIDDEN, D)).astype(np.float32)
    w["w1"][:, :3] *= 6.0
    w["ln1_g"] = np.ones(D, np.float32)
    w["ln1_b"] = np.zeros(D, np.float32)
    w["ln2_g"] = rng.uniform(0.5, 1.5, D).astype(np.float32)
    w["ln2_b"] = np.zeros(D, np.float32)
    w["inv_sqrt_d"] = np.array(1 / np.sqrt(D), np.float32)
    return w


def make_model(path: Path) -> Path:
    """The encoder block with dynamic batch; the output is the mean over the sequence, [batch, D]."""
    node = helper.make_node
    nodes = [
        node("LayerNormalization", ["x", "ln1_g", "ln1_b"], ["n1"], name="ln1", axis=-1),
        node("MatMul", ["n1", "wq"], ["q"], name="q_proj"),
        node("MatMul", ["n1", "wk"], ["k"], name="k_proj"),
        node("MatMul", ["n1", "wv"], ["v"], name="v_proj"),
        node("Transpose", ["k"], ["kt"], name="k_t", perm=[0, 2, 1]),
        node("MatMul", ["q", "kt"], ["scores_raw"], name="scores"),
        node("Mul", ["scores_raw", "inv_sqrt_d"], ["scores_scaled"], name="scale"),
        node("Softmax", ["scores_scaled"], ["probs"], name="softmax", axis=-1),
        node("MatMul", ["probs", "v"], ["context"], name="context"),
        node("MatMul", ["context", "wo"], ["attn"], name="o_proj"),
        node("Add", ["x", "attn"], ["h"], name="residual1"),
        node("LayerNormalization", ["h", "ln2_g", "ln2_b"], ["n2"], name="ln2", axis=-1),
        node("MatMul", ["n2", "w1"], ["f1"], name="ffn_up"),
        node("Gelu", ["f1"], ["g"], name="gelu"),
        node("MatMul", ["g", "w2"], ["f2"], name="ffn_down"),
        node("Add", ["h", "f2"], ["out"], name="residual2"),
        node("ReduceMean", ["out", "seq_axis"], ["y"], name="pool", keepdims=0),
    ]
    inits = [numpy_helper.from_array(v, k) for k, v in weights().items()]
    inits.append(numpy_helper.from_array(np.array([1], np.int64), "seq_axis"))
    graph = helper.make_graph(
        nodes,
        "tiny_attention",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", SEQ, D])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", D])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    model.ir_version = 9
    onnx.save(model, str(path))
    return path


def _split(seed: int, n: int) -> list[tuple[dict[str, np.ndarray], None]]:
    x = np.random.default_rng(seed).normal(0, 1, (n, SEQ, D)).astype(np.float32)
    return [({"x": x[i : i + 16]}, None) for i in range(0, n, 16)]


def calibration() -> list[tuple[dict[str, np.ndarray], None]]:
    """128 calibration samples."""
    return _split(31, 128)


def evaluation() -> list[tuple[dict[str, np.ndarray], None]]:
    """160 evaluation samples."""
    return _split(33, 160)


def validation() -> list[tuple[dict[str, np.ndarray], None]]:
    """160 samples to decide on (sensitivity, search), disjoint from the evaluation ones."""
    return _split(32, 160)
