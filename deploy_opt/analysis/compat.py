"""Per-node compatibility report: will each node of an ONNX model run on ORT CPU, ORT CUDA and TensorRT?

For every node: its op, domain and the opset it resolves to; whether ONNX Runtime has a kernel for it as used
(since_version inside the kernel's range, input types inside its type constraints) on CPU and on CUDA, and an
INT8 kernel on CPU; TensorRT's support and restrictions per version; the minimum opset, ORT and TensorRT versions.
Nodes that fail or fall back on one of the build's targets are flagged. Where the facts come from is recorded in
the report itself (``sources``), see compat_data.py. Where ``tensorrt`` is installed its ONNX parser confirms the
TensorRT column for the installed version.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx
from google.protobuf.message import DecodeError
from onnx import defs, shape_inference

from deploy_opt.analysis import compat_data as data
from deploy_opt.analysis.compat_dynamic import dynamic_reads, dynamic_sources, dynamic_warning, tensorrt_reason
from deploy_opt.analysis.compat_report import CompatReport
from dopt_common.errors import ConfigError, InputError, ModelError, ReportError
from dopt_common.files import regular_input
from dopt_common.names import shown
from exporters.tensorrt.qdq_rules import qdq_problem
from exporters.tensorrt.restrictions import NodeFacts, check_restrictions

log = logging.getLogger(__name__)

TARGETS = ("ort-cpu", "ort-cuda", "tensorrt")
STATUSES = ("ok", "fallback", "fail")
QDQ_OPS = ("QuantizeLinear", "DequantizeLinear")
# ORT's QDQ selectors (qdq_selector_action_transformer.cc) fuse Conv for the CPU, DML and ACL providers and MatMul for
# CPU and DML only: on the CUDA EP a Q/DQ model runs its DequantizeLinear → float op → QuantizeLinear as written.
CUDA_QDQ_NOTE = "ORT's CUDA EP runs Q/DQ in float; INT8 speed on NVIDIA GPUs comes from TensorRT"
_INT8 = {"tensor(int8)", "tensor(uint8)"}
_VARIADIC = defs.OpSchema.FormalParameterOption.Variadic


@dataclass(frozen=True)
class _Graph:
    """What every node's row is judged against."""

    opsets: Mapping[str, int]
    types: Mapping[str, str]
    ranks: Mapping[str, int]
    constants: Mapping[str, onnx.TensorProto]
    dq_outputs: frozenset[str]
    dynamic: Mapping[str, str]  # a tensor quantized at run time -> the float tensor it comes from
    readers: Mapping[str, list[tuple[onnx.NodeProto, int]]]
    cpu: data.KernelTable
    cuda: data.KernelTable
    tensorrt: data.TensorRTVersion


def check_compat(
    model: str | Path | onnx.ModelProto, targets: Sequence[str] = ("ort-cpu",), *, tensorrt_version: str | None = None
) -> CompatReport:
    """The compatibility report for ``model``: one row per node (graph order) and the nodes flagged on ``targets``.

    ``tensorrt_version`` picks the table version the "tensorrt" target is judged against (default: the installed
    TensorRT's, else the newest in the table).
    """
    proto, path = _load(model)
    wanted = _check_targets(targets)
    cpu = data.runtime_kernels(data.CPU_PROVIDER)
    if cpu is None:
        raise ReportError("the installed onnxruntime registers no CPU kernels; fix: reinstall onnxruntime")
    tensorrt, basis = data.tensorrt_target(tensorrt_version)
    types, ranks, constants, inference = _tensor_facts(proto)
    nodes = list(_walk(proto.graph, "main"))
    graph = _Graph(
        opsets={data.normal_domain(o.domain): int(o.version) for o in proto.opset_import},
        types=types,
        ranks=ranks,
        constants=constants,
        dq_outputs=frozenset(n.output[0] for n, _, _ in nodes if n.op_type == "DequantizeLinear" and n.output),
        dynamic=dynamic_sources(n for n, _, _ in nodes),
        readers=_readers(n for n, _, _ in nodes),
        cpu=cpu,
        cuda=data.cuda_kernels(),
        tensorrt=tensorrt,
    )
    rows = [_node_row(i, node, where, top, graph) for i, (node, where, top) in enumerate(nodes)]
    parser = {"ran": False, "reason": "tensorrt is not a target"}
    if "tensorrt" in wanted:
        parser = _confirm_with_tensorrt(proto, path, rows)
    return CompatReport(
        model={
            "name": path.name if path else (proto.graph.name or "model"),
            "path": str(path) if path else None,
            "nodes": len(rows),
            "opsets": {data.shown_domain(d): v for d, v in graph.opsets.items()},
        },
        targets=tuple(wanted),
        sources={
            "opset": f"onnx {onnx.__version__}: get_schema(op, max_inclusive_version=model opset, domain)",
            "ort_cpu": cpu.source,
            "ort_cuda": graph.cuda.source,
            "int8_cpu": "the ORT CPU registry: QLinear<Op>/<Op>Integer/Q<Op> kernels, or <Op> kernels taking int8",
            "tensorrt": "deploy_opt/backend_tables/tensorrt_operators.csv: onnx-tensorrt docs/operators.md, branches "
            + ", ".join(v.branch for v in data.tensorrt_versions()),
            "tensorrt_target": {"version": tensorrt.version, "basis": basis},
            "min_ort": "deploy_opt/backend_tables/ort_opset_support.csv: ORT release -> opset "
            "(ORT's compatibility page)",
            "shape_inference": inference,
        },
        warnings=(*_model_warnings(graph), *dynamic_warning(rows)),
        tensorrt_parser=parser,
        summary={t: {s: sum(r["status"][t] == s for r in rows) for s in STATUSES} for t in TARGETS},
        flagged=tuple(
            {"index": r["index"], "name": r["name"], "op_type": r["op_type"], "target": t}
            | {"status": r["status"][t], "reason": r["reasons"].get(t, "")}
            for r in rows
            for t in wanted
            if r["status"][t] != "ok"
        ),
        nodes=tuple(rows),
    )


def _load(model: str | Path | onnx.ModelProto) -> tuple[onnx.ModelProto, Path | None]:
    if isinstance(model, onnx.ModelProto):
        return model, None
    try:
        path = regular_input(model, "ONNX model")  # a FIFO or /dev/zero is refused before any read
    except InputError as exc:
        raise ModelError(str(exc)) from None
    try:
        proto = onnx.load(str(path), load_external_data=False)
    except (OSError, DecodeError) as exc:
        why = f"{type(exc).__name__}: {exc}"
        raise ModelError(
            f"cannot read ONNX model '{shown(str(path))}' ({why}); fix: pass the path of a .onnx file"
        ) from exc
    if not proto.ir_version or not proto.HasField("graph"):  # any byte string, even an empty file, parses
        size = path.stat().st_size
        raise ModelError(
            f"'{shown(str(path))}' ({size} bytes) is not an ONNX model: it has no IR version or no graph; fix: pass "
            "the path of a .onnx file (an empty or truncated file reads as an empty model)"
        )
    return proto, path


def _check_targets(targets: Sequence[str]) -> tuple[str, ...]:
    if isinstance(targets, str):
        targets = (targets,)
    unknown = [t for t in targets if t not in TARGETS]
    if unknown:
        raise ConfigError(f"compat targets {unknown} are unknown; use any of {', '.join(TARGETS)}")
    return tuple(dict.fromkeys(targets))


def _walk(graph: onnx.GraphProto, where: str) -> Iterator[tuple[onnx.NodeProto, str, int | None]]:
    """Every node in graph order; a control-flow node's sub-graph nodes follow it. Top-level nodes carry their index."""
    for index, node in enumerate(graph.node):
        yield node, where, index if where == "main" else None
        for attr in node.attribute:
            for sub in [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs):
                yield from ((n, w, None) for n, w, _ in _walk(sub, f"{node.name or node.op_type}/{attr.name}"))


def _readers(nodes: Iterator[onnx.NodeProto]) -> dict[str, list[tuple[onnx.NodeProto, int]]]:
    """Tensor name -> the nodes reading it, with the input index."""
    found: dict[str, list[tuple[onnx.NodeProto, int]]] = {}
    for node in nodes:
        for index, name in enumerate(node.input):
            if name:
                found.setdefault(name, []).append((node, index))
    return found


def _subgraphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    yield graph
    for attr in (a for node in graph.node for a in node.attribute):
        for sub in [attr.g] if attr.type == onnx.AttributeProto.GRAPH else attr.graphs:
            yield from _subgraphs(sub)


def _tensor_facts(proto: onnx.ModelProto) -> tuple[dict[str, str], dict[str, int], dict[str, onnx.TensorProto], str]:
    """Element type ('tensor(float)') and rank of every tensor shape inference can name; the constant tensors."""
    try:
        inferred, note = shape_inference.infer_shapes(proto), "ok"
    except Exception as exc:  # custom ops, > 2 GB protos: type checks are skipped, kernels still matched by version
        inferred, note = proto, f"failed ({type(exc).__name__}: {exc}); input types not checked"
    types, ranks, constants = {}, {}, {}
    for graph in _subgraphs(inferred.graph):
        for info in [*graph.input, *graph.output, *graph.value_info]:
            tensor = info.type.tensor_type
            if info.type.HasField("tensor_type") and tensor.elem_type:
                types[info.name] = f"tensor({onnx.TensorProto.DataType.Name(tensor.elem_type).lower()})"
                if tensor.HasField("shape"):
                    ranks[info.name] = len(tensor.shape.dim)
        for init in graph.initializer:
            types[init.name] = f"tensor({onnx.TensorProto.DataType.Name(init.data_type).lower()})"
            ranks[init.name], constants[init.name] = len(init.dims), init
        for node in graph.node:
            value = next((a.t for a in node.attribute if a.name == "value"), None)
            if node.op_type == "Constant" and node.output and value is not None:
                constants[node.output[0]] = value
    return types, ranks, constants, note


def _schema(op: str, domain: str, opset: int | None) -> defs.OpSchema | None:
    try:
        return defs.get_schema(op, max_inclusive_version=opset or 1, domain=domain)
    except defs.SchemaError:
        return None


def _node_row(index: int, node: onnx.NodeProto, where: str, top: int | None, graph: _Graph) -> dict[str, Any]:
    domain = data.normal_domain(node.domain)
    opset = graph.opsets.get(domain)
    schema = _schema(node.op_type, domain, opset)
    since = schema.since_version if schema is not None else None
    version = since if since is not None else (opset or 1)
    in_types = [graph.types.get(name) if name else None for name in node.input]
    cpu = _kernel_cell(graph.cpu, node, domain, version, in_types, schema)
    cuda = _kernel_cell(graph.cuda, node, domain, version, in_types, schema)
    int8 = _int8_cell(graph.cpu, node.op_type, domain, version)
    quantized = node.op_type not in QDQ_OPS and any(name in graph.dq_outputs for name in node.input)
    facts = NodeFacts(node, schema, graph.constants, graph.ranks)
    tensorrt = {
        v.version: _tensorrt_cell(v, node.op_type, domain, version, graph.opsets.get("", 0), facts)
        for v in data.tensorrt_versions()
    }
    verdicts = _verdicts(cpu, cuda, int8, quantized, tensorrt[graph.tensorrt.version], graph.tensorrt.version)
    problem = qdq_problem(node, graph.types, graph.constants, graph.readers, graph.opsets.get("", 0))
    if problem is not None and domain == "":
        verdicts["tensorrt"] = ("fail", f"TensorRT {graph.tensorrt.version}: {problem}")
    dynamic = dynamic_reads(node, graph.dynamic)
    if dynamic:
        verdicts["tensorrt"] = ("fail", f"TensorRT {graph.tensorrt.version}: {tensorrt_reason(dynamic)}")
    return {
        "index": index,
        "name": node.name or f"{node.op_type}_{index}",
        "graph": where,
        "graph_index": top,
        "op_type": node.op_type,
        "domain": data.shown_domain(domain),
        "opset": opset,
        "since_version": since,
        "input_types": [t.removeprefix("tensor(").removesuffix(")") if t else None for t in in_types],
        "quantized": quantized,
        "dynamic": dynamic,
        "ort_cpu": cpu,
        "ort_cuda": cuda,
        "int8_cpu": int8,
        "tensorrt": tensorrt,
        "min_opset": since,
        "min_ort": data.first_ort_release(domain, since),
        "min_tensorrt": next((v for v, cell in tensorrt.items() if cell["supported"]), None),
        "status": {t: s for t, (s, _) in verdicts.items()},
        "reasons": {t: why for t, (_, why) in verdicts.items() if why},
    }


def _types_fit(kernel: data.Kernel, schema: defs.OpSchema | None, in_types: list[str | None]) -> bool:
    params = schema.inputs if schema is not None else []
    for i, elem in enumerate(in_types):
        if elem is None or not params or (i >= len(params) and params[-1].option != _VARIADIC):
            continue
        allowed = kernel.types.get(params[min(i, len(params) - 1)].type_str)
        if allowed and elem not in allowed:
            return False
    return True


def _kernel_cell(
    table: data.KernelTable,
    node: onnx.NodeProto,
    domain: str,
    version: int,
    in_types: list[str | None],
    schema: defs.OpSchema | None,
) -> dict[str, Any]:
    if node.op_type == "Constant" and domain in ("", "ai.onnx"):
        # no kernel needed: ORT turns every Constant node into an initializer when it loads the graph
        return {"kernel": True, "via": "initializer", "versions": []}
    kernels = table.find(node.op_type, domain)
    in_range = [k for k in kernels if k.covers(version)]
    fitting = [k for k in in_range if _types_fit(k, schema, in_types)]
    if fitting:
        return {"kernel": True, "via": "kernel", "versions": sorted({k.span for k in fitting})}
    if schema is not None and (schema.has_function or schema.has_context_dependent_function):
        return {"kernel": False, "via": "function", "note": "no kernel: ORT runs the op's ONNX function body"}
    if in_range:
        shown = [t.removeprefix("tensor(").removesuffix(")") if t else "?" for t in in_types]
        note = f"no kernel for input types ({', '.join(shown)})"
    elif kernels:
        note = f"no kernel for opset version {version} (kernels: {', '.join(sorted({k.span for k in kernels}))})"
    else:
        note = f"no kernel for {data.shown_domain(domain)}::{node.op_type}"
    return {"kernel": False, "via": None, "note": note}


def _int8_cell(table: data.KernelTable, op: str, domain: str, version: int) -> dict[str, Any]:
    if op in QDQ_OPS:
        found = [op] if table.has_op(op, domain) else []
    else:
        names = (f"QLinear{op}", f"{op}Integer", f"Q{op}")
        found = [f"{n}" for n in names if table.has_op(n, "") or table.has_op(n, "com.microsoft")]
        if any(k.covers(version) and any(_INT8 & set(t) for t in k.types.values()) for k in table.find(op, domain)):
            found.append(f"{op}(int8)")
    return {"kernel": bool(found), "kernels": found}


def _tensorrt_cell(
    version: data.TensorRTVersion, op: str, domain: str, since: int, model_opset: int, facts: NodeFacts
) -> dict[str, Any]:
    row = data.tensorrt_operators().get((version.version, op)) if domain == "" else None
    reason = None
    if domain != "":
        reason = f"custom domain '{domain}': TensorRT needs a plugin"
    elif since > version.max_opset:
        reason = f"op version {since} is newer than opset {version.max_opset}, the newest its parser takes"
    elif row is None:
        reason = "not in onnx-tensorrt's operator table"
    elif not row.supported:
        reason = "not supported"
    elif version.min_opset is not None and model_opset < version.min_opset:
        reason = f"model opset {model_opset} is older than opset {version.min_opset}, the oldest its parser takes"
    if reason is not None or row is None:
        return {"supported": False, "reason": reason}
    check, clauses = check_restrictions(row.restrictions, facts)
    return {"supported": True, "restriction": check, "clauses": clauses}


def _verdicts(
    cpu: dict[str, Any], cuda: dict[str, Any], int8: dict[str, Any], quantized: bool, trt: dict[str, Any], version: str
) -> dict[str, tuple[str, str | None]]:
    """Target -> (ok/fallback/fail, why)."""
    runs = {"cpu": cpu["kernel"] or cpu["via"] == "function", "cuda": cuda["kernel"] or cuda["via"] == "function"}
    verdicts: dict[str, tuple[str, str | None]] = {"ort-cpu": ("ok", None), "ort-cuda": ("ok", None)}
    if not runs["cpu"]:
        verdicts["ort-cpu"] = ("fail", f"ORT CPU: {cpu['note']}")
    elif quantized and not int8["kernel"]:
        verdicts["ort-cpu"] = ("fallback", "fed by DequantizeLinear, but no INT8 CPU kernel: runs in float")
    if not runs["cuda"]:
        where = "runs on the CPU provider" if runs["cpu"] else "no CPU kernel either"
        verdicts["ort-cuda"] = ("fallback" if runs["cpu"] else "fail", f"ORT CUDA: {cuda['note']}; {where}")
    elif quantized:
        verdicts["ort-cuda"] = ("fallback", f"ORT CUDA: {CUDA_QDQ_NOTE}")
    verdicts["tensorrt"] = ("ok", None)
    if not trt["supported"]:
        verdicts["tensorrt"] = ("fail", f"TensorRT {version}: {trt['reason']}")
    elif trt["restriction"] == "applies":
        verdicts["tensorrt"] = ("fallback", f"TensorRT {version} restriction applies: {'; '.join(trt['clauses'])}")
    return verdicts


def _model_warnings(graph: _Graph) -> list[str]:
    warnings = []
    opset = graph.opsets.get("")
    if opset is not None and opset > graph.tensorrt.max_opset:
        warnings.append(
            f"model opset {opset} is newer than opset {graph.tensorrt.max_opset}, the newest TensorRT "
            f"{graph.tensorrt.version}'s parser takes; it may refuse the model (export with a lower opset)"
        )
    newest = max((k.since for ks in graph.cpu.kernels.values() for k in ks if k.domain == ""), default=0)
    if opset is not None and opset > newest:
        warnings.append(f"model opset {opset} is newer than any kernel of onnxruntime {graph.cpu.ort_version}")
    return warnings


def _confirm_with_tensorrt(proto: onnx.ModelProto, path: Path | None, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Rows of top-level nodes take the word of TensorRT's own ONNX parser, where tensorrt is installed."""
    verdict = data.tensorrt_parser_verdict(path.read_bytes() if path is not None else proto.SerializeToString(), path)
    for row in rows if verdict["ran"] else []:
        if row["graph_index"] is None:
            continue
        row["tensorrt_parser"] = row["graph_index"] not in verdict["rejected"]
        if not row["tensorrt_parser"]:
            row["status"]["tensorrt"] = "fail"
            row["reasons"]["tensorrt"] = f"TensorRT {verdict['tensorrt']}'s ONNX parser does not support it"
        elif row["status"]["tensorrt"] == "fail" and not row["dynamic"]:  # its parser does not judge numerics
            row["status"]["tensorrt"] = "ok"
            row["reasons"]["tensorrt"] = f"not in the table, but TensorRT {verdict['tensorrt']}'s parser accepts it"
    return verdict
