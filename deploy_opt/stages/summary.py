"""The metrics, targets and sensitivity sections of build.json, from the stage results."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from deploy_opt.analysis.compat import CUDA_QDQ_NOTE
from deploy_opt.analysis.sensitivity.record import SensitivityRecord
from deploy_opt.config.build import DeployConfig
from deploy_opt.evaluation.evaluate import Evaluation
from deploy_opt.evaluation.metrics import Metric
from deploy_opt.evaluation.uncertainty import drop_interval, resolution
from deploy_opt.report.record_sections import DecisionScores, DropUncertainty, MetricsRecord, Targets
from deploy_opt.stages.runtime import Runtimes
from deploy_opt.stages.splits import EvaluationSplit
from deploy_opt.stages.verify import Backends
from dopt_common.errors import NumericsError


def metric_record(
    metric: Metric, runtimes: Runtimes, labelled: bool, split: EvaluationSplit | None = None
) -> MetricsRecord:
    """Every runtime's score and the FP32 → INT8 drop (and the drop without fallback, when there is one), on the
    judged samples, with its paired interval and the metric's resolution; the same on the decision samples."""
    scores = runtimes.scores
    base = "ort_fp32_original" if "ort_fp32_original" in scores.values else "ort_fp32"  # a pruned build's original
    broken = {k: v for k, v in scores.values.items() if not math.isfinite(v)}
    if broken:  # a NaN drop passes or fails no comparison honestly: bad numbers, exit 2, not a gate verdict
        raise NumericsError(
            f"metric '{metric.name}' is {', '.join(f'{v} on {k}' for k, v in broken.items())}; the model's outputs "
            "(or the metric) produced NaN or Inf on the judged samples; fix: check the model and the data (a "
            "build with compare enabled names the first non-finite tensor in compare.json)"
        )
    values = scores.values
    decided = runtimes.decision
    return MetricsRecord(
        name=metric.name,
        higher_is_better=metric.higher_is_better,
        samples=scores.samples,
        reference="labels" if labelled else f"{runtimes.reference} output",
        scores=dict(values),
        drop=metric.drop(values[base], values["ort_int8"]),
        drop_vs=base,
        uncertainty=_uncertainty(scores, base),
        drop_pruned_fp32=metric.drop(values[base], values["ort_fp32"]) if base != "ort_fp32" else None,
        drop_no_fallback=(
            metric.drop(values[base], values["ort_int8_no_fallback"]) if "ort_int8_no_fallback" in values else None
        ),
        split=split.how if split is not None else None,
        decision=None if decided is None else _decision(metric, decided, base),
    )


def _decision(metric: Metric, decided: Evaluation, base: str) -> DecisionScores:
    return DecisionScores(
        samples=decided.samples,
        scores={k: decided.values[k] for k in (base, "ort_int8")},
        drop=metric.drop(decided.values[base], decided.values["ort_int8"]),
        uncertainty=_uncertainty(decided, base),
    )


def _uncertainty(scores: Evaluation, base: str) -> DropUncertainty | None:
    """The drop's paired 95% bootstrap interval and the resolution (None: no per-sample scores to pair)."""
    a, b = scores.per_sample.get(base), scores.per_sample.get("ort_int8")
    if a is None or b is None or a.size == 0 or a.size != b.size:
        return None
    interval = drop_interval(a, b, scores.higher_is_better)
    step = resolution([a, b], right_or_wrong=scores.metric == "top1")
    return DropUncertainty(interval.low, interval.high, step)


NOT_ATTEMPTED = "tensorrt: not attempted"


def target_status(deploy: DeployConfig, backends: Backends) -> Targets:
    """One line per deploy target: what was built for it, or why not."""
    status = {}
    for target in deploy.targets:
        if target == "ort-cpu":
            status[target] = "built: model.int8.onnx (ONNX Runtime CPU, Q/DQ)"
        elif target == "ort-cuda":
            status[target] = f"ships model.onnx (FP32): {CUDA_QDQ_NOTE}"
        else:
            engine = backends.artifacts.tensorrt
            status[target] = engine.status if engine is not None and engine.status is not None else NOT_ATTEMPTED
    return Targets(status)


@dataclass(frozen=True)
class SensitivitySummary:
    """The top of the sensitivity ranking for build.json; the whole analysis is in sensitivity.json."""

    mode: str
    metric: dict[str, Any]  # the subset metric: name, higher_is_better, fp32, int8, subset_samples
    timings_s: dict[str, float]
    top: tuple[dict[str, Any], ...]  # rank, name, op_type, drop_both, proxy of the ten most sensitive nodes
    files: tuple[str, ...] = ("sensitivity.json", "sensitivity.png", "sensitivity.html")

    def to_json(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "metric": self.metric,
            "timings_s": self.timings_s,
            "files": list(self.files),
            "top": list(self.top),
        }


def sensitivity_summary(record: SensitivityRecord | None) -> SensitivitySummary | None:
    """The ten most sensitive nodes of the analysis (None when it did not run)."""
    if record is None:
        return None
    top = record.ranked()[:10]
    return SensitivitySummary(
        mode=record.mode,
        metric=dataclasses.asdict(record.metric),
        timings_s=dict(record.timings_s),
        top=tuple(
            {"rank": n.rank, "name": n.name, "op_type": n.op_type, "drop_both": n.drop_both, "proxy": dict(n.proxy)}
            for n in top
        ),
    )
