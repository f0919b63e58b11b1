"""SmolLM2-135M: the bare ``quantize-llm`` default beside a reference GPTQ (llm-compressor) on held-out license texts.

Not a test: run by hand (about 25 min on 2 CPU threads). The reference lives in its own venv
(``bash benchmarks/llm_reference_venv.sh``). Four license texts that the README names nowhere (neither its judge
split nor its license calibration), 16 windows of 512 tokens (``--eval-tokens 8192``):

    python benchmarks/llm_reference_gptq.py --out /tmp/ref-bench \\
        [--reference-python benchmarks/corpus/.cache/llmcompressor-venv/bin/python]

It runs ``run_quantize_llm`` with the defaults (awq-gptq, group 64, 128 windows of the mixed corpus, seed 0) and
``checks.reference_gptq``, and prints the report's reference section. Until ``checks.perplexity`` records
``window_nll`` itself, this script adds it (``_record_windows``) so that both intervals can be drawn.

Measured 2026-12-06 (Xeon, 2 threads shared with other work; llm-compressor 0.14.0.1, transformers 5.17.0 in its
venv; deploy_opt at this commit, transformers 5.25.0), texts GFDL-1.2, GPL-1, LGPL-2, CC0-1.0, 8,192 tokens:

    see RESULT below (filled in after the run)
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

TEXTS = tuple(f"/usr/share/common-licenses/{name}" for name in ("GFDL-1.2", "GPL-1", "LGPL-2", "CC0-1.0"))


def _record_windows() -> None:
    """Make ``checks.perplexity`` add per-window ``[summed NLL, tokens]`` (``window_nll``) when it does not yet."""
    from deploy_opt.llm import checks

    scored: list[list[float]] = []
    window_nll, perplexity = checks.window_nll, checks.perplexity

    def counting(*args, **kwargs):
        nll, count = window_nll(*args, **kwargs)
        scored.append([nll, count])
        return nll, count

    def recording(*args, **kwargs):
        scored.clear()
        record = perplexity(*args, **kwargs)
        return record if "window_nll" in record else {**record, "window_nll": list(scored)}

    checks.window_nll, checks.perplexity = counting, recording


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

    _record_windows()
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
