"""Which PyTorch module each ONNX node came from, read from the names and metadata the exporters record.

- a node whose inputs include a parameter (``encoder.layer.0.attention.self.query.bias``) belongs to that module,
  which names the Gemm a simplifier fused from a MatMul and an Add;
- torch's dynamo exporter stores ``pkg.torch.onnx.name_scopes`` on each node: the module path of every scope from
  the root down, then the op (``['', 'encoder', 'encoder.layer.0.attention.self.query', 'linear']``); the module is
  the last scope before the op.
- The TorchScript exporter (and tools built on it, such as Hugging Face's ONNX exports) names nodes after their
  scope: ``/encoder/layer.0/attention/self/query/MatMul`` is module ``encoder.layer.0.attention.self.query``.

A node with neither (a hand-made graph, another framework's export) has no module path and keeps its ONNX name.
"""

from __future__ import annotations

import ast
import json
import logging

import onnx

log = logging.getLogger(__name__)

NAME_SCOPES = "pkg.torch.onnx.name_scopes"


def _from_metadata(node: onnx.NodeProto) -> str | None:
    for prop in node.metadata_props:
        if prop.key == NAME_SCOPES:
            try:
                scopes = ast.literal_eval(prop.value)
            except (ValueError, SyntaxError):
                return None
            # "_empty_nn_module_stack_from_metadata_hook" and similar are the exporter's placeholders, not modules
            modules = [s for s in scopes[:-1] if s and not s.startswith("_")] if isinstance(scopes, list) else []
            return modules[-1] if modules else None
    return None


def _from_name(name: str) -> str | None:
    if not name.startswith("/") or name.count("/") < 2:
        return None
    parts = [p for p in name.split("/")[1:-1] if p]
    return ".".join(parts) or None


MODEL_KEY = "deploy_opt.module_names"  # model-level metadata: the map, kept when the simplifier drops node metadata


def _from_parameters(node: onnx.NodeProto, initializers: set[str]) -> str | None:
    """A node whose weight or bias initializer keeps its parameter's name (``encoder.layer.0.query.bias``): the
    simplifier's fused nodes (MatMul + Add → Gemm) lose their scope but keep these."""
    for name in node.input:
        if name in initializers and name.endswith((".weight", ".bias")) and "." in name:
            return name.rsplit(".", 1)[0]
    return None


def _stored(model: onnx.ModelProto) -> dict[str, str]:
    for prop in model.metadata_props:
        if prop.key == MODEL_KEY:
            try:
                stored = json.loads(prop.value)
            except ValueError:
                return {}
            return {str(k): str(v) for k, v in stored.items()} if isinstance(stored, dict) else {}
    return {}


def module_paths(model: onnx.ModelProto) -> dict[str, str]:
    """Node name → PyTorch module path, for every node whose export recorded one (the model's stored map first,
    then the node's name scopes, its TorchScript-style name, its parameters' names)."""
    stored = _stored(model)
    initializers = {t.name for t in model.graph.initializer}
    out = {}
    for node in model.graph.node:
        path = (
            stored.get(node.name)
            or _from_metadata(node)
            or _from_name(node.name)
            or _from_parameters(node, initializers)
        )
        if path and node.name:
            out[node.name] = path
    return out


def record_module_paths(model: onnx.ModelProto, paths: dict[str, str]) -> None:
    """Store ``paths`` (for the nodes the model still has) as model-level metadata under ``MODEL_KEY``."""
    kept = {n.name for n in model.graph.node}
    value = json.dumps({k: v for k, v in paths.items() if k in kept}, sort_keys=True)
    for prop in model.metadata_props:
        if prop.key == MODEL_KEY:
            prop.value = value
            return
    model.metadata_props.add(key=MODEL_KEY, value=value)
