"""Importance method × per-layer rule × distillation settings, on one build config: metric before and after.

Each variant prunes a fresh copy of the model with the config's ``prune`` section (plus the variant's overrides),
distils it from the unpruned model on the calibration data, and scores it on the evaluation set (torch; against the
labels, or the unpruned model's output for cosine).

    python benchmarks/prune_variants.py minilm --set prune.ratio=0.3 --set prune.head_ratio=0.25 \
        --set prune.distill.steps=150 --variant method=taylor,per_layer=auto --variant method=magnitude
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import functools
import json
import logging

from deploy_opt.config.loader import parse_override
from deploy_opt.config.profiles import load_build_config
from deploy_opt.evaluation.metrics import resolve_metric
from deploy_opt.prune.distill import DistillData, distill_student, reference_targets, run_model, score_model
from deploy_opt.prune.importance import choose_importance, clear_gradients, ordered_tensors
from deploy_opt.prune.structure import prune_structure
from deploy_opt.stages.inputs import load_inputs


def _forward(model, inputs, names):
    return run_model(model, inputs, names)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config")
    parser.add_argument("--set", action="append", default=[], dest="overrides")
    parser.add_argument("--variant", action="append", default=[], help="key=value,... of the prune section")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    results = []
    for variant in args.variant or [""]:
        extra = [f"prune.{pair}" for pair in variant.split(",") if pair]
        for text in extra:
            parse_override(text)  # fail early on a malformed variant
        config, _ = load_build_config(args.config, None, [*args.overrides, *extra])
        inputs = load_inputs(config.model, config.data, config.calibration, config.export, config.base_dir)
        metric = resolve_metric(config.data.metric, config.base_dir)
        evaluation = inputs.evaluation(hold=True)
        names = [s.name for s in inputs.specs]
        train = list(inputs.calibration.batches)
        original = inputs.torch_model.eval()
        student = copy.deepcopy(original)
        for p in student.parameters():
            p.requires_grad_(True)
        forward = functools.partial(_forward, names=names)
        importance = choose_importance(config.prune.method, student, train, forward, 0)
        prune_structure(student, ordered_tensors(train[0].head(2).inputs, names), config.prune, importance)
        clear_gradients(student)
        scored = (evaluation, reference_targets(original, evaluation, names), metric, names)
        row = {"variant": variant or "config", "pruned": score_model(student, *scored)}
        run = distill_student(student, original, config.prune.distill, DistillData(names, train, evaluation, metric))
        row |= {
            "distilled": score_model(student.eval(), *scored),
            "seconds": round(run.seconds),
            "curve": run.metric,
            "prune": dataclasses.asdict(config.prune),
        }
        results.append(row)
        print(json.dumps({k: row[k] for k in ("variant", "pruned", "distilled", "seconds")}), flush=True)
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
