"""The scheme a ``quantize-llm`` run writes: ``method: auto`` and ``group_size: auto`` resolved against the model.

The rule follows what lmdeploy 0.18 serves (``exporters/lmdeploy.py``: ``engine_problems``, which cites its source):
TurboMind reads GPTQ only at group 128, symmetric and without act-order, and AWQ only at group 128; the PyTorch
engine has no GPTQ but reads AWQ at any group of 16 or more. So ``auto`` is

- GPTQ, symmetric, no act-order, group 128 (TurboMind) when 128 divides every quantized Linear's in_features;
- else AWQ at the largest of 64, 32 that divides them all (the PyTorch engine), e.g. 64 on SmolLM2's 576;
- AWQ as well when ``symmetric: false`` (TurboMind refuses asymmetric GPTQ; AWQ carries zero points);
- AWQ as well for an architecture outside TurboMind's list (Mistral, Phi-3, Gemma): lmdeploy's CLI serves those
  on the PyTorch engine whatever ``--backend`` says, and that engine has no GPTQ.

An explicit method is kept as given (an act-order GPTQ still quantizes; ``serve`` refuses it with advice).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from deploy_opt.llm.config import LLMQuantConfig
from dopt_common.errors import ConfigError

log = logging.getLogger(__name__)
AUTO_GROUP_SIZES = (128, 64, 32)  # largest first; 128 is the only group TurboMind serves
TURBOMIND_GROUP_SIZE = 128
GGUF_GROUP_SIZE = 32  # ggml's Q4_0/Q4_1/Q8_0 block


@dataclass(frozen=True)
class QuantScheme:
    """The resolved method, group size and GPTQ options, with why they were chosen (awq: symmetric is False)."""

    method: str
    group_size: int
    desc_act: bool
    symmetric: bool
    reason: str
    requested: Mapping[str, Any]

    def to_json(self) -> dict[str, Any]:
        """JSON-ready record for the run's report."""
        return {
            "method": self.method,
            "group_size": self.group_size,
            "desc_act": self.desc_act,
            "symmetric": self.symmetric,
            "reason": self.reason,
            "requested": dict(self.requested),
        }


def _blocker(in_features: Mapping[str, int], group: int) -> tuple[str, int] | None:
    """The first (Linear, in_features) that ``group`` does not divide, or None."""
    return next(((name, n) for name, n in in_features.items() if n % group), None)


def auto_group_size(in_features: Mapping[str, int]) -> tuple[int, str]:
    """(largest of 128, 64, 32 dividing every Linear's in_features, why); ConfigError when none does."""
    if not in_features:
        raise ConfigError("quantization.group_size auto: the model has no Linear to quantize; check quantization.keep")
    for group in AUTO_GROUP_SIZES:
        if _blocker(in_features, group) is None:
            if group == TURBOMIND_GROUP_SIZE:
                return group, "128 divides every quantized Linear"
            name, n = _blocker(in_features, TURBOMIND_GROUP_SIZE)  # type: ignore[misc]
            return group, f"128 does not divide {name} (in_features {n}); {group} divides every quantized Linear"
    name, n = _blocker(in_features, AUTO_GROUP_SIZES[-1])  # type: ignore[misc]
    raise ConfigError(
        f"quantization.group_size auto: none of 128, 64, 32 divides {name} (in_features {n}); "
        "set --group-size to a power of two that divides every layer, or -1"
    )


def resolve_scheme(
    quant: LLMQuantConfig, in_features: Mapping[str, int], architecture: str | None = None
) -> QuantScheme:
    """The scheme to quantize with, given the configured one, each target Linear's in_features and the model's
    architecture (config.json's ``architectures[0]``; None: assumed TurboMind's)."""
    from exporters.lmdeploy import TURBOMIND_ARCHITECTURES

    requested = {"method": quant.method, "group_size": quant.group_size, "desc_act": quant.desc_act}
    if quant.format == "gguf":
        return _gguf_scheme(quant, in_features, requested)
    if quant.group_size == "auto":
        group, why = auto_group_size(in_features)
        group_reason = f"group_size auto: {why}"
    else:
        group, group_reason = int(quant.group_size), f"group_size {quant.group_size} as configured"
    if quant.method != "auto":
        desc_act = quant.desc_act and quant.method == "gptq"
        symmetric = quant.symmetric and quant.method != "awq"  # AWQ's codes always carry zero points (AutoAWQ)
        reason = f"method {quant.method} as configured; {group_reason}"
        return QuantScheme(quant.method, group, desc_act, symmetric, reason, requested)
    if not quant.symmetric:
        reason = (
            f"method auto: awq because symmetric is false (TurboMind refuses asymmetric GPTQ; AWQ carries zero "
            f"points and lmdeploy serves it); {group_reason}"
        )
        return QuantScheme("awq", group, False, False, reason, requested)
    if architecture is not None and architecture not in TURBOMIND_ARCHITECTURES:
        reason = (
            f"method auto: awq at group {group} for lmdeploy's PyTorch engine, because {architecture} is not in "
            f"TurboMind's list (lmdeploy serves it on the PyTorch engine, which has no GPTQ); {group_reason}"
        )
        return QuantScheme("awq", group, False, False, reason, requested)
    if group == TURBOMIND_GROUP_SIZE:
        reason = (
            f"method auto: gptq, symmetric, no act-order, at group 128, which lmdeploy's TurboMind serves; "
            f"{group_reason}"
        )
        return QuantScheme("gptq", group, False, True, reason, requested)
    reason = (
        f"method auto: awq at group {group} for lmdeploy's PyTorch engine, because TurboMind serves only group 128 "
        f"and the PyTorch engine has no GPTQ; {group_reason}"
    )
    return QuantScheme("awq", group, False, False, reason, requested)


def _gguf_scheme(quant: LLMQuantConfig, in_features: Mapping[str, int], requested: Mapping[str, Any]) -> QuantScheme:
    """GGUF: group 32 always (ggml's block); auto is symmetric GPTQ (Q4_0), AWQ's codes become Q4_1."""
    blocker = _blocker(in_features, GGUF_GROUP_SIZE)
    if blocker is not None:
        raise ConfigError(
            f"--format gguf: ggml's blocks of 32 do not divide {blocker[0]} (in_features "
            f"{blocker[1]}); fix: use the lmdeploy format"
        )
    if quant.method == "auto":
        method, symmetric = "gptq", quant.symmetric
        how = "method auto: gptq, no act-order"
    else:
        method, symmetric = quant.method, quant.symmetric and quant.method != "awq"
        how = f"method {method} as configured"
    block = "Q4_0 (symmetric codes)" if symmetric else "Q4_1 (asymmetric codes)"
    reason = f"format gguf: group 32 (ggml's block); {how} → {block}"
    return QuantScheme(method, GGUF_GROUP_SIZE, False, symmetric, reason, requested)
