"""Mixed precision: which nodes stay in high precision (FP32 on CPU, FP16 on GPU profiles).

``quantization.fallback`` is ``none``, a list of node names or glob patterns, or ``auto``: a greedy search that
keeps adding the next most sensitive node (or op type) to the fallback set until the gate's ``max_drop`` holds,
measured on variants of the one Q/DQ model, and stops with a verdict if even full fallback cannot meet it.
"""

from __future__ import annotations

import fnmatch
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx

from deploy_opt.analysis.sensitivity.record import SensitivityRecord
from dopt_common.errors import ConfigError
from dopt_common.timer import fixed, median_ms, runner, time_rounds, warm_up

log = logging.getLogger(__name__)
# A head feeds a graph output through these only: it is the classifier or LM head.
HEAD_PASSTHROUGH = {"Identity", "Reshape", "Flatten", "Softmax", "LogSoftmax", "Sigmoid", "Squeeze", "Unsqueeze"}


def match_patterns(patterns: Iterable[str], names: list[str], modules: dict[str, str] | None = None) -> list[str]:
    """Node names matched by each pattern (exact or glob) on the ONNX name or on the node's PyTorch module path
    (``encoder.layer.*.output.dense``); a pattern matching nothing is an error."""
    modules = modules or {}
    chosen: list[str] = []
    for pattern in patterns:
        hits = [n for n in names if fnmatch.fnmatchcase(n, pattern) or fnmatch.fnmatchcase(modules.get(n, ""), pattern)]
        if not hits:
            close = ", ".join(sorted(names, key=lambda n: -_overlap(n, pattern))[:3])
            raise ConfigError(
                f"quantization.fallback pattern '{pattern}' matches no quantizable node or module; e.g. {close} "
                "(see sensitivity.json or report.html for every name)"
            )
        chosen += [h for h in hits if h not in chosen]
    return chosen


def _overlap(name: str, pattern: str) -> int:
    return len(set(name.lower()) & set(pattern.lower().replace("*", "")))


def head_nodes(model: onnx.ModelProto, op_types: Iterable[str]) -> list[str]:
    """Quantizable nodes whose output reaches a graph output through pass-through ops only."""
    wanted = set(op_types)
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in model.graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    outputs = {o.name for o in model.graph.output}

    def reaches_output(tensor: str, depth: int = 0) -> bool:
        if tensor in outputs:
            return True
        nexts = consumers.get(tensor, [])
        return (
            depth < 8
            and bool(nexts)
            and all(n.op_type in HEAD_PASSTHROUGH and reaches_output(n.output[0], depth + 1) for n in nexts)
        )

    return [n.name for n in model.graph.node if n.op_type in wanted and reaches_output(n.output[0])]


@dataclass(frozen=True)
class FallbackSearch:
    """Every step of the greedy search and its verdict."""

    excluded: tuple[str, ...]
    met: bool
    steps: list[dict[str, Any]] = field(default_factory=list)
    verdict: str = ""


def greedy_fallback(
    order: list[list[str]],
    variant_for: Callable[[list[str]], onnx.ModelProto],
    score: Callable[[onnx.ModelProto], float],
    baseline: float,
    drop: Callable[[float, float], float],
    max_drop: float,
    latency: Callable[[onnx.ModelProto], float],
    deadline: float | None = None,
) -> FallbackSearch:
    """Add groups of nodes (in ``order``, most sensitive first) to the fallback set until ``max_drop`` holds.

    ``variant_for(excluded)`` is the model with those nodes in high precision (``exclusion_variant``); past
    ``deadline`` (a ``time.perf_counter`` value) the search stops with the verdict that it ran out of time.
    """
    excluded: list[str] = []
    steps = []
    for step in range(len(order) + 1):
        if step:
            excluded += order[step - 1]
        if deadline is not None and step and time.perf_counter() > deadline:
            verdict = f"stopped at step {step}: the search budget ran out before max_drop {max_drop:g} held"
            return FallbackSearch(tuple(excluded[: -len(order[step - 1])]), False, steps, verdict)
        variant = variant_for(excluded)
        started = time.perf_counter()
        value = score(variant)
        lost = drop(baseline, value)
        steps.append(
            {
                "step": step,
                "fallback": list(excluded),
                "metric": value,
                "drop": lost,
                "latency_ms": latency(variant),
                "seconds": round(time.perf_counter() - started, 2),
            }
        )
        log.info("fallback step %d: %d nodes in high precision, drop %.3f", step, len(excluded), lost)
        if lost <= max_drop:
            verdict = f"gate max_drop {max_drop:g} met with {len(excluded)} node(s) in high precision"
            return FallbackSearch(tuple(excluded), True, steps, verdict)
    verdict = (
        f"cannot meet max_drop {max_drop:g}: even with all {len(excluded)} quantized nodes in high precision "
        f"the drop is {steps[-1]['drop']:.3f}"
    )
    return FallbackSearch(tuple(excluded), False, steps, verdict)


def sensitivity_order(record: SensitivityRecord, by: str) -> list[list[str]]:
    """Groups of node names, most sensitive first: one node per group, or one op type per group."""
    ranked = record.ranked()
    if by == "node":
        return [[n.name] for n in ranked]
    groups: dict[str, list[str]] = {}
    weight: dict[str, float] = {}
    for n in ranked:
        groups.setdefault(n.op_type, []).append(n.name)
        weight[n.op_type] = weight.get(n.op_type, 0.0) + float(n.drop_both or 0.0) + 1.0 / n.rank
    return [groups[op] for op in sorted(groups, key=lambda op: -weight[op])]


def median_latency_ms(session_factory: Callable[[onnx.ModelProto], Any], feed: dict[str, np.ndarray]) -> Callable:
    """A function timing a model: median of a few runs after one warm-up (a rough per-step figure)."""

    def measure(model: onnx.ModelProto) -> float:
        runs = {"model": runner(session_factory(model).run, None, feed)}
        warm_up(runs, 1)
        return median_ms(time_rounds(runs, fixed(5))["model"])

    return measure
