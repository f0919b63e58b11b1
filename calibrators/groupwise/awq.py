"""AWQ (Lin et al. 2023, "AWQ: Activation-aware Weight Quantization for LLM Compression and Acceleration").

deploy_opt's own implementation of the published algorithm in plain torch (see ``calibrators/groupwise/gptq.py`` for why
not a library). Functions over tensors; the model surgery (which Linears share an input, where to fold) is in
``deploy_opt/llm/quantize_engine.py``.

For Linears that read the same input x (q/k/v after the attention norm, gate/up after the MLP norm, down after
up·act, o after v where shapes allow), AWQ scales input channel j by s_j before quantizing:
``Q(W·diag(s))·diag(1/s)`` replaces W and the 1/s is folded into whatever produces x (the RMSNorm weight or the
previous Linear's rows), so the float model is unchanged. s = mean|x|^α (or AutoAWQ's "duo" form
mean|x|^α / mean|ŵ|^(1-α)), normalised so max·min = 1, and α is searched on a grid of 20 points in [0, 1).

The search loss is the output MSE of the group on the calibration tokens, Σ ||x Wᵀ - x Ŵᵀ||². It is computed
exactly from the Gram matrix H ∝ Σ x xᵀ as tr(ΔW H ΔWᵀ), so no activations are stored and every grid point
costs out·in² instead of tokens·out·in. The clip search (AutoAWQ's ``_search_best_clip``) shrinks each group's
max |w| by up to 50% and keeps, per (row, group), the shrink with the least partial output error
Δw_g H_gg Δw_gᵀ. Quantization is then plain group-wise round-to-nearest, asymmetric by default as AutoAWQ.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from calibrators.groupwise.rtn import QuantizedWeight, fake_quantize_groups, rtn_quantize

SCALE_FLOOR = 1e-4  # AutoAWQ's clamp: no channel is scaled by exactly 0


@dataclass(frozen=True)
class AwqScale:
    """The chosen per-input-channel scale of one Linear group and the loss it reaches."""

    scales: torch.Tensor  # [in]
    ratio: float  # the α of the grid point
    duo: bool  # True: mean|x|^α / mean|ŵ|^(1-α); False: mean|x|^α
    loss: float  # tr(ΔW H ΔWᵀ) summed over the group's Linears at the chosen scale
    base_loss: float  # the same without scaling (s = 1, plain RTN)


def _group_loss(weights: list[torch.Tensor], scales: torch.Tensor, hessian: torch.Tensor, quantize) -> float:
    """Σ tr(ΔW H ΔWᵀ) with ΔW = Q(W·s)/s - W over the Linears of a group."""
    total = 0.0
    for w in weights:
        delta = quantize(w * scales[None, :]) / scales[None, :] - w
        total += float(torch.einsum("oi,ij,oj->", delta, hessian, delta))
    return total


def _weight_mean(weights: list[torch.Tensor], group_size: int) -> torch.Tensor:
    """AutoAWQ's w_mean: |w| normalised by its group's max, averaged over output rows [in]."""
    w = torch.cat(weights, dim=0)
    size = w.shape[1] if group_size == -1 else group_size
    grouped = w.abs().reshape(-1, size)
    normed = grouped / (grouped.amax(dim=1, keepdim=True) + 1e-6)
    return normed.reshape(w.shape).mean(dim=0)


def search_awq_scale(
    weights: list[torch.Tensor],
    hessian: torch.Tensor,
    mean_abs: torch.Tensor,
    *,
    bits: int = 4,
    group_size: int = 128,
    sym: bool = False,
    grid: int = 20,
) -> AwqScale:
    """Grid-search α for the Linears ``weights`` ([out_k, in] each) sharing an input with Gram ``hessian``."""
    h = hessian.float()
    ws = [w.detach().float() for w in weights]

    def quantize(w: torch.Tensor) -> torch.Tensor:
        return fake_quantize_groups(w, bits, group_size, sym, style="awq")

    ones = torch.ones_like(mean_abs)
    base = _group_loss(ws, ones, h, quantize)
    best = AwqScale(scales=ones, ratio=0.0, duo=False, loss=base, base_loss=base)
    x_mean = mean_abs.float()
    w_mean = _weight_mean(ws, group_size)
    for duo in (False, True):
        for step in range(grid):
            ratio = step / grid
            if duo:
                s = x_mean.pow(ratio) / (w_mean.pow(1 - ratio) + SCALE_FLOOR)
            else:
                s = x_mean.pow(ratio)
            s = s.clamp(min=SCALE_FLOOR)
            s = s / (s.max() * s.min()).sqrt()
            s = torch.where(torch.isfinite(s), s, torch.ones_like(s))
            loss = _group_loss(ws, s, h, quantize)
            if loss < best.loss:
                best = AwqScale(scales=s, ratio=ratio, duo=duo, loss=loss, base_loss=base)
    return best


def search_awq_clip(
    weight: torch.Tensor,
    hessian: torch.Tensor,
    *,
    bits: int = 4,
    group_size: int = 128,
    sym: bool = False,
    grid: int = 20,
    max_shrink: float = 0.5,
) -> torch.Tensor:
    """Best clipping bound max|w| per (row, group) [out, groups] for ``weight`` [out, in] (already scaled)."""
    w = weight.detach().float()
    out_features, in_features = w.shape
    size = in_features if group_size == -1 else group_size
    groups = in_features // size
    wg = w.reshape(out_features, groups, size)
    h = hessian.float()
    blocks = torch.stack([h[g * size : (g + 1) * size, g * size : (g + 1) * size] for g in range(groups)])
    org_max = wg.abs().amax(dim=2)  # [out, groups]
    best_max = org_max.clone()
    best_err = torch.full_like(org_max, float("inf"))
    for step in range(int(max_shrink * grid)):
        bound = org_max * (1 - step / grid)
        clipped = torch.maximum(torch.minimum(wg, bound[..., None]), -bound[..., None])
        q = fake_quantize_groups(clipped.reshape(out_features, in_features), bits, group_size, sym, style="awq")
        delta = q.reshape(out_features, groups, size) - wg
        err = torch.einsum("ogi,gij,ogj->og", delta, blocks, delta)
        better = err < best_err
        best_err = torch.where(better, err, best_err)
        best_max = torch.where(better, bound, best_max)
    return best_max


def apply_clip(weight: torch.Tensor, max_abs: torch.Tensor, group_size: int) -> torch.Tensor:
    """Clamp each (row, group) of ``weight`` [out, in] to ±max_abs [out, groups]."""
    out_features, in_features = weight.shape
    size = in_features if group_size == -1 else group_size
    wg = weight.float().reshape(out_features, in_features // size, size)
    bound = max_abs[..., None]
    return torch.maximum(torch.minimum(wg, bound), -bound).reshape(out_features, in_features)


def awq_quantize(weight: torch.Tensor, bits: int = 4, group_size: int = 128, sym: bool = False) -> QuantizedWeight:
    """Group-wise round-to-nearest with AutoAWQ's parameter choice (asymmetric over [min, max] by default)."""
    return rtn_quantize(weight, bits, group_size, sym, style="awq")
