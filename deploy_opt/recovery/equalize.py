"""Cross-layer equalization (Nagel et al. 2019, "Data-Free Quantization") with high-bias absorption, FP32 → FP32.

For y = W2·f(W1·x + b1) + b2 with f positively homogeneous (Relu, LeakyRelu, PRelu, Clip(0, inf), none),
f(z / s) = f(z) / s for s > 0, so W1_c /= s_c, b1_c /= s_c, W2[:, c] *= s_c keeps the function. With
s_c = sqrt(r1_c / r2_c) (r: a channel's max |w|) both layers end with range sqrt(r1_c·r2_c) in channel c, DFQ's
optimum for per-tensor quantization. Chains (expand 1x1 → depthwise 3x3 → project 1x1) are swept until the scales
stop moving. Clip(0, 6) is not scale-equivariant: ``relu6="replace"`` makes it a Relu (DFQ's and AIMET's choice,
which changes the function), ``"skip"`` leaves its pair alone.

High-bias absorption (DFQ §4.1, empirical form): where a Relu sits between and the feeds show channel c's
pre-activation never below m_c > 0, m_c moves from b1 to b2 (b1 -= m, b2 += W2·m). It is exact wherever the
pre-activation stays at or above m, the feeds included, and only where the consumer pads nothing: zero padding
would add W2·m at borders that never read m.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from deploy_opt.recovery.layer_pairs import Layer, LayerPair, find_pairs, node_label, subgraph_reads
from deploy_opt.recovery.record import PlainRecord
from dopt_common.errors import CalibrationError, ConfigError, ModelError, NumericsError
from dopt_common.files import scratch_dir

log = logging.getLogger(__name__)
Arrays = dict[str, np.ndarray]  # initializer name → its float64 working copy
Feeds = Iterable[dict[str, np.ndarray]]
RELU6_CHOICES = ("replace", "skip")
CONVERGED = 1e-7  # a sweep whose largest |log s| is below this changed nothing that float32 can hold


@dataclass(frozen=True)
class EqualizedPair:
    """One producer → activation → consumer pair, with the max/min spread of its channel weight ranges."""

    producer: str
    consumer: str
    activation: str  # the op between ("" for none); "Relu" where a Clip(0, hi) was replaced
    tensor: str  # the intermediate the consumer reads
    channels: int
    producer_spread: tuple[float, float]  # of the producer's output-channel ranges: before, after
    consumer_spread: tuple[float, float]  # of the consumer's input-channel ranges: before, after

    def to_json(self) -> dict[str, Any]:
        """Plain data for build.json."""
        return {
            "producer": self.producer,
            "consumer": self.consumer,
            "activation": self.activation,
            "tensor": self.tensor,
            "channels": self.channels,
            "producer_spread": [round(v, 4) for v in self.producer_spread],
            "consumer_spread": [round(v, 4) for v in self.consumer_spread],
        }


@dataclass(frozen=True)
class AbsorbedBias(PlainRecord):
    """A bias shift moved from a producer to its consumer across a Relu."""

    producer: str
    consumer: str
    channels: int  # channels shifted (minimum pre-activation above zero)
    max_shift: float


@dataclass(frozen=True)
class Equalized:
    """The equalized copy of the model and what was done to it."""

    model: onnx.ModelProto
    pairs: tuple[EqualizedPair, ...]
    absorbed: tuple[AbsorbedBias, ...]
    replaced_clips: tuple[str, ...]  # the Clip(0, hi) nodes now Relu (same names)
    skipped: tuple[str, ...]  # one line per pair or absorption left alone, with the reason
    sweeps: int
    converged: bool

    @property
    def relu6_replaced(self) -> bool:
        """Whether the function changed: a Clip(0, hi) became a Relu."""
        return bool(self.replaced_clips)

    def to_json(self) -> dict[str, Any]:
        """Plain data for build.json."""
        return {
            "pairs": [p.to_json() for p in self.pairs],
            "absorbed": [a.to_json() for a in self.absorbed],
            "relu6_replaced": list(self.replaced_clips),
            "skipped": list(self.skipped),
            "sweeps": self.sweeps,
            "converged": self.converged,
        }


def _along(weight: np.ndarray, axis: int, values: np.ndarray) -> np.ndarray:
    """``values`` shaped to broadcast against ``weight`` along ``axis``."""
    shape = [1] * weight.ndim
    shape[axis] = -1
    return values.reshape(shape)


def _along_inputs(layer: Layer, weight: np.ndarray, values: np.ndarray) -> np.ndarray:
    """A per-input-channel vector laid out against a consumer weight; a grouped Conv's channel c is its group's
    c // (C/g) and that group's input c % (C/g) (depthwise: output channels c·m .. c·m+m-1 read channel c)."""
    if layer.family == "linear":
        return _along(weight, layer.in_axis, values)
    out, per_group = weight.shape[0], weight.shape[1]
    grid = np.broadcast_to(values.reshape(layer.group, 1, per_group), (layer.group, out // layer.group, per_group))
    return grid.reshape(out, per_group, *[1] * (weight.ndim - 2))


def _out_ranges(layer: Layer, weight: np.ndarray) -> np.ndarray:
    """max |w| of each output channel."""
    return np.abs(np.moveaxis(weight, layer.out_axis, 0)).reshape(weight.shape[layer.out_axis], -1).max(axis=1)


def _in_ranges(layer: Layer, weight: np.ndarray) -> np.ndarray:
    """max |w| of each input channel (over every output channel of its group)."""
    if layer.family == "linear":
        return np.abs(weight).max(axis=layer.out_axis)
    per = np.abs(weight).reshape(weight.shape[0], weight.shape[1], -1).max(axis=2)
    return per.reshape(layer.group, -1, weight.shape[1]).max(axis=1).reshape(-1)


def _spread(ranges: np.ndarray) -> float:
    """max / min of the non-zero channel ranges (1 when there are none)."""
    live = ranges[ranges > 0]
    return float(live.max() / live.min()) if live.size else 1.0


def _spreads(pair: LayerPair, arrays: Arrays) -> tuple[float, float]:
    return (
        _spread(_out_ranges(pair.producer, arrays[pair.producer.weight])),
        _spread(_in_ranges(pair.consumer, arrays[pair.consumer.weight])),
    )


def _sweep(pairs: list[LayerPair], arrays: Arrays) -> float:
    """Equalize each pair once, in graph order; returns the largest |log s| applied."""
    moved = 0.0
    for pair in pairs:
        first, second = pair.producer, pair.consumer
        w1, w2 = arrays[first.weight], arrays[second.weight]
        r1, r2 = _out_ranges(first, w1), _in_ranges(second, w2)
        scale = np.ones_like(r1)
        live = (r1 > 0) & (r2 > 0)  # a dead channel keeps s = 1
        scale[live] = np.sqrt(r1[live] / r2[live])
        arrays[first.weight] = w1 / _along(w1, first.out_axis, scale)
        if first.bias is not None:
            arrays[first.bias] = arrays[first.bias] / scale.reshape(arrays[first.bias].shape)
        arrays[second.weight] = w2 * _along_inputs(second, w2, scale)
        moved = max(moved, float(np.abs(np.log(scale)).max(initial=0.0)))
    return moved


class _ChannelMin:
    """An Observer (calibrators.activations.collect) keeping each tensor's running per-channel minimum."""

    def __init__(self, axes: dict[str, int]) -> None:
        self.axes = axes
        self.mins: dict[str, np.ndarray] = {}

    def update(self, name: str, values: np.ndarray, where: str = "") -> None:
        """Fold one batch of ``name`` into its per-channel minimum; NaN or Inf is an error."""
        if values.size == 0:
            return
        if not np.isfinite(values).all():
            raise NumericsError(f"equalize: tensor '{name}' has NaN or Inf {where}; fix the model or the feeds")
        axis = self.axes[name] % values.ndim
        low = np.moveaxis(values, axis, 0).reshape(values.shape[axis], -1).min(axis=1).astype(np.float64)
        seen = self.mins.get(name)
        self.mins[name] = low if seen is None else np.minimum(seen, low)


def _channel_mins(model: onnx.ModelProto, pairs: list[LayerPair], feeds: Feeds) -> Arrays:
    """Each pair's per-channel minimum pre-activation over the feeds, from the FP32 model in ONNX Runtime."""
    from calibrators.activations.collect import collect

    observer = _ChannelMin({p.pre_activation: 1 if p.producer.family == "conv" else -1 for p in pairs})
    with scratch_dir("deploy_opt.equalize.") as tmp:
        path = Path(tmp) / "equalized.onnx"
        saved = onnx.ModelProto()
        saved.CopyFrom(model)  # saving as external data rewrites the initializers of the proto it is given
        onnx.save_model(saved, str(path), save_as_external_data=True, location="equalized.onnx.data")
        del saved
        samples = collect(path, feeds, list(observer.axes), observer)
    if not samples or not observer.mins:
        raise CalibrationError("equalize: the feeds gave no batch; fix: pass at least one feed, or feeds=None")
    return observer.mins


def _absorb_blocker(pair: LayerPair) -> str | None:
    """Why high-bias absorption would be inexact or impossible for a Relu pair (None: it can be done)."""
    if pair.consumer.padded:
        return "the consumer pads its input (zero padding would make absorption inexact at borders)"
    for role, layer in (("producer", pair.producer), ("consumer", pair.consumer)):
        if layer.bias is None and not layer.creatable:
            return f"the {role} has no bias to shift and cannot take one ({layer.name})"
    return None


def _ensure_bias(graph: onnx.GraphProto, layer: Layer, arrays: Arrays) -> str:
    """The layer's bias initializer, created as zeros (a new input of its Conv or Gemm) where it has none."""
    node = graph.node[layer.index]
    if layer.bias is not None or (len(node.input) > 2 and node.input[2]):
        return layer.bias or node.input[2]
    taken = {i.name for i in graph.initializer} | {name for n in graph.node for name in [*n.input, *n.output]}
    name, count = f"{layer.weight}_bias", 1
    while name in taken:
        count += 1
        name = f"{layer.weight}_bias_{count}"
    arrays[name] = np.zeros(arrays[layer.weight].shape[layer.out_axis])
    if len(node.input) > 2:
        node.input[2] = name
    else:
        node.input.append(name)
    return name


def _absorb(graph: onnx.GraphProto, pair: LayerPair, low: np.ndarray, arrays: Arrays) -> AbsorbedBias | None:
    """Move max(0, min pre-activation) of each channel from the producer's bias to the consumer's."""
    shift = np.maximum(low, 0.0)
    if not (shift > 0).any():
        return None
    first, second = pair.producer, pair.consumer
    b1, b2 = _ensure_bias(graph, first, arrays), _ensure_bias(graph, second, arrays)
    arrays[b1] = arrays[b1] - (shift / first.bias_gain).reshape(arrays[b1].shape)
    w2 = arrays[second.weight]
    if second.family == "conv":
        moved = (w2 * _along_inputs(second, w2, shift)).reshape(w2.shape[0], -1).sum(axis=1)
    else:
        moved = np.tensordot(shift, w2, axes=([0], [second.in_axis]))
    arrays[b2] = arrays[b2] + (second.gain * moved / second.bias_gain).reshape(arrays[b2].shape)
    return AbsorbedBias(first.name, second.name, int((shift > 0).sum()), float(shift.max()))


def _absorb_all(
    model: onnx.ModelProto,
    pairs: list[LayerPair],
    arrays: Arrays,
    feeds: Feeds,
) -> tuple[list[AbsorbedBias], list[str]]:
    """High-bias absorption over every Relu pair that allows it; the records and the pairs left alone."""
    relu = [p for p in pairs if p.activation in ("Relu", "Clip")]
    blocked = {id(p): reason for p in relu if (reason := _absorb_blocker(p)) is not None}
    notes = [
        f"{p.producer.name} -> {p.consumer.name}: no bias absorption: {blocked[id(p)]}"
        for p in relu
        if id(p) in blocked
    ]
    chosen = [p for p in relu if id(p) not in blocked]
    if not chosen:
        return [], notes
    _write_back(model.graph, arrays)  # the statistics are those of the equalized model
    mins = _channel_mins(model, chosen, feeds)
    absorbed = [a for p in chosen if (a := _absorb(model.graph, p, mins[p.pre_activation], arrays)) is not None]
    return absorbed, notes


def _write_back(graph: onnx.GraphProto, arrays: Arrays) -> None:
    """Store the float64 working copies as float32 initializers under their names (new ones appended)."""
    inits = {i.name: i for i in graph.initializer}
    for name, value in arrays.items():
        tensor = numpy_helper.from_array(value.astype(np.float32), name)
        if name in inits:
            inits[name].CopyFrom(tensor)
        else:
            graph.initializer.append(tensor)


def _replace_clips(graph: onnx.GraphProto, pairs: list[LayerPair]) -> list[str]:
    """Turn each pair's Clip(0, hi) into a Relu of the same name; drop bound initializers nothing else reads."""
    bounds: set[str] = set()
    for pair in pairs:
        clip = graph.node[pair.activation_index]
        bounds |= {name for name in clip.input[1:] if name}
        clip.CopyFrom(onnx.helper.make_node("Relu", [clip.input[0]], list(clip.output), name=clip.name))
    read = {name for n in graph.node for name in [*n.input, *subgraph_reads(n)]} | {o.name for o in graph.output}
    kept = [i for i in graph.initializer if i.name not in bounds or i.name in read]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    return [node_label(graph.node[p.activation_index]) for p in pairs]


def _check_options(model: object, iterations: object, relu6: object) -> None:
    if not isinstance(model, onnx.ModelProto):
        raise ModelError(f"equalize: expected an onnx.ModelProto, got {type(model).__name__}; fix: onnx.load() it")
    if relu6 not in RELU6_CHOICES:
        raise ConfigError(f"equalize: relu6 must be one of {list(RELU6_CHOICES)}, got {relu6!r}")
    if isinstance(iterations, bool) or not isinstance(iterations, int) or iterations < 1:
        raise ConfigError(f"equalize: iterations must be an integer >= 1, got {iterations!r}")


def _record(pair: LayerPair, before: tuple[float, float], after: tuple[float, float]) -> EqualizedPair:
    activation = pair.activation if pair.clip_max is None else f"Relu (was Clip 0..{pair.clip_max:g})"
    return EqualizedPair(
        producer=pair.producer.name,
        consumer=pair.consumer.name,
        activation=activation,
        tensor=pair.tensor,
        channels=pair.channels,
        producer_spread=(before[0], after[0]),
        consumer_spread=(before[1], after[1]),
    )


def equalize(
    model: onnx.ModelProto,
    *,
    feeds: Feeds | None = None,
    iterations: int = 20,
    relu6: str = "replace",
) -> Equalized:
    """Cross-layer equalization of a copy of ``model``, with high-bias absorption where ``feeds`` are given."""
    _check_options(model, iterations, relu6)
    result = onnx.ModelProto()
    result.CopyFrom(model)
    pairs, skipped = find_pairs(result, relu6)
    consts = {i.name: i for i in result.graph.initializer}
    names = {n for p in pairs for n in (p.producer.weight, p.producer.bias, p.consumer.weight, p.consumer.bias) if n}
    arrays = {name: numpy_helper.to_array(consts[name]).astype(np.float64) for name in sorted(names)}
    bad = [name for name, value in arrays.items() if not np.isfinite(value).all()]
    if bad:
        raise NumericsError(f"equalize: initializer '{bad[0]}' holds NaN or Inf; fix the model's weights")
    before = [_spreads(p, arrays) for p in pairs]
    sweeps, moved = 0, np.inf
    while pairs and sweeps < iterations and moved >= CONVERGED:
        moved, sweeps = _sweep(pairs, arrays), sweeps + 1
    records = tuple(_record(p, b, _spreads(p, arrays)) for p, b in zip(pairs, before, strict=True))
    replaced = _replace_clips(result.graph, [p for p in pairs if p.clip_max is not None])
    absorbed: list[AbsorbedBias] = []
    if feeds is not None and pairs:
        absorbed, notes = _absorb_all(result, pairs, arrays, feeds)
        skipped += notes
    _write_back(result.graph, arrays)
    log.info(
        "equalize: %d pairs in %d sweeps, %d Clip(0, hi) -> Relu, %d biases absorbed, %d left alone; "
        "median weight range spread %.3g -> %.3g",
        len(pairs),
        sweeps,
        len(replaced),
        len(absorbed),
        len(skipped),
        float(np.median([r.producer_spread[0] for r in records])) if records else 1.0,
        float(np.median([r.producer_spread[1] for r in records])) if records else 1.0,
    )
    return Equalized(
        model=result,
        pairs=records,
        absorbed=tuple(absorbed),
        replaced_clips=tuple(replaced),
        skipped=tuple(skipped),
        sweeps=sweeps,
        converged=not pairs or moved < CONVERGED,
    )
