"""Sophia's diagonal Hessian estimators (Liu et al. 2023, algorithms 1 and 2), and the backward pass that runs one.

- **Gauss-Newton-Bartlett** (``gnb``): sample labels from the model's own softmax, ``ŷ ~ softmax(logits)``, take the
  gradient ``ĝ`` of the mean cross-entropy against them, and return ``N · ĝ ⊙ ĝ`` (``N`` rows of logits: samples,
  or tokens for a language model). Non-negative; one extra backward through the step's own forward.
- **Hutchinson** (``hutchinson``): ``u ~ N(0, I)``, ``ĥ = u ⊙ (∇²L u)`` through a Hessian-vector product. Works for
  any loss, costs a double backward, and can be negative.

``sophia_backward`` replaces ``loss.backward()`` in a training step: a plain backward, or, when the optimizer is
Sophia and an estimate is due, the backward plus the estimate (returned, for ``update_hessian`` once the step is
known not to be skipped).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Literal

import torch
import torch.nn.functional as F

from dopt_common.errors import ConfigError

log = logging.getLogger(__name__)

Estimator = Literal["auto", "gnb", "hutchinson"]
ESTIMATORS = ("auto", "gnb", "hutchinson")


def gauss_newton_bartlett(
    logits: torch.Tensor, params: list[torch.Tensor], generator: torch.Generator | None = None
) -> dict[torch.Tensor, torch.Tensor]:
    """``N · ĝ ⊙ ĝ`` for each parameter, with ``ĝ`` the gradient of CE(logits, ŷ), ŷ sampled from the logits."""
    if not isinstance(logits, torch.Tensor) or logits.ndim < 2 or not logits.is_floating_point():
        raise ConfigError(
            f"the Gauss-Newton-Bartlett estimator needs logits shaped [..., classes], got "
            f"{getattr(logits, 'shape', type(logits).__name__)}; fix: return logits from the data's logits() or "
            "set optimizer.estimator: hutchinson"
        )
    flat = logits.reshape(-1, logits.shape[-1])
    with torch.no_grad():
        probs = torch.softmax(flat.detach().float(), dim=-1)
        sampled = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
    loss = F.cross_entropy(flat.float(), sampled)
    grads = torch.autograd.grad(loss, params, retain_graph=True, allow_unused=True)
    rows = flat.shape[0]
    return {p: rows * g.detach().square() for p, g in zip(params, grads, strict=True) if g is not None}


def hutchinson(
    loss: torch.Tensor, params: list[torch.Tensor], generator: torch.Generator | None = None
) -> dict[torch.Tensor, torch.Tensor]:
    """``u ⊙ (∇²L u)`` with ``u ~ N(0, I)``; also leaves ∇L in each ``param.grad`` (it replaces the backward)."""
    used = [p for p in params if p.requires_grad]
    grads = torch.autograd.grad(loss, used, create_graph=True, allow_unused=True)
    pairs = [(p, g) for p, g in zip(used, grads, strict=True) if g is not None]
    probes = [torch.randn(p.shape, generator=generator, dtype=p.dtype).to(p.device) for p, _ in pairs]
    products = torch.autograd.grad([g for _, g in pairs], [p for p, _ in pairs], grad_outputs=probes, allow_unused=True)
    for p, g in pairs:
        p.grad = g.detach() if p.grad is None else p.grad + g.detach()
    return {
        p: (u * hv).detach() if hv is not None else torch.zeros_like(p)
        for (p, _), u, hv in zip(pairs, probes, products, strict=True)
    }


def resolve_estimator(estimator: str, has_logits: bool) -> str:
    """``auto`` is ``gnb`` when the data says where the logits are, else ``hutchinson``."""
    if estimator not in ESTIMATORS:
        raise ConfigError(f"optimizer.estimator {estimator!r} is not one of {', '.join(ESTIMATORS)}")
    if estimator == "auto":
        return "gnb" if has_logits else "hutchinson"
    if estimator == "gnb" and not has_logits:
        raise ConfigError(
            "optimizer.estimator gnb needs the data's logits(output) (TrainData.logits); fix: add it, or set "
            "optimizer.estimator: hutchinson"
        )
    return estimator


def sophia_backward(
    optimizer: torch.optim.Optimizer,
    loss: torch.Tensor,
    output: Any,
    logits: Callable[[Any], torch.Tensor] | None,
    estimator: str,
    generator: torch.Generator | None = None,
) -> dict[torch.Tensor, torch.Tensor] | None:
    """``loss.backward()``, plus a Hessian estimate when ``optimizer`` is Sophia and one is due (else None)."""
    from deploy_opt.train.sophia import Int8Sophia

    if not isinstance(optimizer, Int8Sophia) or not optimizer.hessian_due():
        loss.backward()
        return None
    params = optimizer.hessian_params()
    if resolve_estimator(estimator, logits is not None) == "gnb":
        estimate = gauss_newton_bartlett(logits(output), params, generator)  # type: ignore[misc]
        loss.backward()
        return estimate
    return hutchinson(loss, params, generator)
