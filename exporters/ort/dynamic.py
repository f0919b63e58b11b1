"""The ORT dynamic-range INT8 artifact, written by ORT's own ``quantize_dynamic``, and its scale file.

Weights are quantized ahead of time (symmetric int8); each quantized node's input activation is quantized at run
time from its own min and max (``DynamicQuantizeLinear``, uint8). It is what recurrent models and transformers
need on ORT CPU where static INT8 loses too much. It is never for TensorRT, which takes only static, explicit Q/DQ.

ORT's dynamic mode quantizes MatMul with a constant B, Gemm (split into MatMul + Add first, when alpha = beta = 1
and transA = 0), LSTM (``DynamicQuantizeLSTM``), the contrib Attention (``QAttention``) and Conv (``ConvInteger``).
It has no dynamic GRU kernel: GRU nodes stay float, and the result says so. Nodes inside If/Loop/Scan bodies stay
float too: ORT's EnableSubgraph option (1.32) writes an invalid graph when two branches read one outer tensor.

Settings, from ORT's sources and this machine's measurements (benchmarks/int8/dynamic_int8.py):
- ``weight_type`` is QInt8, symmetric (zero point 0): with ORT's uint8 dynamic activations that is u8×s8, what
  x86's VPMADDUBSW and VNNI's VPDPBUSD multiply, and a zero weight zero point saves MLAS a correction term;
- ``per_channel`` is on by default: ORT CPU fuses either form into the same ``DynamicQuantizeMatMul`` and
  ``DynamicQuantizeLSTM`` kernels; per tensor ran 6-17 % faster on an AVX-512 VNNI CPU (tiny LSTM and MLP,
  batch 8), but one scale per weight lost 4x the accuracy of a scale per output channel once a quarter of the
  channels were 20x larger (LSTM: 7.3 % against 1.8 % max error), and dynamic INT8 is chosen where accuracy is
  short. A caller that has measured its model may pass ``per_channel=False``;
- ``reduce_range`` is off: 7-bit weights are only for x86 CPUs without VNNI, whose u8×s8 pair sums saturate
  (``dopt_common.ort.int8_pairs_saturate`` tells); the caller, who knows the target CPU, decides.
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import onnx

from calibrators.scales.format import DynamicTensor, ScaleFile, TensorScale
from dopt_common.deps import require
from dopt_common.errors import ConfigError, ModelError, one_line
from dopt_common.files import check_output_file, sha256_file
from exporters.onnx.io import save_onnx
from exporters.ort.dynamic_read import read_dynamic_model
from exporters.ort.qdq import ort_logging_summarised

log = logging.getLogger(__name__)

DEFAULT_OP_TYPES = ("MatMul", "Gemm", "LSTM", "GRU", "Attention")
# Requested op type -> the op type ORT's dynamic mode quantizes it as (None: ORT has no dynamic kernel).
ORT_OP_TYPE: Mapping[str, str | None] = {
    "MatMul": "MatMul",
    "Gemm": "MatMul",
    "LSTM": "LSTM",
    "GRU": None,
    "Attention": "Attention",
    "Conv": "Conv",
}
NO_KERNEL = "ORT has no dynamic INT8 GRU kernel (no DynamicQuantizeGRU): quantize_dynamic leaves it float"
GEMM_MATMUL = "_MatMul"  # ORT's name for the MatMul it splits a Gemm into (onnx_model.replace_gemm_with_matmul)
_LARGE = 2**31 - 2**26  # protobuf's 2 GiB limit, less a margin for the graph


class NothingToQuantize(ModelError):
    """A model has no node that ORT's dynamic mode can quantize with the given op types."""


@dataclass(frozen=True)
class DynamicSettings:
    """What ``quantize_dynamic`` was called with, in the scale file's provenance."""

    op_types: tuple[str, ...]
    per_channel: bool
    reduce_range: bool
    weight_type: str = "QInt8"

    def to_json(self) -> dict[str, Any]:
        """Plain data for provenance."""
        return {
            "mode": "dynamic",
            "writer": "onnxruntime.quantization.quantize_dynamic",
            "op_types": list(self.op_types),
            "weight_type": self.weight_type,
            "per_channel": self.per_channel,
            "reduce_range": self.reduce_range,
        }


@dataclass(frozen=True)
class DynamicModel:
    """The written dynamic INT8 model and what it really carries (read back from the file)."""

    path: Path
    settings: DynamicSettings
    quantized_nodes: tuple[str, ...]  # names of the FP32 model's nodes now quantized
    dynamic_tensors: Mapping[str, DynamicTensor]  # activations quantized at run time
    weights: Mapping[str, TensorScale]  # int8 weight parameters as written
    left_float: Mapping[str, str] = field(default_factory=dict)  # a node of a requested op type -> why float


def write_ort_dynamic(
    fp32_path: str | Path,
    out_path: str | Path,
    *,
    op_types: Iterable[str] = DEFAULT_OP_TYPES,
    exclude_nodes: Iterable[str] = (),
    per_channel: bool = True,
    reduce_range: bool = False,
    external_data_mb: int = 1024,
) -> DynamicModel:
    """Write the dynamic INT8 model of ``fp32_path`` with ORT's ``quantize_dynamic``, validated and read back.

    ``exclude_nodes`` are FP32 node names (a Gemm's name covers ORT's MatMul split of it). Raises
    ``NothingToQuantize`` before writing anything when no node can be quantized.
    """
    wanted = _check_op_types(op_types)
    settings = DynamicSettings(wanted, per_channel, reduce_range)
    fp32 = onnx.load(str(fp32_path), load_external_data=False)
    nodes = [n for n in fp32.graph.node if n.op_type in wanted]
    if not any(n.op_type != "GRU" for n in nodes):
        raise NothingToQuantize(_nothing_message(fp32_path, fp32, wanted, nodes))
    final = check_output_file(out_path)
    final.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{final.name}.", dir=final.parent) as tmp:
        raw = Path(tmp) / final.name
        _quantize(Path(fp32_path), raw, settings, _ort_excluded(fp32, wanted, exclude_nodes))
        validate_dynamic(raw)  # before anything is published
        written = onnx.load(str(raw))
    readback = read_dynamic_model(raw, written)
    quantized = _quantized_nodes(fp32, readback.outputs.values())
    if not quantized:
        raise NothingToQuantize(
            f"ORT's quantize_dynamic quantized no node of '{fp32_path}' ({len(nodes)} {'/'.join(wanted)} nodes, all "
            f"left float: {_reasons(nodes, set(exclude_nodes), fp32)}); fix: pass other op_types or exclude_nodes"
        )
    path = save_onnx(written, final, external_data_mb=external_data_mb)
    left = _left_float(fp32, nodes, set(quantized), set(exclude_nodes))
    log.info("dynamic INT8: %d nodes quantized, %d left float (%s)", len(quantized), len(left), path.name)
    return DynamicModel(path, settings, quantized, readback.dynamic, readback.weights, left)


def _check_op_types(op_types: Iterable[str]) -> tuple[str, ...]:
    wanted = (op_types,) if isinstance(op_types, str) else tuple(dict.fromkeys(op_types))
    unknown = [t for t in wanted if t not in ORT_OP_TYPE]
    if unknown or not wanted:
        raise ConfigError(
            f"dynamic INT8 op_types {list(unknown or wanted)} are not supported; use any of {', '.join(ORT_OP_TYPE)} "
            "(the ops ORT's dynamic mode quantizes; GRU is accepted and reported as float)"
        )
    return wanted


def _quantize(fp32_path: Path, raw: Path, settings: DynamicSettings, excluded: list[str]) -> None:
    """ORT's own ``quantize_dynamic``, called as a user would: the acceptance test calls it the same way."""
    quant = require("onnxruntime.quantization", purpose="writing the ORT dynamic INT8 model")
    logging.getLogger().addFilter(_no_preprocess_advice)
    try:
        with ort_logging_summarised():
            quant.quantize_dynamic(
                fp32_path,
                raw,
                op_types_to_quantize=ort_op_types(settings.op_types),
                per_channel=settings.per_channel,
                reduce_range=settings.reduce_range,
                weight_type=quant.QuantType.QInt8,
                nodes_to_exclude=excluded,
                use_external_data_format=_model_bytes(fp32_path) > _LARGE,
            )
    finally:
        logging.getLogger().removeFilter(_no_preprocess_advice)


def _no_preprocess_advice(record: logging.LogRecord) -> bool:
    """Drop ORT's advice to pre-process, logged on every call: the graph is quantized as given, so the model is
    what quantize_dynamic makes of it; ORT's pre-processing is an FP32 step a caller may run before."""
    return not str(record.msg).startswith("Please consider to run pre-processing")


def ort_op_types(op_types: Iterable[str]) -> list[str]:
    """The ``op_types_to_quantize`` ORT takes for ``op_types`` (a Gemm is quantized as its MatMul)."""
    return list(dict.fromkeys(t for t in (ORT_OP_TYPE[o] for o in op_types) if t is not None))


def _ort_excluded(model: onnx.ModelProto, wanted: tuple[str, ...], exclude: Iterable[str]) -> list[str]:
    """``nodes_to_exclude`` for ORT: the given names, each Gemm's MatMul split, and what ``op_types`` leaves out.

    ORT splits every Gemm in dynamic mode and quantizes the split as a MatMul: a Gemm is excluded through the name
    of its split; and with MatMul asked for but not Gemm (or the reverse), the other kind is excluded by name.
    """
    names = list(exclude)
    names += [f"{n}{GEMM_MATMUL}" for n in names]
    for node in model.graph.node:
        if node.op_type == "Gemm" and "Gemm" not in wanted and node.name:
            names.append(f"{node.name}{GEMM_MATMUL}")
        elif node.op_type == "MatMul" and "MatMul" not in wanted and node.name:
            names.append(node.name)
    return list(dict.fromkeys(names))


def _nothing_message(path: str | Path, model: onnx.ModelProto, wanted: tuple[str, ...], nodes: list) -> str:
    """One line: what is missing, in which model, and how to fix it."""
    ops = sorted({n.op_type for n in model.graph.node})
    shown = ", ".join(ops[:12]) + (" …" if len(ops) > 12 else "")
    if nodes:  # GRU only
        return f"'{path}' has {len(nodes)} GRU nodes and nothing else to quantize; {NO_KERNEL}; fix: keep it FP32"
    bodies = (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
    nested = any(a.type in bodies for n in model.graph.node for a in n.attribute)
    nested_note = " (nodes inside If/Loop/Scan bodies stay float)" if nested else ""
    return (
        f"'{path}' has no {'/'.join(wanted)} node for dynamic INT8 (its ops: {shown}){nested_note}; fix: pass op_types "
        "that it has (any of MatMul, Gemm, LSTM, Attention, Conv), or keep it FP32"
    )


def _quantized_nodes(model: onnx.ModelProto, outputs: Iterable[str]) -> tuple[str, ...]:
    """The FP32 nodes whose output a quantized node now produces (a Gemm's through ORT's ``<out>_MatMul``)."""
    producer = {out: node for node in model.graph.node for out in node.output}
    found = []
    for tensor in outputs:
        node = producer.get(tensor)
        split = producer.get(tensor.removesuffix(GEMM_MATMUL))
        if node is None and split is not None and split.op_type == "Gemm":
            node = split
        if node is not None:
            found.append(node.name or node.output[0])
    return tuple(dict.fromkeys(found))


def _left_float(
    model: onnx.ModelProto, nodes: list[onnx.NodeProto], quantized: set[str], excluded: set[str]
) -> dict[str, str]:
    """Each requested node that stayed float (by name, else by its first output) and why."""
    inits = {i.name for i in model.graph.initializer}
    keys = ((node.name or node.output[0], node) for node in nodes)
    return {key: _why_float(node, inits, excluded) for key, node in keys if key not in quantized}


def _why_float(node: onnx.NodeProto, inits: set[str], excluded: set[str]) -> str:
    """The likely reason ORT left a node of a requested type float."""
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    if node.name in excluded:
        return "excluded (exclude_nodes)"
    if node.op_type == "GRU":
        return NO_KERNEL
    if node.op_type in ("MatMul", "Gemm") and node.input[1] not in inits:
        return "its B input is not a constant: ORT quantizes only MatMul with constant weights (MatMulConstBOnly)"
    plain_gemm = (attrs.get("alpha", 1.0), attrs.get("beta", 1.0), attrs.get("transA", 0)) == (1, 1, 0)
    if node.op_type == "Gemm" and not plain_gemm:
        return "ORT splits only Gemm with alpha = beta = 1 and transA = 0 into a MatMul it can quantize"
    if node.op_type in ("LSTM", "Attention", "Conv") and node.input[1] not in inits:
        return "its weights are not constant initializers"
    return "ORT's dynamic mode left it float"


def _reasons(nodes: list[onnx.NodeProto], excluded: set[str], model: onnx.ModelProto) -> str:
    inits = {i.name for i in model.graph.initializer}
    return "; ".join(sorted({_why_float(n, inits, excluded) for n in nodes}))


def _model_bytes(path: Path) -> int:
    """The model file and the external data files it names."""
    model = onnx.load(str(path), load_external_data=False)
    files = {
        e.value
        for init in model.graph.initializer
        if init.data_location == onnx.TensorProto.EXTERNAL
        for e in init.external_data
        if e.key == "location"
    }
    return path.stat().st_size + sum((path.parent / f).stat().st_size for f in files if (path.parent / f).is_file())


def validate_dynamic(path: Path) -> None:
    """``onnx.checker`` and an ORT CPU session on the written model, before anything is published."""
    from dopt_common.ort import create_session

    try:
        onnx.checker.check_model(str(path))
    except onnx.checker.ValidationError as exc:
        raise ModelError(
            f"the dynamic INT8 model '{path.name}' is invalid ONNX: {one_line(exc)}; fix: report it with the "
            "model's opset, or exclude the named node (exclude_nodes)"
        ) from exc
    create_session(path, threads=1)


def dynamic_scale_file(model: DynamicModel, fp32_path: str | Path) -> ScaleFile:
    """The scale file of a dynamic INT8 model: its int8 weights as written, and its run-time quantized activations."""
    ort = require("onnxruntime", purpose="recording the ORT version of a dynamic INT8 model")
    return ScaleFile(
        activations="asymmetric",  # DynamicQuantizeLinear: uint8 with a zero point, from each input's min and max
        tensors=dict(model.weights),
        provenance={
            "model_sha256": sha256_file(fp32_path),
            "quantization": model.settings.to_json(),
            "onnxruntime_version": ort.__version__,
        },
        dynamic=dict(model.dynamic_tensors),
    )
