"""FP32 vs INT8 latency of ONNX Runtime on this CPU, for the demo and the MiniLM transformer.

Not a test: run by hand. Each config is built with the given profile; FP32 and INT8 are timed interleaved in
the same loop (median of ``--repeats`` after warm-up), so the machine's noise hits both alike.

    python benchmarks/int8/latency.py                  # both configs, 200 repeats, 2 threads
    python benchmarks/int8/latency.py --configs deploy_opt/demo/digits.yaml --repeats 500
"""

from __future__ import annotations

import argparse
import logging
import tempfile
from pathlib import Path

from deploy_opt.config.profiles import example_config, load_build_config
from deploy_opt.pipeline.build import run_build


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--configs",
        nargs="+",
        type=Path,
        default=[example_config("digits"), example_config("minilm")],
    )
    parser.add_argument("--profile", default="cpu-server")
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch-sizes", default="1,32")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)

    rows = []
    with tempfile.TemporaryDirectory(prefix="deploy_opt.bench.") as tmp:
        for path in args.configs:
            overrides = [
                f"benchmark.repeats={args.repeats}",
                f"benchmark.threads={args.threads}",
                f"benchmark.batch_sizes=[{args.batch_sizes}]",
                "benchmark.warmup=20",
                "gate.min_speedup=null",
            ]
            config, profile = load_build_config(path, args.profile, overrides)
            build = run_build(config, profile, Path(tmp), progress=False).build.to_json()
            metric = build["metrics"]
            for size, row in build["benchmark"]["batches"].items():
                rows.append(
                    (
                        config.name,
                        size,
                        row["ort_fp32"]["median_ms"],
                        row["ort_int8"]["median_ms"],
                        row["speedup"],
                        metric["name"],
                        metric["ort_fp32"],
                        metric["ort_int8"],
                    )
                )
            shapes = build["benchmark"]["input_shapes"]
            print(
                f"# {config.name}: per-sample input shapes {shapes}, {args.threads} threads, "
                f"{build['quantization']['activations']} activations"
            )

    print(f"\n| model | batch | FP32 ms | INT8 ms | speedup | metric | FP32 | INT8 |   (median of {args.repeats})")
    print("|---|---:|---:|---:|---:|---|---:|---:|")
    for name, size, fp32, int8, speedup, metric, m_fp32, m_int8 in rows:
        print(
            f"| {name} | {size} | {fp32:.3f} | {int8:.3f} | {speedup:.2f}x | {metric} | {m_fp32:.2f} | {m_int8:.2f} |"
        )


if __name__ == "__main__":
    main()
