"""One trial: the config it trains (the user's YAML with the trial's overrides) and one segment of its run.

``run_segment`` is what a Ray task (or the in-process executor) runs: it trains the trial's config up to a step in
the trial's own folder (resuming from its checkpoint when there is one), and returns the loss curve so far, the
evaluation (when the run completed), the optimizer's state bytes and the time. It takes and returns plain data,
so it runs on any Ray worker that has deploy_opt installed and can see the output folder.
"""

from __future__ import annotations

import copy
import json
import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

QUIET_LOGGERS = ("deploy_opt.train.loop", "deploy_opt.train.param_groups", "deploy_opt.demo")
CONVERGED_FRACTION = 0.05  # converged: the smoothed loss is within 5% of its total drop from the final value


@dataclass(frozen=True)
class TrialSpec:
    """What one trial trains: its number, stage, hyper-parameters and length."""

    number: int
    stage: str  # default | recommended | grid | tpe
    params: dict[str, Any]  # optimizer type, lr, betas/momentum, weight_decay, warmup_ratio, rho
    steps: int
    label: str = ""
    reasons: tuple[tuple[str, str], ...] = field(default=())


def trial_config(base: dict[str, Any], params: dict[str, Any], steps: int, threads: int | None) -> dict[str, Any]:
    """The user's YAML mapping with the trial's hyper-parameters and length laid over it."""
    data = copy.deepcopy(base)
    optimizer = dict(data.get("optimizer") or {})
    kind = params.get("type", optimizer.get("type", "adamw"))
    if kind != optimizer.get("type", "adamw"):
        # Another optimizer: its own defaults, not the other type's betas and LR.
        for key in ("betas", "lr", "eps", "rho", "update_period", "estimator", "momentum", "nesterov"):
            optimizer.pop(key, None)
    optimizer["type"] = kind
    for key in ("lr", "weight_decay", "momentum", "rho", "state"):
        if key in params:
            optimizer[key] = params[key]
    if "beta1" in params:
        optimizer["betas"] = [params["beta1"], params["beta2"]]
    data["optimizer"] = optimizer
    if "warmup_ratio" in params:
        data["scheduler"] = {**(data.get("scheduler") or {}), "warmup_ratio": params["warmup_ratio"]}
    data.pop("epochs", None)
    data.pop("model_type", None)  # the recommender spoke once, for trial 0; trials need not repeat it
    data["steps"] = steps
    data["checkpoint_every"] = None
    if threads:
        data["threads"] = threads
    return data


def run_segment(config_data: dict[str, Any], base_dir: str, out: str, stop_at: int) -> dict[str, Any]:
    """Train ``config_data`` in ``out`` up to ``stop_at`` (resuming from its checkpoint) and report."""
    from deploy_opt.train.checkpoint import CHECKPOINT_NAME
    from deploy_opt.train.config import build_train_config
    from deploy_opt.train.loop import train

    started = time.perf_counter()
    config = build_train_config(config_data, base_dir)
    folder = Path(out)
    resume = (folder / CHECKPOINT_NAME).exists()
    # A trial's step lines stay in its train_log.jsonl; the search logs one line per trial event.
    quiet = [logging.getLogger(name) for name in QUIET_LOGGERS]
    levels = [logger.level for logger in quiet]
    for logger in quiet:
        logger.setLevel(logging.WARNING)
    try:
        result = train(config, folder, resume=resume, progress=False, stop_at=stop_at)
    finally:
        for logger, level in zip(quiet, levels, strict=True):
            logger.setLevel(level)
    return {
        "step": result.steps,
        "total_steps": result.total_steps,
        "completed": result.completed,
        "curve": read_curve(Path(result.log)),
        "metrics": result.metrics,
        "state_bytes": result.optimizer_state_bytes,
        "skipped_steps": result.skipped_steps,
        "seconds": time.perf_counter() - started,
    }


def read_curve(log_path: Path) -> list[list[float]]:
    """``[step, loss]`` of every step that updated the weights, from a run's train_log.jsonl."""
    curve = []
    with open(log_path, encoding="utf-8") as handle:
        for line in handle:
            event = json.loads(line)
            if event.get("event") == "step" and not event.get("skipped"):
                curve.append([event["step"], event["loss"]])
    return curve


def smoothed(curve: list[list[float]]) -> list[float]:
    """A trailing mean over 5% of the steps (at least one): what the pruner and the convergence step read."""
    losses = [loss for _, loss in curve]
    window = max(1, len(losses) // 20)
    out, total = [], 0.0
    for i, loss in enumerate(losses):
        total += loss
        if i >= window:
            total -= losses[i - window]
        out.append(total / min(i + 1, window))
    return out


def recent_loss(curve: list[list[float]]) -> float:
    """The smoothed training loss at the end of the curve (NaN without steps)."""
    values = smoothed(curve)
    return values[-1] if values else math.nan


def steps_to_converge(curve: list[list[float]]) -> int | None:
    """The first step whose smoothed loss is within ``CONVERGED_FRACTION`` of the total drop from the end's."""
    values = smoothed(curve)
    if not values or not all(math.isfinite(v) for v in values):
        return None
    start, end = values[0], values[-1]
    if not start > end:
        return None  # no progress to speak of
    line = end + CONVERGED_FRACTION * (start - end)
    return next(int(step) for (step, _), value in zip(curve, values, strict=True) if value <= line)
