"""Sophia (Liu et al. 2023, "Sophia: A Scalable Stochastic Second-order Optimizer for Language Model
Pre-training", algorithm 3) with block-wise 8-bit state, and its fp32-state twin.

Per step ``t`` (``lr`` = η, ``rho`` = γ, ``update_period`` = k, ``betas`` = (β1, β2)):

    m_t = β1 m_{t-1} + (1 - β1) g_t
    h_t = β2 h_{t-k} + (1 - β2) ĥ_t      when t mod k = 1 (else h_t = h_{t-1}); ĥ from an estimator
    θ  ← θ - η λ θ                        (decoupled weight decay)
    θ  ← θ - η clip(m_t / max(γ h_t, ε), 1)

The estimators (Gauss-Newton-Bartlett and Hutchinson) need the model, so they live in
``deploy_opt.train.hessian``; the training loop (or your own) asks :meth:`Int8Sophia.hessian_due` before a step
and hands the estimate to :meth:`Int8Sophia.update_hessian`. Until the first estimate, ``h = 0`` and the update is
``lr * sign(m)`` clipped, as in the paper.

State: ``exp_avg`` (signed int8 code) and ``hessian`` (the unsigned second-moment code, like AdamW's ``v``): two
states per parameter, as much as AdamW. A Hutchinson estimate can be negative; the int8 form stores ``max(h, 0)``,
which changes no update (any ``h <= ε/γ`` divides by ``ε``), only the memory of the EMA.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch

from deploy_opt.train import foreach
from deploy_opt.train.blockwise_optimizer import BlockwiseOptimizer, Moments
from deploy_opt.train.foreach import Group, Tensors
from deploy_opt.train.state_io import (
    SecondMomentOptions,
    check_range,
    local_tensor,
    moment_code,
    read_moment,
    state_config,
    write_moment,
)
from dopt_common.errors import ConfigError

if TYPE_CHECKING:
    from typing_extensions import Unpack

log = logging.getLogger(__name__)

__all__ = ["Int8Sophia", "Sophia"]

# The paper's GPT-2 settings (section 3.3 and its code): β = (0.965, 0.99), γ = 0.04 with the GNB estimator's
# batch scaling, k = 10, λ = 0.1 (ours defaults to the project's 0.01 in configs; the class keeps the paper's).
DEFAULT_BETAS = (0.965, 0.99)
DEFAULT_RHO = 0.04
DEFAULT_UPDATE_PERIOD = 10


class Int8Sophia(BlockwiseOptimizer):
    """Sophia with block-wise int8 momentum and 8-bit Hessian EMA (``state="fp32"`` keeps both in fp32)."""

    foreach_update = staticmethod(foreach.sophia_foreach)  # called with the Hessians by ``_foreach_update``

    def __init__(
        self,
        params: Any,
        lr: float = 1e-4,
        betas: tuple[float, float] = DEFAULT_BETAS,
        rho: float = DEFAULT_RHO,
        weight_decay: float = 0.1,
        eps: float = 1e-12,
        update_period: int = DEFAULT_UPDATE_PERIOD,
        **options: Unpack[SecondMomentOptions],
    ) -> None:
        check_range("lr", lr, 0.0)
        check_range("betas[0]", betas[0], 0.0, 1.0, high_open=True)
        check_range("betas[1]", betas[1], 0.0, 1.0, high_open=True)
        check_range("rho", rho, 0.0)
        if not rho > 0:
            raise ConfigError(f"rho = {rho!r} must be > 0 (the paper uses 0.01-0.05)")
        check_range("eps", eps, 0.0)
        check_range("weight_decay", weight_decay, 0.0)
        if isinstance(update_period, bool) or not isinstance(update_period, int) or update_period < 1:
            raise ConfigError(
                f"update_period must be a positive integer (steps between Hessian estimates), "
                f"got {update_period!r}; the paper uses 10"
            )
        defaults = {"lr": lr, "betas": tuple(betas), "rho": rho, "weight_decay": weight_decay, "eps": eps}
        self.update_period = update_period
        self._hessian: torch.Tensor | None = None
        self._foreach_hessians: list[torch.Tensor | None] = []
        super().__init__(params, defaults, *state_config("Int8Sophia", options))

    # --- the Hessian EMA -------------------------------------------------------------------------------
    def steps_done(self) -> int:
        """Optimizer steps taken so far (the largest per-parameter step count; 0 before the first)."""
        steps = [int(s["step"].item()) for s in self.state.values() if "step" in s]
        return max(steps, default=0)

    def hessian_due(self) -> bool:
        """Whether the coming step ``t`` has ``t mod k = 1`` (steps 1, k+1, 2k+1, ...): estimate before it."""
        return self.steps_done() % self.update_period == 0

    def hessian_params(self) -> list[torch.Tensor]:
        """The parameters whose Hessian diagonal the estimators must return (those that train)."""
        return [p for group in self.param_groups for p in group["params"] if p.requires_grad]

    @torch.no_grad()
    def update_hessian(self, estimates: Mapping[torch.Tensor, torch.Tensor]) -> None:
        """``h ← β2 h + (1 - β2) ĥ`` for each parameter in ``estimates`` (parameter → its diagonal estimate)."""
        cfg = self.config
        code = moment_code("second", cfg)
        for group in self.param_groups:
            beta2 = group["betas"][1]
            for param, name in zip(group["params"], self._names(group), strict=True):
                estimate = estimates.get(param)
                if estimate is None:
                    continue
                local = local_tensor(param)
                estimate = local_tensor(estimate).float().reshape(local.shape)
                state = self.state[param]
                step = int(state["step"].item()) if "step" in state else 0
                as_int8 = cfg.quantizes(name, local.numel(), step)
                value = read_moment(state, "hessian", code, cfg.block_size, local.shape)
                value = torch.zeros_like(local, dtype=torch.float32) if value is None else value
                value.mul_(beta2).add_(estimate, alpha=1.0 - beta2)
                write_moment(
                    state, "hessian", code, value.clamp_(min=0.0) if as_int8 else value, cfg.block_size, as_int8
                )

    # --- the step --------------------------------------------------------------------------------------
    def _moments(self, group: Group) -> tuple[tuple[str, str], ...]:
        # Only the momentum is read and written by a step; the Hessian is read-only there (re-encoding it every
        # step would drift), so _step_param stashes it and update_hessian alone writes it.
        return (("exp_avg", "signed"),)

    def _fits_kernel(self, state: dict[str, Any], local: torch.Tensor, grad: torch.Tensor, group: Group) -> bool:
        return False  # no fused kernel for Sophia: the per-op path below

    def _joins_foreach(self, param: torch.Tensor, name: str | None, group: Group) -> bool:
        return "hessian_codes" not in self.state[param] and super()._joins_foreach(param, name, group)

    def _foreach_step(self, params: Tensors, group: Group) -> None:
        # the fp32 Hessian EMAs (read-only in a step), stashed for _foreach_update as _step_param stashes one
        hessians = [self.state[p].get("hessian") for p in params]
        self._foreach_hessians = [None if h is None else local_tensor(h) for h in hessians]
        try:
            super()._foreach_step(params, group)
        finally:
            self._foreach_hessians = []

    def _foreach_update(
        self, params: Tensors, grads: Tensors, moments: dict[str, Tensors], steps: Tensors, group: Group
    ) -> None:
        foreach.sophia_foreach(params, grads, moments, steps, group, self._foreach_hessians)

    def _step_param(self, param: torch.Tensor, name: str | None, group: Group) -> None:
        local = local_tensor(param)
        cfg = self.config
        self._hessian = read_moment(
            self.state[param], "hessian", moment_code("second", cfg), cfg.block_size, local.shape
        )
        try:
            super()._step_param(param, name, group)
        finally:
            self._hessian = None

    def _update(self, param: torch.Tensor, grad: torch.Tensor, moments: Moments, group: Group, step: int) -> None:
        lr, (beta1, _), rho, wd, eps = group["lr"], group["betas"], group["rho"], group["weight_decay"], group["eps"]
        exp_avg = moments["exp_avg"]
        exp_avg.lerp_(grad, 1.0 - beta1)
        if wd:
            param.mul_(1.0 - lr * wd)
        hessian = self._hessian
        denom = torch.full_like(param, eps) if hessian is None else (hessian * rho).clamp_(min=eps)
        param.add_((exp_avg / denom).clamp_(-1.0, 1.0), alpha=-lr)


class Sophia(Int8Sophia):
    """Sophia with fp32 state: ``Int8Sophia(..., state="fp32")`` under its own name (the same arguments)."""

    def __init__(self, params: Any, *args: Any, **kwargs: Any) -> None:
        if kwargs.setdefault("state", "fp32") != "fp32":
            raise ConfigError("Sophia keeps fp32 state; for int8 state use Int8Sophia")
        super().__init__(params, *args, **kwargs)
