"""AdamW, Lion and SGD-momentum whose state is kept in block-wise 8-bit codes (``deploy_opt.train.blockwise``).

Int8 state is worked one parameter at a time: dequantize its moments to fp32, update, requantize. The whole
model's fp32 state never exists at once. Weight decay is decoupled (``p -= lr * wd * p``) in all three. A
parameter whose state is int8 goes through one fused kernel (``deploy_opt.train.kernels``) compiled by
``torch.compile`` (a few seconds on the first step): on CUDA always (one call per parameter, whole blocks and
tail block in one graph), on the CPU for tensors of 64k elements and more or with ``compiled=True`` (one call
for the whole blocks, one for a shorter tail block); otherwise through the per-op path in ``_update``.
Parameters with fp32 state are updated together by torch's multi-tensor ops (``deploy_opt.train.foreach``). All
give the same numbers; the paths are described in ``deploy_opt.train.blockwise_optimizer``.

Which parameters keep fp32 state: all of them with ``state="fp32"`` (the same class, so int8 vs fp32 is one
switch); tensors under ``min_numel`` elements; parameters whose name contains (or glob-matches) one of
``fp32_patterns``; and every parameter during its first ``fp32_warmup_steps`` steps.

Parameters may be given as tensors, ``(name, tensor)`` pairs (``model.named_parameters()``; torch keeps the
names in ``group["param_names"]``), or groups whose ``"params"`` are either, optionally with ``"names"``.
DTensor parameters (FSDP2) are updated through their local shard; each shard owns its own blocks.
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Any

import torch

from deploy_opt.train import foreach, kernels
from deploy_opt.train.blockwise_optimizer import BlockwiseOptimizer, Moments
from deploy_opt.train.foreach import Group
from deploy_opt.train.state_io import (
    MOMENTS,
    SecondMomentOptions,
    StateOptions,
    check_range,
    optimizer_state_bytes,
    state_config,
)
from dopt_common.errors import ConfigError

if TYPE_CHECKING:
    from typing_extensions import Unpack

log = logging.getLogger(__name__)

__all__ = ["Int8AdamW", "Int8Lion", "Int8SGD", "optimizer_state_bytes"]


class Int8AdamW(BlockwiseOptimizer):
    """AdamW (decoupled weight decay, bias-corrected) with block-wise int8 first and 8-bit second moments."""

    foreach_update = staticmethod(foreach.adamw_foreach)
    block_kernel = staticmethod(kernels.adamw_blocks)
    param_kernel = staticmethod(kernels.adamw_param)

    def __init__(
        self,
        params: Any,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.01,
        **options: Unpack[SecondMomentOptions],
    ) -> None:
        check_range("lr", lr, 0.0)
        check_range("betas[0]", betas[0], 0.0, 1.0, high_open=True)
        check_range("betas[1]", betas[1], 0.0, 1.0, high_open=True)
        check_range("eps", eps, 0.0)
        check_range("weight_decay", weight_decay, 0.0)
        defaults = {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay}
        super().__init__(params, defaults, *state_config("Int8AdamW", options))

    def _hyper_values(self, group: Group, step: int) -> list[float]:
        lr, (beta1, beta2), eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
        return [lr, wd, beta1, beta2, eps, lr / (1.0 - beta1**step), math.sqrt(1.0 - beta2**step)]

    def _kernel_operands(
        self, param: torch.Tensor, state: dict[str, Any], group: Group
    ) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
        moments = (*self._blocks(state, "exp_avg"), *self._blocks(state, "exp_avg_sq"))
        return moments, (self.config.second_moment_code,)

    def _update(self, param: torch.Tensor, grad: torch.Tensor, moments: Moments, group: Group, step: int) -> None:
        lr, (beta1, beta2), eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
        exp_avg, exp_avg_sq = moments["exp_avg"], moments["exp_avg_sq"]
        if wd:
            param.mul_(1.0 - lr * wd)
        exp_avg.lerp_(grad, 1.0 - beta1)
        exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1.0 - beta2)
        denom = exp_avg_sq.sqrt().div_(math.sqrt(1.0 - beta2**step)).add_(eps)
        param.addcdiv_(exp_avg, denom, value=-lr / (1.0 - beta1**step))


class Int8Lion(BlockwiseOptimizer):
    """Lion (sign of interpolated momentum, decoupled weight decay) with block-wise int8 momentum."""

    foreach_update = staticmethod(foreach.lion_foreach)
    block_kernel = staticmethod(kernels.lion_blocks)
    param_kernel = staticmethod(kernels.lion_param)

    def __init__(
        self,
        params: Any,
        lr: float = 1e-4,
        betas: tuple[float, float] = (0.9, 0.99),
        weight_decay: float = 0.0,
        **options: Unpack[StateOptions],
    ) -> None:
        check_range("lr", lr, 0.0)
        check_range("betas[0]", betas[0], 0.0, 1.0)
        check_range("betas[1]", betas[1], 0.0, 1.0, high_open=True)
        check_range("weight_decay", weight_decay, 0.0)
        defaults = {"lr": lr, "betas": tuple(betas), "weight_decay": weight_decay}
        super().__init__(params, defaults, *state_config("Int8Lion", options))

    def _hyper_values(self, group: Group, step: int) -> list[float]:
        (beta1, beta2) = group["betas"]
        return [group["lr"], group["weight_decay"], beta1, beta2]

    def _kernel_operands(
        self, param: torch.Tensor, state: dict[str, Any], group: Group
    ) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
        return self._blocks(state, "exp_avg"), ()

    def _update(self, param: torch.Tensor, grad: torch.Tensor, moments: Moments, group: Group, step: int) -> None:
        lr, (beta1, beta2), wd = group["lr"], group["betas"], group["weight_decay"]
        exp_avg = moments["exp_avg"]
        if wd:
            param.mul_(1.0 - lr * wd)
        param.add_(torch.lerp(exp_avg, grad, 1.0 - beta1).sign_(), alpha=-lr)
        exp_avg.lerp_(grad, 1.0 - beta2)


class Int8SGD(BlockwiseOptimizer):
    """SGD with (optionally Nesterov) momentum, decoupled weight decay and a block-wise int8 momentum buffer."""

    foreach_update = staticmethod(foreach.sgd_foreach)
    block_kernel = staticmethod(kernels.sgd_blocks)
    param_kernel = staticmethod(kernels.sgd_param)

    def __init__(
        self,
        params: Any,
        lr: float = 1e-2,
        momentum: float = 0.9,
        weight_decay: float = 0.0,
        nesterov: bool = False,
        **options: Unpack[StateOptions],
    ) -> None:
        check_range("lr", lr, 0.0)
        check_range("momentum", momentum, 0.0, 1.0, high_open=True)
        check_range("weight_decay", weight_decay, 0.0)
        if nesterov and momentum <= 0:
            raise ConfigError("nesterov=True needs momentum > 0")
        defaults = {"lr": lr, "momentum": momentum, "weight_decay": weight_decay, "nesterov": nesterov}
        super().__init__(params, defaults, *state_config("Int8SGD", options))

    def _hyper_values(self, group: Group, step: int) -> list[float]:
        return [group["lr"], group["weight_decay"], group["momentum"]]

    def _moments(self, group: Group) -> tuple[tuple[str, str], ...]:
        return MOMENTS["Int8SGD"] if group["momentum"] else ()

    def _kernel_operands(
        self, param: torch.Tensor, state: dict[str, Any], group: Group
    ) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
        return self._blocks(state, "momentum_buffer"), (bool(group["nesterov"]),)

    def _update(self, param: torch.Tensor, grad: torch.Tensor, moments: Moments, group: Group, step: int) -> None:
        lr, momentum, wd = group["lr"], group["momentum"], group["weight_decay"]
        if wd:
            param.mul_(1.0 - lr * wd)
        direction = grad
        if momentum:
            buf = moments["momentum_buffer"]
            buf.mul_(momentum).add_(grad)
            direction = grad.add(buf, alpha=momentum) if group["nesterov"] else buf
        param.add_(direction, alpha=-lr)
