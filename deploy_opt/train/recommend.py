"""Which optimizer, LR range, schedule and state precision to start from, each with the reason it was chosen.

The rules, in the order they are applied (issue #7):
- a CNN or MLP with fewer than 100k samples → SGD with momentum;
- a transformer under a tight memory budget → Lion, at 1/3–1/5 of the AdamW LR, with warmup;
- an LLM pre-trained on long sequences (>= ``LONG_SEQUENCE`` tokens) with ample memory → Sophia (Liu et al. 2023:
  2x fewer steps than AdamW to the same GPT-2 loss, at AdamW's memory: two states per parameter);
- an LLM with ample memory otherwise → AdamW;
- otherwise → AdamW;
- state precision: ≥ 1B parameters → int8; < 100M → fp32 (the int8 kernels' overhead outweighs the saving);
  in between → int8 when the fp32-state estimate is tight, else fp32.

"Tight" means the memory estimate for fp32-state training (weights, gradients, master weights and optimizer
state; see ``memory.py``) exceeds ``TIGHT_FRACTION`` of ``memory_gb``; the rest is left for activations.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

from deploy_opt.train.memory import GB, estimate_memory, parse_count
from deploy_opt.train.schedules import ScheduleConfig
from dopt_common.errors import ConfigError

log = logging.getLogger(__name__)

MODEL_TYPES = ("cnn", "mlp", "transformer", "llm")
SMALL_DATA = 100_000
LARGE_MODEL = 1_000_000_000
SMALL_MODEL = 100_000_000
TIGHT_FRACTION = 0.8
HUGE_LLM = 10_000_000_000
LONG_SEQUENCE = 2048
# Sophia's peak LR: half of AdamW's range to AdamW's (its update is clipped to lr per element, like Lion's sign
# update, but only where the curvature is flat; a starting point for `train search` to refine).
SOPHIA_LR_FACTORS = (0.5, 1.0)

# Peak-LR ranges to start a sweep from, by optimizer and model type. Sources:
# - SGD + momentum 0.9 on CNNs: 0.1 at batch 256 (He et al. 2016, ResNet; Goyal et al. 2017 scale it with batch
#   size); 0.05 covers smaller batches and the MLP case.
# - AdamW on CNNs/MLPs: 1e-3 is Adam's default (Kingma & Ba 2015); 3e-4 the common safer start.
# - AdamW on transformers: 1e-4 (BERT pre-training, Devlin et al. 2019) to 5e-4 (GPT-3's small models, Brown et
#   al. 2020, table 2.1: 6e-4 at 125M, 3e-4 at 350M).
# - AdamW on LLMs: 3e-4 peak for 7B-13B (LLaMA, Touvron et al. 2023), 1.5e-4 from 33B up; 3e-5 is a typical
#   full fine-tuning rate (Alpaca used 2e-5).
# - Lion: 3-10x smaller than AdamW's (Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms"); the
#   rule here takes AdamW's range divided by 5 (low) and by 3 (high).
ADAMW_LR = {"cnn": (3e-4, 1e-3), "mlp": (3e-4, 1e-3), "transformer": (1e-4, 5e-4), "llm": (3e-5, 3e-4)}
ADAMW_LR_HUGE_LLM = (3e-5, 1.5e-4)
SGD_LR = (0.05, 0.1)
LION_DIVISORS = (5, 3)
# Warmup: adaptive optimizers need it while the second moment is still noisy (Liu et al. 2020, "On the
# Variance of the Adaptive Learning Rate and Beyond"); the cosine floor of 10% follows Chinchilla and LLaMA.
WARMUP = {"cnn": 0.03, "mlp": 0.03, "transformer": 0.05, "llm": 0.05}
MIN_LR_RATIO = 0.1


@dataclass(frozen=True)
class Recommendation:
    """A starting point: optimizer, LR range, schedule and state precision, with (choice, reason) pairs."""

    model_type: str
    params: int
    samples: int
    memory_gb: float
    optimizer: str  # adamw | lion | sgd | sophia
    lr_range: tuple[float, float]
    schedule: ScheduleConfig
    state: str  # int8 | fp32
    fp32_state_gb: float  # the estimate "tight" is judged by (AdamW, fp32 state)
    chosen_gb: float  # the estimate for the recommended optimizer and state precision
    reasons: tuple[tuple[str, str], ...]

    def to_json(self) -> dict[str, Any]:
        """Plain data for the CLI's --json output and the training log."""
        return {
            "model_type": self.model_type,
            "params": self.params,
            "samples": self.samples,
            "memory_gb": self.memory_gb,
            "optimizer": self.optimizer,
            "lr_range": list(self.lr_range),
            "schedule": {
                "type": self.schedule.type,
                "warmup_ratio": self.schedule.warmup_ratio,
                "min_lr_ratio": self.schedule.min_lr_ratio,
            },
            "state": self.state,
            "fp32_state_gb": self.fp32_state_gb,
            "chosen_gb": self.chosen_gb,
            "reasons": [{"choice": c, "reason": r} for c, r in self.reasons],
        }


def recommend(
    model_type: str,
    params: int | float | str,
    samples: int | float | str,
    memory_gb: float,
    *,
    param_dtype: str = "bf16",
    shards: int = 1,
    seq_len: int | None = None,
) -> Recommendation:
    """Apply the rules above; every choice comes with its reason, which is also logged."""
    kind = str(model_type).lower()
    if kind not in MODEL_TYPES:
        raise ConfigError(f"model type '{model_type}' is not one of {', '.join(MODEL_TYPES)}; pick one of them")
    count, n_samples = parse_count(params), parse_count(samples)
    if isinstance(memory_gb, bool) or not isinstance(memory_gb, (int, float)) or not math.isfinite(memory_gb):
        raise ConfigError(f"memory_gb {memory_gb!r} must be a positive number (GB per device, e.g. 24)")
    if memory_gb <= 0:
        raise ConfigError(f"memory_gb {memory_gb} must be > 0 (GB per device, e.g. 24)")

    def gb(optimizer: str, state: str) -> float:
        return estimate_memory(count, optimizer, state, param_dtype, shards).per_device_bytes / GB

    fp32_gb = gb("adamw", "fp32")
    tight = fp32_gb > TIGHT_FRACTION * memory_gb
    budget = (
        f"AdamW with fp32 state needs {fp32_gb:,.1f} GB per device before activations, "
        f"{'more' if tight else 'not more'} than {TIGHT_FRACTION:.0%} of {memory_gb:g} GB"
    )
    if seq_len is not None and (isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 1):
        raise ConfigError(f"seq_len {seq_len!r} must be a positive integer (tokens per training sequence)")
    optimizer, lr_range, why = _choose_optimizer(kind, count, n_samples, tight, budget, seq_len)
    state, state_why = _choose_state(count, optimizer, tight, gb)
    warmup = WARMUP[kind]
    schedule = ScheduleConfig("warmup_cosine", warmup_ratio=warmup, min_lr_ratio=MIN_LR_RATIO)
    chosen_gb = gb(optimizer, state)

    reasons = [
        (_optimizer_text(optimizer), why),
        (f"lr {_lr(lr_range[0])} to {_lr(lr_range[1])}", _lr_reason(kind, optimizer, count)),
        (
            f"schedule warmup_cosine, warmup {warmup:.0%}, floor {MIN_LR_RATIO:.0%} of peak",
            "linear warmup while the optimizer's running statistics settle, then cosine decay to a floor "
            "rather than zero so the last steps still learn (Chinchilla/LLaMA decay to 10%)",
        ),
        (f"state {state}", state_why),
    ]
    if chosen_gb > memory_gb:
        reasons.append(
            (
                "warning: does not fit",
                f"even this setup needs {chosen_gb:,.1f} GB per device before activations, over {memory_gb:g} GB; "
                "shard the optimizer state and master weights across more devices (shards) or use a smaller model",
            )
        )
    rec = Recommendation(
        kind,
        count,
        n_samples,
        float(memory_gb),
        optimizer,
        lr_range,
        schedule,
        state,
        fp32_gb,
        chosen_gb,
        tuple(reasons),
    )
    for choice, reason in rec.reasons:
        log.info("recommend %s: %s", choice, reason)
    return rec


def format_recommendation(rec: Recommendation) -> str:
    """Printed lines: the inputs, then each choice with its reason."""
    head = f"{rec.model_type}, {rec.params:,} parameters, {rec.samples:,} samples, {rec.memory_gb:g} GB per device"
    width = max(len(c) for c, _ in rec.reasons)
    return "\n".join([head, *(f"{c:<{width}}  because {r}" for c, r in rec.reasons)])


def _choose_optimizer(
    kind: str, params: int, samples: int, tight: bool, budget: str, seq_len: int | None = None
) -> tuple[str, tuple[float, float], str]:
    adamw = ADAMW_LR_HUGE_LLM if kind == "llm" and params >= HUGE_LLM else ADAMW_LR[kind]
    if kind == "llm" and not tight and seq_len is not None and seq_len >= LONG_SEQUENCE:
        return (
            "sophia",
            (adamw[0] * SOPHIA_LR_FACTORS[0], adamw[1] * SOPHIA_LR_FACTORS[1]),
            (
                f"LLM pre-training on long sequences ({seq_len:,} >= {LONG_SEQUENCE:,} tokens) with ample memory "
                f"({budget}): Sophia's clipped diagonal-Hessian step reached GPT-2's AdamW loss in half the steps "
                "(Liu et al. 2023) with AdamW's memory (two states per parameter); a Hessian estimate every 10 steps "
                "costs ~5% more compute"
            ),
        )
    if kind in ("cnn", "mlp") and samples < SMALL_DATA:
        return (
            "sgd",
            SGD_LR,
            (
                f"a {kind} with {samples:,} samples (< {SMALL_DATA:,}): SGD with momentum tends to generalize better "
                "than adaptive methods on small data and keeps one state per parameter"
            ),
        )
    if kind == "transformer" and tight:
        low, high = adamw[0] / LION_DIVISORS[0], adamw[1] / LION_DIVISORS[1]
        return (
            "lion",
            (low, high),
            (
                f"a transformer under a tight memory budget ({budget}): Lion keeps one state per parameter "
                "instead of AdamW's two; its sign update needs 1/3-1/5 of the AdamW LR and a warmup"
            ),
        )
    if kind == "llm" and not tight:
        return (
            "adamw",
            adamw,
            (
                f"an LLM with ample memory ({budget}): AdamW is the proven default at this scale; "
                f"Sophia is offered for pre-training on sequences of {LONG_SEQUENCE:,}+ tokens (give seq_len)"
            ),
        )
    if kind == "llm":
        why = f"an LLM under a tight memory budget ({budget}): no rule swaps AdamW out; save memory with int8 state"
    elif kind == "transformer":
        why = f"a transformer with ample memory ({budget}): AdamW is the default"
    else:
        why = f"a {kind} with {samples:,} samples (>= {SMALL_DATA:,}): AdamW is the default"
    return "adamw", adamw, why


def _choose_state(params: int, optimizer: str, tight: bool, gb: Any) -> tuple[str, str]:
    if params >= LARGE_MODEL:
        return "int8", f"{params:,} parameters (>= 1B): block-wise int8 state cuts each state to ~1 byte/param"
    if params < SMALL_MODEL:
        return "fp32", (
            f"{params:,} parameters (< 100M): the int8 kernels' overhead outweighs the few MB they would save"
        )
    fp32, int8 = gb(optimizer, "fp32"), gb(optimizer, "int8")
    if tight:
        return "int8", (
            f"{params:,} parameters (100M-1B) and a tight budget: {optimizer} needs {fp32:,.1f} GB with fp32 state, "
            f"{int8:,.1f} GB with int8 state"
        )
    return "fp32", (
        f"{params:,} parameters (100M-1B) and ample memory: {optimizer} with fp32 state fits ({fp32:,.1f} GB), "
        "so the int8 overhead buys nothing"
    )


def _optimizer_text(optimizer: str) -> str:
    return {
        "sgd": "optimizer sgd (momentum 0.9)",
        "lion": "optimizer lion",
        "adamw": "optimizer adamw",
        "sophia": "optimizer sophia (rho 0.04, Hessian every 10 steps)",
    }[optimizer]


def _lr_reason(kind: str, optimizer: str, params: int) -> str:
    if optimizer == "sgd":
        return "SGD with momentum 0.9 on CNNs uses 0.1 at batch 256 (ResNet; scale linearly with batch size)"
    if optimizer == "sophia":
        return "half of AdamW's LLM range to AdamW's: the clipped step is at most lr per element"
    if optimizer == "lion":
        return "the AdamW range for transformers (1e-4 to 5e-4) divided by 5 to 3 (Lion paper: 3-10x smaller)"
    if kind == "llm":
        if params >= HUGE_LLM:
            return "LLaMA used 1.5e-4 from 33B up; full fine-tuning typically uses a few 1e-5"
        return "LLaMA 7B/13B peaked at 3e-4; full fine-tuning typically uses a few 1e-5"
    if kind == "transformer":
        return "BERT pre-training used 1e-4, GPT-3's small models 3e-4 to 6e-4"
    return "Adam's default 1e-3 (Kingma & Ba), 3e-4 as the safer start"


def _lr(value: float) -> str:
    """0.1 → '0.1'; 1.6667e-4 → '1.7e-4' (the short form people write in configs)."""
    if value >= 0.01:
        return f"{value:.2g}"
    mantissa, exponent = f"{value:.1e}".split("e")
    return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"
