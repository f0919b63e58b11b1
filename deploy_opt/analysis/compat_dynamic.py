"""Dynamic INT8 in the compatibility report: which tensors a node quantizes at run time, and why TensorRT cannot.

ORT's dynamic mode quantizes an activation from its own min and max at each run: ``DynamicQuantizeLinear`` feeds
``MatMulInteger``/``ConvInteger``/``QAttention``, and ``DynamicQuantizeLSTM``/``DynamicQuantizeMatMul`` quantize
their float input themselves. ORT CPU has those kernels; TensorRT takes only static INT8 (Q/DQ with constant
scales), so such a node fails there whatever its op table says.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import onnx

# Ops that quantize their first (float) input themselves at run time.
SELF_QUANTIZING = ("DynamicQuantizeLinear", "DynamicQuantizeLSTM", "DynamicQuantizeMatMul")
TENSORRT_REASON = (
    "quantizes {tensors} at run time (dynamic INT8), and TensorRT takes only static INT8 (Q/DQ with constant "
    "scales); fix: build the TensorRT engine from the static Q/DQ model"
)


def dynamic_sources(nodes: Iterable[onnx.NodeProto]) -> dict[str, str]:
    """Each run-time quantized tensor (a DynamicQuantizeLinear's output) -> the float tensor it comes from."""
    return {n.output[0]: n.input[0] for n in nodes if n.op_type == "DynamicQuantizeLinear" and n.output and n.input}


def dynamic_reads(node: onnx.NodeProto, sources: Mapping[str, str]) -> list[str]:
    """The float tensors ``node`` reads quantized at run time (empty for a node outside dynamic INT8)."""
    if node.op_type in SELF_QUANTIZING and node.input and node.input[0]:
        return [node.input[0]]
    return list(dict.fromkeys(sources[name] for name in node.input if name in sources))


def tensorrt_reason(tensors: list[str]) -> str:
    """Why TensorRT fails a node that quantizes ``tensors`` at run time."""
    shown = ", ".join(f"'{t}'" for t in tensors[:3]) + (" …" if len(tensors) > 3 else "")
    return TENSORRT_REASON.format(tensors=shown)


def dynamic_warning(rows: Iterable[Mapping]) -> list[str]:
    """One report warning naming the tensors quantized at run time, when there are any."""
    tensors = list(dict.fromkeys(t for row in rows for t in row.get("dynamic", ())))
    if not tensors:
        return []
    shown = ", ".join(tensors[:5]) + (" …" if len(tensors) > 5 else "")
    return [
        f"dynamic INT8: {len(tensors)} activations are quantized at run time ({shown}); ORT CPU runs them, TensorRT "
        "takes only static Q/DQ"
    ]


def render_dynamic_markdown(rows: Iterable[Mapping]) -> list[str]:
    """compat.md's section listing each run-time quantized tensor and the nodes that read it so (none: no lines)."""
    found = [(t, row) for row in rows for t in row.get("dynamic", ())]
    if not found:
        return []
    lines = ["", "## Dynamic INT8 (activations quantized at run time)", "", "| tensor | node | op |", "|---|---|---|"]
    return lines + [f"| {_md(t)} | {_md(row['name'])} | {row['op_type']} |" for t, row in found]


def _md(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")
