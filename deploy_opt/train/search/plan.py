"""The trials a search runs before Optuna samples any: the recommender's choice, the config as given, the grid.

- Trial 0 is the recommender's choice when the config names ``model_type`` (optimizer, the geometric middle of its
  LR range, state and warmup), with its reasons; else the config as given.
- Trial 1 is the config as given (the "default" the report compares against), when it differs from trial 0.
- Then the stage-1 grid: each optimizer at each LR decade, for ``steps_fraction`` of the steps.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from deploy_opt.train.config import DEFAULT_LR, TrainConfig
from deploy_opt.train.search.space import GridStage
from deploy_opt.train.search.trial import TrialSpec

log = logging.getLogger(__name__)


def config_params(config: TrainConfig) -> dict[str, Any]:
    """The searched hyper-parameters as the config sets them."""
    opt = config.optimizer
    params: dict[str, Any] = {
        "type": opt.type,
        "lr": opt.resolved_lr,
        "weight_decay": opt.weight_decay,
        "warmup_ratio": config.scheduler.warmup_ratio,
        "state": opt.state,
    }
    if opt.type == "sgd":
        params["momentum"] = opt.momentum
    else:
        params["beta1"], params["beta2"] = opt.resolved_betas
    if opt.type == "sophia":
        params["rho"] = opt.rho
    return params


def recommended_spec(config: TrainConfig, samples: int, memory_gb: float, steps: int) -> TrialSpec | None:
    """Trial 0 from the recommender (None without ``model_type``)."""
    if config.model_type is None:
        return None
    from deploy_opt.train.loop import build_model
    from deploy_opt.train.recommend import recommend

    params = sum(p.numel() for p in build_model(config).parameters() if p.requires_grad)
    rec = recommend(config.model_type, params, samples, memory_gb)
    low, high = rec.lr_range
    chosen = {
        "type": rec.optimizer,
        "lr": float(f"{math.sqrt(low * high):.3g}"),
        "warmup_ratio": rec.schedule.warmup_ratio,
        "state": rec.state,
    }
    if rec.optimizer == config.optimizer.type:  # same optimizer: keep the config's betas/momentum and decay
        chosen = {**config_params(config), **chosen}
    return TrialSpec(0, "recommended", chosen, steps, "the recommender's choice", tuple(rec.reasons))


def fixed_specs(config: TrainConfig, recommended: TrialSpec | None, grid: GridStage, steps: int) -> list[TrialSpec]:
    """Trial 0 (and 1), then the grid cells, numbered in that order."""
    specs: list[TrialSpec] = []
    default = config_params(config)
    if recommended is not None:
        specs.append(recommended)
    if recommended is None or _differs(recommended.params, default):
        specs.append(TrialSpec(len(specs), "default", default, steps, "the config as given"))
    short = max(1, math.ceil(steps * grid.steps_fraction))
    for kind, decade in grid.cells:
        base = config.optimizer.resolved_lr if kind == config.optimizer.type else DEFAULT_LR[kind]
        lr = float(f"{base * 10.0**decade:.3g}")
        specs.append(TrialSpec(len(specs), "grid", {"type": kind, "lr": lr}, short, f"{kind} lr {lr:g}"))
    return specs


def _differs(a: dict[str, Any], b: dict[str, Any]) -> bool:
    keys = set(a) & set(b)
    return a["type"] != b["type"] or any(
        a[k] != b[k] if isinstance(a[k], str) else not math.isclose(a[k], b[k], rel_tol=1e-6) for k in keys
    )


def rung_steps(steps: int, rungs: int) -> list[int]:
    """Where a trial pauses for the pruner: ``rungs`` equal segments (deduplicated for short runs)."""
    return sorted({max(1, math.ceil(steps * r / rungs)) for r in range(1, rungs + 1)})
