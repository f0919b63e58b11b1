"""``quantize-llm``, top to bottom: model → stratified calibration text → perplexity (original) → W4A16
(GPTQ/AWQ/RTN, or torchao) → perplexity (quantized) and the stability run → checkpoint (reloaded and checked)
→ quantize_report.json → gate. Each stage is a plain function; this module only composes them.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deploy_opt.llm.config import LLMConfig
from deploy_opt.llm.run_common import (
    LoadedLLM,
    Measured,
    checkpoint_format,
    engine_settings,
    model_source,
    plan_scheme,
    select_texts,
    write_report,
)
from deploy_opt.llm.scheme import QuantScheme
from deploy_opt.llm.text_data import pydoc_texts
from deploy_opt.report.gate import GateResult
from deploy_opt.report.llm_report import LLMReport
from dopt_common.errors import OutputError
from dopt_common.files import ensure_writable_dir
from dopt_common.names import run_dir
from dopt_common.ownership import check_separate, check_target
from dopt_common.runs import Timings, seed_everything, staged_dir

log = logging.getLogger(__name__)
CHECK_PROMPT = "What is the capital of France? Answer in one word."


@dataclass(frozen=True)
class LLMResult:
    """Where the run landed, its report and its gate verdict."""

    out_dir: Path
    report: LLMReport
    gate: GateResult


def run_quantize_llm(config: LLMConfig, output_root: Path, progress: bool = True) -> LLMResult:
    """Quantize, check and gate one LLM; everything lands in ``output_root/<name>/`` (checkpoint/ inside)."""
    import torch

    from deploy_opt.llm.pipeline_layers import choose_onload, load_layers, run_layers
    from deploy_opt.llm.preflight import preflight

    seed_everything(config.seed)
    times = Timings()
    source = model_source(config)
    if config.name:  # known before loading: a folder that cannot be replaced is refused in the first second
        _check_output(run_dir(ensure_writable_dir(output_root), config.name, "--name"), source)
    preflight(source, config.quantization)  # from the header alone: exit 2 in seconds, before any load
    onload = choose_onload(config.model.onload, source)
    with times.stage("load", explain=False):
        loaded = (load_layers if onload == "layers" else load_llm)(config, source)
    name = config.name or default_run_name(config.model.path, loaded.scheme)
    out_dir = run_dir(ensure_writable_dir(output_root), name, "--name")
    _check_output(out_dir, source)
    refuse_other_model(out_dir, loaded.source)
    with staged_dir(out_dir, kind="llm") as stage, torch.no_grad():  # no_grad scoped: a global switch would leak
        run = run_layers if onload == "layers" else _run
        report, gate = run(config, name, loaded, times, stage, out_dir, progress)
    return LLMResult(out_dir, report, gate)


def _check_output(out_dir: Path, source: Path) -> None:
    """The run folder may be replaced (absent, empty, or an LLM run deploy_opt wrote) and holds not the model."""
    check_target(out_dir, "llm")
    check_separate(out_dir, [source], [source] if source.is_dir() else [])


def load_llm(config: LLMConfig, source: Path) -> LoadedLLM:
    """Load the model and texts and resolve ``auto`` (a group that cannot work fails here, before any long step)."""
    from deploy_opt.llm.gguf_model import load_model_folder, model_reference

    model, tokenizer = load_model_folder(source)
    reference = model_reference(Path(source))
    if config.model.device != "cpu":
        model = model.to(config.model.device)
    scheme = plan_scheme(config.quantization, model)
    evaluation_docs, selection = select_texts(config, tokenizer)
    return LoadedLLM(Path(source), model, tokenizer, scheme, evaluation_docs, selection, reference=reference)


def default_run_name(model_path: str, scheme: QuantScheme) -> str:
    """``<model>-<method>[-g<group>]``: smollm2-awq-gptq-g64, llama-gptq-g128, llama-torchao-int8-wo."""
    model = "smollm2" if model_path == "smollm2" else Path(model_path.rstrip("/")).name
    model = Path(model).stem if model.endswith(".gguf") else model
    grouped = scheme.method in ("gptq", "awq", "awq-gptq", "rtn", "torchao-int4-wo")
    group = f"-g{scheme.group_size}" if grouped and scheme.group_size > 0 else ""
    return f"{model}-{scheme.method}{group}"


def refuse_other_model(out_dir: Path, source: Path) -> None:
    """A run folder holds one model: replacing another model's run needs a --name of its own."""
    import json

    report = out_dir / "quantize_report.json"
    if not report.is_file():
        return
    try:
        previous = json.loads(report.read_text(encoding="utf-8"))["model"]["source"]
    except (OSError, ValueError, KeyError, TypeError):
        return  # not a readable report of ours: publishing replaces it whole, as any run folder
    if Path(previous).resolve() != source.resolve():
        raise OutputError(
            f"'{out_dir}' holds a run of another model ({previous}); fix: pass --name for this one, or delete it"
        )


def _run(
    config: LLMConfig, name: str, loaded: LoadedLLM, times: Timings, stage: Path, out_dir: Path, progress: bool
) -> tuple[LLMReport, GateResult]:
    from deploy_opt.llm.checks import PerplexityWindow, StabilitySettings, perplexity, stability_run
    from deploy_opt.llm.reference_gptq import reference_before_quantization
    from deploy_opt.llm.stability_baseline import judge_against_baseline

    cal, checks = config.calibration, config.checks
    model, tokenizer, scheme = loaded.model, loaded.tokenizer, loaded.scheme
    evaluation_docs, selection, source = loaded.evaluation_docs, loaded.selection, loaded.source

    settings = StabilitySettings(
        generations=checks.generations,
        max_new_tokens=checks.max_new_tokens,
        max_seq_len=cal.max_seq_len,
        seed=config.seed,
        progress=progress,
    )
    window = PerplexityWindow(max_seq_len=checks.eval_seq_len, max_tokens=checks.eval_tokens, progress=progress)
    with times.stage("perplexity_original"):
        original = perplexity(model, tokenizer, evaluation_docs, window)
        baseline = stability_run(model, tokenizer, pydoc_texts("prompts"), settings)
    reference = reference_before_quantization(config, loaded, window, times)  # off by default

    with times.stage("quantize"):
        checkpoint = stage / "checkpoint"
        engine, fmt = _quantize(config, scheme, model, tokenizer, selection.tensors(), checkpoint, progress, source)

    with times.stage("checks"):
        quantized = perplexity(model, tokenizer, evaluation_docs, window)
        stability = judge_against_baseline(baseline, stability_run(model, tokenizer, pydoc_texts("prompts"), settings))

    kv = None
    if checks.kv_cache != "none":
        with times.stage("kv_cache"):
            from deploy_opt.llm.kv_report import KVCheck, kv_checks

            check = KVCheck(
                checks.kv_cache, checks.session_len, evaluation_docs, pydoc_texts("prompts"), window, settings
            )
            kv = kv_checks(model, tokenizer, check, quantized, baseline)
            kv["increase_vs_original"] = kv["perplexity"]["ppl"] / original["ppl"] - 1

    with times.stage("reload"):
        if fmt == "gguf":
            reload = _gguf_read_back(model, tokenizer, engine["gguf"], checkpoint, evaluation_docs, window)
        else:
            reload = _check_reload(model, tokenizer, checkpoint, fmt)
    measured = Measured(engine, fmt, original, quantized, stability, kv, reload, reference)
    return write_report(config, name, loaded, measured, times, stage, out_dir)


def _quantize(
    config: LLMConfig,
    scheme: QuantScheme,
    model: Any,
    tokenizer: Any,
    samples: list,
    checkpoint: Path,
    progress: bool,
    source: Path,
) -> tuple[dict[str, Any], str]:
    """Run the resolved method and write its checkpoint; (the report's quantization section, format)."""
    quant = config.quantization
    if scheme.method.startswith("torchao"):
        from deploy_opt.llm.torchao_path import quantize_torchao, save_torchao_checkpoint

        summary = quantize_torchao(model, scheme.method, group_size=scheme.group_size, keep=quant.keep)
        save_torchao_checkpoint(model, checkpoint, summary, tokenizer=tokenizer)
        return summary, "torchao"
    from deploy_opt.llm.quantize_engine import quantize_model
    from exporters.w4a16_writer import write_quantized_checkpoint

    result = quantize_model(model, samples, engine_settings(quant, scheme), progress=progress)
    if quant.format == "gguf":
        return _write_gguf(model, result, source, checkpoint, tokenizer), "gguf"
    fmt = checkpoint_format(scheme)
    write_quantized_checkpoint(model, result.weights, checkpoint, fmt=fmt, tokenizer=tokenizer)
    return result.as_dict(), fmt


def _write_gguf(model: Any, result: Any, source: Path, checkpoint: Path, tokenizer: Any) -> dict[str, Any]:
    """checkpoint/model.gguf; the model then holds what the file reads back as (the checks measure the file)."""
    from deploy_opt.llm.gguf_export import export_gguf, match_gguf_weights

    match_gguf_weights(model, dict(result.weights))
    return {**result.as_dict(), "gguf": export_gguf(model, dict(result.weights), source, checkpoint, tokenizer)}


def _gguf_read_back(
    model: Any, tokenizer: Any, record: dict[str, Any], checkpoint: Path, docs: Any, window: Any
) -> dict[str, Any]:
    """The bytes' read-back (gguf's dequantizer) and the meaning's: the file loaded as a user loads it, scored on
    evaluation windows against the in-process model (the gate fails a gap over 1%)."""
    from deploy_opt.llm.gguf_export import read_back_meaning

    meaning = read_back_meaning(model, tokenizer, checkpoint / record["file"], docs, window)
    record["read_back"] = {**record["read_back"], "meaning": meaning}
    return record["read_back"]


def _check_reload(model: Any, tokenizer: Any, checkpoint: Path, fmt: str) -> dict[str, Any]:
    """Reload the written checkpoint, compare its logits with the in-memory model, and answer one prompt."""
    import torch

    if fmt == "torchao":
        from deploy_opt.llm.torchao_path import load_torchao_checkpoint

        reloaded, _ = load_torchao_checkpoint(checkpoint)
    else:
        from exporters.lmdeploy import load_quantized_checkpoint

        reloaded, _ = load_quantized_checkpoint(checkpoint)
    ids = tokenizer(CHECK_PROMPT, return_tensors="pt").input_ids
    if getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": CHECK_PROMPT}], add_generation_prompt=True, return_tensors="pt"
        )
        ids = ids if isinstance(ids, torch.Tensor) else ids["input_ids"]
    device = model.get_input_embeddings().weight.device
    live, back = model(ids.to(device)).logits.float().cpu(), reloaded(ids).logits.float()
    max_diff = float((live - back).abs().max())
    out = reloaded.generate(ids, max_new_tokens=12, do_sample=False, pad_token_id=tokenizer.eos_token_id)
    answer = tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True).strip()
    log.info("reloaded checkpoint answers %r (max |logit diff| %.3g vs the in-memory model)", answer, max_diff)
    return {"prompt": CHECK_PROMPT, "answer": answer, "max_logit_diff": max_diff}
