"""``quantize-llm`` with layer-wise onloading: the same stages as ``pipeline.py``, one decoder layer resident.

Perplexity before: the source layers streamed in float32. Quantize: each layer read, quantized and written into
the checkpoint's shards before the next is read. Perplexity after: the written checkpoint's layers read back and
dequantized, so it measures the file (that is the read-back). The stability run and the KV-cache check generate
token by token through every layer, which would read the whole model once per token: they are not run, and the
report says so. GGUF and torchao outputs need the whole model too: refused before any long step.

``choose_onload`` decides ``model.onload: auto``: layers when twice the float32 model (the model and the codes the
in-memory path keeps) would not fit in the memory available.
"""

from __future__ import annotations

import logging
from pathlib import Path

from deploy_opt.llm.config import LLMConfig
from deploy_opt.llm.gguf_model import model_reference
from deploy_opt.llm.run_common import (
    LoadedLLM,
    Measured,
    checkpoint_format,
    engine_settings,
    plan_scheme,
    select_texts,
    write_report,
)
from dopt_common.errors import ConfigError
from dopt_common.hf_tokenizer import load_auto_tokenizer
from dopt_common.runs import Timings

log = logging.getLogger(__name__)
NOT_RUN = "not run: layer-wise onloading (generation reads every layer once per token); use model.onload: memory"


def available_bytes() -> int:
    """MemAvailable from /proc/meminfo (or the physical memory where it is unreadable)."""
    import os

    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def float32_bytes(folder: Path) -> int:
    """The model's size in float32, from its shard headers (no tensor is read)."""
    from deploy_opt.llm.onload import open_folder
    from dopt_common.weights import open_safetensors

    total = 0
    for path in set(open_folder(folder).files.values()):
        with open_safetensors(path) as handle:
            for name in handle.keys():  # noqa: SIM118
                numel = 1
                for size in handle.get_slice(name).get_shape():
                    numel *= size
                total += 4 * numel
    return total


def choose_onload(onload: str, source: Path) -> str:
    """'memory' or 'layers' for ``model.onload`` (auto: layers when 2 x float32 exceeds the memory available)."""
    is_folder = source.is_dir()
    if onload == "layers" and not is_folder:
        raise ConfigError(
            f"model.onload layers reads a Hugging Face folder's safetensors; '{source}' is not one; fix: convert "
            "it to a folder, or set model.onload: memory"
        )
    vision = is_folder and _has_vision_tower(source)
    if onload == "layers" and vision:
        raise ConfigError(
            f"model.onload layers reads decoder-only folders; '{source.name}' also holds a vision tower, whose "
            "checkpoint names the layer-wise reader does not map; fix: set model.onload: memory"
        )
    if onload != "auto":
        return onload
    if not is_folder or not any(source.glob("*.safetensors")) or vision:
        return "memory"
    need, have = 2 * float32_bytes(source), available_bytes()
    choice = "layers" if need > have else "memory"
    log.info(
        "model.onload auto: %s (2 x float32 model %.1f GiB, %.1f GiB available)", choice, need / 2**30, have / 2**30
    )
    return choice


def _has_vision_tower(folder: Path) -> bool:
    """Whether the folder's config.json describes a vision tower beside the language model (Gemma 3 of 4B and up)."""
    import json

    try:
        return "vision_config" in json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, TypeError):
        return False


def _refuse_whole_model_outputs(config: LLMConfig) -> None:
    quant, checks = config.quantization, config.checks
    if quant.format == "gguf" or quant.method.startswith("torchao"):
        raise ConfigError(
            f"quantization {quant.method}/{quant.format} needs the whole model in memory; layer-wise onloading "
            "writes lmdeploy gptq/awq folders; fix: set format: lmdeploy and method auto, gptq, awq or rtn"
        )
    if checks.kv_cache != "none":
        raise ConfigError(
            "checks.kv_cache generates through every layer and cannot run layer by layer; fix: set kv_cache: none "
            "or model.onload: memory"
        )


def load_layers(config: LLMConfig, source: Path) -> LoadedLLM:
    """The skeleton model (decoder layers on the meta device), tokenizer, scheme and texts."""
    from deploy_opt.llm.onload import load_skeleton, open_folder

    _refuse_whole_model_outputs(config)
    shards = open_folder(source)  # the weights first: a damaged index fails before any tokenizer work
    tokenizer = load_auto_tokenizer(source, "model.hf")
    model = load_skeleton(shards, config.model.device)
    reference = model_reference(source)
    scheme = plan_scheme(config.quantization, model)
    evaluation_docs, selection = select_texts(config, tokenizer)
    return LoadedLLM(source, model, tokenizer, scheme, evaluation_docs, selection, onload="layers", reference=reference)


def run_layers(
    config: LLMConfig, name: str, loaded: LoadedLLM, times: Timings, stage: Path, out_dir: Path, progress: bool
) -> tuple:
    """Perplexity, quantization and the written checkpoint's perplexity, one layer resident at a time."""
    from deploy_opt.llm.checks import PerplexityWindow
    from deploy_opt.llm.onload import (
        checkpoint_source,
        layer_source,
        open_folder,
        quantize_streamed,
        streamed_perplexity,
    )
    from exporters.w4a16_writer import CheckpointWriter

    quant, checks, scheme, device = config.quantization, config.checks, loaded.scheme, config.model.device
    model, tokenizer, docs, folder = loaded.model, loaded.tokenizer, loaded.evaluation_docs, open_folder(loaded.source)
    window = PerplexityWindow(max_seq_len=checks.eval_seq_len, max_tokens=checks.eval_tokens, progress=progress)
    with times.stage("perplexity_original"):
        original = streamed_perplexity(model, layer_source(folder, model, device), tokenizer, docs, window)
    settings = engine_settings(quant, scheme)
    fmt = checkpoint_format(scheme)
    with times.stage("quantize"):
        writer = CheckpointWriter(stage / "checkpoint", fmt)
        try:
            result = quantize_streamed(
                folder, model, loaded.selection.tensors(), settings, writer, device=device, progress=progress
            )
            writer.finish(model, tokenizer)
        finally:
            writer.abort()
    with times.stage("checks"):
        written = checkpoint_source(open_folder(stage / "checkpoint"), model, device)
        quantized = streamed_perplexity(model, written, tokenizer, docs, window)
    reload = {"read_back": "the quantized perplexity is measured on the written checkpoint, read layer by layer"}
    stability = {"skipped": NOT_RUN}
    measured = Measured(result.as_dict(), fmt, original, quantized, stability, None, reload)
    return write_report(config, name, loaded, measured, times, stage, out_dir)
