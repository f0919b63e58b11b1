"""The fp32-state updates over all of a group's fp32 parameters at once, with torch's multi-tensor (foreach) ops.

The int8-state optimizers keep fp32 state for small tensors, name patterns, warmup steps and ``state="fp32"``.
Those parameters are updated together, a few multi-tensor launches per group instead of a Python loop of per-op
calls per parameter: AdamW through torch's own functional (``torch.optim.adamw.adamw(foreach=True)``), SGD through
``torch.optim.sgd.sgd(foreach=True)`` after the decoupled weight decay, Lion and Sophia with ``torch._foreach_*``.
Each gives the numbers of the per-op ``_update`` of its optimizer (the same ops in the same order).

Every function takes the parameters, their gradients, the fp32 moments by kind (lists in parameter order), the
0-d CPU ``step`` tensors, which it advances by one as torch's functionals do, and the parameter group.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch
from torch.optim.adamw import adamw
from torch.optim.sgd import sgd

log = logging.getLogger(__name__)

Tensors = list[torch.Tensor]
Group = dict[str, Any]  # a param group: its "params" and hyper-parameters (torch.optim.Optimizer.param_groups)
# An optimizer's multi-tensor update: (params, grads, moments, steps, group[, extra state]) → None, in place.
ForeachUpdate = Callable[..., None]


def adamw_foreach(params: Tensors, grads: Tensors, moments: dict[str, Tensors], steps: Tensors, group: Group) -> None:
    """AdamW (decoupled weight decay) by ``torch.optim.adamw.adamw(foreach=True)``, which advances ``steps``."""
    beta1, beta2 = group["betas"]
    adamw(
        params,
        grads,
        moments["exp_avg"],
        moments["exp_avg_sq"],
        [],
        steps,
        foreach=True,
        amsgrad=False,
        beta1=beta1,
        beta2=beta2,
        lr=group["lr"],
        weight_decay=group["weight_decay"],
        eps=group["eps"],
        maximize=False,
    )


def sgd_foreach(params: Tensors, grads: Tensors, moments: dict[str, Tensors], steps: Tensors, group: Group) -> None:
    """SGD: decoupled weight decay, then ``torch.optim.sgd.sgd(foreach=True)`` without its (coupled) decay."""
    torch._foreach_add_(steps, 1.0)
    lr, wd = group["lr"], group["weight_decay"]
    if wd:
        torch._foreach_mul_(params, 1.0 - lr * wd)
    buffers: list[torch.Tensor | None] = list(moments.get("momentum_buffer", [None] * len(params)))
    sgd(
        params,
        grads,
        buffers,
        foreach=True,
        weight_decay=0.0,
        momentum=group["momentum"],
        lr=lr,
        dampening=0.0,
        nesterov=bool(group["nesterov"]),
        maximize=False,
    )


def lion_foreach(params: Tensors, grads: Tensors, moments: dict[str, Tensors], steps: Tensors, group: Group) -> None:
    """Lion: ``p -= lr * sign(lerp(m, g, 1 - beta1))``, then ``m = lerp(m, g, 1 - beta2)``."""
    torch._foreach_add_(steps, 1.0)
    lr, (beta1, beta2), wd = group["lr"], group["betas"], group["weight_decay"]
    exp_avgs = moments["exp_avg"]
    if wd:
        torch._foreach_mul_(params, 1.0 - lr * wd)
    update = torch._foreach_lerp(exp_avgs, grads, 1.0 - beta1)
    torch._foreach_sign_(update)
    torch._foreach_add_(params, update, alpha=-lr)
    torch._foreach_lerp_(exp_avgs, grads, 1.0 - beta2)


def sophia_foreach(
    params: Tensors,
    grads: Tensors,
    moments: dict[str, Tensors],
    steps: Tensors,
    group: Group,
    hessians: list[torch.Tensor | None],
) -> None:
    """Sophia: ``m = lerp(m, g, 1 - beta1)``; ``p -= lr * clip(m / max(rho * h, eps), 1)`` (``h`` None: 0)."""
    torch._foreach_add_(steps, 1.0)
    lr, (beta1, _), rho, wd, eps = group["lr"], group["betas"], group["rho"], group["weight_decay"], group["eps"]
    exp_avgs = moments["exp_avg"]
    torch._foreach_lerp_(exp_avgs, grads, 1.0 - beta1)
    if wd:
        torch._foreach_mul_(params, 1.0 - lr * wd)
    denoms = [torch.full_like(p, eps) if h is None else h * rho for p, h in zip(params, hessians, strict=True)]
    torch._foreach_clamp_min_(denoms, eps)
    ratios = torch._foreach_div(exp_avgs, denoms)
    torch._foreach_clamp_min_(ratios, -1.0)
    torch._foreach_clamp_max_(ratios, 1.0)
    torch._foreach_add_(params, ratios, alpha=-lr)
