"""GPTQ (Frantar et al. 2022, "GPTQ: Accurate Post-Training Quantization for Generative Pre-trained Transformers").

deploy_opt's own implementation of the published algorithm in plain torch, so W4A16 needs no extra package and
runs on a CPU. (llm-compressor pins another transformers and its AWQ fails on CPU; auto-gptq is archived and
does not import with transformers 5; gptqmodel only installs with ``--no-deps``.) It is checked against
llm-compressor's GPTQ core on a real SmolLM2 layer by ``benchmarks/llm/gptq_crosscheck.py``.

For one Linear weight W [out, in] and H = 2/N · Σ x xᵀ over the N calibration tokens reaching it:

1. dead columns (H_jj = 0) are zeroed and get H_jj = 1;
2. act-order (``desc_act``): columns are visited by descending H_jj;
3. dampening: H += percdamp · mean(diag H) · I;
4. U = upper Cholesky factor of H⁻¹;
5. columns are quantized left to right in blocks of 128: each column's rounding error, divided by U_jj, is
   spread over the not-yet-quantized columns of the block through row j of U, and the block's errors are
   applied to the remaining columns at once (the "lazy batch" update).

Group parameters are computed from the *current* (already error-corrected) weights when a group starts, in
visiting order, as AutoGPTQ does with ``static_groups=False``; g_idx is written in the original column order
(``g_idx[perm[i]] = i // group_size``), the AutoGPTQ/GPTQModel layout. One difference from AutoGPTQ: the block
is a multiple of the group size and a group's parameters see the in-block updates of the columns before it
(AutoGPTQ reads the stale copy of the block there).

``static_groups=True`` (AutoGPTQ's option of that name, llm-compressor's ``actorder="weight"``) instead fixes
every group's parameters up front from the original weights, groups being contiguous in the original column
order; act-order then only changes the visiting order, g_idx stays ``j // group_size`` and the checkpoint needs
no act-order support (lmdeploy's TurboMind refuses ``desc_act: true``).
"""

from __future__ import annotations

import torch

from calibrators.groupwise.rtn import (
    QuantizedWeight,
    check_bits,
    check_group_size,
    compute_qparams,
    quantize_codes,
)
from dopt_common.errors import CalibrationError


class HessianAccumulator:
    """Running H = 2/N · Σ x xᵀ and mean |x| per input channel over the tokens seen by one Linear."""

    def __init__(self, in_features: int, dtype: torch.dtype = torch.float32) -> None:
        self.in_features = in_features
        self.dtype = dtype
        self.count = 0
        self._hessian = torch.zeros(in_features, in_features, dtype=dtype)
        self._abs_sum = torch.zeros(in_features, dtype=torch.float64)

    def add(self, x: torch.Tensor) -> None:
        """Add a batch of inputs [..., in_features] (every leading position is one token)."""
        x = x.detach().reshape(-1, x.shape[-1]).to(self.dtype)
        if self._hessian.device != x.device:  # accumulate where the layer runs (a CUDA model stays on CUDA)
            self._hessian = self._hessian.to(x.device)
            self._abs_sum = self._abs_sum.to(x.device)
        if x.shape[1] != self.in_features:
            raise CalibrationError(f"input has {x.shape[1]} features, expected {self.in_features}")
        n = x.shape[0]
        if n == 0:
            return
        total = self.count + n
        # Running mean keeps the values O(1) however many tokens are added.
        self._hessian.mul_(self.count / total)
        self._hessian.addmm_(x.t(), x, alpha=2.0 / total)
        self._abs_sum += x.abs().sum(dim=0, dtype=torch.float64)
        self.count = total

    def hessian(self) -> torch.Tensor:
        """The accumulated H [in, in] (a copy)."""
        if self.count == 0:
            raise CalibrationError("no calibration tokens reached this layer; fix: pass at least one sample")
        return self._hessian.clone()

    def mean_abs(self) -> torch.Tensor:
        """Mean |x| per input channel [in] (AWQ's activation statistic)."""
        if self.count == 0:
            raise CalibrationError("no calibration tokens reached this layer; fix: pass at least one sample")
        return (self._abs_sum / self.count).float()


def _inverse_cholesky(hessian: torch.Tensor, percdamp: float) -> torch.Tensor:
    """Upper Cholesky factor of (H + damp·I)⁻¹, in float64 for stability, returned as float32."""
    h = hessian.double()
    damp = percdamp * torch.mean(torch.diag(h))
    h.diagonal().add_(damp)
    factor, info = torch.linalg.cholesky_ex(h)
    if int(info) != 0:
        raise CalibrationError(
            f"the Hessian is not positive definite even with percdamp {percdamp}; "
            "fix: use more calibration samples or a larger percdamp"
        )
    inverse = torch.cholesky_inverse(factor)
    return torch.linalg.cholesky(inverse, upper=True).float()


def _check_inputs(weight: torch.Tensor, hessian: torch.Tensor, bits: int, group_size: int) -> None:
    check_bits(bits)
    in_features = weight.shape[1]
    check_group_size("weight", in_features, group_size)
    if hessian.shape != (in_features, in_features):
        raise CalibrationError(f"Hessian shape {tuple(hessian.shape)} does not match in_features {in_features}")


def group_qparams(
    w: torch.Tensor, size: int, bits: int, sym: bool, *, style: str = "gptq"
) -> tuple[torch.Tensor, torch.Tensor]:
    """(scales, zeros), each [groups, out]: the min/max parameters of each ``size``-column group of ``w`` [out, in],
    in ``compute_qparams``'s ``style``."""
    out_features, in_features = w.shape
    groups = in_features // size
    grouped = w.reshape(out_features, groups, size).transpose(0, 1).reshape(-1, size)
    scale, zero = compute_qparams(grouped, bits, sym, style=style)
    return scale.reshape(groups, out_features), zero.reshape(groups, out_features)


def _static_group_params(
    w: torch.Tensor, size: int, bits: int, sym: bool, given: tuple[torch.Tensor, torch.Tensor] | None
) -> list[torch.Tensor]:
    """Each static group's [scales, zeros], each [groups, out]: ``given`` (shape-checked), or the min/max of the
    group's weights."""
    out_features, in_features = w.shape
    groups = in_features // size
    if given is None:
        return list(group_qparams(w, size, bits, sym))
    fixed = [p.to(w.device, torch.float32) for p in given]
    if fixed[0].shape != (groups, out_features) or fixed[1].shape != fixed[0].shape:
        raise CalibrationError(
            f"group_params shapes {tuple(fixed[0].shape)}, {tuple(fixed[1].shape)} do not match "
            f"({groups}, {out_features}) groups x rows"
        )
    return fixed


def gptq_quantize(
    weight: torch.Tensor,
    hessian: torch.Tensor,
    *,
    bits: int = 4,
    group_size: int = 128,
    sym: bool = True,
    desc_act: bool = False,
    percdamp: float = 0.01,
    blocksize: int = 128,
    static_groups: bool = False,
    group_params: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> QuantizedWeight:
    """GPTQ-quantize ``weight`` [out, in] with the Hessian ``hessian`` [in, in] of its inputs.

    ``group_params`` (scales, zeros), each [groups, out], fixes every group's parameters (static groups) instead of
    taking them from the weights' min/max: AWQ + GPTQ passes the ranges of AWQ's clip search, so the rounding
    compensates the clipping error too."""
    _check_inputs(weight, hessian, bits, group_size)
    out_features, in_features = weight.shape
    w = weight.detach().float().clone()
    h = hessian.detach().double().clone()

    dead = torch.diag(h) == 0
    h[dead, dead] = 1.0
    w[:, dead] = 0.0

    size = in_features if group_size == -1 else group_size
    static_groups = static_groups or group_params is not None
    fixed = _static_group_params(w, size, bits, sym, group_params) if static_groups else []
    perm = torch.argsort(torch.diag(h), descending=True) if desc_act else torch.arange(in_features, device=h.device)
    w = w[:, perm]
    h = h[perm][:, perm]
    hinv = _inverse_cholesky(h, percdamp)

    block = blocksize if group_size == -1 else size * max(1, blocksize // size)
    codes = torch.zeros(out_features, in_features, device=w.device)
    scales: list[torch.Tensor] = []
    zeros: list[torch.Tensor] = []
    if group_size == -1 and not static_groups:
        scale, zero = compute_qparams(w, bits, sym)
        scales, zeros = [scale], [zero]

    for i1 in range(0, in_features, block):
        i2 = min(i1 + block, in_features)
        w1 = w[:, i1:i2].clone()
        err1 = torch.zeros_like(w1)
        hinv1 = hinv[i1:i2, i1:i2]
        for i in range(i2 - i1):
            if static_groups:
                group = int(perm[i1 + i]) // size
                scale, zero = fixed[0][group], fixed[1][group]
            elif group_size != -1 and (i1 + i) % size == 0:
                scale, zero = compute_qparams(w1[:, i : i + size], bits, sym)
                scales.append(scale)
                zeros.append(zero)
            col = w1[:, i]
            q = quantize_codes(col[:, None], scale, zero, bits)[:, 0]
            codes[:, i1 + i] = q
            dq = (q - zero) * scale
            err = (col - dq) / hinv1[i, i]
            w1[:, i:] -= err[:, None] * hinv1[i, i:][None, :]
            err1[:, i] = err
        w[:, i2:] -= err1 @ hinv[i1:i2, i2:]

    invperm = torch.argsort(perm)
    if static_groups:
        g_idx = torch.arange(in_features, device=w.device) // size
        scales, zeros = list(fixed[0]), list(fixed[1])
    else:
        g_idx = (torch.arange(in_features, device=w.device) // size)[invperm]
    return QuantizedWeight(
        qweight=codes[:, invperm].to(torch.int32).contiguous(),
        scales=torch.stack(scales).contiguous(),
        zeros=torch.stack(zeros).to(torch.int32).contiguous(),
        g_idx=g_idx.to(torch.int32).contiguous(),
        bits=bits,
        group_size=group_size,
        sym=sym,
    )
