"""Importance method × per-layer rule × distillation settings, on one build config: metric before and after.

Each variant prunes a fresh copy of the model with the config's ``prune`` section (plus the variant's overrides),
distils it from the unpruned model on the calibration data, and scores it on the evaluation set (torch; against the
labels, or the unpruned model's output for cosine).

    python -m benchmarks.train.prune_variants minilm --set prune.ratio=0.3 --set prune.head_ratio=0.25 \
        --set prune.distill.steps=150 --variant method=taylor,per_layer=auto --variant method=magnitude
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging

from benchmarks.train.pruning import load_setup, pruned_copy
from deploy_opt.config.loader import parse_override
from deploy_opt.prune.distill import distill_student, score_model


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
        setup = load_setup(args.config, [*args.overrides, *extra], with_training_data=False)
        config = setup.config
        student = pruned_copy(setup, trainable=True)
        scored = setup.scored()
        row = {"variant": variant or "config", "pruned": score_model(student, *scored)}
        run = distill_student(student, setup.original, config.prune.distill, setup.data())
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
