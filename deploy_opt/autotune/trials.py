"""One measured point of the auto search, and how the search compares them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from deploy_opt.autotune.candidates import Candidate


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

    def meets(self, max_drop: float) -> bool:
        """Whether the accuracy gate holds."""
        return self.drop <= max_drop

    def pays(self, min_gain: float | None) -> bool:
        """Whether INT8 is worth shipping here: faster than FP32 by ``min_gain`` (always, when not timed)."""
        return self.speedup is None or min_gain is None or self.speedup >= min_gain

    def to_json(self) -> dict[str, Any]:
        """Plain data for build.json's ``auto.trials``."""
        return {
            "step": self.step,
            "label": self.candidate.label,
            "settings": self.candidate.to_json(),
            "metric": self.metric,
            "drop": self.drop,
            "predicted_drop": self.predicted_drop,
            "latency_ms": self.latency_ms,
            "speedup": self.speedup,
            "quantized_nodes": self.quantized_nodes,
            "seconds": round(self.seconds, 2),
        }


def best_trial(trials: list[Trial], max_drop: float, min_gain: float | None) -> Trial | None:
    """The fastest trial that meets the gate and pays; untimed, the one that keeps the most nodes in INT8."""
    good = [t for t in trials if t.meets(max_drop) and t.pays(min_gain) and t.quantized_nodes > 0]
    if not good:
        return None
    if all(t.speedup is not None for t in good):
        return max(good, key=lambda t: t.speedup or 0.0)
    return min(good, key=lambda t: (len(t.candidate.excluded), trials.index(t)))


@dataclass(frozen=True)
class AutoSearch:
    """Every trial, the candidate that ships (None: FP32 ships) and the verdict in one line."""

    chosen: Candidate | None
    trials: tuple[Trial, ...]
    verdict: str
    seconds: float
    batch: int | None  # the batch latency was measured at (None: not timed)

    def to_json(self) -> dict[str, Any]:
        """The build.json ``auto`` section."""
        return {
            "chosen": self.chosen.to_json() if self.chosen else None,
            "verdict": self.verdict,
            "seconds": round(self.seconds, 1),
            "latency_batch": self.batch,
            "trials": [t.to_json() for t in self.trials],
        }
