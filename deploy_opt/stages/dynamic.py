"""Stage: dynamic-range INT8 for ORT CPU (weights int8 ahead of time, activations quantized at run time).

The auto search's candidate where static INT8 loses too much: recurrent models (LSTM) and transformers' MatMuls.
ORT's own ``quantize_dynamic`` writes it (``exporters.ort.dynamic``); scales.json records its weights and lists the
activations quantized at run time, and the written model is read back against the file before it is used. Never
for TensorRT, which takes only static, explicit Q/DQ (``dynamic_allowed``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path

import onnx

from calibrators.scales.format import load_scale_file, save_scale_file
from deploy_opt.config.setup import QuantSetup
from deploy_opt.report.model_sections import QuantizationInfo
from deploy_opt.stages.calibrate import ActivationRanges
from deploy_opt.stages.quantize import QuantizedModel, weight_levels
from dopt_common.errors import ScaleMismatchError
from exporters.ort.dynamic import DEFAULT_OP_TYPES, dynamic_scale_file, write_ort_dynamic
from exporters.ort.dynamic_read import compare_dynamic, read_dynamic_model

log = logging.getLogger(__name__)


def dynamic_allowed(targets: tuple[str, ...]) -> bool:
    """Dynamic INT8 is ORT CPU's: offered only when it is a target and TensorRT (static Q/DQ only) is not."""
    return "ort-cpu" in targets and "tensorrt" not in targets


def dynamic_nodes(model: onnx.ModelProto) -> list[str]:
    """The nodes ORT's dynamic mode can quantize (GRU has no dynamic kernel)."""
    kinds = set(DEFAULT_OP_TYPES) - {"GRU"}
    return [n.name for n in model.graph.node if n.op_type in kinds]


def quantize_dynamic(
    setup: QuantSetup, fp32_path: Path, stage: Path, exclude: Iterable[str], samples: int
) -> QuantizedModel:
    """Write ``model.int8.onnx`` (dynamic INT8) and ``scales.json`` in ``stage``, and prove they agree."""
    stage.mkdir(parents=True, exist_ok=True)
    levels, why = weight_levels(setup.quantization.weight_range, setup.deploy.targets)
    reduce = levels < 127  # 7-bit weights: quantization.weight_range, or auto on x86 without VNNI
    written = write_ort_dynamic(
        fp32_path,
        stage / "model.int8.onnx",
        exclude_nodes=tuple(exclude),
        reduce_range=reduce,
        external_data_mb=setup.export.external_data_mb,
    )
    scales_path = save_scale_file(dynamic_scale_file(written, fp32_path), stage / "scales.json")
    scales = load_scale_file(scales_path)
    diff = compare_dynamic(scales, read_dynamic_model(written.path))
    if not diff.ok:
        raise ScaleMismatchError(
            f"the dynamic INT8 model does not carry scales.json exactly: {diff.summary()}; fix: exclude the named "
            "tensor's node (quantization.exclude_nodes) and report the model"
        )
    info = {
        "method": "dynamic",
        "activations": "dynamic (uint8, from each input's own min and max at run time)",
        "weights": "absmax, per channel",
        "weight_range": why,
        "samples": 0,
        "op_types": list(written.settings.op_types),
        "quantized_tensors": {"weight": len(scales.tensors), "dynamic": len(scales.dynamic)},
        "scale_check": "pass: every int8 weight parameter equals scales.json bit for bit; dynamic tensors as listed",
        "quantized_nodes": len(written.quantized_nodes),
        "left_float": dict(written.left_float),
        "tensors": {},
    }
    nodes, dynamic = len(written.quantized_nodes), len(scales.dynamic)
    log.info("dynamic INT8: %d nodes, %d run-time quantized activations", nodes, dynamic)
    return QuantizedModel(
        written.path, scales_path, scales, QuantizationInfo.from_json(info), ActivationRanges.empty(samples)
    )
