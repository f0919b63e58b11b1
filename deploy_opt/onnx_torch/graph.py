"""Run a graph node by node, If and Loop included, and name what the evaluator cannot run before it starts.

The operator table is built once (first use) from the op modules; each entry says how inputs and attributes reach
its torch function (see :class:`OpSpec`). :func:`unsupported_ops` applies the same table and the same checks as
:func:`run_node`, to every node of the model and of its subgraphs, so a run it clears does not stop half way
for want of an operator.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, NamedTuple

import numpy as np
import onnx
from onnx import numpy_helper

from deploy_opt.onnx_torch._common import (
    OpSpec,
    UnsupportedOpError,
    known_dtype,
    node_attrs,
    to_tensor,
    type_name,
)
from dopt_common.errors import DeployOptError

NodeHook = Callable[[onnx.NodeProto, list[Any], list[Any]], list[Any] | None]
InputHook = Callable[[onnx.NodeProto, list[Any]], list[Any]]
LATEST_OPSET = onnx.defs.onnx_opset_version()
_DEFAULT_DOMAINS = ("", "ai.onnx")
_CONTROL_FLOW = ("If", "Loop")
_SEQUENCES = (tuple, list)
# Element types an initializer may have: those torch holds, and 4-bit integers (widened to 8 bits).
_WIDENED_TYPES = (onnx.TensorProto.INT4, onnx.TensorProto.UINT4)


@functools.cache
def _op_table() -> dict[str, OpSpec]:
    """Operator type → how to run it (built once: the hot path runs a node at a time)."""
    from deploy_opt.onnx_torch.math_ops import OPS as MATH_OPS
    from deploy_opt.onnx_torch.nn_ops import OPS as NN_OPS
    from deploy_opt.onnx_torch.resize import OPS as RESIZE_OPS
    from deploy_opt.onnx_torch.tensor_ops import OPS as TENSOR_OPS

    return {**MATH_OPS, **TENSOR_OPS, **NN_OPS, **RESIZE_OPS}


@functools.cache
def _entries() -> dict[str, tuple[OpSpec, frozenset[str] | None]]:
    """Per operator, its spec and the attribute names its function takes (None: any)."""
    return {op: (spec, _parameter_names(spec.fn)) for op, spec in _op_table().items()}


def _parameter_names(fn: Callable[..., Any]) -> frozenset[str] | None:
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):  # a torch builtin: ONNX gives it no attributes
        return frozenset()
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return None
    named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return frozenset(p.name for p in params if p.kind in named and not p.name.startswith("_"))


def supported_ops() -> list[str]:
    """Every operator type of the default domain this evaluator runs (If and Loop included)."""
    return sorted([*_op_table(), *_CONTROL_FLOW])


def _setting_issue(node: onnx.NodeProto, spec: OpSpec, attrs: dict[str, Any]) -> str | None:
    """An attribute or setting of ``node`` its implementation does not handle, as ``Op (what)``."""
    accepted = _entries()[node.op_type][1]
    unknown = sorted(set(attrs) - accepted) if accepted is not None else []
    if unknown:
        return f"{node.op_type} (attribute {', '.join(unknown)})"
    reason = spec.check(attrs, len(node.output)) if spec.check is not None else None
    return f"{node.op_type} ({reason})" if reason else None


def _node_issue(node: onnx.NodeProto, local_functions: set[tuple[str, str]]) -> str | None:
    if node.domain not in _DEFAULT_DOMAINS:
        if (node.domain, node.op_type) in local_functions:
            return f"{node.domain}.{node.op_type} (model-local function; inline it with onnx.inliner)"
        return f"{node.domain}.{node.op_type}"
    if node.op_type in _CONTROL_FLOW:
        return None
    spec = _op_table().get(node.op_type)
    if spec is None:
        return node.op_type
    return _setting_issue(node, spec, node_attrs(node))


def _graph_nodes(graph: onnx.GraphProto) -> Iterator[onnx.NodeProto]:
    """Every node of ``graph`` and of the subgraphs its nodes hold (If branches, Loop and Scan bodies)."""
    for node in graph.node:
        yield node
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from _graph_nodes(attr.g)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for sub in attr.graphs:
                    yield from _graph_nodes(sub)


def _graphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    yield graph
    for node in graph.node:
        for attr in node.attribute:
            subs = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)
            for sub in subs:
                yield from _graphs(sub)


def _type_issues(graph: onnx.GraphProto) -> set[str]:
    """Initializer and Constant element types torch cannot hold, and QuantizeLinear to 4-bit integers."""
    types = {i.name: i.data_type for g in _graphs(graph) for i in g.initializer}
    for node in _graph_nodes(graph):
        if node.op_type == "Constant" and node.attribute and node.attribute[0].type == onnx.AttributeProto.TENSOR:
            types[node.output[0]] = node.attribute[0].t.data_type
    issues = {f"{type_name(t)} tensors" for t in set(types.values()) if not known_dtype(t) and t not in _WIDENED_TYPES}
    for node in _graph_nodes(graph):
        if node.op_type == "QuantizeLinear" and len(node.input) > 2 and types.get(node.input[2]) in _WIDENED_TYPES:
            issues.add("QuantizeLinear (4-bit output)")
    return issues


def unsupported_ops(model: onnx.ModelProto) -> list[str]:
    """What of ``model`` this evaluator cannot run (empty when it runs all), subgraphs included.

    An operator it lacks is named by its type (``com.microsoft.X`` outside the default domain); an operator it
    has but not with some setting is named with that setting, e.g. ``Resize (antialias=1)``.
    """
    local = {(f.domain, f.name) for f in model.functions}
    found = {issue for node in _graph_nodes(model.graph) if (issue := _node_issue(node, local))}
    return sorted(found | _type_issues(model.graph))


def model_opset(model: onnx.ModelProto) -> int:
    """The model's version of the default ONNX domain."""
    versions = [o.version for o in model.opset_import if o.domain in _DEFAULT_DOMAINS]
    return versions[0] if versions else LATEST_OPSET


def run_node(node: onnx.NodeProto, inputs: list[Any], opset: int | None = None) -> list[Any]:
    """One node's outputs for the given input tensors (None for an absent optional input).

    ``opset`` is the model's default-domain version (:func:`model_opset`); it only matters for the operators
    whose meaning changed across versions (Softmax before 13, Resize 10). None means the latest.
    """
    entry = _entries().get(node.op_type) if node.domain in _DEFAULT_DOMAINS else None
    if entry is None:
        raise UnsupportedOpError(f"operator {node.domain or 'ai.onnx'}.{node.op_type} (node {node.name!r})")
    spec, accepted = entry
    attrs = node_attrs(node)
    if spec.check is not None or (attrs and accepted is not None and not accepted.issuperset(attrs)):
        issue = _setting_issue(node, spec, attrs)
        if issue:
            raise UnsupportedOpError(f"operator {issue} (node {node.name!r})")
    if spec.keywords:
        attrs.update((k, v) for k, v in zip(spec.keywords, inputs[1:], strict=False) if v is not None)
        inputs = inputs[:1]
    while inputs and inputs[-1] is None:
        inputs = inputs[:-1]
    if spec.context:
        attrs["_opset"], attrs["_outputs"] = opset or LATEST_OPSET, len(node.output)
    out = spec.fn(*inputs, **attrs)
    return list(out) if isinstance(out, _SEQUENCES) else [out]


def run_graph(
    model: onnx.ModelProto,
    feeds: Mapping[str, np.ndarray],
    hook: NodeHook | None = None,
    constants: Mapping[str, Any] | None = None,
    input_hook: InputHook | None = None,
) -> dict[str, Any]:
    """Evaluate ``model`` on ``feeds``; returns every tensor by name. ``hook`` may replace a node's outputs.

    ``constants`` are the initializers as torch tensors (:func:`initializer_tensors`), to convert them once.
    The hook sees every node but Constant, subgraph nodes included. ``input_hook`` may replace the inputs a
    node reads (fake quantization for quantization-aware training), without changing the tensors themselves.
    """
    env: dict[str, Any] = dict(constants) if constants is not None else initializer_tensors(model)
    env.update({name: to_tensor(np.asarray(value)) for name, value in feeds.items()})
    graph = model.graph
    _run_nodes(graph.node, env, _Hooks(hook, input_hook), model_opset(model))
    missing = [o.name for o in graph.output if o.name not in env]
    if missing:
        raise DeployOptError(f"torch evaluation produced no value for graph output(s) {missing}")
    return env


class _Hooks(NamedTuple):
    after: NodeHook | None
    before: InputHook | None


def _run_nodes(nodes: Iterable[onnx.NodeProto], env: dict[str, Any], hooks: _Hooks, opset: int) -> None:
    hook, before = hooks
    for node in nodes:
        op, names = node.op_type, node.output  # proto field reads cost: read once
        if op == "Constant" and names[0] in env:  # converted once by initializer_tensors
            continue
        inputs = _inputs(node, env)
        if before is not None and op != "Constant":
            inputs = before(node, inputs)
        if op in _CONTROL_FLOW and node.domain in _DEFAULT_DOMAINS:
            outputs = _run_control_flow(node, inputs, env, hooks, opset)
        else:
            outputs = run_node(node, inputs, opset)
        if hook is not None and op != "Constant":
            outputs = hook(node, inputs, outputs) or outputs
        for name, value in zip(names, outputs, strict=False):
            if name:
                env[name] = value


def _inputs(node: onnx.NodeProto, env: dict[str, Any]) -> list[Any]:
    try:
        return [env[name] if name else None for name in node.input]
    except KeyError as exc:
        raise DeployOptError(
            f"node {node.name!r} ({node.op_type}) reads tensor {exc.args[0]!r}, which no feed, initializer or "
            "earlier node gives"
        ) from None


def _run_control_flow(
    node: onnx.NodeProto, inputs: list[Any], env: dict[str, Any], hooks: _Hooks, opset: int
) -> list[Any]:
    attrs = node_attrs(node)
    if node.op_type == "If":
        branch = attrs["then_branch"] if bool(inputs[0].reshape(-1)[0]) else attrs["else_branch"]
        return _run_subgraph(branch, env, {}, hooks, opset)
    return _run_loop(attrs["body"], inputs, env, hooks, opset)


def _run_subgraph(
    graph: onnx.GraphProto, env: dict[str, Any], bound: dict[str, Any], hooks: _Hooks, opset: int
) -> list[Any]:
    """A subgraph's outputs; it sees the enclosing scope's tensors, and its own initializers and inputs."""
    scope = {**env, **{i.name: to_tensor(numpy_helper.to_array(i)) for i in graph.initializer}, **bound}
    _run_nodes(graph.node, scope, hooks, opset)
    return [scope[o.name] for o in graph.output]


def _run_loop(body: onnx.GraphProto, inputs: list[Any], env: dict[str, Any], hooks: _Hooks, opset: int) -> list[Any]:
    """Loop: (max trip count, condition, carried values...) → (final carried values..., stacked scan outputs...)."""
    import torch

    trips = int(inputs[0].reshape(-1)[0]) if inputs and inputs[0] is not None else None
    going = bool(inputs[1].reshape(-1)[0]) if len(inputs) > 1 and inputs[1] is not None else True
    carried = list(inputs[2:])
    names = [i.name for i in body.input]
    scans: list[list[Any]] = []
    step = 0
    while going and (trips is None or step < trips):
        bound = dict(zip(names, [torch.tensor(step, dtype=torch.int64), torch.tensor(going), *carried], strict=True))
        outputs = _run_subgraph(body, env, bound, hooks, opset)
        going, carried = bool(outputs[0].reshape(-1)[0]), outputs[1 : 1 + len(carried)]
        scans.append(outputs[1 + len(carried) :])
        step += 1
    count = len(body.output) - 1 - len(carried)
    stacked = [torch.stack(column) for column in zip(*scans, strict=True)] if scans else [torch.empty(0)] * count
    return [*carried, *stacked]


def initializer_tensors(model: onnx.ModelProto, names: Iterable[str] | None = None) -> dict[str, Any]:
    """The model's initializers and Constant-node values (or the named ones) as torch tensors.

    These are the same for every run: passed to :func:`run_graph` as ``constants``, they are converted once.
    """
    wanted = set(names) if names is not None else None
    inits = [i for i in model.graph.initializer if wanted is None or i.name in wanted]
    tensors = {i.name: to_tensor(numpy_helper.to_array(i)) for i in inits}
    for node in model.graph.node:
        if (
            node.op_type == "Constant"
            and node.domain in _DEFAULT_DOMAINS
            and (wanted is None or node.output[0] in wanted)
        ):
            try:
                tensors[node.output[0]] = run_node(node, [])[0]
            except UnsupportedOpError:  # left for run_graph to report
                continue
    return tensors
