"""The student: the FP32 ONNX graph run in torch, fake-quantized exactly where the PTQ Q/DQ model quantizes.

The placement is read from the Q/DQ model ORT wrote (every input a node reads through a DequantizeLinear, and
every graph output it quantized), and the starting parameters from its ``scales.json``, so what is trained is
the model that ships. Any ONNX graph the torch evaluator runs can train, with or without a torch source.

Trainable: the weights and biases of the quantized nodes, Conv/Gemm biases, the bias Add after a MatMul, and
normalisation scales and shifts; plus one log step size per activation scale (tensors that share a scale in
``scales.json``, such as a MaxPool's output and its input, share the parameter).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from calibrators.scales.format import ScaleFile, TensorScale
from deploy_opt.onnx_torch import initializer_tensors, run_graph, unsupported_ops
from deploy_opt.qat.fake_quant import CODE_RANGES, fake_quantize, fake_quantize_weight, lsq_factor
from dopt_common.deps import require
from dopt_common.errors import InputError
from exporters.ort.graph import OUTPUT_SUFFIX, quantized_nodes

log = logging.getLogger(__name__)

# Per op type, the input positions that hold a trainable parameter when they are float constants.
_PARAMETER_INPUTS = {
    "Conv": (1, 2),
    "ConvTranspose": (1, 2),
    "Gemm": (1, 2),
    "MatMul": (0, 1),
    "BatchNormalization": (1, 2),
    "LayerNormalization": (1, 2),
    "InstanceNormalization": (1, 2),
    "GroupNormalization": (1, 2),
    "PRelu": (1,),
}
_BIAS_PRODUCERS = ("MatMul", "Gemm", "Conv", "ConvTranspose")


@dataclass(frozen=True)
class ActivationQuant:
    """One learnable activation scale: the tensor whose scale it is, its zero point and code range."""

    tensor: str
    zero_point: int
    qmin: int
    qmax: int


@dataclass
class Student:
    """The fake-quantized graph's torch state (mutable: the optimizer updates it in place)."""

    model: onnx.ModelProto
    constants: dict[str, Any]  # every initializer and Constant value; trainable ones are the weights' tensors
    weights: dict[str, Any]  # name → leaf tensor with requires_grad
    log_scales: dict[str, Any]  # root activation tensor → log of its step size
    activations: dict[str, ActivationQuant]
    inputs: dict[str, dict[int, tuple[str, str]]]  # node → input index → (kind, key)
    outputs: dict[str, str]  # graph output → root activation tensor
    weight_axes: dict[str, int | None]
    levels: int

    def parameters(self) -> list[Any]:
        """Every trainable tensor: weights first, then the log step sizes."""
        return [*self.weights.values(), *self.log_scales.values()]

    def snapshot(self) -> dict[str, Any]:
        """A copy of the trainable state (the best checkpoint)."""
        return {name: t.detach().clone() for name, t in (*self.weights.items(), *self.log_scales.items())}

    def restore(self, state: Mapping[str, Any]) -> None:
        """Load a :meth:`snapshot` back, in place."""
        import torch

        with torch.no_grad():
            for name, tensor in (*self.weights.items(), *self.log_scales.items()):
                tensor.copy_(state[name])


def build_student(
    fp32: onnx.ModelProto, qdq: onnx.ModelProto, scales: ScaleFile, levels: int, learn_scales: bool = True
) -> Student:
    """The student of ``fp32`` with the placement of ``qdq`` and the starting parameters of ``scales``."""
    torch = require("torch", purpose="quantization-aware training")
    missing = unsupported_ops(fp32)
    if missing:
        raise InputError(
            f"quantization-aware training cannot run this graph in torch: {', '.join(missing)}; fix: set "
            "quantization.qat.enabled: false (PTQ still works)"
        )
    names = {n.name for n in fp32.graph.node}
    tensors = scales.tensors
    inputs: dict[str, dict[int, tuple[str, str]]] = {}
    roots: dict[str, ActivationQuant] = {}
    axes: dict[str, int | None] = {}
    for qnode in quantized_nodes(qdq):
        if qnode.name not in names:
            log.warning("QAT: Q/DQ node %r is not in the FP32 graph; its quantization is not simulated", qnode.name)
            continue
        for q in qnode.inputs:
            name = q.float_name.removesuffix(OUTPUT_SUFFIX)
            entry = tensors.get(name)
            if entry is None or q.role == "bias":
                continue  # int32 biases: their rounding is far below the activations' (scale_in × scale_w)
            if entry.role == "weight":
                axes[name] = entry.axis
                inputs.setdefault(qnode.name, {})[q.index] = ("weight", name)
            else:
                root = _root(name, tensors)
                roots.setdefault(root.name, _activation(root))
                inputs.setdefault(qnode.name, {})[q.index] = ("activation", root.name)
    outputs = _quantized_outputs(qdq, tensors)
    for root in outputs.values():
        roots.setdefault(root, _activation(tensors[root]))
    constants = initializer_tensors(fp32)
    weights = {}
    for name in _trainable(fp32, constants):
        tensor = constants[name].detach().clone().to(torch.float32).requires_grad_(True)
        constants[name] = weights[name] = tensor
    log_scales = {
        name: torch.tensor(float(np.log(tensors[name].scale[0])), requires_grad=learn_scales) for name in roots
    }
    log.info(
        "QAT student: %d weight tensors, %d activation scales, %d quantized node inputs",
        len(weights),
        len(log_scales),
        sum(len(v) for v in inputs.values()),
    )
    return Student(fp32, constants, weights, log_scales, roots, inputs, outputs, axes, levels)


def _root(name: str, tensors: Mapping[str, TensorScale]) -> TensorScale:
    """The tensor whose scale ``name`` shares (itself when it has its own)."""
    entry = tensors[name]
    seen = {name}
    while entry.derived_from and entry.derived_from[0] in tensors and entry.derived_from[0] not in seen:
        seen.add(entry.derived_from[0])
        entry = tensors[entry.derived_from[0]]
    return entry


def _activation(entry: TensorScale) -> ActivationQuant:
    qmin, qmax = CODE_RANGES[entry.dtype]
    return ActivationQuant(entry.name, int(entry.zero_point[0]), qmin, qmax)


def _quantized_outputs(qdq: onnx.ModelProto, tensors: Mapping[str, TensorScale]) -> dict[str, str]:
    """Graph outputs the Q/DQ model ends with a QuantizeLinear → DequantizeLinear pair, with their root tensor."""
    producer = {o: n for n in qdq.graph.node for o in n.output}
    out = {}
    for output in qdq.graph.output:
        dq = producer.get(output.name)
        if dq is None or dq.op_type != "DequantizeLinear" or output.name not in tensors:
            continue
        if tensors[output.name].role == "activation":
            out[output.name] = _root(output.name, tensors).name
    return out


def _trainable(fp32: onnx.ModelProto, constants: Mapping[str, Any]) -> list[str]:
    """Float constants that are parameters: weights, biases and normalisation scales and shifts."""
    producer = {o: n.op_type for n in fp32.graph.node for o in n.output}
    found: dict[str, None] = {}
    for node in fp32.graph.node:
        positions: tuple[int, ...] = _PARAMETER_INPUTS.get(node.op_type, ())
        if node.op_type == "Add" and len(node.input) == 2:  # the bias after a MatMul (dynamo exports)
            positions = tuple(i for i in (0, 1) if producer.get(node.input[1 - i]) in _BIAS_PRODUCERS)
        for i in positions:
            name = node.input[i] if i < len(node.input) else ""
            value = constants.get(name)
            if name and value is not None and value.is_floating_point() and value.numel() > 1:
                found[name] = None
    return list(found)


def run_student(student: Student, feeds: Mapping[str, np.ndarray], quantized: bool = True) -> list[Any]:
    """The graph outputs for ``feeds``: fake-quantized (the student) or with its weights as they are."""
    import torch

    scales = {name: torch.exp(value) for name, value in student.log_scales.items()} if quantized else {}
    factors: dict[str, float] = {}

    def quantize_activation(x: Any, key: str) -> Any:
        spec = student.activations[key]
        if key not in factors:
            factors[key] = lsq_factor(x, spec.qmax)
        return fake_quantize(x, scales[key], spec.zero_point, spec.qmin, spec.qmax, factors[key])

    def fake_inputs(node: onnx.NodeProto, values: list[Any]) -> list[Any]:
        points = student.inputs.get(node.name)
        if not points:
            return values
        values = list(values)
        for index, (kind, key) in points.items():
            if values[index] is None or not values[index].is_floating_point():
                continue
            if kind == "weight":
                values[index] = fake_quantize_weight(values[index], student.weight_axes[key], student.levels)
            else:
                values[index] = quantize_activation(values[index], key)
        return values

    env = run_graph(student.model, feeds, constants=student.constants, input_hook=fake_inputs if quantized else None)
    outputs = []
    for output in student.model.graph.output:
        value = env[output.name]
        if quantized and output.name in student.outputs and value.is_floating_point():
            value = quantize_activation(value, student.outputs[output.name])
        outputs.append(value)
    return outputs


def learned_ranges(student: Student) -> dict[str, tuple[float, float]]:
    """Per root activation tensor, the range whose ORT scale and zero point are the learned ones."""
    out = {}
    for name, log_scale in student.log_scales.items():
        spec, step = student.activations[name], float(np.exp(float(log_scale.detach())))
        out[name] = ((spec.qmin - spec.zero_point) * step, (spec.qmax - spec.zero_point) * step)
        if spec.qmin < 0:  # symmetric int8: ORT's scale is amax / 127, so the range is ±127 steps
            out[name] = (-127 * step, 127 * step)
    return out


def trained_model(student: Student) -> onnx.ModelProto:
    """A copy of the FP32 graph with the fine-tuned weights in place of the originals."""
    model = onnx.ModelProto()
    model.CopyFrom(student.model)
    values = {name: t.detach().cpu().numpy() for name, t in student.weights.items()}
    for init in model.graph.initializer:
        if init.name in values:
            dtype = numpy_helper.to_array(init).dtype
            init.CopyFrom(numpy_helper.from_array(values.pop(init.name).astype(dtype), init.name))
    for node in model.graph.node:
        if node.op_type == "Constant" and node.output[0] in values:
            value = next(a for a in node.attribute if a.name == "value")
            dtype = numpy_helper.to_array(value.t).dtype
            value.t.CopyFrom(numpy_helper.from_array(values.pop(node.output[0]).astype(dtype), node.output[0]))
    return model
