"""SmolLM2-135M: the bare ``quantize-llm`` default beside a reference GPTQ (llm-compressor) on held-out license texts.

Not a test: run by hand (63 min on 2 CPU threads shared with other work; less on a quiet machine). The
reference lives in its own venv (``bash benchmarks/llm/reference_venv.sh``). Four license texts that the README
names nowhere (neither its judge split nor its license calibration), 16 windows of 512 tokens
(``--eval-tokens 8192``):

    python benchmarks/llm/reference_gptq.py --out /tmp/ref-bench \\
        [--reference-python benchmarks/corpus/.cache/llmcompressor-venv/bin/python]

It runs ``run_quantize_llm`` with the defaults (awq-gptq, group 64, 128 windows of the mixed corpus, seed 0) and
``checks.reference_gptq``, and prints the report's reference section (both intervals come from the records'
``window_nll``).

Measured 2026-12-06 (2 CPU threads, load average 4-9 from other work; llm-compressor 0.14.0.1 with
compressed-tensors 0.19.0, transformers 5.17.0, torch 2.13.0+cpu in its venv; deploy_opt with transformers 5.25.0),
texts GFDL-1.2, GPL-1, LGPL-2, CC0-1.0, last 8,192 tokens, 16 windows of 512 (8,176 tokens scored), calibration
128 windows / 36,268 tokens of the mixed corpus (seed 0), both on those same windows:

    float perplexity                      19.646 (the reference's own scoring of the windows: identical, gap 0.0)
    deploy_opt awq-gptq g64 (default)     22.380  +13.91% (95% CI +10.51% to +17.84%)   quantize 1462 s
    llm-compressor GPTQ g64 act-order     28.774  +46.46% (95% CI +36.20% to +58.63%)   quantize 1130 s
    deploy_opt over reference, quantized  -22.2% (95% CI -25.7% to -18.6%): deploy_opt's default is the better one
    gate (limit +25%, interval's upper end): PASS; stability 0 of 8 flagged

The reference's +46% is far above the +11.8% that issue 57 quotes for "a reference GPTQ g64 with act-order" on
other license texts; not explained yet (see the report of the branch that added this script).
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

TEXTS = tuple(f"/usr/share/common-licenses/{name}" for name in ("GFDL-1.2", "GPL-1", "LGPL-2", "CC0-1.0"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="output root (a run folder lands inside)")
    parser.add_argument("--reference-python", default=None, help="a Python that has llmcompressor")
    parser.add_argument("--eval-tokens", type=int, default=8192)
    parser.add_argument("--texts", nargs="+", default=list(TEXTS))
    parser.add_argument("--seed", type=int, default=0, help="calibration sample seed")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")

    from deploy_opt.llm.config import load_llm_config
    from deploy_opt.llm.pipeline import run_quantize_llm
    from deploy_opt.llm.reference_gptq import reference_line

    checks = {"eval_texts": args.texts, "eval_tokens": args.eval_tokens, "reference_gptq": True}
    if args.reference_python:
        checks["reference_python"] = args.reference_python
    flags = {"name": f"smollm2-ref-seed{args.seed}", "checks": checks, "calibration": {"seed": args.seed}}
    config = load_llm_config(None, flags)
    start = time.perf_counter()
    result = run_quantize_llm(config, args.out, progress=False)
    record = result.report.sections["reference_gptq"]
    shown = {k: v for k, v in record.items() if k not in ("reference",)}
    shown["reference"] = {k: v for k, v in record.get("reference", {}).items() if "window_nll" not in k}
    shown["deploy_opt"] = {k: v for k, v in record.get("deploy_opt", {}).items() if "window_nll" not in k}
    print(json.dumps(shown, indent=1))
    print(reference_line(record))
    print(f"gate: {'PASS' if result.gate.passed else 'FAIL'}; {'; '.join(result.gate.lines())}")
    print(f"timings: {result.report.sections['timings_s']}; whole run {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
