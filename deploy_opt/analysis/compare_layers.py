"""Per-layer comparison of the Q/DQ model against the FP32 model, and the first layer where INT8 goes wrong.

Every float tensor of the FP32 graph (inputs, node outputs) and every quantized initializer becomes a graph output
of an augmented copy of each model; both run the same fixed samples chunk by chunk, and only running sums are
kept, so memory stays that of one chunk. For each tensor, in graph order:

- ``sqnr_db`` / ``cosine``: the Q/DQ model's tensor (as its producer computed it, before its own Q/DQ) against the
  FP32 model's: the error accumulated up to here. It falls steadily through a healthy network (MiniLM: ~12 dB
  late in the encoder), so on its own it says little about *where* something broke.
- ``quant_sqnr_db``: the tensor's own quantization noise: pre- vs post-Q/DQ inside the quantized model (for a
  weight or bias: the FP32 initializer vs its dequantized value). Healthy INT8 keeps this at about 19-50 dB
  whatever happened upstream (measured minimum: 18.7 dB on MiniLM, 39.7 dB on the digits demo); a wrong scale or
  zero point drives it far lower (a scale 50x too large costs ~34 dB; 50x too small clips to ~0 dB).
- ``drop_db``: for a quantized MatMul/Gemm/Conv/ConvTranspose, how much worse its output is than its inputs' noise
  predicts (each input's accumulated noise, plus its Q/DQ noise, plus its weights' noise, summed as powers).
  Healthy: at most ~2 dB (MiniLM), ~0.5 dB (digits demo). A broken kernel or a wrong bias shows here.

Tensors are paired by producer node and output position, never by name alone. ORT's quantizer removes a Relu or
Clip that follows a quantized node (asymmetric activations) and gives the producer the activation's output name, so
the Q/DQ model's ``relu_1`` is the Gemm's pre-activation output: it is paired with FP32's Gemm output, and FP32's
``relu_1`` with that tensor clipped as the removed activation would (its Q/DQ pair does the clip). A tensor whose
producer is gone in some other way is left unpaired.

The first divergence is the first row where ``quant_sqnr_db < min_quant_sqnr_db`` or ``drop_db > max_drop_db``.
A bias is not judged by its own SQNR: its int32 step is input scale × weight scale, so a bias far smaller than
the node's output (a Caffe2 zoo graph's 0.02 beside activations in the hundreds) rounds to 0 dB of itself while
costing the output nothing; what it costs shows in the node output's ``sqnr_db`` and ``drop_db``.
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from deploy_opt.config.build import CompareConfig
from deploy_opt.evaluation.numerics import json_db, noise_db, power_db, relative_noise
from dopt_common.errors import ModelError
from dopt_common.ort import create_session
from exporters.ort.qdq import INITIALIZER_SUFFIX, OUTPUT_SUFFIX

log = logging.getLogger(__name__)
# Ops whose output noise the summed noise of their inputs predicts; normalising ops (Softmax, LayerNormalization)
# amplify relative noise by design (MiniLM's masked Softmax: ~70 dB "drop" on a healthy model), so they are not judged.
LINEAR_OPS = ("MatMul", "Gemm", "Conv", "ConvTranspose")
FLOAT_TYPES = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE, onnx.TensorProto.BFLOAT16}
CRITERION = (
    "first tensor, in graph order, whose own quantization SQNR (pre- vs post-Q/DQ in the quantized model; weights: "
    "FP32 vs dequantized; biases excepted) is below min_quant_sqnr_db, or whose producing node's output SQNR is "
    "more than max_drop_db below what its inputs' and weights' noise predicts (MatMul/Gemm/Conv/ConvTranspose "
    "reading a quantized input)"
)


@dataclass
class PairStats:
    """Running sums for SQNR and cosine of a test tensor against a reference tensor."""

    ref2: float = 0.0
    test2: float = 0.0
    cross: float = 0.0
    noise: float = 0.0

    def add(self, reference: np.ndarray, test: np.ndarray) -> None:
        """Accumulate one chunk (shapes must match)."""
        a = np.asarray(reference, dtype=np.float64).ravel()
        b = np.asarray(test, dtype=np.float64).ravel()
        if a.shape != b.shape:
            raise ModelError(f"per-layer compare: shapes differ ({a.size} vs {b.size} values) for one tensor")
        self.ref2 += float(a @ a)
        self.test2 += float(b @ b)
        self.cross += float(a @ b)
        self.noise += float((a - b) @ (a - b))

    @property
    def sqnr_db(self) -> float:
        """The SQNR in dB (evaluation.numerics.power_db): +inf when identical."""
        return power_db(self.ref2, self.noise)

    @property
    def cosine(self) -> float:
        """Cosine similarity over all accumulated values (1.0 when both are zero)."""
        if self.ref2 == 0.0 and self.test2 == 0.0:
            return 1.0
        return self.cross / max(math.sqrt(self.ref2 * self.test2), 1e-30)


@dataclass(frozen=True)
class Row:
    """One tensor of the FP32 graph and its names in both models."""

    name: str
    kind: str  # input | activation | weight
    producer: str | None  # producing node (FP32 graph), None for inputs and initializers
    op: str
    consumer: str | None  # first node that reads it through Q/DQ (or at all)
    pre: str | None  # the Q/DQ model's tensor before its own Q/DQ (activations)
    post: str | None  # the Q/DQ model's dequantized tensor, when this tensor is quantized
    clip: tuple[float, float] | None = None  # a removed Relu/Clip: ``pre`` clipped to this is the tensor


def plan_rows(fp32: onnx.ModelProto, qdq: onnx.ModelProto) -> tuple[list[Row], dict[str, int]]:
    """Rows in graph order and the element type of every tensor to expose."""
    types = _float_types(fp32)
    inits = {i.name for i in fp32.graph.initializer}
    q_produced = {o for n in qdq.graph.node for o in n.output} | {i.name for i in qdq.graph.input}
    q_nodes = list(qdq.graph.node)
    quantizer = {n.input[0]: n.output[0] for n in q_nodes if n.op_type == "QuantizeLinear"}
    dequantizer = {n.input[0]: n.output[0] for n in q_nodes if n.op_type == "DequantizeLinear"}
    consumers: dict[str, str] = {}
    for node in [*qdq.graph.node, *fp32.graph.node]:  # a dequantized tensor's reader in the Q/DQ model comes first
        for name in node.input:
            consumers.setdefault(name, node.name)
    paired = paired_outputs(fp32, qdq)
    constants = {i.name: i for i in fp32.graph.initializer}

    def dequantized(pre: str | None) -> str | None:
        return dequantizer.get(quantizer.get(pre, ""), None) if pre else None

    def graph_input(name: str) -> Row:
        pre = name + OUTPUT_SUFFIX if name + OUTPUT_SUFFIX in q_produced else name  # an input that is an output
        pre = pre if pre in q_produced else None
        post = dequantized(pre)
        return Row(name, "input", None, "input", consumers.get(post or name), pre, post)

    def node_output(name: str, node: onnx.NodeProto) -> Row:
        pre, clip = paired.get(name), None
        if pre is None:  # the producer is gone: a removed activation is its input's producer's output, clipped
            pre, clip = _removed_activation(node, name, paired, constants)
        # The Q/DQ pair on ``pre`` is this tensor's unless ORT renamed the output to a removed activation's.
        own_qdq = pre is not None and (clip is not None or pre.removesuffix(OUTPUT_SUFFIX) == name)
        post = dequantized(pre) if own_qdq else None
        return Row(name, "activation", node.name, node.op_type, consumers.get(post or name), pre, post, clip)

    rows: list[Row] = [
        graph_input(i.name) for i in fp32.graph.input if i.name not in inits and types.get(i.name) is not None
    ]
    seen_weights: set[str] = set()
    for node in fp32.graph.node:
        for name in node.input:
            post = dequantizer.get(name + INITIALIZER_SUFFIX)
            if name in inits and post and name not in seen_weights:
                seen_weights.add(name)
                rows.append(Row(name, "weight", None, "initializer", consumers.get(post, node.name), None, post))
        rows += [node_output(o, node) for o in node.output if o in types]
    return rows, types


def paired_outputs(fp32: onnx.ModelProto, qdq: onnx.ModelProto) -> dict[str, str]:
    """Each FP32 node output → the Q/DQ model's output of the same node (name and op type) at the same position.

    A node with no such twin (no name, a name used twice, or a node the quantizer renamed) is matched through its
    output's name, and only when the Q/DQ model's producer of that name (or of its renamed graph output) has the
    same op type and is nobody's twin: a Gemm that took a removed Relu's output name is never the Relu.
    """
    counts = Counter(n.name for n in fp32.graph.node)
    q_compute = [n for n in qdq.graph.node if n.op_type not in ("QuantizeLinear", "DequantizeLinear")]
    q_counts = Counter(n.name for n in q_compute)
    q_by_name = {n.name: n for n in q_compute if n.name and q_counts[n.name] == 1}
    q_producer = {o: n for n in q_compute for o in n.output}
    twins = {
        node.name: twin
        for node in fp32.graph.node
        if node.name
        and counts[node.name] == 1
        and (twin := q_by_name.get(node.name)) is not None
        and (twin.op_type, twin.domain) == (node.op_type, node.domain)
    }
    claimed = set(twins)  # a twin has its FP32 node's name
    pairs: dict[str, str] = {}
    for node in fp32.graph.node:
        twin = twins.get(node.name) if node.name and counts[node.name] == 1 else None
        if twin is not None:
            pairs |= {f: q for f, q in zip(node.output, twin.output, strict=False) if f and q}
            continue
        for name in node.output:
            found = next((t for t in (name, name + OUTPUT_SUFFIX) if t in q_producer), None)
            producer = q_producer.get(found or "")
            if producer is not None and producer.name not in claimed and producer.op_type == node.op_type:
                pairs[name] = found
    return pairs


def _removed_activation(
    node: onnx.NodeProto, name: str, paired: dict[str, str], constants: dict[str, onnx.TensorProto]
) -> tuple[str | None, tuple[float, float] | None]:
    """For a Relu/Clip that ORT removed: the producer's renamed output in the Q/DQ model and the clip range."""
    clip = _clip_range(node, constants)
    upstream = paired.get(node.input[0]) if node.input and clip is not None else None
    if upstream is None or upstream.removesuffix(OUTPUT_SUFFIX) != name:
        return None, None
    return upstream, clip


def _clip_range(node: onnx.NodeProto, constants: dict[str, onnx.TensorProto]) -> tuple[float, float] | None:
    """The range a Relu or a Clip with constant bounds clips to; None for anything else."""
    if node.op_type == "Relu" and node.domain in ("", "ai.onnx"):
        return 0.0, math.inf
    if node.op_type != "Clip" or node.domain not in ("", "ai.onnx"):
        return None
    attrs = {a.name: a.f for a in node.attribute}  # opset < 11 carries min and max as attributes
    bounds = [attrs.get("min", -math.inf), attrs.get("max", math.inf)]
    for index, name in enumerate(node.input[1:3]):
        if not name:
            continue
        if name not in constants:
            return None
        bounds[index] = float(onnx.numpy_helper.to_array(constants[name]).reshape(-1)[0])
    return bounds[0], bounds[1]


def _float_types(model: onnx.ModelProto) -> dict[str, int]:
    """Element type of every float tensor that is a graph input or node output."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    except Exception as exc:  # a model onnx cannot infer still has its own value_info
        log.debug("shape inference failed (%s); using the model's own value_info", exc)
        inferred = model
    infos = [*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output]
    return {v.name: v.type.tensor_type.elem_type for v in infos if v.type.tensor_type.elem_type in FLOAT_TYPES}


def _expose(model: onnx.ModelProto, names: dict[str, int]) -> bytes:
    """A copy of ``model`` with every name in ``names`` as an extra graph output."""
    augmented = onnx.ModelProto()
    augmented.CopyFrom(model)
    present = {o.name for o in augmented.graph.output}
    for name, elem in names.items():
        if name not in present:
            augmented.graph.output.append(onnx.helper.make_tensor_value_info(name, elem, None))
    return augmented.SerializeToString()


def _chunks(samples: dict[str, np.ndarray], size: int) -> Iterator[dict[str, np.ndarray]]:
    total = next(iter(samples.values())).shape[0]
    for start in range(0, total, size):
        yield {k: v[start : start + size] for k, v in samples.items()}


def compare_layers(
    fp32_path: Path, int8_path: Path, samples: dict[str, np.ndarray], config: CompareConfig, threads: int | None = None
) -> dict[str, Any]:
    """The per-layer table and the first divergence (see the module docstring for the criterion)."""
    fp32, qdq = onnx.load(str(fp32_path)), onnx.load(str(int8_path))
    rows, types = plan_rows(fp32, qdq)
    dq_types = _dequantized_types(qdq)
    fp32_names = {r.name: types[r.name] for r in rows if r.kind != "weight"}
    q_names = {r.pre: types[r.name] for r in rows if r.pre} | {
        r.post: dq_types.get(r.post, types.get(r.name, onnx.TensorProto.FLOAT)) for r in rows if r.post
    }
    try:
        fp32_session = create_session(_expose(fp32, fp32_names), threads=threads, optimize=False)
        q_session = create_session(_expose(qdq, q_names), threads=threads, optimize=False)
    except ValueError as exc:  # protobuf refuses models over 2 GB
        return {"status": f"skipped: {exc}", "criterion": CRITERION, "layers": [], "first_divergence": None}
    weights = {r.name for r in rows if r.kind == "weight"}
    inits = {i.name: onnx.numpy_helper.to_array(i) for i in fp32.graph.initializer if i.name in weights}
    accumulated = {r.name: PairStats() for r in rows if r.pre}
    own = {r.name: PairStats() for r in rows if r.post}
    fp32_list, q_list = list(fp32_names), list(q_names)
    for index, feed in enumerate(_chunks(samples, config.batch_size)):
        f_out = dict(zip(fp32_list, fp32_session.run(fp32_list, feed), strict=True))
        q_out = dict(zip(q_list, q_session.run(q_list, feed), strict=True))
        for row in rows:
            pre = _clipped(q_out[row.pre], row.clip) if row.pre else None
            if pre is not None:
                accumulated[row.name].add(f_out[row.name], pre)
            if row.post and row.kind != "weight":
                own[row.name].add(pre, q_out[row.post])
            elif row.post and index == 0:
                own[row.name].add(inits[row.name], q_out[row.post])
    return _table(rows, qdq, accumulated, own, config)


def _clipped(tensor: np.ndarray, clip: tuple[float, float] | None) -> np.ndarray:
    return tensor if clip is None else np.clip(tensor, clip[0], clip[1])


def _dequantized_types(qdq: onnx.ModelProto) -> dict[str, int]:
    """A DequantizeLinear output has its scale's element type."""
    inits = {i.name: i.data_type for i in qdq.graph.initializer}
    return {
        n.output[0]: inits.get(n.input[1], onnx.TensorProto.FLOAT)
        for n in qdq.graph.node
        if n.op_type == "DequantizeLinear"
    }


def _table(
    rows: list[Row],
    qdq: onnx.ModelProto,
    accumulated: dict[str, PairStats],
    own: dict[str, PairStats],
    config: CompareConfig,
) -> dict[str, Any]:
    # A removed activation's row shares its producer's ``pre``; a reader of that raw tensor reads the producer's.
    by_q_name = {n: r for r in rows for n in (r.pre if r.clip is None else None, r.post) if n}
    q_producer = {o: n for n in qdq.graph.node for o in n.output}
    biases = {n.input[2] for n in qdq.graph.node if n.op_type in LINEAR_OPS and len(n.input) > 2}
    table, first = [], None
    for row in rows:
        sqnr = accumulated[row.name].sqnr_db if row.name in accumulated else None
        quant = own[row.name].sqnr_db if row.name in own else None
        drop = _drop(row, by_q_name, q_producer, accumulated, own) if row.kind == "activation" else None
        entry = {
            "name": row.name,
            "op": row.op,
            "node": row.producer or row.consumer,
            "sqnr_db": _finite(sqnr),
            "cosine": _finite(accumulated[row.name].cosine) if row.name in accumulated else None,
            "quant_sqnr_db": _finite(quant),
            "drop_db": _finite(drop),
        }
        table.append(entry)
        if first is None:
            if quant is not None and quant < config.min_quant_sqnr_db and row.post not in biases:
                first = {
                    "tensor": row.name,
                    "node": row.consumer,
                    "producer": row.producer,
                    "op": row.op,
                    "reason": "quantization",
                    "sqnr_db": _finite(quant),
                    "threshold": config.min_quant_sqnr_db,
                }
            elif drop is not None and drop > config.max_drop_db:
                first = {
                    "tensor": row.name,
                    "node": row.producer,
                    "producer": row.producer,
                    "op": row.op,
                    "reason": "drop",
                    "sqnr_db": _finite(sqnr),
                    "drop_db": _finite(drop),
                    "threshold": config.max_drop_db,
                }
    if first:
        log.warning(
            "first diverging layer: tensor '%s' at node '%s' (%s %.1f dB)",
            first["tensor"],
            first["node"],
            first["reason"],
            first["sqnr_db"],
        )
    return {"status": "compared", "criterion": CRITERION, "layers": table, "first_divergence": first}


def _drop(
    row: Row,
    by_q_name: dict[str, Row],
    q_producer: dict[str, onnx.NodeProto],
    accumulated: dict[str, PairStats],
    own: dict[str, PairStats],
) -> float | None:
    """Expected output SQNR (inputs' noise powers summed) minus the measured one, for one node output."""
    if row.name not in accumulated or row.pre is None or row.pre not in q_producer or row.clip is not None:
        return None
    node = q_producer[row.pre]
    if node.op_type not in LINEAR_OPS:
        return None
    noise, quantized = 0.0, False
    for name in node.input[:2]:  # the input and the weight; a bias's noise is relative to itself, not the output
        source = by_q_name.get(name)
        if source is None and name not in q_producer:
            continue  # a float initializer: exact in both models
        if source is None or (source.kind != "weight" and source.name not in accumulated):
            return None  # an input left unpaired: its noise is unknown, so is what the output should be
        if source.name in accumulated:
            noise += relative_noise(accumulated[source.name].sqnr_db)
        if name == source.post and source.name in own:
            noise += relative_noise(own[source.name].sqnr_db)
            quantized = True
    measured = accumulated[row.name].sqnr_db
    if math.isinf(measured):
        return None
    return noise_db(noise) - measured if quantized and noise > 0 else None


def _finite(value: float | None) -> float | None:
    """JSON has no inf: None for identical tensors, rounded otherwise."""
    return json_db(value)
