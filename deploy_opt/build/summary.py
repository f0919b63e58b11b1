"""The metrics, targets and sensitivity sections of build.json, from the stage results."""

from __future__ import annotations

import math
from typing import Any

from deploy_opt.build.runtime import Runtimes
from deploy_opt.build.splits import EvaluationSplit
from deploy_opt.config.build import DeployConfig
from deploy_opt.evaluation.evaluate import Evaluation
from deploy_opt.evaluation.metrics import Metric
from deploy_opt.evaluation.uncertainty import drop_interval, resolution
from dopt_common.errors import NumericsError


def metric_record(metric: Metric, runtimes: Runtimes, labelled: bool, split: EvaluationSplit | None = None) -> dict:
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
    record = {
        "name": metric.name,
        "higher_is_better": metric.higher_is_better,
        "samples": scores.samples,
        "reference": "labels" if labelled else f"{runtimes.reference} output",
        **scores.values,
        "drop": metric.drop(scores.values[base], scores.values["ort_int8"]),
        "drop_vs": base,
        **_uncertainty(scores, base),
    }
    if base != "ort_fp32":
        record["drop_pruned_fp32"] = metric.drop(scores.values[base], scores.values["ort_fp32"])
    if "ort_int8_no_fallback" in scores.values:
        record["drop_no_fallback"] = metric.drop(scores.values[base], scores.values["ort_int8_no_fallback"])
    if split is not None:
        record["split"] = split.how
    decided = runtimes.decision
    if decided is not None:
        record["decision"] = {
            "samples": decided.samples,
            **{k: decided.values[k] for k in (base, "ort_int8")},
            "drop": metric.drop(decided.values[base], decided.values["ort_int8"]),
            **_uncertainty(decided, base),
        }
    return record


def _uncertainty(scores: Evaluation, base: str) -> dict[str, Any]:
    """The drop's paired 95% bootstrap interval and the resolution (None: a continuous score)."""
    a, b = scores.per_sample.get(base), scores.per_sample.get("ort_int8")
    if a is None or b is None or a.size == 0 or a.size != b.size:
        return {}
    interval = drop_interval(a, b, scores.higher_is_better)
    step = resolution([a, b], right_or_wrong=scores.metric == "top1")
    return {"drop_ci95": [interval.low, interval.high], "resolution": step}


def target_status(deploy: DeployConfig, backends: dict[str, Any]) -> dict[str, str]:
    """One line per deploy target: what was built for it, or why not."""
    status = {}
    for target in deploy.targets:
        if target == "ort-cpu":
            status[target] = "built: model.int8.onnx (ONNX Runtime CPU, Q/DQ)"
        elif target == "ort-cuda":
            status[target] = "built: model.int8.onnx runs on ORT CUDA as is (compare.json says whether it ran here)"
        else:
            status[target] = (backends.get("tensorrt") or {}).get("status", "tensorrt: not attempted")
    return status


def sensitivity_summary(record: dict[str, Any] | None) -> dict[str, Any] | None:
    """The top of the ranking for build.json; the whole analysis is in sensitivity.json."""
    if record is None:
        return None
    top = sorted(record["nodes"], key=lambda n: n["rank"])[:10]
    return {
        "mode": record["mode"],
        "metric": record["metric"],
        "timings_s": record["timings_s"],
        "files": ["sensitivity.json", "sensitivity.png", "sensitivity.html"],
        "top": [{k: n[k] for k in ("rank", "name", "op_type", "drop_both", "proxy")} for n in top],
    }
