"""Quality checks for an LLM before and after quantization: perplexity, a stability run and the perplexity gate.

Perplexity: the texts are joined with ``DOC_SEPARATOR``, tokenized without special tokens and cut to their LAST
``max_tokens`` tokens; windows of ``max_seq_len`` tokens advance by ``stride`` (default: no overlap) and each
token is scored once, from the window that first reaches it (the first token of each window is never scored).
Where the tokenizer adds BOS (Gemma, Llama 2), each window's first token is replaced by BOS, as llama.cpp's
``llama-perplexity`` does (tools/perplexity/perplexity.cpp); a model trained with BOS first scores far too high
without it (Gemma 3 270M, last 8,192 tokens of four license texts in 16 windows of 512: 33.5 without, 14.1 with).
llama.cpp then scores only the second half of each window; we score every token after the first, like
``model(input_ids, labels=input_ids)``. The record states the protocol (``perplexity_record``). With
``pydoc_texts("evaluation")``, max_seq_len 512 and the defaults, SmolLM2-135M fp32 (its tokenizer adds no BOS)
scores 9.46, the reference value (benchmarks/llm/quantize.py).
"""

from __future__ import annotations

import logging
import math
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from deploy_opt.llm.text_data import DOC_SEPARATOR, TextDoc, bos_token_id, pydoc_texts, with_bos
from dopt_common.errors import ConfigError, InputError, NumericsError

log = logging.getLogger(__name__)

# A generation of at least MIN_JUDGED_TOKENS new tokens is degenerate when more than half of its 4-grams repeat
# an earlier one, or when one token is more than half of it.
MIN_JUDGED_TOKENS = 16
MAX_REPEATED_NGRAM_SHARE = 0.5
MAX_TOP_TOKEN_SHARE = 0.5
SAMPLED_EVERY = 4  # generations 3, 7, ... sample (temperature 0.7, top-p 0.9); the others are greedy


def _encode(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"])


def _joined(docs_or_text: str | Sequence[TextDoc | str]) -> str:
    if isinstance(docs_or_text, str):
        return docs_or_text
    return DOC_SEPARATOR.join(d.text if isinstance(d, TextDoc) else str(d) for d in docs_or_text)


def _positive_int(name: str, value: Any, low: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ConfigError(f"{name}={value!r} must be an integer >= {low}")
    return value


def _progress(iterable: Any, enabled: bool, desc: str) -> Any:
    if not enabled:
        return iterable
    from tqdm import tqdm

    return tqdm(iterable, desc=desc, leave=False, disable=None)


@dataclass(frozen=True)
class PerplexityWindow:
    """How perplexity is measured: the last ``max_tokens`` tokens in windows of ``max_seq_len`` every ``stride``.

    ``kv_bits`` (8 or 4) simulates lmdeploy's quantized KV cache (``kv_cache.simulated_kv_cache``). ``bos`` None
    places BOS where the tokenizer adds one; False never does (the protocol before issue 57, for comparisons)."""

    max_seq_len: int = 512
    stride: int | None = None  # None: max_seq_len (disjoint windows)
    max_tokens: int | None = 4096
    progress: bool = False
    kv_bits: int | None = None
    bos: bool | None = None


@dataclass(frozen=True)
class StabilitySettings:
    """The stability run: how many generations, how long, with what seed, and the KV cache simulated or not.

    ``filler``: the text that fills the last run's context up to ``max_seq_len`` (default: pydoc calibration
    text); ``chat`` None: use the tokenizer's chat template when it has one."""

    generations: int = 8
    max_new_tokens: int = 64
    max_seq_len: int = 512
    seed: int = 0
    filler: str | None = None
    chat: bool | None = None
    progress: bool = False
    kv_bits: int | None = None


@dataclass(frozen=True)
class WindowPlan:
    """The token windows perplexity scores: (begin, end, tokens scored fresh) of each, the text's length, and the
    BOS that replaces each window's first token (None: the tokenizer adds none)."""

    ids: list[int]
    spans: list[tuple[int, int, int]]
    text_tokens: int
    stride: int
    bos_token_id: int | None = None

    def window(self, number: int) -> list[int]:
        """The token ids of window ``number`` as the model reads them: BOS first where the tokenizer adds one."""
        begin, end, _ = self.spans[number]
        return with_bos(self.ids[begin:end], self.bos_token_id)


def plan_windows(tokenizer: Any, docs_or_text: str | Sequence[TextDoc | str], window: PerplexityWindow) -> WindowPlan:
    """The last ``max_tokens`` tokens cut into windows; each token is scored from the first window reaching it."""
    max_seq_len, stride, max_tokens = window.max_seq_len, window.stride, window.max_tokens
    _positive_int("max_seq_len", max_seq_len, 2)
    stride = max_seq_len if stride is None else _positive_int("stride", stride)
    if stride > max_seq_len:
        raise ConfigError(f"stride={stride} is larger than max_seq_len={max_seq_len}; tokens would be skipped")
    if max_tokens is not None:
        _positive_int("max_tokens", max_tokens, 2)
    all_ids = _encode(tokenizer, _joined(docs_or_text))
    ids = all_ids[-max_tokens:] if max_tokens else all_ids
    if len(ids) < 2:
        raise InputError(
            f"perplexity needs at least 2 tokens of text, got {len(ids)}; fix: give longer evaluation text"
        )
    spans, prev_end = [], 0
    for begin in range(0, len(ids) - 1, stride):
        end = min(begin + max_seq_len, len(ids))
        spans.append((begin, end, min(end - prev_end, end - begin - 1)))
        prev_end = end
        if end == len(ids):
            break
    bos = None if window.bos is False else bos_token_id(tokenizer)
    return WindowPlan(ids, spans, len(all_ids), stride, bos)


def window_nll(logits: Any, chunk: Any, span: tuple[int, int, int], number: int) -> tuple[float, int]:
    """(summed NLL, tokens) of one window's fresh tokens; NumericsError on NaN/Inf log-probabilities."""
    import torch

    begin, end, fresh = span
    token_nll = -torch.log_softmax(logits[0, :-1].float(), dim=-1).gather(1, chunk[0, 1:, None])[:, 0]
    scored = token_nll[-fresh:]
    if not torch.isfinite(scored).all():
        raise NumericsError(
            f"perplexity window {number} (tokens {begin}..{end - 1}) has NaN/Inf log-probabilities; "
            "the model's logits are not finite: run the stability check and re-quantize"
        )
    return float(scored.double().sum()), scored.numel()


def perplexity_protocol(plan: WindowPlan, window: PerplexityWindow) -> str:
    """One line saying how the perplexity was measured: windows, length, stride/overlap, BOS, tokens scored."""
    bos = (
        f"each window's first token replaced by BOS (id {plan.bos_token_id}, llama.cpp's placement)"
        if plan.bos_token_id is not None
        else "no BOS (" + ("turned off" if window.bos is False else "the tokenizer adds none") + ")"
    )
    overlap = window.max_seq_len - plan.stride
    return (
        f"last {len(plan.ids)} of {plan.text_tokens} text tokens, {len(plan.spans)} windows of <= "
        f"{window.max_seq_len} tokens every {plan.stride} (overlap {overlap}), {bos}; each token scored once, "
        "every window's first token never"
    )


def perplexity_record(
    plan: WindowPlan, window: PerplexityWindow, nll_sum: float, scored: int, per_window: Sequence[Any] = ()
) -> dict[str, Any]:
    """The report's perplexity entry, with the protocol it was measured under. ``per_window``: each window's
    (summed NLL, scored tokens), kept as ``window_nll`` for the gate's interval (``report/gate.py``)."""
    nll = nll_sum / scored
    return {
        "window_nll": [[float(total), int(count)] for total, count in per_window],
        "ppl": math.exp(nll),
        "nll": nll,
        "tokens": scored,
        "windows": len(plan.spans),
        "max_seq_len": window.max_seq_len,
        "stride": plan.stride,
        "overlap": window.max_seq_len - plan.stride,
        "bos": plan.bos_token_id is not None,
        "text_tokens": plan.text_tokens,
        "kv_bits": window.kv_bits,
        "protocol": perplexity_protocol(plan, window),
    }


def perplexity(
    model: Any,
    tokenizer: Any,
    docs_or_text: str | Sequence[TextDoc | str],
    window: PerplexityWindow = PerplexityWindow(),
) -> dict[str, Any]:
    """Perplexity over the last ``max_tokens`` tokens of the text, in strided windows; log-probs in float32."""
    import torch

    from deploy_opt.llm.kv_cache import simulated_kv_cache

    plan = plan_windows(tokenizer, docs_or_text, window)
    nll_sum, scored, per_window = 0.0, 0, []
    device = model.get_input_embeddings().weight.device
    with torch.no_grad(), simulated_kv_cache(window.kv_bits):
        for number, span in enumerate(_progress(plan.spans, window.progress, "perplexity")):
            chunk = torch.tensor([plan.window(number)], dtype=torch.long, device=device)
            logits = model(input_ids=chunk, use_cache=window.kv_bits is not None).logits
            nll, count = window_nll(logits, chunk, span, number)
            nll_sum, scored = nll_sum + nll, scored + count
            per_window.append((nll, count))
    return perplexity_record(plan, window, nll_sum, scored, per_window)


def _generation_config(model: Any, tokenizer: Any, max_new_tokens: int, sampled: bool) -> Any:
    from transformers import GenerationConfig

    eos = getattr(model.generation_config, "eos_token_id", None) or tokenizer.eos_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    if isinstance(pad, list):
        pad = pad[0]
    extra = {"do_sample": True, "temperature": 0.7, "top_p": 0.9, "top_k": 0} if sampled else {"do_sample": False}
    return GenerationConfig(
        max_new_tokens=max_new_tokens,
        eos_token_id=eos,
        pad_token_id=pad,
        return_dict_in_generate=True,
        output_logits=True,
        **extra,
    )


def _chat_ids(tokenizer: Any, text: str, chat: bool) -> list[int]:
    if not chat:
        return list(tokenizer(text, verbose=False)["input_ids"])
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
    )
    return _encode(tokenizer, rendered)


def _long_prompt(tokenizer: Any, prompt: str, filler: list[int], budget: int, chat: bool) -> list[int]:
    """``prompt`` preceded by real text so that prompt + generation reach ``budget`` + max_new_tokens positions."""
    take = budget - len(_chat_ids(tokenizer, prompt, chat)) - 4
    for _ in range(4):
        if take <= 0:
            break
        ids = _chat_ids(tokenizer, tokenizer.decode(filler[:take]) + "\n\n" + prompt, chat)
        if len(ids) <= budget:
            return ids
        take -= len(ids) - budget
    return _chat_ids(tokenizer, prompt, chat)[-budget:]


def repetition_stats(ids: Sequence[int]) -> dict[str, float]:
    """Share of 4-grams that repeat an earlier one, and the share of the most common token."""
    grams = [tuple(ids[i : i + 4]) for i in range(len(ids) - 3)]
    repeated = 1 - len(set(grams)) / len(grams) if grams else 0.0
    top = max(Counter(ids).values()) / len(ids) if ids else 0.0
    return {"repeated_4gram_share": repeated, "top_token_share": top}


def _all_finite(model: Any, sequence: list[int], generated_logits: Sequence[Any], cache: bool = False) -> bool:
    """Finite logits over the whole sequence in one forward pass, and in every step generate() took."""
    import torch

    with torch.no_grad():
        ids = torch.tensor([sequence], dtype=torch.long, device=model.get_input_embeddings().weight.device)
        logits = model(input_ids=ids, use_cache=cache).logits
    return bool(torch.isfinite(logits).all()) and all(bool(torch.isfinite(s).all()) for s in generated_logits)


def _generate_one(model: Any, ids: list[int], config: Any, seed: int) -> tuple[list[int], Any, str]:
    import torch

    prompt = torch.tensor([ids], dtype=torch.long, device=model.get_input_embeddings().weight.device)
    with torch.no_grad(), torch.random.fork_rng():
        torch.manual_seed(seed)
        try:
            out = model.generate(prompt, attention_mask=torch.ones_like(prompt), generation_config=config)
        except RuntimeError as exc:  # sampling from NaN probabilities raises here
            return [], (), f"generation failed: {exc}"
    return out.sequences[0, len(ids) :].tolist(), out.logits, ""


def _judge(new: list[int], eos: Any, finite: bool, error: str) -> tuple[list[str], dict[str, float]]:
    eos_ids = set(eos if isinstance(eos, list) else [eos])
    body = new[:-1] if new and new[-1] in eos_ids else new
    stats = repetition_stats(body)
    flags = [] if finite else ["non_finite_logits"]
    if error:
        flags.append("generation_error")
    if len(body) >= MIN_JUDGED_TOKENS and stats["repeated_4gram_share"] > MAX_REPEATED_NGRAM_SHARE:
        flags.append("repeated_ngrams")
    if len(body) >= MIN_JUDGED_TOKENS and stats["top_token_share"] > MAX_TOP_TOKEN_SHARE:
        flags.append("dominant_token")
    return flags, stats


def stability_run(
    model: Any, tokenizer: Any, prompts: Sequence[TextDoc | str], settings: StabilitySettings = StabilitySettings()
) -> dict[str, Any]:
    """Greedy and sampled generations; flags NaN/Inf logits and degenerate repetition. The last one fills the
    context with real text (``settings.filler``) so positions up to max_seq_len run. ``settings.kv_bits`` (8 or 4)
    runs it all with lmdeploy's quantized KV cache simulated."""
    from deploy_opt.llm.kv_cache import simulated_kv_cache

    generations, max_new_tokens, max_seq_len = settings.generations, settings.max_new_tokens, settings.max_seq_len
    seed, filler, chat, progress, kv_bits = (
        settings.seed,
        settings.filler,
        settings.chat,
        settings.progress,
        settings.kv_bits,
    )

    _positive_int("generations", generations)
    _positive_int("max_new_tokens", max_new_tokens)
    if _positive_int("max_seq_len", max_seq_len) <= max_new_tokens:
        raise ConfigError(f"max_seq_len={max_seq_len} must exceed max_new_tokens={max_new_tokens}")
    texts = [p.text if isinstance(p, TextDoc) else str(p) for p in prompts]
    if not texts or not all(t.strip() for t in texts):
        raise InputError("the stability run needs non-empty prompts; fix: give at least one prompt text")
    chat = bool(getattr(tokenizer, "chat_template", None)) if chat is None else chat
    filler_ids = _encode(tokenizer, filler if filler is not None else _joined(pydoc_texts("calibration")[:8]))
    warnings: list[str] = []
    limit = getattr(model.config, "max_position_embeddings", None)
    if limit is not None and max_seq_len > limit:
        warnings.append(f"max_seq_len={max_seq_len} exceeds the model's max_position_embeddings={limit}")

    runs: list[dict[str, Any]] = []
    model.eval()
    for i in _progress(range(generations), progress, "stability"):
        sampled = i % SAMPLED_EVERY == SAMPLED_EVERY - 1
        long = i == generations - 1
        text = texts[i % len(texts)]
        budget = max_seq_len - max_new_tokens
        ids = _long_prompt(tokenizer, text, filler_ids, budget, chat) if long else _chat_ids(tokenizer, text, chat)
        ids = ids[-budget:]
        config = _generation_config(model, tokenizer, max_new_tokens, sampled)
        with simulated_kv_cache(kv_bits):
            start = time.perf_counter()
            new, step_logits, error = _generate_one(model, ids, config, seed + i)
            seconds = time.perf_counter() - start
            sequence = ids + new
            if long:  # check every position up to max_seq_len, even when generation stopped early at EOS
                sequence = sequence + filler_ids[: max(0, max_seq_len - len(sequence))]
            finite = _all_finite(model, sequence, step_logits, cache=kv_bits is not None)
        flags, stats = _judge(new, config.eos_token_id, finite, error)
        runs.append(
            {
                "prompt": text,
                "mode": "sampled" if sampled else "greedy",
                "prompt_tokens": len(ids),
                "positions": len(sequence),
                "tokens": len(new),
                "text": error or tokenizer.decode(new, skip_special_tokens=True),
                "tokens_per_s": len(new) / seconds if seconds > 0 else 0.0,
                **stats,
                "flags": flags,
            }
        )
        if flags:  # info: whether it counts is judged against the FP model's run (stability_baseline.py)
            log.info("stability run %d (%s) flagged: %s", i, runs[-1]["mode"], ", ".join(flags))
    flagged = sum(bool(r["flags"]) for r in runs)
    return {
        "ok": flagged == 0,
        "generations": len(runs),
        "flagged": flagged,
        "max_seq_len": max_seq_len,
        "longest_sequence": max(r["positions"] for r in runs),
        "kv_bits": kv_bits,
        "warnings": warnings,
        "runs": runs,
    }
