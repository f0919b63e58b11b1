"""An invalid Q/DQ model is caught in staging with its node named, and no error message is ever cut."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
import tiny_onnx
from onnx import helper, numpy_helper

from dopt_common.errors import ModelError
from dopt_common.ort import create_session
from exporters.ort.qdq import validate_qdq

NODE = "backbone.stage3.block7.depthwise_conv.weight_DequantizeLinear_" + "x" * 300


def _per_channel_dq_at_opset_11(path: Path) -> Path:
    """What ORT's writer produced for an opset-11 file: a per-channel DequantizeLinear (``axis`` needs 13)."""
    inits = [
        numpy_helper.from_array(np.ones((4, 3), np.int8), "w_quantized"),
        numpy_helper.from_array(np.full(4, 0.1, np.float32), "w_scale"),
        numpy_helper.from_array(np.zeros(4, np.int8), "w_zero_point"),
    ]
    nodes = [
        helper.make_node("DequantizeLinear", ["w_quantized", "w_scale", "w_zero_point"], ["w"], name=NODE, axis=0),
        helper.make_node("MatMul", ["x", "w"], ["y"], name="matmul"),
    ]
    model = tiny_onnx.xy_model(nodes, "bad", [2, 4], [2, 3], inits, opset=11)
    model.ir_version = 7
    onnx.save(model, str(path))
    return path


def test_an_invalid_qdq_model_is_caught_with_its_node_named(tmp_path: Path) -> None:
    path = _per_channel_dq_at_opset_11(tmp_path / "model.int8.onnx")
    with pytest.raises(ModelError) as caught:
        validate_qdq(path)
    message = str(caught.value)
    assert NODE in message and "axis" in message and "fix:" in message


def test_an_ort_load_error_is_never_cut(tmp_path: Path) -> None:
    path = _per_channel_dq_at_opset_11(tmp_path / "model.int8.onnx")
    with pytest.raises(ModelError) as caught:
        create_session(path, threads=1)
    message = str(caught.value)
    assert NODE in message and "axis" in message.split(NODE)[-1] and "…" not in message
