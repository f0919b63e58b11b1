"""Peak memory of ``quantize-llm`` with layer-wise onloading, on synthetic bf16 Llamas of growing depth.

    python benchmarks/llm/onload.py [--layers 4 8 16 22] [--memory-layers 4] [--method rtn] [--eval-tokens 1024]

Each model is a random Llama (hidden 2048, intermediate 5632, vocab 32000: TinyLlama's shape, 22 layers is
2.5 GB in bf16) written shard by shard by ``tests/tiny_llama.py:make_synthetic_llama`` into ``--work`` (never
committed). Each run is a fresh ``python -m deploy_opt quantize-llm`` whose peak RSS comes from ``os.wait4``
(the kernel's ru_maxrss of that child). The table compares it with the working set the design promises: one
float32 decoder layer, its Hessians and activations (calibration samples and perplexity windows, float32) +
float32 embeddings and lm_head + 1 GiB. ``--memory-layers N`` also runs the in-memory path on the N-layer model,
for contrast. Also reported: the engine's seconds per decoder layer (the report's quantization section).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HIDDEN, INTERMEDIATE, VOCAB, SEQ = 2048, 5632, 32000, 512
GIB = 1024**3


def cpu_flags() -> str:
    try:
        flags = next(line for line in open("/proc/cpuinfo") if line.startswith("flags")).split()
    except (OSError, StopIteration):
        return platform.processor()
    wanted = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16")
    return " ".join(f for f in wanted if f in flags)


def make_model(work: Path, layers: int) -> Path:
    sys.path.insert(0, str(ROOT / "tests"))
    import tiny_llama

    folder = work / f"synthetic-{layers}"
    if not (folder / "config.json").is_file():
        tiny_llama.make_synthetic_llama(folder, hidden=HIDDEN, intermediate=INTERMEDIATE, layers=layers, vocab=VOCAB)
    return folder


def working_set(samples: int, eval_tokens: int) -> int:
    """One layer's working set (float32 weights, the Hessians of its four distinct inputs and their normalised
    copies, the activations) + float32 embeddings and lm_head + 1 GiB."""
    layer = 4 * (4 * HIDDEN * HIDDEN + 3 * HIDDEN * INTERMEDIATE)
    hessians = 2 * 4 * (3 * HIDDEN * HIDDEN + INTERMEDIATE * INTERMEDIATE)
    resident = 4 * 2 * VOCAB * HIDDEN
    activations = 4 * HIDDEN * (samples * SEQ + eval_tokens) + 4 * INTERMEDIATE * SEQ * 4
    return layer + hessians + resident + activations + GIB


def run(folder: Path, onload: str, args: argparse.Namespace, out: Path) -> dict:
    name = f"{folder.name}-{onload}"
    command = [sys.executable, "-m", "deploy_opt", "-q", "quantize-llm", "--path", str(folder), "--onload", onload]
    command += ["--method", args.method, "--group-size", "128", "--samples", str(args.samples)]
    command += ["--max-seq-len", str(SEQ), "--eval-tokens", str(args.eval_tokens), "--generations", "1"]
    command += ["--name", name, "--output-dir", str(out)]
    start = time.perf_counter()
    child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    _, status, usage = os.wait4(child.pid, 0)
    seconds = time.perf_counter() - start
    stderr = child.stderr.read() if child.stderr else ""
    if status != 0:
        return {"model": folder.name, "onload": onload, "error": stderr.strip().splitlines()[-1:]}
    report = json.loads((out / name / "quantize_report.json").read_text())
    engine = report["quantization"]
    layers = int(folder.name.rsplit("-", 1)[1])
    return {
        "model": folder.name,
        "layers": layers,
        "onload": onload,
        "bf16_gib": sum(p.stat().st_size for p in folder.glob("*.safetensors")) / GIB,
        "peak_rss_gib": usage.ru_maxrss * 1024 / GIB,
        "wall_s": seconds,
        "engine_s_per_layer": engine["seconds"] / layers,
        "ppl": [report["perplexity"]["original"]["ppl"], report["perplexity"]["quantized"]["ppl"]],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, nargs="+", default=[4, 8, 16, 22])
    parser.add_argument("--memory-layers", type=int, default=4, help="also run onload memory here (0: never)")
    parser.add_argument("--method", default="rtn", choices=("rtn", "gptq", "awq"))
    parser.add_argument("--samples", type=int, default=512, help="calibration samples (RTN walks 8 of them)")
    parser.add_argument("--eval-tokens", type=int, default=1024)
    parser.add_argument("--work", type=Path, default=Path("/tmp/deploy_opt_onload"))
    parser.add_argument("--output", type=Path, default=Path("reports/llm_onload.json"))
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    rows = []
    for layers in args.layers:
        folder = make_model(args.work, layers)
        modes = ["layers", "memory"] if layers == args.memory_layers else ["layers"]
        for onload in modes:
            rows.append(run(folder, onload, args, args.work / "runs"))
            print(json.dumps(rows[-1]), flush=True)
    walked = 8 if args.method == "rtn" else args.samples
    budget = working_set(walked, args.eval_tokens) / GIB
    print(f"\nCPU: {platform.processor() or platform.machine()} ({cpu_flags()}), {os.cpu_count()} cores")
    print(f"method {args.method}, group 128; budget = 1 layer's working set + fp32 embeddings/lm_head + 1 GiB")
    print("| layers | bf16 GiB | onload | peak RSS GiB | budget GiB | wall s | engine s/layer | ppl before → after |")
    print("|---:|---:|---|---:|---:|---:|---:|---|")
    for row in rows:
        if "error" in row:
            print(f"| {row['model']} | - | {row['onload']} | failed: {row['error']} | | | | |")
            continue
        before, after = row["ppl"]
        print(
            f"| {row['layers']} | {row['bf16_gib']:.2f} | {row['onload']} | {row['peak_rss_gib']:.2f} | {budget:.2f} | "
            f"{row['wall_s']:.0f} | {row['engine_s_per_layer']:.1f} | {before:.1f} → {after:.1f} |"
        )
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps({"cpu": cpu_flags(), "budget_gib": budget, "rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
