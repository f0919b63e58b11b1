"""Stage: sensitivity analysis, its report, and the fallback set for mixed precision.

Static fallback (the head by default, and listed patterns) is resolved before quantization; ``auto`` runs after
the fully quantized model exists, from the sensitivity ranking, and the pipeline then re-quantizes with the
chosen nodes excluded (ORT's own ``nodes_to_exclude``).
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

import onnx

from deploy_opt.analysis.sensitivity.analyze import SubsetScorer, analyze, pick_subset
from deploy_opt.analysis.sensitivity.fallback import (
    greedy_fallback,
    head_nodes,
    match_patterns,
    median_latency_ms,
    sensitivity_order,
)
from deploy_opt.analysis.sensitivity.heatmap import write_heatmap, write_html
from deploy_opt.analysis.sensitivity.record import SensitivityRecord
from deploy_opt.analysis.sensitivity.resolution import Resolution
from deploy_opt.analysis.sensitivity.variants import exclusion_variant
from deploy_opt.config.build import (
    DeployConfig,
    GateConfig,
    QuantizationConfig,
    RuntimeConfig,
    SensitivityConfig,
)
from deploy_opt.config.setup import QuantSetup
from deploy_opt.data.sources import Batch
from deploy_opt.evaluation.metrics import Metric
from dopt_common.files import write_json
from dopt_common.ort import create_session
from exporters.onnx.module_names import module_paths

log = logging.getLogger(__name__)


def static_fallback(quant: QuantizationConfig, deploy: DeployConfig, fp32_path: Path) -> tuple[str, ...]:
    """The head (unless ``keep_head`` is off) and the nodes that the fallback patterns name."""
    model = onnx.load(str(fp32_path), load_external_data=False)
    names = [n.name for n in model.graph.node if n.op_type in quant.op_types]
    chosen = list(quant.exclude_nodes)
    if quant.keep_head:
        chosen += [n for n in head_nodes(model, quant.op_types) if n not in chosen]
    if not isinstance(quant.fallback, str):
        modules = module_paths(model)  # patterns may name PyTorch modules as well as ONNX nodes
        chosen += [n for n in match_patterns(quant.fallback, names, modules) if n not in chosen]
    if "tensorrt" in deploy.targets:
        chosen += [n for n in activation_matmuls(model) if n not in chosen and n in names]
    return tuple(chosen)


def activation_matmuls(model: onnx.ModelProto) -> list[str]:
    """MatMuls of two computed tensors (attention's QK^T and AV): TensorRT targets keep them float.

    TensorRT fuses attention into its own fp16 kernel, which Q/DQ around these MatMuls breaks, and ModelOpt's
    ONNX PTQ leaves them unquantized for the same reason (its MHA pattern); their symmetric int8 inputs (a
    softmax in [0, 1] uses half the int8 codes) are also where a transformer loses most accuracy.
    """
    constants = {i.name for i in model.graph.initializer}
    constants |= {o for n in model.graph.node if n.op_type == "Constant" for o in n.output}
    return [n.name for n in model.graph.node if n.op_type == "MatMul" and not any(i in constants for i in n.input)]


def with_excluded(setup: QuantSetup, nodes: tuple[str, ...]) -> QuantSetup:
    """The setup whose quantization excludes ``nodes``."""
    return dataclasses.replace(setup, quantization=dataclasses.replace(setup.quantization, exclude_nodes=nodes))


def fp32_references(fp32_path: Path, batches: list[Batch], threads: int) -> list:
    """The FP32 model's first output on each batch: what a variant is scored against."""
    session = create_session(fp32_path, threads=threads, spin=False)  # its CPU time is budgeted work
    return [session.run(None, b.inputs)[0] for b in batches]


def task_executor(sens: Any) -> Any:
    """None (in-process, with a progress bar) for parallel 1 without an address, else Ray's executor."""
    if sens.parallel == 1 and sens.address is None and sens.gpus_per_task == 0:
        return None
    from dopt_common.executor import make_executor

    return make_executor(sens.parallel, sens.address, sens.gpus_per_task)


def run_sensitivity(
    sens: SensitivityConfig,
    quant: QuantizationConfig,
    gate: GateConfig,
    runtime: RuntimeConfig,
    models: tuple[Path, Path],
    evaluation: list[Batch],
    metric: Metric,
    stage: Path,
    *,
    seed: int,
    name: str,
) -> SensitivityRecord:
    """Analyze every quantized node of ``models`` (FP32, Q/DQ) on a subset of ``evaluation`` drawn with ``seed``, and
    write the three report files; ``name``: the build's, which the record carries."""
    from tqdm import tqdm

    (fp32_path, qdq_path), threads = models, runtime.threads
    subset = pick_subset(evaluation, sens.subset, seed)
    scorer = SubsetScorer(subset, fp32_references(fp32_path, subset, threads), metric, threads)
    progress = lambda nodes: tqdm(nodes, desc="sensitivity", unit="node", leave=False, disable=None)  # noqa: E731
    executor = task_executor(sens)
    try:
        op_types = quant.op_types
        analysis = analyze(fp32_path, qdq_path, scorer, op_types, sens.mode, sens.top_k, progress, executor)
    finally:
        if executor is not None:
            executor.close()
    resolution = Resolution(
        metric=metric.name,
        samples=sum(b.size for b in subset),
        drawn_from=sum(b.size for b in evaluation),
        subset=sens.subset,
        max_drop=gate.max_drop,
    )
    modules = module_paths(onnx.load(str(fp32_path), load_external_data=False))
    nodes = analysis.nodes
    if modules:  # the PyTorch module beside each ONNX name, where the exporter recorded it
        nodes = tuple(dataclasses.replace(n, module=modules.get(n.name, "")) for n in nodes)
    # A new record: the analysis itself is never mutated.
    record = dataclasses.replace(analysis, model=name, resolution=resolution.to_json(), nodes=nodes)
    write_sensitivity(record, stage)
    return record


def write_sensitivity(record: SensitivityRecord, folder: Path) -> None:
    """sensitivity.json, its heatmap (sensitivity.png) and its page (sensitivity.html) in ``folder``."""
    data = record.to_json()
    write_json(folder / "sensitivity.json", data)
    write_heatmap(data, folder / "sensitivity.png")
    write_html(data, folder / "sensitivity.png", folder / "sensitivity.html")


def auto_fallback(
    quant: QuantizationConfig,
    gate: GateConfig,
    runtime: RuntimeConfig,
    fp32_path: Path,
    qdq_path: Path,
    evaluation: list[Batch],
    metric: Metric,
    record: SensitivityRecord,
) -> dict[str, Any]:
    """Greedy fallback in sensitivity order until the gate's max_drop holds on the evaluation set."""
    threads = runtime.threads
    scorer = SubsetScorer(evaluation, fp32_references(fp32_path, evaluation, threads), metric, threads)
    fp32, qdq = onnx.load(str(fp32_path)), onnx.load(str(qdq_path))
    baseline = scorer.score(fp32)
    one = evaluation[0].head(1).inputs
    latency = median_latency_ms(lambda m: create_session(m.SerializeToString(), threads=threads), one)
    placement = "outputs" if quant.quantize_outputs else "inputs"
    search = greedy_fallback(
        sensitivity_order(record, quant.fallback_by),
        lambda excluded: exclusion_variant(qdq, fp32, quant.op_types, excluded, placement),
        scorer.score,
        baseline,
        metric.drop,
        gate.max_drop,
        latency,
    )
    log.info("fallback: %s", search.verdict)
    return {
        "met": search.met,
        "verdict": search.verdict,
        "nodes": list(search.excluded),
        "steps": search.steps,
        "by": quant.fallback_by,
    }
