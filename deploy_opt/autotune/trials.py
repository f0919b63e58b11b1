"""One measured point of the auto search, and how the search compares them."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from deploy_opt.autotune.candidates import Candidate
from deploy_opt.evaluation.numerics import json_db

SPEED_TIE = 0.05  # speedups within 5% of each other rank as one (``fastest``)


@dataclass(frozen=True)
class Trial:
    """A candidate as measured: its metric and drop on the evaluation set, and its latency against FP32."""

    step: str  # placement | smoothquant | head | fallback | latency | confirm
    candidate: Candidate
    metric: float
    drop: float
    predicted_drop: float | None
    latency_ms: float | None
    speedup: float | None
    quantized_nodes: int
    seconds: float
    # One standard error of ``drop`` over the decision samples (paired per-sample differences; 0 when unknown).
    drop_error: float = 0.0
    # The lower end of the speedup's 95% interval, where it was measured (the confirming timing); else None.
    speedup_low: float | None = None
    # Work seconds (this process's CPU time per thread: ``dopt_common.clock``) the trial cost: what the budget counts
    work_s: float = 0.0
    # The model output's SQNR against FP32 over the decision samples, in dB (None: not measured in-process): a
    # continuous fidelity that orders candidates a coarse metric ties
    fidelity_db: float | None = None

    def meets(self, max_drop: float, spare: bool = True) -> bool:
        """Whether the accuracy gate holds, with a standard error to spare (``spare``): a candidate chosen as the
        fastest of many on one set of samples meets ``max_drop`` there partly by luck, and the gate judges others."""
        return self.drop + (self.drop_error if spare else 0.0) <= max_drop

    def pays(self, min_gain: float | None) -> bool:
        """Whether INT8 is worth shipping here: faster than FP32 by ``min_gain`` (always, when not timed) and,
        where the speedup has an interval, faster than FP32 beyond timing noise (its lower end at least 1x, as the
        gate asks of the shipped model: a MobileNet-v2 with 48 of 53 convs float confirmed at 1.07x and was timed
        at 0.97x, 95% CI 0.94-1.01x, by the build's benchmark)."""
        if self.speedup is None or min_gain is None:
            return True
        return self.speedup >= min_gain and (self.speedup_low is None or self.speedup_low >= 1.0)

    @property
    def fidelity(self) -> float:
        """``fidelity_db`` for ordering: unknown ranks below any measured value, no noise above all."""
        return -math.inf if self.fidelity_db is None else self.fidelity_db

    def better_than(self, other: Trial) -> bool:
        """A lower drop, or at the same drop (a coarse metric's tie) a higher output SQNR."""
        return (self.drop, -self.fidelity) < (other.drop, -other.fidelity)

    def to_json(self) -> dict[str, Any]:
        """Plain data for build.json's ``auto.trials``."""
        return {
            "step": self.step,
            "label": self.candidate.label,
            "settings": self.candidate.to_json(),
            "metric": self.metric,
            "drop": self.drop,
            "drop_error": round(self.drop_error, 4),
            "predicted_drop": self.predicted_drop,
            "latency_ms": self.latency_ms,
            "speedup": self.speedup,
            "speedup_ci95_low": self.speedup_low,
            "quantized_nodes": self.quantized_nodes,
            "seconds": round(self.seconds, 2),
            "work_s": round(self.work_s, 2),
            "fidelity_db": json_db(self.fidelity_db, 2),
        }


def best_trial(trials: list[Trial], max_drop: float, min_gain: float | None, spare: bool = True) -> Trial | None:
    """The fastest trial that meets the gate (with a standard error to spare) and pays; untimed, the one that keeps
    the most nodes in INT8."""
    good = [t for t in trials if t.meets(max_drop, spare) and t.pays(min_gain) and t.quantized_nodes > 0]
    if not good:
        return None
    if all(t.speedup is not None for t in good):
        return fastest(good)
    return min(good, key=lambda t: (len(t.candidate.excluded), trials.index(t)))


def fastest(trials: list[Trial]) -> Trial:
    """The fastest of ``trials``, speeds within ``SPEED_TIE`` of the top counting as one speed: among those the
    most accurate (lower drop, then higher output SQNR), then the earliest.

    Two candidates a few percent apart swap places from one timing to the next (on a textdir build the plain and
    the chained placement measured 0.71x and 0.71x idle, 0.71x and 0.75x beside two CPU hogs), so ranking them on
    raw speed would make the search's path depend on noise and load.
    """
    top = max(t.speedup or 0.0 for t in trials)
    tied = [t for t in trials if (t.speedup or 0.0) * (1 + SPEED_TIE) >= top]
    return min(tied, key=lambda t: (t.drop, -t.fidelity, trials.index(t)))


def chosen_trial(trials: list[Trial], max_drop: float, min_gain: float | None) -> Trial | None:
    """The search's answer: the best trial that meets ``max_drop`` with a standard error to spare, else (few or
    noisy decision samples: one flipped prediction of 128 is a drop of 0.78 give or take 0.78) the best that
    meets it as measured."""
    return best_trial(trials, max_drop, min_gain) or best_trial(trials, max_drop, min_gain, spare=False)


@dataclass(frozen=True)
class AutoSearch:
    """Every trial, the candidate that ships (None: FP32 ships) and the verdict in one line."""

    chosen: Candidate | None
    trials: tuple[Trial, ...]
    verdict: str
    seconds: float
    batch: int | None  # the batch latency was measured at (None: not timed)
    work_s: float = 0.0  # the work seconds the search spent (its budget's unit: ``dopt_common.clock``)
    capped: bool = False  # the wall cap, not the work budget, ended the search (a loaded machine)

    def to_json(self) -> dict[str, Any]:
        """The build.json ``auto`` section."""
        return {
            "chosen": self.chosen.to_json() if self.chosen else None,
            "verdict": self.verdict,
            "seconds": round(self.seconds, 1),
            "work_s": round(self.work_s, 1),
            "wall_capped": self.capped,
            "latency_batch": self.batch,
            "trials": [t.to_json() for t in self.trials],
        }
