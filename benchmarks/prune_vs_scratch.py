"""Pruning + distillation against distillation alone into the same smaller architecture trained from scratch.

Both students have exactly the pruned shape and get the same distillation (steps, lr, data, teacher); the only
difference is the start: the pruned weights, or a fresh initialisation (which also trains its batch-norm statistics,
and gets a second run with 4x the steps). Metric on the build's evaluation set,
against labels (top1) or the unpruned model's output (cosine), in torch.

    python benchmarks/prune_vs_scratch.py benchmarks/unseen/cnn.yaml --set prune.ratio=0.3
    python benchmarks/prune_vs_scratch.py benchmarks/unseen/encoder.yaml --set prune.ratio=0.3 \
        --set prune.head_ratio=0.25
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import logging

import torch

from deploy_opt.config.profiles import load_build_config
from deploy_opt.evaluation.metrics import resolve_metric
from deploy_opt.prune.distill import DistillData, distill_student, reference_targets, run_model, score_model
from deploy_opt.prune.importance import choose_importance, clear_gradients, ordered_tensors
from deploy_opt.prune.structure import prune_structure
from deploy_opt.stages.inputs import load_inputs, training_batches


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config")
    parser.add_argument("--set", action="append", default=[], dest="overrides")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    config, _ = load_build_config(args.config, None, args.overrides)
    inputs = load_inputs(config.model, config.data, config.calibration, config.export, config.base_dir)
    metric = resolve_metric(config.data.metric, config.base_dir)
    evaluation = inputs.evaluation(hold=True)
    names = [s.name for s in inputs.specs]
    train = [*inputs.calibration.batches, *training_batches(config.data, config.base_dir, inputs.specs)]
    original = inputs.torch_model.eval()
    example = ordered_tensors(train[0].head(2).inputs, names)
    pruned = copy.deepcopy(original)
    importance = choose_importance(config.prune.method, pruned, train, lambda m, x: run_model(m, x, names), 0)
    prune_structure(pruned, example, config.prune, importance)
    clear_gradients(pruned)
    scratch = copy.deepcopy(pruned)
    torch.manual_seed(config.seed)  # the fresh start is reproducible
    for module in scratch.modules():
        if hasattr(module, "reset_parameters"):
            module.reset_parameters()
    scored = (evaluation, reference_targets(original, evaluation, names), metric, names)
    results = {
        "original": score_model(original, *scored),
        "params_original": sum(p.numel() for p in original.parameters()),
        "params_student": sum(p.numel() for p in pruned.parameters()),
    }
    long = dataclasses.replace(config.prune.distill, steps=4 * config.prune.distill.steps)
    runs = (
        ("pruned+distilled", pruned, config.prune.distill, False),
        ("scratch+distilled", scratch, config.prune.distill, True),
        ("scratch+distilled 4x steps", copy.deepcopy(scratch), long, True),
    )
    for name, student, distill, fresh in runs:
        results[f"{name} before"] = score_model(student, *scored)
        run = distill_student(student, original, distill, DistillData(names, train, evaluation, metric), fresh=fresh)
        results[name] = score_model(student.eval(), *scored)
        results[f"{name} seconds"] = round(run.seconds, 1)
    print(json.dumps({"metric": metric.name, "samples": sum(b.size for b in evaluation)} | results, indent=1))


if __name__ == "__main__":
    main()
