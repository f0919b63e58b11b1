"""Pruning + distillation against distillation alone into the same smaller architecture trained from scratch.

Both students have exactly the pruned shape and get the same distillation (steps, lr, data, teacher); the only
difference is the start: the pruned weights, or a fresh initialisation (which also trains its batch-norm statistics,
and gets a second run with 4x the steps). Metric on the build's evaluation set,
against labels (top1) or the unpruned model's output (cosine), in torch.

    python -m benchmarks.train.prune_vs_scratch benchmarks/unseen/cnn.yaml --set prune.ratio=0.3
    python -m benchmarks.train.prune_vs_scratch benchmarks/unseen/encoder.yaml --set prune.ratio=0.3 \
        --set prune.head_ratio=0.25
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import logging

import torch

from benchmarks.train.pruning import load_setup, pruned_copy
from deploy_opt.prune.distill import distill_student, score_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config")
    parser.add_argument("--set", action="append", default=[], dest="overrides")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    setup = load_setup(args.config, args.overrides, with_training_data=True)
    config, original = setup.config, setup.original
    pruned = pruned_copy(setup, trainable=False)
    scratch = copy.deepcopy(pruned)
    torch.manual_seed(config.seed)  # the fresh start is reproducible
    for module in scratch.modules():
        if hasattr(module, "reset_parameters"):
            module.reset_parameters()
    scored = setup.scored()
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
        run = distill_student(student, original, distill, setup.data(), fresh=fresh)
        results[name] = score_model(student.eval(), *scored)
        results[f"{name} seconds"] = round(run.seconds, 1)
    print(
        json.dumps({"metric": setup.metric.name, "samples": sum(b.size for b in setup.evaluation)} | results, indent=1)
    )


if __name__ == "__main__":
    main()
