"""Per-node INT8 sensitivity: which quantized nodes cost the accuracy.

For each quantizable node (the build's op types that read a DequantizeLinear in the Q/DQ model):
(a) only this node quantized (weights and activations), and the same split into (b) weight-only and
activation-only: the metric drop against FP32; (c) everything quantized except this node: the points it
recovers; (d) one-pass proxies. The one that ranks is linearised: the node's own quantization noise carried to
the model output through the Jacobian (``noise_propagation``), as an SQNR at the output and, for cosine, a
predicted drop. From ORT's ``qdq_loss_debug`` come the local quantization SQNR of the node's inputs (activation
noise combined with weight noise, the ranking proxy when the torch evaluator lacks an operator) and the node's
output SQNR and cosine against FP32 in the fully quantized model. Exact evaluations run on a seeded subset of
the evaluation data, on variants of the one Q/DQ model (``qdq_variants``), so they measure exactly the
deployed scales.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from deploy_opt.analysis.sensitivity.noise import predicted_drop, propagated_noise
from deploy_opt.analysis.sensitivity.record import NodeSensitivity, SensitivityRecord, SubsetMetric
from deploy_opt.analysis.sensitivity.variants import QuantizedNode, all_roles, make_variant, quantized_nodes
from deploy_opt.data.sources import Batch, select_rows
from deploy_opt.evaluation.metrics import Metric
from deploy_opt.evaluation.numerics import cosine_similarity, json_db, noise_db, power_db, relative_noise, sqnr_db
from dopt_common.files import scratch_dir
from dopt_common.ort import create_session

log = logging.getLogger(__name__)
PROXY_KEYS = ("propagated_sqnr_db", "predicted_drop", "local_sqnr_db", "node_sqnr_db", "sqnr_db", "cosine")


@dataclass(frozen=True)
class SubsetScorer:
    """Scores any variant of the model on a fixed evaluation subset against FP32 references."""

    batches: list[Batch]
    references: list[np.ndarray]
    metric: Metric
    threads: int

    def score(self, model: onnx.ModelProto | bytes) -> float:
        """The metric of ``model`` on the subset."""
        return float(np.mean(self.sample_scores(model)))

    def sample_scores(self, model: onnx.ModelProto | bytes) -> np.ndarray:
        """The metric of ``model`` per sample of the subset (the score is their mean)."""
        return self.scored(model)[0]

    def scored(self, model: onnx.ModelProto | bytes) -> tuple[np.ndarray, float]:
        """Per-sample metric scores and the output SQNR in dB against FP32 over the whole subset: a continuous
        fidelity that still ranks candidates where a coarse metric ties them (64 top-1 samples move in 1.56-point
        steps)."""
        data = model if isinstance(model, bytes) else model.SerializeToString()
        session = create_session(data, threads=self.threads, spin=False)  # its CPU time is the search's budget
        scores, signal, noise = [], 0.0, 0.0
        for batch, reference in zip(self.batches, self.references, strict=True):
            out = session.run(None, batch.inputs)[0]
            scores.append(np.ravel(self.metric.score(out, batch.label if batch.label is not None else reference)))
            if out.shape == reference.shape and np.issubdtype(out.dtype, np.floating):
                ref = reference.astype(np.float64).ravel()
                signal += float(ref @ ref)
                noise += float(((ref - out.astype(np.float64).ravel()) ** 2).sum())
        return np.concatenate(scores).astype(np.float64), power_db(signal, noise)


def pick_subset(batches: list[Batch], fraction: float, seed: int) -> list[Batch]:
    """A seeded ``fraction`` of the evaluation samples (at least one), keeping each batch's shapes."""
    total = sum(b.size for b in batches)
    count = max(1, round(total * fraction))
    return select_rows(batches, set(np.random.default_rng(seed).choice(total, size=count, replace=False).tolist()))


def analyzed_nodes(qdq: onnx.ModelProto, op_types: tuple[str, ...]) -> list[QuantizedNode]:
    """The quantized nodes of the configured op types, in graph order."""
    return [n for n in quantized_nodes(qdq) if n.op_type in op_types]


def proxy_key(proxy: Mapping[str, Any]) -> float | None:
    """The proxy that ranks, lower is more sensitive: the propagated SQNR, else the local SQNR of the node's
    inputs, else its output SQNR; None when the record has none of them."""
    return next(
        (proxy[k] for k in ("propagated_sqnr_db", "local_sqnr_db", "sqnr_db") if proxy.get(k) is not None), None
    )


def proxy_scores(
    fp32_path: Path, qdq_path: Path, nodes: list[QuantizedNode], batches: list[Batch]
) -> dict[str, dict[str, float]]:
    """One pass of the FP32 and the fully quantized model through ORT's ``qdq_loss_debug``."""
    from onnxruntime.quantization.calibrate import CalibrationDataReader
    from onnxruntime.quantization.qdq_loss_debug import (
        collect_activations,
        compute_weight_error,
        create_activation_matching,
        create_weight_matching,
        modify_model_output_intermediate_tensors,
    )

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.feeds = iter([b.inputs for b in batches])

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.feeds, None)

    op_types = sorted({n.op_type for n in nodes} | {"QuantizeLinear", "DequantizeLinear"})
    with scratch_dir("deploy_opt.analysis.sensitivity.analyze.") as tmp:
        qdq_aug, fp32_aug = Path(tmp) / "qdq.onnx", Path(tmp) / "fp32.onnx"
        modify_model_output_intermediate_tensors(str(qdq_path), str(qdq_aug), op_types, save_as_external_data=True)
        modify_model_output_intermediate_tensors(str(fp32_path), str(fp32_aug), op_types, save_as_external_data=True)
        qdq_acts = collect_activations(str(qdq_aug), Reader())
        fp32_acts = collect_activations(str(fp32_aug), Reader())
    matching = create_activation_matching(qdq_acts, fp32_acts)
    # Each quantized activation's own error, pre-Q vs post-DQ. ORT's compute_activation_error would also read
    # match["float"], which create_activation_matching leaves out for a tensor the FP32 graph lacks under that
    # name (torchvision's MobileNetV2 export: KeyError 'float'), so the one figure used is computed here.
    local = {
        name: {"qdq_err": _sqnr(match["pre_qdq"], match["post_qdq"])}
        for name, match in matching.items()
        if "pre_qdq" in match and "post_qdq" in match
    }
    weight_match = create_weight_matching(str(fp32_path), str(qdq_path))
    weights = compute_weight_error(weight_match, _sqnr)
    graph = {n.name: n for n in onnx.load(str(fp32_path), load_external_data=False).graph.node}
    scores = {}
    for node in nodes:
        noise = [
            relative_noise(local[i.float_name]["qdq_err"])
            for i in node.inputs
            if i.role == "activation" and i.float_name in local
        ]
        noise += [relative_noise(weights[node.weight])] if node.weight in weights else []
        output = node.outputs[0]
        entry = {"local_sqnr_db": noise_db(sum(noise))}  # +inf: no quantized input adds noise
        if output in qdq_acts and output in fp32_acts:
            entry["sqnr_db"] = _sqnr(fp32_acts[output], qdq_acts[output])
            entry["cosine"] = _cosine(fp32_acts[output], qdq_acts[output])
        entry["macs"] = _macs(node, fp32_acts)
        entry["node_sqnr_db"] = _node_output_sqnr(node, graph.get(node.name), matching, weight_match)
        scores[node.name] = entry
    return scores


def _node_output_sqnr(node: QuantizedNode, proto: onnx.NodeProto | None, matching: dict, weights: dict) -> float | None:
    """The node's own output SQNR: float input × float weight vs quantized input × dequantized weight.

    Both sides take the quantized model's pre-Q input, so only this node's quantization is in it: the noise the
    node adds, as its weights shape it. For MatMul/Gemm with a weight (``qdq_loss_debug`` saves tensors
    flattened, so the input is reshaped to rows of the weight's input width); None otherwise.
    """
    if proto is None or node.op_type not in ("MatMul", "Gemm") or node.weight not in weights:
        return None
    activation = next((q for q in node.inputs if q.role == "activation"), None)
    if activation is None or activation.float_name not in matching:
        return None
    trans_b = proto.op_type == "Gemm" and any(a.name == "transB" and a.i for a in proto.attribute)
    w_float, w_deq = weights[node.weight]["float"], weights[node.weight]["dequantized"]
    if trans_b:
        w_float, w_deq = w_float.T, w_deq.T
    width = w_float.shape[0]
    pre = [np.reshape(a, (-1, width)) for a in matching[activation.float_name]["pre_qdq"]]
    post = [np.reshape(a, (-1, width)) for a in matching[activation.float_name]["post_qdq"]]
    return _sqnr([a @ w_float for a in pre], [a @ w_deq for a in post])


def _flat(arrays: Any) -> np.ndarray:
    # one array, or a list of them; ORT dequantizes a 0-d weight (a scalar Mul constant) to a numpy scalar
    arrays = [arrays] if isinstance(arrays, (np.ndarray, np.generic, float, int)) else arrays
    return np.concatenate([np.asarray(a, dtype=np.float64).ravel() for a in arrays])


def _sqnr(x: Any, y: Any) -> float:
    return sqnr_db(_flat(x), _flat(y))


def _cosine(x: Any, y: Any) -> float:
    return cosine_similarity(_flat(x), _flat(y))


def _recorded(key: str, value: Any) -> Any:
    """A proxy as sensitivity.json stores it: dB figures through ``json_db`` (+inf, no noise, is null)."""
    return json_db(value, digits=None) if key.endswith("_db") else value


def _macs(node: QuantizedNode, activations: dict[str, list[np.ndarray]]) -> int:
    """Multiply-accumulates per evaluated subset: output elements × the reduction length."""
    out = activations.get(node.outputs[0])
    first = activations.get(node.inputs[0].float_name) if node.inputs else None
    if not out or not first:
        return 0
    elements = sum(int(np.asarray(a).size) for a in out)
    if node.op_type in ("MatMul", "Gemm"):
        return elements * int(np.asarray(first[0]).shape[-1])
    return elements


@dataclass(frozen=True)
class _Shared:
    """What every per-node task reads: both models (serialized) and the scorer; shipped to workers once."""

    qdq: bytes
    fp32: bytes
    scorer: SubsetScorer
    full: dict[str, set[str]]


def _score_node(
    qdq: onnx.ModelProto, fp32: onnx.ModelProto, scorer: SubsetScorer, full: dict[str, set[str]], node: QuantizedNode
) -> tuple[float, float, float, float]:
    """The subset metric with the node's both roles, weight only, activation only, and all but the node quantized."""
    both = scorer.score(make_variant(qdq, fp32, {node.name: node.roles}))
    weight = scorer.score(make_variant(qdq, fp32, {node.name: {"weight", "bias"} & node.roles}))
    act = scorer.score(make_variant(qdq, fp32, {node.name: {"activation"}}))
    rest = scorer.score(make_variant(qdq, fp32, {**full, node.name: set()}))
    return both, weight, act, rest


def _node_scores(shared: _Shared, node: QuantizedNode) -> tuple[float, float, float, float]:
    """``_score_node`` in a worker: the models are parsed from the shared bytes."""
    qdq, fp32 = onnx.ModelProto(), onnx.ModelProto()
    qdq.ParseFromString(shared.qdq)
    fp32.ParseFromString(shared.fp32)
    return _score_node(qdq, fp32, shared.scorer, shared.full, node)


def _exact_scores(
    qdq: onnx.ModelProto, fp32: onnx.ModelProto, scorer: SubsetScorer, exact: list, progress: Any, executor: Any
) -> list[tuple[float, float, float, float]]:
    """``_score_node`` of each exact node: here with a progress bar, or as tasks of ``executor``."""
    full = all_roles(quantized_nodes(qdq))
    if executor is None:
        return [_score_node(qdq, fp32, scorer, full, node) for node in progress(exact)]
    from dopt_common.executor import scatter

    shared = _Shared(qdq.SerializeToString(), fp32.SerializeToString(), scorer, full)
    return scatter(executor, _node_scores, shared, list(exact))


def analyze(
    fp32_path: Path,
    qdq_path: Path,
    scorer: SubsetScorer,
    op_types: tuple[str, ...],
    mode: str,
    top_k: int,
    progress: Callable[[Any], Any] = lambda it: it,
    executor: Any = None,
) -> SensitivityRecord:
    """The sensitivity record (``sensitivity.json``): metrics, per-node proxies and exact drops, ranking."""
    started = time.perf_counter()
    fp32, qdq = onnx.load(str(fp32_path)), onnx.load(str(qdq_path))
    nodes = analyzed_nodes(qdq, op_types)
    base_fp32, base_int8 = scorer.score(fp32), scorer.score(qdq)
    proxies = proxy_scores(fp32_path, qdq_path, nodes, scorer.batches)
    metric = scorer.metric.name
    for name, noise in (propagated_noise(fp32, qdq, nodes, scorer.batches, metric) or {}).items():
        proxies[name].update(propagated_sqnr_db=noise_db(noise), predicted_drop=predicted_drop(metric, noise))
    proxy_time = time.perf_counter() - started
    by_proxy = sorted(nodes, key=lambda n: proxy_key(proxies[n.name]))
    exact = {"exhaustive": nodes, "proxy": [], "proxy+topk": by_proxy[:top_k]}[mode]
    drop = scorer.metric.drop
    results: dict[str, dict[str, float]] = {}
    scores = _exact_scores(qdq, fp32, scorer, exact, progress, executor)
    for node, (both, weight, act, rest) in zip(exact, scores, strict=True):
        results[node.name] = {
            "drop_both": drop(base_fp32, both),
            "drop_weight_only": drop(base_fp32, weight) if node.weight else None,
            "drop_activation_only": drop(base_fp32, act),
            "recovered_all_but": drop(base_int8, rest) * -1,
        }
    total_macs = sum(p["macs"] for p in proxies.values()) or 1
    ranked = sorted(
        nodes,
        key=lambda n: (
            n.name not in results,
            -(results.get(n.name, {}).get("drop_both") or 0.0),
            proxy_key(proxies[n.name]),
        ),
    )
    rank = {n.name: i + 1 for i, n in enumerate(ranked)}
    fp32_shapes = {i.name: list(i.dims) for i in fp32.graph.initializer}
    return SensitivityRecord(
        metric=SubsetMetric(
            name=scorer.metric.name,
            higher_is_better=scorer.metric.higher_is_better,
            fp32=base_fp32,
            int8=base_int8,
            subset_samples=sum(b.size for b in scorer.batches),
        ),
        mode=mode,
        top_k=top_k,
        proxy="linearised" if any("propagated_sqnr_db" in p for p in proxies.values()) else "local",
        nodes=tuple(
            NodeSensitivity(
                name=n.name,
                op_type=n.op_type,
                order=n.order,
                weight_shape=fp32_shapes.get(n.weight) if n.weight else None,
                macs=proxies[n.name]["macs"],
                mac_share=proxies[n.name]["macs"] / total_macs,
                proxy={k: _recorded(k, proxies[n.name].get(k)) for k in PROXY_KEYS},
                drop_both=results.get(n.name, {}).get("drop_both"),
                drop_weight_only=results.get(n.name, {}).get("drop_weight_only"),
                drop_activation_only=results.get(n.name, {}).get("drop_activation_only"),
                recovered_all_but=results.get(n.name, {}).get("recovered_all_but"),
                rank=rank[n.name],
                exact=n.name in results,
            )
            for n in nodes
        ),
        timings_s={"proxy": round(proxy_time, 2), "exact": round(time.perf_counter() - started - proxy_time, 2)},
    )
