"""A tiny Q/DQ model named as ONNX Runtime's QDQQuantizer names things, for the TensorRT fakes' tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def _quantize_dequantize(prefix: str, source: str, output: str) -> list[onnx.NodeProto]:
    """QuantizeLinear then DequantizeLinear of ``source`` into ``output``, with ``prefix``'s scale and zero point,
    named as ORT's QDQQuantizer names them."""
    quantized = f"{prefix}_QuantizeLinear_Output"
    params = [f"{prefix}_scale", f"{prefix}_zero_point"]
    return [
        helper.make_node("QuantizeLinear", [source, *params], [quantized], name=f"{prefix}_QuantizeLinear"),
        helper.make_node("DequantizeLinear", [quantized, *params], [output], name=f"{prefix}_DequantizeLinear"),
    ]


def ort_style_qdq_model(path: Path) -> Path:
    """x → Q/DQ → MatMul(DQ(int8 W, per channel)) → Q/DQ → y, named as ORT's QDQQuantizer names things."""
    rng = np.random.default_rng(3)
    w_q = rng.integers(-127, 128, (4, 3), dtype=np.int8)
    inits = {
        "x_scale": np.float32(0.02),
        "x_zero_point": np.int8(0),
        "W_quantized": w_q,
        "W_scale": np.array([0.011, 0.013, 0.017], np.float32),
        "W_zero_point": np.zeros(3, np.int8),
        "mm_scale": np.float32(0.05),
        "mm_zero_point": np.int8(0),
    }
    nodes = [
        *_quantize_dequantize("x", "x", "x_DequantizeLinear_Output"),
        helper.make_node(
            "DequantizeLinear",
            ["W_quantized", "W_scale", "W_zero_point"],
            ["W_DequantizeLinear_Output"],
            name="W_DequantizeLinear",
            axis=1,
        ),
        helper.make_node(
            "MatMul", ["x_DequantizeLinear_Output", "W_DequantizeLinear_Output"], ["mm_QuantizeLinear_Input"], name="mm"
        ),
        *_quantize_dequantize("mm", "mm_QuantizeLinear_Input", "y"),
    ]
    graph = helper.make_graph(
        nodes,
        "qdq",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def as_float32(values: tuple[float, ...]) -> tuple[float, ...]:
    return tuple(float(v) for v in np.asarray(values, np.float32))
