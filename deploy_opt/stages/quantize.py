"""Stage: calibrate, write scales.json, write the ORT Q/DQ model from it, and prove they agree."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx
from onnx import numpy_helper

from calibrators.qparams import (
    activation_scale,
    bias_scales,
    share_passthrough_scales,
    weight_scales,
    widen_weights_for_bias,
)
from calibrators.scales.format import (
    ScaleFile,
    TensorScale,
    load_scale_file,
    save_scale_file,
)
from deploy_opt import __version__
from deploy_opt.config.setup import QuantSetup
from deploy_opt.report.calibration_plot import plotted_tensors, tensor_summary
from deploy_opt.report.model_sections import QuantizationInfo
from deploy_opt.stages.calibrate import ActivationRanges, calibrate_activations
from deploy_opt.stages.calibration_set import CalibrationSet
from dopt_common.errors import ScaleMismatchError
from dopt_common.files import sha256_file
from dopt_common.ort import int8_pairs_saturate
from exporters.onnx.io import default_opset
from exporters.ort.graph import quantized_nodes
from exporters.ort.qdq import compare_scales, read_qdq_scales, write_ort_qdq

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class QuantizedModel:
    """The Q/DQ model, the scale file it was written from, and calibration facts."""

    path: Path
    scales_path: Path
    scales: ScaleFile
    info: QuantizationInfo
    ranges: ActivationRanges


def constant_scales(
    model: onnx.ModelProto, op_types: Iterable[str], known: set[str], scheme: str
) -> dict[str, TensorScale]:
    """Activation-type parameters for constant (initializer) inputs that are not weights or biases."""
    inits = {i.name: i for i in model.graph.initializer}
    wanted = set(op_types)
    out: dict[str, TensorScale] = {}
    for node in model.graph.node:
        if node.op_type not in wanted:
            continue
        for name in node.input:
            if name in inits and name not in known and name not in out:
                array = numpy_helper.to_array(inits[name])
                if array.dtype.kind == "f" and array.size:
                    out[name] = activation_scale(name, float(array.min()), float(array.max()), scheme, "constant")
    return out


def quantize(
    setup: QuantSetup,
    fp32_path: Path,
    calibration: CalibrationSet,
    stage: Path,
    ranges: ActivationRanges | None = None,
    smoothing: dict[str, Any] | None = None,
    qat: dict[str, Any] | None = None,
    recovery: dict[str, Any] | None = None,
) -> QuantizedModel:
    """Calibrate (unless ``ranges`` are given) and write ``scales.json`` and ``model.int8.onnx``.

    ``smoothing``, ``qat`` and ``recovery`` are provenance: how the graph and its ranges were made before
    quantization.
    """
    quant, cal = setup.quantization, setup.calibration
    model = onnx.load(str(fp32_path))
    ranges = ranges or calibrate_activations(setup, fp32_path, calibration)
    tensors: dict[str, TensorScale] = {
        name: activation_scale(name, low, high, quant.activations, ranges.methods[name])
        for name, (low, high) in ranges.chosen.items()
    }
    tensors |= share_passthrough_scales(model, tensors, quant.op_types, quant.exclude_nodes)
    levels, why = weight_levels(quant.weight_range, setup.deploy.targets)
    # ORT clips weight codes to the full int8 range, so a clipped (mse) 7-bit scale would let outliers past ±63.
    weights = "absmax" if levels < 127 else cal.weights
    tensors |= weight_scales(model, quant.op_types, quant.exclude_nodes, weights, levels)
    int32_bias = int32_biases(setup.deploy.targets)
    if int32_bias:  # ORT's form: a bias quantized to int32 at input × weight scale must not overflow
        tensors |= widen_weights_for_bias(model, tensors, quant.op_types, quant.exclude_nodes)
        tensors |= bias_scales(model, tensors, quant.op_types, quant.exclude_nodes)
    tensors |= constant_scales(model, quant.op_types, set(tensors), quant.activations)
    candidate = ScaleFile(
        quant.activations,
        tensors,
        _provenance(setup, model, fp32_path, ranges, calibration, weights) | _made_by(smoothing, qat, recovery),
        tuple(quant.exclude_nodes),
    )
    int8_path = write_ort_qdq(
        fp32_path,
        candidate,
        stage / "model.int8.onnx",
        op_types=quant.op_types,
        exclude_nodes=quant.exclude_nodes,
        external_data_mb=setup.export.external_data_mb,
        quantize_outputs=quant.quantize_outputs,
        int32_bias=int32_bias,
    )
    written = onnx.load(str(int8_path))
    carried = read_qdq_scales(int8_path, written)
    scales = candidate.restricted_to(carried)
    scales_path = save_scale_file(scales, stage / "scales.json")
    diff = compare_scales(load_scale_file(scales_path).tensors, carried)
    if not diff.ok:
        raise ScaleMismatchError(
            f"model.int8.onnx does not carry scales.json exactly: {diff.summary()}; fix: exclude the named tensor's "
            "node (quantization.exclude_nodes) and report the model"
        )
    nodes = len(quantized_nodes(written))
    quantizable = sum(n.op_type in quant.op_types for n in model.graph.node)
    info = _info(setup, ranges, scales, weights) | {
        "weight_range": why,
        "quantized_nodes": nodes,
        "quantizable_nodes": quantizable,
    }
    return QuantizedModel(int8_path, scales_path, scales, QuantizationInfo.from_json(info), ranges)


def int32_biases(targets: tuple[str, ...]) -> bool:
    """Whether the Q/DQ model carries ORT's int32 bias DequantizeLinear nodes.

    ORT CPU's integer kernels fuse them; TensorRT's parser refuses them (it fuses a float bias itself). So a
    TensorRT target without ORT CPU gets float biases; with both, model.int8.onnx keeps ORT's form and the
    TensorRT engine is built from its float-bias copy (exporters/tensorrt/form.py), with the same scales.
    """
    return "tensorrt" not in targets or "ort-cpu" in targets


def weight_levels(weight_range: str, targets: tuple[str, ...]) -> tuple[int, str]:
    """The weight levels (127 or 63) for ``quantization.weight_range``, and why, for build.json."""
    if weight_range == "full":
        return 127, "full (int8 ±127, set in the config)"
    if weight_range == "reduced":
        return 63, "reduced (7-bit ±63, set in the config)"
    if "ort-cpu" in targets and int8_pairs_saturate():
        return 63, "reduced (7-bit ±63): this machine's ORT int8 CPU kernels saturate u8×s8 pairs (no VNNI)"
    return 127, "full (int8 ±127)"


def _provenance(
    setup: QuantSetup,
    model: onnx.ModelProto,
    fp32_path: Path,
    ranges: ActivationRanges,
    calibration: CalibrationSet,
    weights: str,
) -> dict[str, Any]:
    """Where the scales came from: the model's hash and opset, the calibration and any smoothing."""
    cal = setup.calibration
    provenance = {
        "model_sha256": sha256_file(fp32_path),
        "opset": default_opset(model),
        "calibration": {
            "method": cal.method,
            "overrides": [{"pattern": o.pattern, "method": o.method} for o in cal.overrides],
            "weights": weights,  # the method used (7-bit weights always take absmax)
            "samples": ranges.samples,
            "sample_hash": calibration.selection.sample_hash,
        },
        "deploy_opt_version": __version__,
    }
    return provenance


def _made_by(
    smoothing: dict[str, Any] | None, qat: dict[str, Any] | None, recovery: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The provenance entries of what changed the graph or its ranges before quantization."""
    made = (("smoothing", smoothing), ("qat", qat), ("recovery", recovery))
    return {key: value for key, value in made if value}


def _info(setup: QuantSetup, ranges: ActivationRanges, scales: ScaleFile, weights: str) -> dict[str, Any]:
    """The build.json ``quantization`` section: the settings, the tensor counts and each tensor's range."""
    quant, cal = setup.quantization, setup.calibration
    roles = {role: sum(t.role == role for t in scales.tensors.values()) for role in ("activation", "weight", "bias")}
    log.info("scales.json: %s; the Q/DQ model carries them bit for bit", roles)
    info = {
        "method": cal.method,
        "weights": weights,
        "samples": ranges.samples,
        "activations": quant.activations,
        "op_types": list(quant.op_types),
        "quantized_tensors": roles,
        "scale_check": "pass: every Q/DQ scale and zero point equals scales.json bit for bit",
        "tensors": {
            name: tensor_summary(
                ranges.methods[name],
                ranges.observed[name],
                ranges.chosen[name],
                ranges.signed.get(name) or ranges.absolute.get(name),
            )
            | ({"guard": ranges.guards[name]} if name in ranges.guards else {})
            | ({"propagated_sqnr_db": ranges.evidence[name]} if name in ranges.evidence else {})
            for name in ranges.chosen
            if name in scales.tensors
        },
        "plotted": plotted_tensors(ranges.absolute, {n for n, t in scales.tensors.items() if t.role == "activation"}),
    }
    return info
