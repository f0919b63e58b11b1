"""QAT with fp32-state AdamW against deploy_opt's Int8AdamW, on one build config, side by side in one run.

    python benchmarks/train/qat_optimizers.py benchmarks/unseen/textrec.yaml --set quantization.mode=manual \\
        --set quantization.qat.steps=150 --set quantization.qat.batch_size=8

Each optimizer gets the same build (same calibration, same PTQ start, same seed), with
``quantization.qat.enabled=true``, and benchmarking off (the builds differ only in QAT's optimizer state).
The table gives, per optimizer, the held-out metric and drop of the QAT model (ORT), the validation metric
and loss of the checkpoint it kept, the steps and the training time. Reports land under ``--output-dir``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

OPTIMIZERS = ("adamw", "int8adamw")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config")
    parser.add_argument("--set", action="append", default=[], dest="overrides")
    parser.add_argument("--output-dir", default="benchmarks/.cache/qat_optimizers")
    args = parser.parse_args()
    rows = []
    for optimizer in OPTIMIZERS:
        out = Path(args.output_dir) / optimizer
        sets = [
            *args.overrides,
            "quantization.qat.enabled=true",
            f"quantization.qat.optimizer={optimizer}",
            "benchmark.enabled=false",
        ]
        command = [sys.executable, "-m", "deploy_opt", "build", args.config, "--output-dir", str(out), "-q"]
        for item in sets:
            command += ["--set", item]
        subprocess.run(command, check=False)
        build = json.loads(next(out.glob("*/build.json")).read_text())
        rows.append((optimizer, build["qat"]))
    print("| optimizer | QAT metric | QAT drop | PTQ drop | kept step | validation metric | steps | seconds |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for optimizer, qat in rows:
        train = qat["training"]
        kept = dict((s, v) for s, v in train["validation_metric"]).get(train["best_step"])
        start = qat["rows"].get("ptq_all_int8", qat["rows"]["ptq"])
        print(
            f"| {optimizer} | {qat['rows']['qat']['metric']:.3f} | {qat['rows']['qat']['drop']:.3f} | "
            f"{start['drop']:.3f} | {train['best_step']} | {kept:.3f} | {train['steps']} | {train['seconds']:.0f} |"
        )


if __name__ == "__main__":
    main()
