"""Which PyTorch module each ONNX node came from, read from the names and metadata the exporters record.

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


def module_paths(model: onnx.ModelProto) -> dict[str, str]:
    """Node name → PyTorch module path, for every node whose export recorded one."""
    for prop in model.metadata_props:
        if prop.key == MODEL_KEY:
            try:
                stored = json.loads(prop.value)
            except ValueError:
                break
            return {str(k): str(v) for k, v in stored.items()} if isinstance(stored, dict) else {}
    out = {}
    for node in model.graph.node:
        path = _from_metadata(node) or _from_name(node.name)
        if path and node.name:
            out[node.name] = path
    return out


def display_name(node: str, modules: dict[str, str]) -> str:
    """``module.path (onnx_name)`` when the module is known, else the ONNX name."""
    module = modules.get(node)
    return f"{module} ({node})" if module else node


def record_module_paths(model: onnx.ModelProto, paths: dict[str, str]) -> None:
    """Store ``paths`` (for the nodes the model still has) as model-level metadata under ``MODEL_KEY``."""
    kept = {n.name for n in model.graph.node}
    value = json.dumps({k: v for k, v in paths.items() if k in kept}, sort_keys=True)
    for prop in model.metadata_props:
        if prop.key == MODEL_KEY:
            prop.value = value
            return
    model.metadata_props.add(key=MODEL_KEY, value=value)
