"""The prune stage: structured pruning of the torch model, distillation from the unpruned model, ``pruned.pt``.

It runs before export when ``prune`` is on. The original model stays the build's reference: the evaluate stage
scores it (torch, and its ONNX export as ``ort_fp32_original``), the drop the gate judges is measured from it, and
the benchmark times it beside the pruned FP32 and INT8 models. :func:`stage_table` then puts the four stages
(original, pruned, distilled, INT8) side by side for build.json, ``summary.md`` and ``prune.png``.
"""

from __future__ import annotations

import copy
import logging
import shutil
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from deploy_opt.config.prune import PruneConfig
from deploy_opt.distill.loop import curve_batches
from deploy_opt.prune.checkpoint import save_pruned
from deploy_opt.prune.distill import DistillData, distill_student, reference_targets, run_model, score_model
from deploy_opt.prune.importance import choose_importance, clear_gradients, ordered_tensors
from deploy_opt.prune.structure import prune_structure, torch_pruning
from deploy_opt.stages.runtime import BenchmarkRecord
from deploy_opt.stages.summary import MetricsRecord

log = logging.getLogger(__name__)
ORIGINAL_DIR = "original"  # the unpruned model's ONNX export, in the staging folder until the benchmark is done


@dataclass(frozen=True)
class PrunedModel:
    """The pruned, distilled student, the unpruned original (the reference) and the build.json ``prune`` record."""

    model: Any
    original: Any
    info: dict[str, Any]


def prune_model(
    prune: PruneConfig,
    factory: str,
    original: Any,
    data: DistillData,
    stage: Path,
    seed: int = 0,
    progress: bool = True,
) -> PrunedModel:
    """Prune a copy of ``original`` as ``prune`` says, distil it from ``original``, save ``stage/pruned.pt``.

    ``data.batches``: the training data (the calibration sample, plus ``data.train``); ``data.evaluation``: the
    evaluation set, whose first samples give each stage's metric against the original (torch).
    """
    names, batches, evaluation, metric = data.names, data.batches, data.evaluation, data.metric
    example = ordered_tensors(batches[0].head(2).inputs, names)
    original = original.eval()
    student = copy.deepcopy(original)
    for p in student.parameters():
        p.requires_grad_(True)
    importance = choose_importance(prune.method, student, batches, lambda m, x: run_model(m, x, names), seed)
    cuts, _ = prune_structure(student, example, prune, importance)
    clear_gradients(student)
    sample = curve_batches(evaluation)
    scored = (sample, reference_targets(original, sample, names), metric, names)
    stages = {"original": _measure(original, example, scored)}
    stages["pruned"] = _measure(student, example, scored)
    training = None
    if prune.distill.steps:
        training = distill_student(student, original, prune.distill, data, seed, progress)
        stages["distilled"] = _measure(student, example, scored)
    cut_rows = [asdict(c) | {"ratio": round(c.ratio, 4)} for c in cuts]
    save_pruned(stage / "pruned.pt", factory, original, student, {"cuts": cut_rows})
    _log_cuts(cuts, stages)
    info = {
        "method": prune.method,
        "per_layer": prune.per_layer,
        "ratio": prune.ratio,
        "head_ratio": prune.heads,
        "targets": list(prune.targets),
        "removed": _removed(cuts),
        "cuts": cut_rows,
        "stages_torch": stages,
        "torch_metric_samples": sum(b.size for b in sample),
        "training": None if training is None else training.to_json(),
        "checkpoint": "pruned.pt (torch.load(weights_only=True); rebuild: deploy_opt.prune.checkpoint.load_pruned)",
    }
    return PrunedModel(student.eval(), original, info)


def _measure(model: Any, example: Sequence[Any], scored: tuple) -> dict[str, Any]:
    """Parameters, MACs (one sample) and the metric (``scored``: the arguments of ``score_model`` after it)."""
    params = sum(p.numel() for p in model.parameters())
    try:
        macs, _ = torch_pruning().utils.count_ops_and_params(model, tuple(t[:1] for t in example))
        macs = int(macs)
    except Exception as exc:  # noqa: BLE001 (the op counter is best effort; the build does not depend on it)
        log.warning("prune: MACs not counted (%s)", exc)
        macs = None
    return {"params": int(params), "macs": macs, "metric": score_model(model, *scored)}


def _removed(cuts: Sequence[Any]) -> dict[str, dict[str, Any]]:
    """Per kind (ffn, heads, channels): units before and after, and the share removed."""
    out: dict[str, dict[str, Any]] = {}
    for cut in cuts:
        row = out.setdefault(cut.kind, {"before": 0, "after": 0, "layers": 0})
        row["before"] += cut.before
        row["after"] += cut.after
        row["layers"] += 1
    for row in out.values():
        row["ratio"] = round(1 - row["after"] / row["before"], 4)
    return out


def _log_cuts(cuts: Sequence[Any], stages: dict[str, Any]) -> None:
    for kind, row in _removed(cuts).items():
        log.info(
            "prune: %s %d → %d (%.1f%% removed over %d layers)",
            kind,
            row["before"],
            row["after"],
            100 * row["ratio"],
            row["layers"],
        )
    log.info("prune: %s", ", ".join(f"{k} {v['params']:,} params, metric {v['metric']}" for k, v in stages.items()))


def stage_table(
    info: dict[str, Any], metrics: MetricsRecord, bench: BenchmarkRecord | None, sizes: dict[str, int]
) -> list[dict[str, Any]]:
    """One row per stage (original, pruned, distilled, INT8): size, parameters, MACs, latency and metric.

    Latency and the ORT metric are the benchmark's and the evaluate stage's (the whole evaluation set, against the
    original); the pruned stage's metric is torch's on the first evaluation samples (it has no ONNX model).
    """
    torch_stages = info["stages_torch"]
    batches = bench.batches if bench is not None else {}
    final = "distilled" if "distilled" in torch_stages else "pruned"
    session = {"original": "ort_fp32_original", final: "ort_fp32", "int8": "ort_int8"}
    rows = []
    for name in ("original", "pruned", "distilled", "int8"):
        base = torch_stages.get(final if name == "int8" else name)
        if base is None:
            continue
        key = session.get(name)
        rows.append(
            {
                "stage": name,
                "params": base["params"],
                "macs": base["macs"],
                "bytes": sizes.get(key),
                "metric_torch": None if name == "int8" else base["metric"],
                "metric_ort": metrics.scores.get(key) if key else None,
                "latency_ms": {
                    b: row.timings[key].median_ms for b, row in batches.items() if key and key in row.timings
                },
            }
        )
    return rows


@dataclass(frozen=True)
class PruneRecord:
    """The prune stage's record: what was cut and how (``info``), and the size/speed/metric table per stage."""

    info: dict[str, Any]
    stages: list[dict[str, Any]]

    def to_json(self) -> dict[str, Any]:
        """The build.json ``prune`` section."""
        return self.info | {"stages": self.stages}


def finish_prune(
    pruned: PrunedModel,
    metrics: MetricsRecord,
    bench: BenchmarkRecord | None,
    models: dict[str, Path],
    metric: str,
    stage: Path,
) -> PruneRecord:
    """The prune record with the stage table; draws ``prune.png``; drops the original's export."""
    from deploy_opt.report.prune_report import plot_prune

    sizes = {name: _file_bytes(path) for name, path in models.items()}
    record = PruneRecord(pruned.info, stage_table(pruned.info, metrics, bench, sizes))
    plot_prune(record.to_json(), metric, stage / "prune.png")
    shutil.rmtree(stage / ORIGINAL_DIR, ignore_errors=True)
    return record


def _file_bytes(path: Path) -> int:
    """An ONNX model's bytes on disk, its external data file included."""
    data = path.with_name(path.name + ".data")
    return path.stat().st_size + (data.stat().st_size if data.is_file() else 0)
