"""``quantize-llm --kv-cache int8|int4``: perplexity and the stability run again with lmdeploy's KV-cache
quantization simulated on the quantized model, and the KV memory at the session length, for the report and gate."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from deploy_opt.llm.checks import PerplexityWindow, StabilitySettings, perplexity, stability_run
from deploy_opt.llm.kv_cache import kv_bits, kv_memory
from deploy_opt.llm.stability_baseline import judge_against_baseline

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class KVCheck:
    """What the KV-cache checks run: the cache kind, the session length its memory is quoted at, the texts, and
    the perplexity window and stability settings of the weights-only checks (the KV bits are added here)."""

    kv_cache: str  # "int8" | "int4"
    session_len: int
    evaluation: Sequence[Any]  # the perplexity texts
    prompts: Sequence[Any]  # the stability prompts
    window: PerplexityWindow
    stability: StabilitySettings


def kv_checks(
    model: Any, tokenizer: Any, check: KVCheck, reference: dict[str, Any], baseline: dict[str, Any]
) -> dict[str, Any]:
    """The ``kv_cache`` section: perplexity with the simulated KV cache against the weights-only quantized one
    (``reference``) and the original, the stability run judged against the FP model, and the memory saved."""
    kv_cache, session_len = check.kv_cache, check.session_len
    bits = kv_bits(kv_cache)
    with_kv = perplexity(model, tokenizer, check.evaluation, dataclasses.replace(check.window, kv_bits=bits))
    settings = dataclasses.replace(check.stability, kv_bits=bits)
    stability = judge_against_baseline(baseline, stability_run(model, tokenizer, check.prompts, settings))
    memory = kv_memory(model.config, session_len, bits)
    record = {
        "kv_cache": kv_cache,
        "simulation": "lmdeploy's KV quantization (asymmetric, per head and token) applied to every key and value "
        "the HF model caches; K after the rotary embedding",
        "perplexity": with_kv,
        "increase_vs_quantized": with_kv["ppl"] / reference["ppl"] - 1,
        "stability": stability,
        "memory": memory,
    }
    log.info(
        "KV cache %s: perplexity %.4f → %.4f (%+.2f%%); KV memory at %d tokens %.1f → %.1f MB (%.0f%% saved)",
        kv_cache,
        reference["ppl"],
        with_kv["ppl"],
        100 * record["increase_vs_quantized"],
        session_len,
        memory["fp16_bytes"] / 1e6,
        memory["bytes"] / 1e6,
        100 * memory["saved_fraction"],
    )
    return record
