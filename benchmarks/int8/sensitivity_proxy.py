"""How well each one-pass sensitivity proxy predicts the exhaustive ranking, and what the report costs.

Not a test: run by hand. Two ``sensitivity`` runs of the same config (default: all-MiniLM-L6-v2,
``deploy_opt/demo/minilm.yaml``, profile ``ci``), each a full ``build`` with the analysis on and latency off:

* ``proxy+topk`` (the default mode): the wall time of the whole command, and the analysis's own timings
  (``timings_s`` in ``sensitivity.json``: proxy, exact evaluations of the top K);
* ``exhaustive``: every node's "only this node quantized" drop on the same seeded subset, the ranking the
  proxies are scored against.

It prints the Spearman rank correlation of each proxy with the exhaustive drops (higher is better):

* ``propagated``: the node's own quantization noise carried to the output through the Jacobian
  (``deploy_opt.analysis.sensitivity.noise``), what ``proxy+topk`` ranks by;
* ``local``: the SQNR of the node's quantized inputs alone (activation and weight noise combined);
* ``node output``: the node's output SQNR with only its own quantization (MatMul/Gemm with a weight);
* ``output in full INT8``: the node's output SQNR in the fully quantized model (upstream noise included).

and the top-K overlap, the share of the exhaustive top K that the proxy's top K holds.

    python benchmarks/int8/sensitivity_proxy.py
    python benchmarks/int8/sensitivity_proxy.py --config deploy_opt/demo/digits.yaml --subset 0.2
    python benchmarks/int8/sensitivity_proxy.py --config benchmarks/unseen/encoder.yaml  # BertModel, dynamo
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
PROXIES = {
    "propagated": "propagated_sqnr_db",
    "local": "local_sqnr_db",
    "node output": "node_sqnr_db",
    "output in full INT8": "sqnr_db",
}


def run_mode(config: Path, mode: str, subset: float, out: Path, extra: list[str]) -> tuple[dict, float]:
    """One ``sensitivity`` command (manual mode: both runs analyze the same Q/DQ model); record and wall time."""
    command = [
        sys.executable,
        "-m",
        "deploy_opt",
        "sensitivity",
        "--config",
        str(config),
        "--profile",
        "ci",
        "--mode",
        mode,
        "--output-dir",
        str(out),
        "--quiet",
        "--set",
        f"sensitivity.subset={subset}",
        "--set",
        "quantization.mode=manual",
        *[a for s in extra for a in ("--set", s)],
    ]
    started = time.perf_counter()
    subprocess.run(command, check=True, cwd=ROOT)
    wall = time.perf_counter() - started
    return json.loads(next(out.glob("*-sensitivity/sensitivity.json")).read_text()), wall  # the command's own folder


def spearman(a: list[float], b: list[float]) -> float:
    """Rank correlation (no ties expected in continuous measurements)."""
    rank = lambda v: np.argsort(np.argsort(np.asarray(v)))  # noqa: E731
    return float(np.corrcoef(rank(a), rank(b))[0, 1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, default=ROOT / "deploy_opt" / "demo" / "minilm.yaml")
    parser.add_argument("--set", action="append", default=[], help="a config override for both runs (repeatable)")
    parser.add_argument("--subset", type=float, default=0.1, help="evaluation subset of both runs (default 0.1)")
    parser.add_argument("--top-k", type=int, default=8)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="deploy_opt.sens_bench.") as tmp:
        topk, topk_wall = run_mode(args.config, "proxy+topk", args.subset, Path(tmp) / "topk", args.set)
        exhaustive, exhaustive_wall = run_mode(
            args.config, "exhaustive", args.subset, Path(tmp) / "exhaustive", args.set
        )
    nodes = exhaustive["nodes"]
    drops = [n["drop_both"] for n in nodes]
    worst = {n["name"] for n in sorted(nodes, key=lambda n: -n["drop_both"])[: args.top_k]}
    metric = exhaustive["metric"]
    print(f"# {args.config.name}: {len(nodes)} nodes, {metric['subset_samples']} samples, metric {metric['name']}")
    print(f"FP32 {metric['fp32']:.4f}, INT8 {metric['int8']:.4f}\n")
    print("| run | command wall s | proxy s | exact s |\n|---|---|---|---|")
    for name, record, wall in (("proxy+topk", topk, topk_wall), ("exhaustive", exhaustive, exhaustive_wall)):
        t = record["timings_s"]
        print(f"| {name} | {wall:.1f} | {t['proxy']:.1f} | {t['exact']:.1f} |")
    print(f"\n| proxy | Spearman vs exhaustive | top-{args.top_k} overlap |\n|---|---|---|")
    for label, key in PROXIES.items():
        values = [n["proxy"].get(key) for n in nodes]
        usable = [(d, v, n["name"]) for d, v, n in zip(drops, values, nodes, strict=True) if v is not None]
        if len(usable) < 3:
            print(f"| {label} | n/a | n/a |")
            continue
        rho = spearman([u[0] for u in usable], [-u[1] for u in usable])
        top = {u[2] for u in sorted(usable, key=lambda u: u[1])[: args.top_k]}
        print(f"| {label} ({len(usable)} nodes) | {rho:.3f} | {len(top & worst)}/{args.top_k} |")
    predicted = [n["proxy"].get("predicted_drop") for n in nodes]
    if all(p is not None for p in predicted):
        ratio = np.asarray(predicted) / np.maximum(np.asarray(drops), 1e-12)
        print(
            f"\npredicted / measured drop per node: median {np.median(ratio):.2f}, "
            f"10th-90th percentile {np.percentile(ratio, 10):.2f}-{np.percentile(ratio, 90):.2f}"
        )


if __name__ == "__main__":
    main()
