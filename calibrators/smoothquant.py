"""SmoothQuant (Xiao et al. 2023): move activation outliers into the weights of the MatMuls that read them.

For Y = X·W with W a [K, N] initializer, each input channel j gets s_j = max|X_j|^α / max|W_j,:|^(1-α);
then X' = X / s and W' = diag(s)·W, so Y is unchanged in exact arithmetic while X' has a flatter range.
The 1/s is folded into the producing LayerNormalization when it feeds only those MatMuls, otherwise a
``Mul(X, 1/s)`` is inserted in front of them (other readers of X, e.g. a residual Add, keep reading X).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import numpy_helper

from dopt_common.errors import CalibrationError, ConfigError

log = logging.getLogger(__name__)
FLOOR = 1e-5  # |x| and |w| below this are treated as this (no division by zero)
SCALE_RANGE = (1e-3, 1e3)  # s is clamped here: smoothing never rescales a channel by more than 1000x
_DEFAULT_DOMAINS = ("", "ai.onnx")


@dataclass(frozen=True)
class SmoothTarget:
    """One activation X read (as input 0) by MatMul/Gemm nodes whose weights are [K, N] initializers."""

    tensor: str
    channels: int
    consumers: tuple[str, ...]  # node names (op_type:output when unnamed), graph order
    node_indices: tuple[int, ...]  # positions of those nodes in graph.node
    weights: tuple[str, ...]  # distinct weight initializers of the consumers
    fold_into: str | None  # the LayerNormalization to fold 1/s into, or None: insert a Mul
    producer_index: int | None  # position of the producer of X in graph.node (None: a graph input)


def _node_label(node: onnx.NodeProto) -> str:
    """A readable name for a node, unnamed ones included."""
    return node.name or f"{node.op_type}:{node.output[0] if node.output else '?'}"


def _subgraph_inputs(node: onnx.NodeProto) -> Iterable[str]:
    """Every tensor name read inside the subgraphs of ``node`` (outer-scope references included)."""
    for attr in node.attribute:
        graphs = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)
        for graph in graphs:
            for inner in graph.node:
                yield from inner.input
                yield from _subgraph_inputs(inner)


def _uses(graph: onnx.GraphProto) -> dict[str, list[tuple[int, int]]]:
    """tensor name → (node index, input slot) of every reader; slot -1 is a read from a subgraph."""
    uses: dict[str, list[tuple[int, int]]] = {}
    for index, node in enumerate(graph.node):
        for slot, name in enumerate(node.input):
            if name:
                uses.setdefault(name, []).append((index, slot))
        for name in set(_subgraph_inputs(node)):
            uses.setdefault(name, []).append((index, -1))
    return uses


def _weight_input(node: onnx.NodeProto) -> str | None:
    """The weight input of a MatMul, or of a Gemm without transposes; None for any other node."""
    if node.domain not in _DEFAULT_DOMAINS or len(node.input) < 2:
        return None
    if node.op_type == "MatMul":
        return node.input[1]
    if node.op_type == "Gemm":
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        if attrs.get("transA", 0) == 0 and attrs.get("transB", 0) == 0:
            return node.input[1]
    return None


def _float_init(init: onnx.TensorProto | None, rank: int | None = None) -> bool:
    """Whether ``init`` is a float32 initializer (of the given rank)."""
    return init is not None and init.data_type == onnx.TensorProto.FLOAT and (rank is None or len(init.dims) == rank)


def _fold_target(
    graph: onnx.GraphProto,
    tensor: str,
    nodes: tuple[int, ...],
    channels: int,
    consts: Mapping[str, onnx.TensorProto],
    uses: Mapping[str, list[tuple[int, int]]],
    producer: int | None,
) -> str | None:
    """The LayerNormalization producing ``tensor`` if 1/s can be folded into its scale and bias, else None."""
    if producer is None:
        return None
    ln = graph.node[producer]
    if ln.op_type != "LayerNormalization" or ln.domain not in _DEFAULT_DOMAINS or ln.output[0] != tensor:
        return None
    if sorted(uses.get(tensor, [])) != sorted((i, 0) for i in nodes):
        return None  # another reader (a residual Add, a graph output) needs the unscaled values
    if any(o.name == tensor for o in graph.output):
        return None
    params = [name for name in ln.input[1:3] if name]
    for name in params:
        init = consts.get(name)
        if not _float_init(init) or not init.dims or init.dims[-1] != channels:
            return None
    return _node_label(ln)


def smoothing_targets(model: onnx.ModelProto) -> list[SmoothTarget]:
    """Every activation read by MatMul/Gemm nodes with [K, N] float weights that SmoothQuant can rescale."""
    graph = model.graph
    overridable = {i.name for i in graph.input}
    consts = {i.name: i for i in graph.initializer if i.name not in overridable}
    uses = _uses(graph)
    graph_outputs = {o.name for o in graph.output}
    producers = {out: index for index, node in enumerate(graph.node) for out in node.output if out}
    groups: dict[str, list[int]] = {}
    for index, node in enumerate(graph.node):
        weight = _weight_input(node)
        if weight is None or node.input[0] in consts or not node.input[0] or not _float_init(consts.get(weight), 2):
            continue
        groups.setdefault(node.input[0], []).append(index)
    targets = []
    for tensor, indices in groups.items():
        nodes = tuple(indices)
        weights = tuple(dict.fromkeys(graph.node[i].input[1] for i in nodes))
        widths = {consts[w].dims[0] for w in weights}
        if len(widths) != 1:
            log.info("smoothquant: skip '%s': its MatMul weights disagree on K (%s)", tensor, sorted(widths))
            continue
        shared = [w for w in weights if w in graph_outputs or any(i not in nodes for i, _ in uses[w])]
        if shared:
            log.info("smoothquant: skip '%s': weight '%s' is also read outside its MatMuls", tensor, shared[0])
            continue
        channels = int(widths.pop())
        producer = producers.get(tensor)
        fold = _fold_target(graph, tensor, nodes, channels, consts, uses, producer)
        targets.append(
            SmoothTarget(
                tensor=tensor,
                channels=channels,
                consumers=tuple(_node_label(graph.node[i]) for i in nodes),
                node_indices=nodes,
                weights=weights,
                fold_into=fold,
                producer_index=producer,
            )
        )
    return targets


def smoothing_scales(act_absmax: np.ndarray, weight_absmax: np.ndarray, alpha: float) -> np.ndarray:
    """s_j = max|X_j|^α / max|W_j,:|^(1-α), floored and clamped; channels never seen active keep s = 1."""
    act = np.maximum(act_absmax.astype(np.float64), FLOOR)
    weight = np.maximum(weight_absmax.astype(np.float64), FLOOR)
    scale = np.clip(act**alpha / weight ** (1.0 - alpha), *SCALE_RANGE)
    scale[act_absmax <= FLOOR] = 1.0
    return scale


class _Names:
    """Fresh tensor and node names that clash with nothing in the graph."""

    def __init__(self, graph: onnx.GraphProto) -> None:
        self._taken = {i.name for i in graph.initializer} | {n.name for n in graph.node}
        self._taken |= {v.name for v in [*graph.input, *graph.output, *graph.value_info]}
        self._taken |= {o for n in graph.node for o in [*n.input, *n.output]}

    def fresh(self, base: str) -> str:
        """``base``, or ``base_2``, ``base_3``... when taken."""
        name, count = base, 1
        while name in self._taken:
            count += 1
            name = f"{base}_{count}"
        self._taken.add(name)
        return name


def _check_absmax(target: SmoothTarget, values: np.ndarray) -> np.ndarray:
    """The calibrated per-channel max |x| of ``target`` as a finite float [K] array."""
    act = np.asarray(values, dtype=np.float32)
    if act.shape != (target.channels,):
        raise CalibrationError(
            f"smoothquant: channel absmax of '{target.tensor}' has shape {list(act.shape)}, expected "
            f"[{target.channels}] (the K of its MatMul weights); calibrate the same model"
        )
    if not np.isfinite(act).all() or (act < 0).any():
        raise CalibrationError(f"smoothquant: channel absmax of '{target.tensor}' is negative, NaN or Inf")
    return act


def _add_init(graph: onnx.GraphProto, names: _Names, base: str, value: np.ndarray) -> str:
    """Append a float32 initializer under a fresh name derived from ``base``; returns the name."""
    name = names.fresh(base)
    graph.initializer.append(numpy_helper.from_array(value.astype(np.float32), name))
    return name


def _smooth_one(
    graph: onnx.GraphProto,
    target: SmoothTarget,
    act: np.ndarray,
    alpha: float,
    names: _Names,
    inits: Mapping[str, onnx.TensorProto],
) -> tuple[dict, onnx.NodeProto | None]:
    """Rescale one target in place in ``graph`` (a copy); returns its record and the Mul to insert, if any."""
    weights = {w: numpy_helper.to_array(inits[w]).astype(np.float64) for w in target.weights}
    weight_absmax = np.max([np.abs(w).max(axis=1) for w in weights.values()], axis=0)
    scale = smoothing_scales(act, weight_absmax, alpha)
    renamed = {w: _add_init(graph, names, f"{w}_smooth", scale[:, None] * value) for w, value in weights.items()}
    for index in target.node_indices:
        node = graph.node[index]
        node.input[1] = renamed[node.input[1]]
    mul = None
    if target.fold_into is not None:
        ln = graph.node[target.producer_index]
        for slot in (1, 2):
            if len(ln.input) > slot and ln.input[slot]:
                param = numpy_helper.to_array(inits[ln.input[slot]]).astype(np.float64)
                ln.input[slot] = _add_init(graph, names, f"{ln.input[slot]}_smooth", param / scale)
    else:
        inv = _add_init(graph, names, f"{target.tensor}_smooth_inv_scale", 1.0 / scale)
        smoothed = names.fresh(f"{target.tensor}_smoothed")
        mul = onnx.helper.make_node("Mul", [target.tensor, inv], [smoothed], name=names.fresh(f"{smoothed}_mul"))
        for index in target.node_indices:
            graph.node[index].input[0] = smoothed
        for info in list(graph.value_info):
            if info.name == target.tensor:
                copy = graph.value_info.add()
                copy.CopyFrom(info)
                copy.name = smoothed
    record = {
        "tensor": target.tensor,
        "consumers": list(target.consumers),
        "folded_into": target.fold_into,
        "inserted_mul": mul.name if mul is not None else None,
        "alpha": alpha,
        "scale_min": float(scale.min()),
        "scale_max": float(scale.max()),
        "act_absmax_before": float(act.max()),
        "act_absmax_after": float((act / scale).max()),
    }
    return record, mul


def _drop_unused(graph: onnx.GraphProto, candidates: set[str]) -> None:
    """Remove the initializers in ``candidates`` that nothing reads any more."""
    read = {name for node in graph.node for name in [*node.input, *_subgraph_inputs(node)]}
    read |= {o.name for o in graph.output}
    kept = [i for i in graph.initializer if i.name not in candidates or i.name in read]
    del graph.initializer[:]
    graph.initializer.extend(kept)


def apply_smoothquant(
    model: onnx.ModelProto, channel_absmax: Mapping[str, np.ndarray], alpha: float = 0.5
) -> tuple[onnx.ModelProto, list[dict]]:
    """A smoothed copy of ``model`` (the input is not modified) and one record per rescaled activation."""
    if not isinstance(alpha, int | float) or not 0.0 <= float(alpha) <= 1.0:
        raise ConfigError(f"smoothquant: alpha must be in [0, 1], got {alpha!r}")
    alpha = float(alpha)
    smoothed = onnx.ModelProto()
    smoothed.CopyFrom(model)
    graph = smoothed.graph
    targets = smoothing_targets(smoothed)
    checked = {t.tensor: _check_absmax(t, channel_absmax[t.tensor]) for t in targets if t.tensor in channel_absmax}
    for target in targets:
        if target.tensor not in checked:
            log.info("smoothquant: skip '%s': no channel absmax was collected for it", target.tensor)
    inits = {i.name: i for i in graph.initializer}
    names = _Names(graph)
    replaced = set()
    records: list[dict] = []
    after: dict[int | None, list[onnx.NodeProto]] = {}
    for target in targets:
        if target.tensor not in checked:
            continue
        replaced |= set(target.weights)
        if target.fold_into is not None:
            replaced |= {n for n in graph.node[target.producer_index].input[1:3] if n}
        record, mul = _smooth_one(graph, target, checked[target.tensor], alpha, names, inits)
        records.append(record)
        if mul is not None:
            after.setdefault(target.producer_index, []).append(mul)
    nodes = list(after.get(None, []))
    for index, node in enumerate(graph.node):
        nodes += [node, *after.get(index, [])]
    del graph.node[:]
    graph.node.extend(nodes)
    _drop_unused(graph, replaced)
    folded = sum(r["folded_into"] is not None for r in records)
    log.info(
        "smoothquant: alpha %.2f, %d activations smoothed (%d folded into LayerNorm, %d with an inserted Mul)",
        alpha,
        len(records),
        folded,
        len(records) - folded,
    )
    return smoothed, records
