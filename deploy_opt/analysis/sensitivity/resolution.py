"""How finely the exact drops can measure: the samples they run on and the metric's step on that many samples.

A top1 score is 0 or 100 per sample, so on n samples its mean moves in steps of 100/n points: on 45 samples a
drop is 0, 2.22, 4.44, ... and a real 1-point drop reads 0 or 2.22. The sensitivity page and JSON state this
beside the gate's ``max_drop``, and say how large a subset would resolve it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

# Metrics that score each sample 0 or 100, so a mean over n samples moves in steps of 100/n points.
STEP_METRICS = ("top1",)


@dataclass(frozen=True, kw_only=True)
class Resolution:
    """The exact drops' sample count, what it was drawn from, and the metric's step against the gate."""

    metric: str
    samples: int  # what the exact drops (and the subset FP32/INT8 figures) are measured on
    drawn_from: int  # the evaluation samples the seeded subset was drawn from
    subset: float  # sensitivity.subset, the configured fraction
    max_drop: float  # gate.max_drop, the finest drop a verdict needs

    @property
    def step(self) -> float | None:
        """The smallest non-zero change of the metric on ``samples`` (points), or None for a continuous one."""
        return 100.0 / self.samples if self.metric in STEP_METRICS and self.samples > 0 else None

    @property
    def coarser_than_gate(self) -> bool:
        """Whether one sample moves the metric by more than the gate's ``max_drop``."""
        return self.step is not None and self.step > self.max_drop

    def needed_samples(self) -> int | None:
        """Samples for a step no coarser than ``max_drop`` (None: continuous metric, or ``max_drop`` not positive)."""
        if self.step is None or self.max_drop <= 0:
            return None
        return math.ceil(100.0 / self.max_drop - 1e-9)

    def fix(self) -> str | None:
        """What to change so that the step fits the gate, when it does not."""
        needed = self.needed_samples()
        if not self.coarser_than_gate:
            return None
        if needed is None:
            return "a gate max_drop of 0 needs every sample to agree; read the drops as counts of changed samples"
        if needed > self.drawn_from:
            return (
                f"even all {self.drawn_from} samples step by {100.0 / self.drawn_from:.2f} points; fix: add "
                f"evaluation data (at least {needed} samples)"
            )
        fraction = min(1.0, math.ceil(needed / self.drawn_from * 100) / 100)
        return f"fix: --set sensitivity.subset={fraction:g} (at least {needed} samples)"

    def text(self) -> str:
        """One sentence for the page and the command line."""
        where = (
            f"{self.samples} of the {self.drawn_from} evaluation samples it reads (sensitivity.subset {self.subset:g})"
        )
        if self.step is None:
            return f"exact drops on {where}; {self.metric} is a per-sample mean, not a count, so it has no fixed step"
        text = f"exact drops on {where}: {self.metric} moves in steps of {self.step:.2f} points (one sample)"
        if not self.coarser_than_gate:
            return f"{text}, finer than the gate's max_drop {self.max_drop:g}"
        return (
            f"{text}, coarser than the gate's max_drop {self.max_drop:g}: a drop of 0 means no sample changed, "
            f"not that the node is harmless; {self.fix()}"
        )

    def to_json(self) -> dict[str, Any]:
        """The ``resolution`` section of sensitivity.json."""
        return {
            "metric": self.metric,
            "samples": self.samples,
            "drawn_from": self.drawn_from,
            "subset": self.subset,
            "points_per_sample": self.step,
            "gate_max_drop": self.max_drop,
            "coarser_than_gate": self.coarser_than_gate,
            "needed_samples": self.needed_samples(),
            "text": self.text(),
        }
