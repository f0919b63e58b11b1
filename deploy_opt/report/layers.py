"""The per-layer table of ``report.html``: every weighted node of the FP32 model with its PyTorch module, weight
shape, parameter bytes before and after, share of the model's weights, the precision it shipped in (read from
the shipped Q/DQ model itself), and its measured (sensitivity) or predicted drop."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from deploy_opt.report import html_parts

log = logging.getLogger(__name__)

WEIGHTED = ("Conv", "ConvTranspose", "Gemm", "MatMul", "Gather", "LSTM", "GRU")
INT8_MODELS = ("model.qat.onnx", "model.int8.onnx")
# Ops that run in INT8 only with both operands quantized: the weight and the activation beside it (inputs 0 and 1).
ACTIVATION_READERS = ("Conv", "ConvTranspose", "Gemm", "MatMul")


def _weights(model: onnx.ModelProto) -> dict[str, tuple[int, ...]]:
    return {t.name: tuple(t.dims) for t in model.graph.initializer}


def _int8_nodes(folder: Path, fp32: onnx.ModelProto) -> set[str]:
    """Nodes that run in INT8 in the shipped Q/DQ model: their weight, and for Conv/Gemm/MatMul their other input,
    are read through a DequantizeLinear.

    Read from the model, not the plan: a node kept float (fallback, the classifier head) may still read a
    dequantized activation when its producer's output is quantized, yet its weight stays float and so does it.
    """
    path = next((folder / name for name in INT8_MODELS if (folder / name).is_file()), None)
    if path is None:
        return set()
    model = onnx.load(str(path), load_external_data=False)
    dequantized = {o for n in model.graph.node if n.op_type == "DequantizeLinear" for o in n.output}
    weights = {name for name, dims in _weights(fp32).items() if len(dims) >= 2}
    originals = {n.name: n for n in fp32.graph.node if n.name}
    int8 = set()
    for node in model.graph.node:
        original = originals.get(node.name)
        if original is None or original.op_type != node.op_type:
            continue
        weight = next((i for i, name in enumerate(original.input) if name in weights), None)
        if weight is None:
            continue
        needed = [weight] + ([1 - weight] if node.op_type in ACTIVATION_READERS and weight < 2 else [])
        if all(index < len(node.input) and node.input[index] in dequantized for index in needed):
            int8.add(node.name)
    return int8


def _drops(folder: Path) -> dict[str, tuple[float | None, str]]:
    path = folder / "sensitivity.json"
    if not path.is_file():
        return {}
    data = json.loads(path.read_text(encoding="utf-8"))
    nodes = data.get("nodes") or (data.get("analysis") or {}).get("nodes") or []
    out = {}
    for node in nodes:
        if node.get("drop_both") is not None:
            out[str(node.get("name"))] = (node["drop_both"], "measured")
        elif (node.get("proxy") or {}).get("predicted_drop") is not None:
            out[str(node.get("name"))] = (node["proxy"]["predicted_drop"], "predicted")
    return out


def layer_table_rows(folder: Path, build: dict[str, Any]) -> list[tuple[Any, ...]]:
    """(node, module, op, weight shape, bytes before, bytes after, share of weights %, precision, drop, kind)."""
    fp32 = folder / "model.onnx"
    if not fp32.is_file():
        return []
    model = onnx.load(str(fp32), load_external_data=False)
    shapes, modules = _weights(model), (build.get("export") or {}).get("module_names") or {}
    int8, drops = _int8_nodes(folder, model), _drops(folder)
    fallback = set((build.get("fallback") or {}).get("nodes") or [])
    rows = []
    for node in model.graph.node:
        weight = next((shapes[i] for i in node.input if i in shapes and len(shapes[i]) >= 2), None)
        if node.op_type not in WEIGHTED or weight is None:
            continue
        numel = int(np.prod(weight))
        quantized = node.name in int8
        precision = "INT8" if quantized else ("fallback (FP32)" if node.name in fallback else "FP32")
        drop, kind = drops.get(node.name, (None, ""))
        rows.append(
            [
                node.name,
                modules.get(node.name, ""),
                node.op_type,
                "×".join(map(str, weight)),
                numel * 4,
                numel * (1 if quantized else 4),
                numel,
                precision,
                drop,
                kind,
            ]
        )
    total = sum(r[6] for r in rows) or 1
    for row in rows:
        row[6] = 100.0 * row[6] / total
    return [tuple(r) for r in rows]


def layer_rows(folder: Path, build: dict[str, Any]) -> str:
    """The table's HTML (empty when the folder has no model.onnx)."""
    rows = layer_table_rows(folder, build)
    headers = (
        "ONNX node",
        "PyTorch module",
        "op",
        "weight shape",
        "bytes FP32",
        "bytes shipped",
        "share of weights %",
        "precision",
        "drop (points)",
        "drop is",
    )
    return html_parts.table(headers, rows, text_columns=(0, 1, 2, 3, 7, 9))
