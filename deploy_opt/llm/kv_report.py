"""``quantize-llm --kv-cache int8|int4``: perplexity and the stability run again with lmdeploy's KV-cache
quantization simulated on the quantized model, and the KV memory at the session length, for the report and gate."""

from __future__ import annotations

import logging
from typing import Any

from deploy_opt.llm.checks import perplexity, stability_run
from deploy_opt.llm.kv_cache import kv_bits, kv_memory
from deploy_opt.llm.stability_baseline import judge_against_baseline

log = logging.getLogger(__name__)


def kv_checks(
    model: Any,
    tokenizer: Any,
    kv_cache: str,
    session_len: int,
    evaluation: Any,
    prompts: Any,
    ppl_kwargs: dict[str, Any],
    stability_kwargs: dict[str, Any],
    reference: dict[str, Any],
    baseline: dict[str, Any],
) -> dict[str, Any]:
    """The ``kv_cache`` section: perplexity with the simulated KV cache against the weights-only quantized one
    (``reference``) and the original, the stability run judged against the FP model, and the memory saved."""
    bits = kv_bits(kv_cache)
    with_kv = perplexity(model, tokenizer, evaluation, kv_bits=bits, **ppl_kwargs)
    stability = judge_against_baseline(
        baseline, stability_run(model, tokenizer, prompts, kv_bits=bits, **stability_kwargs)
    )
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
