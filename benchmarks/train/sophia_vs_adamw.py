"""Sophia against AdamW through the real training loop (``train run``), side by side in one process.

    python benchmarks/train/sophia_vs_adamw.py                              # the MiniLM fine-tuning slice, 60 steps
    python benchmarks/train/sophia_vs_adamw.py --config deploy_opt/demo/train_digits.yaml --sophia-lrs 1e-3 3e-3

Every variant trains the same model from the same seed on the same batches. Reported per variant: the held-out
loss at the end, the optimizer state in bytes per parameter (fp32 and int8 state; the int8 rows set
``fp32_patterns: []`` so the embeddings are int8 too), and the median and mean step time (forward, backward,
the Hessian estimate every ``update_period`` steps for Sophia, and the optimizer step), with the ratio to AdamW's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run_variant(config_path: Path, overrides: list[str], out: Path) -> dict:
    from deploy_opt.train.config import load_train_config
    from deploy_opt.train.loop import train

    result = train(load_train_config(config_path, overrides), out, progress=False)
    events = [json.loads(line) for line in Path(result.log).read_text().splitlines()]
    params = next(e["parameters"] for e in events if e["event"] == "start")
    times = [e["step_time_s"] for e in events if e["event"] == "step"][1:]  # the first step warms up
    return {
        "overrides": overrides,
        "eval_loss": result.metrics["eval_loss"],
        "final_train_loss": result.final_loss,
        "state_bytes": result.optimizer_state_bytes,
        "bytes_per_param": result.optimizer_state_bytes / params,
        "median_step_s": statistics.median(times),
        "mean_step_s": statistics.fmean(times),
        "seconds": result.seconds,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, default=REPO / "deploy_opt/demo/train_minilm.yaml")
    parser.add_argument("--sophia-lrs", type=float, nargs="+", default=[2e-5, 5e-5, 1e-4])
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="applied to every variant")
    parser.add_argument("--json", type=Path, help="write the rows here too")
    args = parser.parse_args()
    base = list(args.overrides)
    int8 = ["optimizer.state=int8", "optimizer.fp32_patterns=[]"]
    variants = {
        "adamw fp32": ["optimizer.type=adamw", "optimizer.state=fp32"],
        "adamw int8": ["optimizer.type=adamw", *int8],
    }
    for lr in args.sophia_lrs:
        variants[f"sophia fp32 lr {lr:g}"] = ["optimizer.type=sophia", f"optimizer.lr={lr}", "optimizer.state=fp32"]
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        for i, (name, overrides) in enumerate(variants.items()):
            rows[name] = run_variant(args.config, base + overrides, Path(tmp) / str(i))
            print(f"{name}: eval_loss {rows[name]['eval_loss']:.4f}", file=sys.stderr)
        best = min((n for n in rows if n.startswith("sophia")), key=lambda n: rows[n]["eval_loss"])
        lr = best.rsplit(" ", 1)[1]
        rows[f"sophia int8 lr {lr}"] = run_variant(
            args.config, base + ["optimizer.type=sophia", f"optimizer.lr={lr}", *int8], Path(tmp) / "int8"
        )
    adamw = rows["adamw fp32"]
    print(
        f"{'variant':<24} {'eval_loss':>9} {'vs adamw':>9} {'B/param':>8} {'median step':>12} {'ratio':>6}"
        f" {'mean step':>10} {'ratio':>6}"
    )
    for name, row in rows.items():
        print(
            f"{name:<24} {row['eval_loss']:>9.4f} {row['eval_loss'] - adamw['eval_loss']:>+9.4f} "
            f"{row['bytes_per_param']:>8.2f} {row['median_step_s']:>11.3f}s "
            f"{row['median_step_s'] / adamw['median_step_s']:>6.2f} {row['mean_step_s']:>9.3f}s "
            f"{row['mean_step_s'] / adamw['mean_step_s']:>6.2f}"
        )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
