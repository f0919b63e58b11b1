"""AWQ on one Llama-family decoder layer: search each group's scales, fold them into the producer, clip, quantize.

The scaling groups are AutoAWQ's: a norm or Linear whose output feeds a set of Linears takes 1/s, the Linears take
s on their input columns, so the layer's float function is unchanged before rounding (``calibrators/groupwise/awq.py``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping

import torch

from calibrators.groupwise.awq import apply_clip, awq_quantize, search_awq_clip, search_awq_scale
from calibrators.groupwise.gptq import HessianAccumulator, gptq_quantize, group_qparams
from calibrators.groupwise.rtn import QuantizedWeight
from dopt_common.errors import ConfigError

log = logging.getLogger(__name__)
# AWQ's scaling groups in a Llama-family layer: (producer to fold 1/s into, its kind, the Linears reading it).
AWQ_GROUPS = (
    ("input_layernorm", "norm", ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")),
    ("self_attn.v_proj", "linear", ("self_attn.o_proj",)),
    ("post_attention_layernorm", "norm", ("mlp.gate_proj", "mlp.up_proj")),
    ("mlp.up_proj", "linear", ("mlp.down_proj",)),
)
AWQ_NO_CLIP = ("q_proj", "k_proj")  # AutoAWQ skips the clip search where attention scores amplify errors


def quantize_awq_layer(
    layer: torch.nn.Module,
    names: Mapping[str, str],
    stats: dict[str, HessianAccumulator],
    leader: Mapping[str, str],
    *,
    bits: int,
    group_size: int,
    sym: bool,
    rounding: str = "rtn",
    percdamp: float = 0.01,
) -> dict[str, tuple[torch.Tensor, QuantizedWeight, torch.Tensor, float]]:
    """Scale, fold, clip and quantize a Llama-family layer; local name → (reference W, codes, H, seconds).

    ``rounding`` "rtn" is AWQ as published (round to nearest in the clipped ranges); "gptq" keeps AWQ's scaling
    and clip ranges as static groups and rounds with act-order GPTQ inside them (``round_in_ranges``)."""
    modules = dict(layer.named_modules())
    hessians = {local: stats[leader[local]].hessian() for local in names}
    means = {local: stats[leader[local]].mean_abs() for local in names}
    for producer, kind, consumers in AWQ_GROUPS:
        if producer not in modules or not all(c in modules for c in consumers):
            raise ConfigError(
                f"awq needs Llama-style layers ({producer} feeding {', '.join(consumers)}); "
                f"{type(layer).__name__} differs; fix: use method gptq or rtn"
            )
        quantized = [c for c in consumers if c in names]
        if not quantized:
            continue
        source = modules[producer]
        width = modules[consumers[0]].in_features
        if kind == "linear" and source.out_features != width:
            continue  # grouped-query attention: v_proj's rows do not line up with o_proj's columns
        if kind == "norm" and "Gemma" in type(source).__name__:
            raise ConfigError("awq cannot fold scales into Gemma's (1 + weight) RMSNorm; fix: use method gptq")
        found = search_awq_scale(
            [modules[c].weight for c in quantized],
            hessians[quantized[0]],
            means[quantized[0]],
            bits=bits,
            group_size=group_size,
            sym=sym,
        )
        s = found.scales
        source.weight.div_(s if kind == "norm" else s[:, None])
        if getattr(source, "bias", None) is not None:
            source.bias.div_(s)
        for consumer in consumers:
            modules[consumer].weight.mul_(s[None, :])
            if consumer in hessians:
                hessians[consumer] = hessians[consumer] / s[:, None] / s[None, :]
        log.debug(
            "awq %s: ratio %.2f duo %s loss %.4g (rtn %.4g)",
            producer,
            found.ratio,
            found.duo,
            found.loss,
            found.base_loss,
        )

    results = {}
    for local in names:
        start = time.perf_counter()
        module = modules[local]
        reference = module.weight.detach().float().clone()
        weight = reference
        if not local.endswith(AWQ_NO_CLIP):
            bound = search_awq_clip(weight, hessians[local], bits=bits, group_size=group_size, sym=sym)
            weight = apply_clip(weight, bound, group_size)
        if rounding == "gptq":
            codes = round_in_ranges(reference, weight, hessians[local], bits, group_size, sym, percdamp)
        else:
            codes = awq_quantize(weight, bits, group_size, sym)
        results[local] = (reference, codes, hessians[local], time.perf_counter() - start)
    return results


def round_in_ranges(
    weight: torch.Tensor,
    clipped: torch.Tensor,
    hessian: torch.Tensor,
    bits: int,
    group_size: int,
    sym: bool,
    percdamp: float,
) -> QuantizedWeight:
    """GPTQ codes (act-order, static groups) of the scaled ``weight`` in the ranges AWQ chose for ``clipped``.

    The group parameters are AWQ's (AutoAWQ's min/max of the clipped weights), so the codes are an AWQ checkpoint's;
    GPTQ rounds the unclipped weights, and its error feedback spreads the clipping error as well as the rounding."""
    size = clipped.shape[1] if group_size == -1 else group_size
    params = group_qparams(clipped, size, bits, sym, style="awq")
    return gptq_quantize(
        weight,
        hessian,
        bits=bits,
        group_size=group_size,
        sym=sym,
        desc_act=True,
        percdamp=percdamp,
        group_params=params,
    )
