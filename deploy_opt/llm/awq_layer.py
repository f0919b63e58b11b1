"""AWQ on one decoder layer: search each group's scales, fold them into the producer, clip, quantize.

The scaling groups are AutoAWQ's, per family in ``architectures.py``: a norm or Linear whose output feeds a set of
Linears takes 1/s, the Linears take s on their input columns, so the layer's float function is unchanged before
rounding (``calibrators/groupwise/awq.py``). A ``1 + w`` norm (Gemma) takes ``w' = (1 + w) / s - 1``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping

import torch

from calibrators.groupwise.awq import apply_clip, awq_quantize, search_awq_clip, search_awq_scale
from calibrators.groupwise.gptq import HessianAccumulator, gptq_quantize, group_qparams
from calibrators.groupwise.rtn import QuantizedWeight
from deploy_opt.llm.architectures import LLAMA_GROUPS, NORM, ScaleGroup, by_layer
from dopt_common.errors import ConfigError

log = logging.getLogger(__name__)
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
    groups, form = awq_groups(layer)
    for group in groups:
        quantized = [c for c in group.consumers if c in names]
        if not quantized:
            continue
        source = modules[group.producer]
        if group.kind != NORM and source.out_features != modules[group.consumers[0]].in_features:
            continue  # grouped-query attention: v_proj's rows do not line up with o_proj's columns
        found = search_awq_scale(
            [modules[c].weight for c in quantized],
            hessians[quantized[0]],
            means[quantized[0]],
            bits=bits,
            group_size=group_size,
            sym=sym,
        )
        fold_scales(layer, group, found.scales, form)
        for consumer in group.consumers:
            if consumer in hessians:
                hessians[consumer] = hessians[consumer] / found.scales[:, None] / found.scales[None, :]
        log.debug(
            "awq %s: ratio %.2f duo %s loss %.4g (rtn %.4g)",
            group.producer,
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


def awq_groups(layer: torch.nn.Module) -> tuple[tuple[ScaleGroup, ...], str]:
    """(AWQ's scaling groups, the norm form) of this decoder layer: its family's in the architecture table, or
    Llama's for a layer class the table lacks; a ConfigError where the layer lacks a group's modules."""
    name = type(layer).__name__
    arch = by_layer(name)
    if arch is None and "Gemma" in name:
        raise ConfigError(f"awq does not know {name}'s norm groups (a Gemma norm is 1 + w); fix: use method gptq")
    groups, form = (LLAMA_GROUPS, "w") if arch is None else (arch.awq_groups, arch.norm_form)
    if not groups:
        raise ConfigError(f"awq has no scaling groups for {name} ({arch.family}); fix: use method gptq or rtn")
    modules = dict(layer.named_modules())
    for group in groups:
        if group.producer not in modules or not all(c in modules for c in group.consumers):
            raise ConfigError(
                f"awq needs {group.producer} feeding {', '.join(group.consumers)} in {name}, which differs; "
                "fix: use method gptq or rtn"
            )
    return groups, form


def fold_scales(layer: torch.nn.Module, group: ScaleGroup, s: torch.Tensor, form: str = "w") -> None:
    """Divide the producer's output channels by ``s`` and multiply the consumers' input columns by it, so the
    layer computes the same function (up to float rounding); ``form`` "1 + w" is a Gemma norm."""
    modules = dict(layer.named_modules())
    source = modules[group.producer]
    if group.kind == NORM and form == "1 + w":
        source.weight.copy_((1 + source.weight) / s - 1)
    else:
        source.weight.div_(s if group.kind == NORM else s[:, None])
    if getattr(source, "bias", None) is not None:
        source.bias.div_(s)
    for consumer in group.consumers:
        modules[consumer].weight.mul_(s[None, :])


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
