"""The scheme a ``quantize-llm`` run writes: ``method: auto`` and ``group_size: auto`` resolved against the model.

The packing layout is not the algorithm. lmdeploy 0.18 (``exporters/lmdeploy.py``: ``engine_problems``, which cites
its source) reads the AWQ layout (per group: an fp16 scale, a 4-bit zero point, packed 4-bit codes) in both engines,
TurboMind at group 128 and the PyTorch engine at any group of 16 or more; it reads the GPTQ layout only in
TurboMind, at group 128, symmetric and without act-order. Any algorithm that produces group-wise asymmetric codes
in sequential groups can write the AWQ layout. So ``auto`` is

- ``awq-gptq`` in the AWQ layout, at group 128 when 128 divides every quantized Linear's in_features (TurboMind or
  the PyTorch engine), else at the largest of 64, 32 that divides them all (the PyTorch engine), e.g. 64 on
  SmolLM2's 576. AWQ's activation-aware scales and clip ranges fix each group's scale and zero point (static
  groups), and act-order GPTQ rounds inside them. On SmolLM2-135M at group 64 it measured better than AWQ's
  round-to-nearest and than symmetric GPTQ in the GPTQ layout (``benchmarks/llm/quantize.py``, README).

- ``gptq`` (act-order rounding in static groups, asymmetric) in the AWQ layout, for a family the architecture table
  gives no AWQ scale groups (``architectures.py``: Nemotron): its codes keep one scale and zero point per group in
  sequential order, so the AWQ layout holds them and the PyTorch engine serves them; the reason says so.

An explicit method is kept as given, in its own layout: awq and awq-gptq write AWQ, gptq and rtn write GPTQ (an
act-order GPTQ still quantizes; ``quantize-llm`` warns in its first seconds, and ``serve`` refuses it with advice).
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
    layout: str = ""  # awq | gptq | gguf | torchao; "" takes the method's own (layout_of)
    static_groups: bool = False  # gptq: act-order inside groups fixed before rounding (sequential g_idx)

    def __post_init__(self) -> None:
        if not self.layout:
            object.__setattr__(self, "layout", layout_of(self.method))

    def to_json(self) -> dict[str, Any]:
        """JSON-ready record for the run's report."""
        return {
            "method": self.method,
            "layout": self.layout,
            "group_size": self.group_size,
            "desc_act": self.desc_act,
            "static_groups": self.static_groups,
            "symmetric": self.symmetric,
            "reason": self.reason,
            "requested": dict(self.requested),
        }


def layout_of(method: str) -> str:
    """The checkpoint layout a method's codes are written in (lmdeploy's names; gguf is set by the format)."""
    if method.startswith("torchao"):
        return "torchao"
    return "awq" if method.startswith("awq") else "gptq"


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
        "fix: set --group-size to a power of two that divides every layer, or -1"
    )


def serving_config(scheme: QuantScheme, bits: int = 4) -> dict[str, Any]:
    """The ``quantization_config`` the scheme's checkpoint will carry, as lmdeploy's engine rules read it."""
    if scheme.layout == "awq":
        return {"quant_method": "awq", "bits": bits, "group_size": scheme.group_size, "version": "gemm"}
    return {
        "quant_method": scheme.layout,
        "bits": bits,
        "group_size": scheme.group_size,
        "desc_act": scheme.desc_act and not scheme.static_groups,
        "sym": scheme.symmetric,
    }


def resolve_scheme(
    quant: LLMQuantConfig,
    in_features: Mapping[str, int],
    architecture: str | None = None,
    awq_groups: bool = True,
) -> QuantScheme:
    """The scheme to quantize with, given the configured one, each target Linear's in_features, the model's
    architecture (config.json's ``architectures[0]``; None: assumed TurboMind's) and whether the architecture table
    gives its family AWQ scale groups."""
    from exporters.lmdeploy_engines import TURBOMIND_ARCHITECTURES

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
        # AWQ-layout codes always carry zero points (AutoAWQ)
        symmetric = quant.symmetric and not quant.method.startswith("awq")
        reason = f"method {quant.method} as configured; {group_reason}"
        return QuantScheme(quant.method, group, desc_act, symmetric, reason, requested)
    if not awq_groups:
        return _gptq_fallback(group, group_reason, architecture, requested)
    if group == TURBOMIND_GROUP_SIZE and (architecture is None or architecture in TURBOMIND_ARCHITECTURES):
        engine = "which lmdeploy's TurboMind and PyTorch engine both serve"
    elif group == TURBOMIND_GROUP_SIZE:
        engine = f"which lmdeploy's PyTorch engine serves ({architecture} is not in TurboMind's list)"
    else:
        engine = "which lmdeploy's PyTorch engine serves (TurboMind serves only group 128)"
    reason = (
        f"method auto: awq-gptq (AWQ's scales and clip ranges, act-order GPTQ rounding in static groups) in the "
        f"AWQ layout at group {group}, {engine}; {group_reason}"
    )
    return QuantScheme("awq-gptq", group, False, False, reason, requested)


def _gptq_fallback(group: int, group_reason: str, architecture: str | None, requested: Any) -> QuantScheme:
    """auto on a family without AWQ scale groups: act-order GPTQ in static groups, asymmetric, in the AWQ layout."""
    reason = (
        f"method auto: gptq (act-order rounding in static groups, asymmetric) in the AWQ layout at group {group}, "
        f"because the architecture table gives {architecture or 'this family'} no AWQ scale groups (AWQ cannot fold "
        f"its scales); lmdeploy's PyTorch engine serves the AWQ layout; {group_reason}"
    )
    log.info("quantization scheme: AWQ cannot serve %s; falling back to GPTQ", architecture or "this family")
    return QuantScheme("gptq", group, True, False, reason, requested, layout="awq", static_groups=True)


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
        method, symmetric = quant.method, quant.symmetric and not quant.method.startswith("awq")
        how = f"method {method} as configured"
    block = "Q4_0 (symmetric codes)" if symmetric else "Q4_1 (asymmetric codes)"
    reason = f"format gguf: group 32 (ggml's block); {how} → {block}"
    return QuantScheme(method, GGUF_GROUP_SIZE, False, symmetric, reason, requested, layout="gguf")
