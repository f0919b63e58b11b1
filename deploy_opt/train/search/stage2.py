"""Stage 2: Optuna's TPE around the grid's winner (its optimizer fixed; LR, betas or momentum, weight decay,
warmup and Sophia's rho sampled), full-length runs that pause at rungs for the pruner."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

from deploy_opt.train.search.plan import rung_steps
from deploy_opt.train.search.space import TpeStage
from deploy_opt.train.search.trial import TrialSpec
from dopt_common.errors import DeployOptError

log = logging.getLogger(__name__)


class SearchError(DeployOptError):
    """The search cannot go on (e.g. every grid trial failed)."""


@dataclass
class TpeSampling:
    """Samples stage-2 trials once the grid has a winner (read from the ``fixed`` study)."""

    space: TpeStage
    steps: int
    fixed_study: Any
    state: str  # the optimizer state precision every trial keeps (the config's)
    winner: dict[str, Any] | None = None

    def stops(self, steps: int) -> list[int]:
        return rung_steps(steps, self.space.rungs)

    def find_winner(self) -> dict[str, Any]:
        """The grid trial with the lowest evaluation loss: its optimizer and LR."""
        if self.winner is None:
            done = [
                t
                for t in self.fixed_study.get_trials(deepcopy=False)
                if t.user_attrs.get("stage") == "grid" and t.state.name == "COMPLETE"
            ]
            if not done:
                raise SearchError(
                    "no stage-1 grid trial completed, so stage 2 has no winner to start from; fix: "
                    "look at the trials' errors in search.json and widen the space's lr_decades"
                )
            best = min(done, key=lambda t: t.value)
            self.winner = {**best.user_attrs["params"], "number": best.user_attrs["number"], "value": best.value}
            log.info(
                "stage 1 winner: trial %d, %s lr %g (eval_loss %.4g)",
                self.winner["number"],
                self.winner["type"],
                self.winner["lr"],
                best.value,
            )
        return self.winner

    def sample(self, trial: Any, number: int) -> TrialSpec:
        """One TPE suggestion around the winner."""
        winner = self.find_winner()
        s = self.space
        kind, lr = winner["type"], winner["lr"]
        params: dict[str, Any] = {
            "type": kind,
            "state": self.state,
            "lr": trial.suggest_float("lr", lr / s.lr_factor, lr * s.lr_factor, log=True),
            "weight_decay": trial.suggest_float("weight_decay", *s.weight_decay, log=True),
            "warmup_ratio": trial.suggest_float("warmup_ratio", *s.warmup_ratio),
        }
        if kind == "sgd":
            params["momentum"] = trial.suggest_float("momentum", *s.momentum)
        else:
            params["beta1"] = trial.suggest_float("beta1", *s.beta1)
            params["beta2"] = trial.suggest_float("beta2", *s.beta2)
        if kind == "sophia":
            params["rho"] = trial.suggest_float("rho", *s.rho, log=True)
        label = ", ".join(f"{k} {_short(v)}" for k, v in params.items() if k not in ("type", "state"))
        return TrialSpec(number, "tpe", params, self.steps, f"{kind}: {label}")


def _short(value: Any) -> str:
    return f"{value:.3g}" if isinstance(value, float) and math.isfinite(value) else str(value)
